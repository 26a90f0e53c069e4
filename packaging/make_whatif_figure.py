"""The README's What if figure: activation patching on a motif model, made by the What if panel itself
(offscreen), by typing into its boxes and clicking Run.

    .venv/bin/python -m desktop_app train --task motif --family gpt2 --layers 2 --heads 1 --d-model 32 \\
        --d-ff 64 --context 20 --lr 3e-3 --steps 3000 --warmup 50 --batch-size 64 --seed 0 --out runs/motif2
    .venv/bin/python packaging/make_whatif_figure.py runs/motif2 [OUT.png]   (default: docs/screenshots/whatif_motif.png)

The clean text's last A is followed by D and the text ends in C, so the answer must be read from
position 17; the corrupted text has a B there. Prints the panel's status line.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

CLEAN = "D A B D B A C A A A A B C A B A C D B C"
CORRUPTED = "D A B D B A C A A A A B C A B A B D B C"


def main(argv: list[str]) -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.ui.panels.whatif import WhatIfPanel
    from desktop_app.ui.state import AppState

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "screenshots"
               / "whatif_motif.png")
    app = QApplication.instance() or QApplication([])
    state = AppState()
    state.loaded = load_model_folder(argv[0])
    panel = WhatIfPanel(state)
    state.model_changed.emit(state.loaded)
    panel.resize(1300, 560)
    panel.show()
    panel.tabs.setCurrentIndex(1)
    for edit, text in ((panel.clean_edit, CLEAN), (panel.corrupted_edit, CORRUPTED), (panel.answer_edit, "C"),
                       (panel.wrong_edit, "B")):
        edit.clear()
        QTest.keyClicks(edit, text)
    QTest.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    deadline = time.time() + 300
    while panel.patching is None or not panel.run_button.isEnabled():
        if time.time() > deadline:
            print("make_whatif_figure: patching did not finish within 5 minutes", file=sys.stderr)
            return 1
        app.processEvents()
        time.sleep(0.02)
    app.processEvents()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not panel.grab().save(str(out)):
        print(f"make_whatif_figure: cannot write {out}", file=sys.stderr)
        return 1
    print(panel.patch_status.text())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

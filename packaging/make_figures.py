"""The README's Lipschitz figure, made by the Lipschitz panel itself (offscreen) on the demo model.

    .venv/bin/python packaging/make_figures.py [OUTDIR]     (default: docs/figures)

Plays the panel's screenshot demo (layer 0: head 1 on real windows of Alice, the same head on the
paper's adversarial inputs, the whole masked sublayer on real windows; n = 4..256, five inputs per n),
then exports the plot (lipschitz_demo.png, at 1100x700) and its numbers (lipschitz_demo.csv), and
prints each run's fitted exponent with its 95% interval.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.panels.lipschitz import LipschitzPanel
    from desktop_app.ui.state import AppState

    out = Path(argv[0] if argv else Path(__file__).resolve().parents[1] / "docs" / "figures")
    app = QApplication.instance() or QApplication([])
    state = AppState()
    state.loaded = load_model_folder(demo_model_dir())
    panel = LipschitzPanel(state)
    state.model_changed.emit(state.loaded)
    panel.resize(1400, 900)
    panel.plot.resize(1100, 700)
    panel.screenshot_demo()
    deadline = time.time() + 600
    while not panel.screenshot_ready():
        if time.time() > deadline:
            print("make_figures: the sweeps did not finish within 10 minutes", file=sys.stderr)
            return 1
        app.processEvents()
        time.sleep(0.02)
    panel.plot.setTitle("Demo model, layer 0: local Lipschitz constant vs sequence length", color="#555")
    out.mkdir(parents=True, exist_ok=True)
    panel.export(out / "lipschitz_demo.png")
    panel.export(out / "lipschitz_demo.csv")
    for run in panel.runs:
        r = run.result
        print(f"{run.label}: exponent {r.exponent:.3f} [{r.exponent_ci[0]:.3f}, {r.exponent_ci[1]:.3f}]")
    print(f"wrote {out / 'lipschitz_demo.png'} and {out / 'lipschitz_demo.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

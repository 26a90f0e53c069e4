"""The README's figures of an encoder-decoder in the Model and Attention panels (issue 28), grabbed offscreen
from the main window: the source "the black dog sees a white cow" and the target "le chien blanc voit une vache
blanche [END]" (one adjective wrong) in the Model panel (the target's chips coloured by the probability the
model gave each target token), then, with the right target, "le chien noir voit une vache blanche [END]", the
Attention panel's heatmap of the last layer's head 0 in each of its three kinds: cross-attention (the target
tokens' rows over the source tokens' columns), the encoder's self-attention (source over source) and the
decoder's causal self-attention (target over target, the masked upper triangle grey).

    .venv/bin/python packaging/make_seq2seq_figures.py MODEL_DIR [OUTDIR]   (default: docs/screenshots)

MODEL_DIR: a model trained on the translation task, e.g. (about two minutes on an idle CPU thread)
    .venv/bin/python -m desktop_app train --task translate --family marian --layers 2 --heads 4 --d-model 64 \\
        --d-ff 128 --lr 3e-3 --steps 600 --warmup 50 --batch-size 64 --seed 0 --out runs/translate
Writes OUTDIR/seq2seq_model.png, OUTDIR/seq2seq_attention.png (cross-attention),
OUTDIR/seq2seq_attention_encoder.png and OUTDIR/seq2seq_attention_decoder.png (the README's four figures).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import wait_until  # noqa: E402

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")

SOURCE = "the black dog sees a white cow"
TARGET = "le chien noir voit une vache blanche [END]"
WRONG = "le chien blanc voit une vache blanche [END]"  # the Model panel's: one adjective wrong, its chip pale


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--all"]  # (--all: what an older version wrote only when asked)
    if not args:
        print(__doc__)
        return 2
    model, out = args[0], Path(args[1] if len(args) > 1 else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, tempfile.mkdtemp())  # not the user's
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    window = MainWindow(state)
    window.resize(1400, 640)
    window.show()

    def wait(condition, seconds: float = 120) -> None:
        wait_until(app, condition, seconds, "opening the model, its trace or a view", "make_seq2seq_figures")

    def settle() -> None:
        for _ in range(40):
            app.processEvents()
            time.sleep(0.02)

    def panel(title: str):
        window.tabs.setCurrentWidget(window.slot(title))
        wait(lambda: window.slot(title).panel is not None)
        return window.slot(title).panel

    state.text = SOURCE
    window.open_model(model)
    wait(lambda: state.loaded is not None and state._trace_job is None)
    if state.text != SOURCE:
        state.set_text(SOURCE)
    state.set_target(WRONG)
    wait(lambda: state._trace_job is None and len(state.decoder_ids) > 1)
    model_panel = panel("Model")
    settle()
    model_panel.grab().save(str(out / "seq2seq_model.png"))
    print(model_panel.target_count.text(), [round(p, 4) for p in model_panel.target_probabilities[1:]])
    state.set_target(TARGET)
    wait(lambda: state._trace_job is None and state.token_strings(state.decoder_ids)[3] == "noir")
    attention = panel("Attention")
    for kind in ("cross", "encoder", "decoder"):
        attention.kind_combo.setCurrentIndex(attention.kind_combo.findData(kind))
        wait(lambda: attention.screenshot_ready() and attention.data is not None and attention.data.aggregated)
        attention.open_head(attention.data.n_layers - 1, 0)  # the heatmap of the last layer's head 0
        settle()
        name = "seq2seq_attention.png" if kind == "cross" else f"seq2seq_attention_{kind}.png"
        attention.grab().save(str(out / name))
        print(f"wrote {out / name}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

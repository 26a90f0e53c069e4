"""The README's figure of the Train panel training an encoder-decoder on translate, made by the panel itself
(offscreen): Task translate (the family becomes marian, the original Transformer: post-LN, sinusoidal
positions, ReLU; 2 + 2 layers, 4 heads, width 64: the form's defaults), learning rate 3e-3, batch 64,
600 steps, an evaluation every 25; the panel is grabbed at 1500 x 1050 once the run ends.

    .venv/bin/python packaging/make_train_translate_figure.py [OUTDIR]   (default: docs/screenshots)

Writes OUTDIR/train_translate.png and prints the run's last event, the held-out exact match at each evaluation
and the held-out sentence drawn.
The run's folder goes to a temporary folder (about two minutes of training on one CPU thread).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the run's process: one thread for a small model
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, exit_status, save_grab, shown_panel  # noqa: E402


def make(out: Path, steps: int = 600, eval_every: int = 25, seconds: float = 900) -> list[dict]:
    """train_translate.png in `out`: the panel once its run of `steps` steps (an evaluation every `eval_every`)
    ends, or after `seconds`; the run's events."""
    from PySide6.QtCore import QEventLoop

    from desktop_app.ui.panels.training import TrainingPanel

    app = application()
    out.mkdir(parents=True, exist_ok=True)
    with shown_panel(TrainingPanel, None, 1500, 1050) as panel, tempfile.TemporaryDirectory() as runs:
        panel.task.setCurrentText("translate")
        assert panel.family.currentText() == "marian"
        panel.lr.setValue(3e-3)
        panel.batch_size.setValue(64)
        panel.steps.setValue(steps)
        panel.eval_every.setValue(eval_every)
        panel.checkpoint_every.setValue(100_000)
        panel.out_edit.setText(runs)
        panel.start()
        t0 = time.time()
        while panel.running and time.time() - t0 < seconds:
            app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 100)
            time.sleep(0.05)
        for _ in range(20):
            app.processEvents()
        view = panel.plots.cross_attention
        print("last event:", panel.events[-1] if panel.events else None)
        print("held-out exact match:", " ".join(f"{e['step']}:{e['val_exact_match']:.3f}" for e in panel.events
                                                if e.get("event") == "eval"))  # the README's figures (not "done"'s)
        if view.event is not None:
            print("held out:", " ".join(view.event["source"]), "->", " ".join(view.event["written"]))
        save_grab(panel, out / "train_translate.png", "make_train_translate_figure")
        return list(panel.events)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return exit_status(lambda: make(Path(argv[0] if argv else "docs/screenshots")))


if __name__ == "__main__":
    sys.exit(main())

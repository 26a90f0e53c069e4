"""The README's timeline figures (issue 30), made by the app itself offscreen: an induction head forming in a
2-layer GPT-2, seen through the timeline bar and the Across-training window, exported by its own export bar.

    .venv/bin/python packaging/make_timeline_figures.py [--run RUN_DIR] [--docs DOCS_DIR]   (default: docs)

Without --run it first trains the README's run (about 25 s on one core; the settings of
`pytest -m slow -k induction_head_forms`) into a temporary folder:

    python -m desktop_app train --task induction --family gpt2 --layers 2 --heads 4 --d-model 128 --d-ff 128 \\
        --context 31 --positions rotary --length 16 --min-length 8 --symbols 64 --lr 1e-3 --schedule constant \\
        --warmup 200 --batch-size 32 --steps 600 --eval-every 600 --checkpoint-every 600 --log-every 10 \\
        --keep-every 50 --keep-spacing linear --seed 0 --out RUN_DIR

Writes DOCS/screenshots/timeline.png (the window at 1280 x 800 on step 300, the Attention panel on a repeated
text), DOCS/screenshots/timeline_across.png (the Across-training window, logit lens chosen), and with the
window's own export (PNG and CSV): DOCS/figures/induction_across_training.png / .csv (the head metrics and
the logit lens of each layer) and DOCS/figures/induction_lipschitz.png / .csv (the head metrics and each
layer's Lipschitz constant). Prints the window's status line.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, given_or_trained, open_model, save_grab, shown_window  # noqa: E402
from figure_kit import wait_until  # noqa: E402

TRAIN = ("train --task induction --family gpt2 --layers 2 --heads 4 --d-model 128 --d-ff 128 --context 31 "
         "--positions rotary --length 16 --min-length 8 --symbols 64 --lr 1e-3 --schedule constant --warmup 200 "
         "--batch-size 32 --steps 600 --eval-every 600 --checkpoint-every 600 --log-every 10 --keep-every 50 "
         "--keep-spacing linear --seed 0").split()
# a random half of 12 of the task's symbols, then the same again (the induction task's data)
TEXT = "12 40 7 33 51 2 19 60 5 27 44 9 12 40 7 33 51 2 19 60 5 27 44 9"
STEP = 300


def _wait(app, done, seconds: float = 300.0, what: str = "the work") -> None:
    wait_until(app, done, seconds, what, "make_timeline_figures")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="an induction run with kept steps (default: train one)")
    p.add_argument("--docs", default="docs", help="the docs folder (default docs)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    with given_or_trained(args.run, TRAIN, "induction") as run:
        if run is None:
            return 1
        docs = Path(args.docs)
        (docs / "screenshots").mkdir(parents=True, exist_ok=True)
        (docs / "figures").mkdir(parents=True, exist_ok=True)

        from PySide6.QtCore import Qt
        from PySide6.QtTest import QTest

        from desktop_app.core.training.timeline import step_folder
        from desktop_app.ui.widgets.export import export_view

        app = application()
        with shown_window(1280, 800) as (state, window):
            open_model(app, window, step_folder(run, STEP), "make_timeline_figures")
            bar = window.timeline_bar
            _wait(app, lambda: state.loaded is not None and bar.isVisible() and bar.shown_step == STEP,
                  what="the step")
            window.show_panel("Attention")
            state.set_text(TEXT)
            _wait(app, lambda: state.trace is not None and len(state.token_ids) == 24, what="the trace")
            attention = window.panel("Attention")
            _wait(app, lambda: getattr(attention, "screenshot_ready", lambda: True)(), what="the Attention panel")
            window.statusBar().clearMessage()  # the opening's message, long enough to run under the status fields
            save_grab(window, docs / "screenshots" / "timeline.png", "make_timeline_figures")

            QTest.mouseClick(bar.across_button, Qt.MouseButton.LeftButton)
            across = bar.across
            across.resize(1000, 900)
            for entry, metric, name in (("Lipschitz constant", "lipschitz", "induction_lipschitz"),
                                        ("Logit lens: probability", "logit-lens", "induction_across_training")):
                across.layer_metric.setFocus()
                QTest.keyClicks(across.layer_metric, entry)
                _wait(app, lambda: across.results is not None and metric in across.layer_results, what=entry)
                for suffix in (".png", ".csv"):
                    export_view(across, docs / "figures" / (name + suffix))
            save_grab(across, docs / "screenshots" / "timeline_across.png", "make_timeline_figures")
            print(across.status.text())
            across.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's grokking figures (issue 30), made by the app itself offscreen from a modular-addition run with
kept steps: the Train panel's curves (training and held-out accuracy, loss) and the Across-training window
(each block's weight norm, each head's attention metrics), each exported by its own export bar.

    .venv/bin/python packaging/make_grokking_figures.py [--run RUN_DIR] [--docs DOCS_DIR]   (default: docs)

Without --run it first trains the README's run into a temporary folder (10,000 full-batch steps: about 20
minutes on one quiet core, a minute on a GPU with --device cuda added to TRAIN):

    python -m desktop_app train --task modadd --p 59 --train-fraction 0.4 --family gpt2 --layers 1 --heads 4 \
        --d-model 128 --d-ff 512 --context 4 --lr 1e-3 --weight-decay 1.0 --schedule constant --warmup 10 \
        --batch-size 1392 --steps 10000 --eval-every 100 --log-every 100 --checkpoint-every 500 \
        --keep-every 500 --keep-spacing log --precision float32 --seed 0 --out RUN_DIR

The Train panel draws a run while it trains, from the events the training process prints; here it is given the
same events as the run recorded them (RUN_DIR/metrics.json), so the figure is the panel's own drawing and export
of that run. Writes DOCS/figures/modadd_train.png / .csv (the Train panel) and DOCS/figures/modadd_across.png
/ .csv (the Across-training window, weight norms chosen). Prints the window's status line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, given_or_trained, open_model, shown_window, wait_until  # noqa: E402

TRAIN = ("train --task modadd --p 59 --train-fraction 0.4 --family gpt2 --layers 1 --heads 4 --d-model 128 "
         "--d-ff 512 --context 4 --lr 1e-3 --weight-decay 1.0 --schedule constant --warmup 10 --batch-size 1392 "
         "--steps 10000 --eval-every 100 --log-every 100 --checkpoint-every 500 --keep-every 500 --keep-spacing log "
         "--precision float32 --seed 0").split()


def _wait(app, done, seconds: float = 600.0, what: str = "the work") -> None:
    wait_until(app, done, seconds, what, "make_grokking_figures")


def live_event(ev: dict) -> dict:
    """A metrics.json entry as the training process printed it: its per-block gradient norms
    (grad_norm.NAME, flattened in the file) back in one grad_norms entry."""
    out = {k: v for k, v in ev.items() if not k.startswith("grad_norm.")}
    norms = {k[len("grad_norm."):]: v for k, v in ev.items() if k.startswith("grad_norm.")}
    if norms:
        out["grad_norms"] = norms
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="a modadd run with kept steps (default: train one)")
    p.add_argument("--docs", default="docs", help="the docs folder (default docs)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    with given_or_trained(args.run, TRAIN, "modadd") as run:
        if run is None:
            return 1
        figures = Path(args.docs) / "figures"
        figures.mkdir(parents=True, exist_ok=True)

        from PySide6.QtCore import Qt
        from PySide6.QtTest import QTest

        from desktop_app.ui.widgets.export import export_view

        app = application()
        with shown_window(1280, 800) as (state, window):
            panel = window.panel("Train")
            window.show_panel("Train")
            history = json.loads((Path(run) / "metrics.json").read_text(encoding="utf-8"))
            for ev in history:
                if ev.get("event") in ("step", "eval"):
                    panel._on_event(live_event(ev))
            _wait(app, lambda: True)
            panel.plots_widget.resize(1100, 520)
            for suffix in (".png", ".csv"):
                export_view(panel, figures / ("modadd_train" + suffix))

            open_model(app, window, run, "make_grokking_figures")
            bar = window.timeline_bar
            _wait(app, lambda: state.loaded is not None and bar.isVisible(), what="the run")
            QTest.mouseClick(bar.across_button, Qt.MouseButton.LeftButton)
            across = bar.across
            across.resize(1000, 900)
            _wait(app, lambda: across.results is not None and across.chosen_layer_metric in across.layer_results,
                  what="the Across-training window")
            for suffix in (".png", ".csv"):
                export_view(across, figures / ("modadd_across" + suffix))
            print(across.status.text())
            across.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's routing figure (the Experts row's screenshot), made by the app itself offscreen: a small
Mixtral trained on the demo text without the load-balancing loss, the Layers panel's Routing view of block 1
(each token's router probabilities) on the demo text's first 62 characters, the window at 1100 x 760.

    .venv/bin/python packaging/make_routing_figure.py [--run MODEL_DIR] [OUT.png]
        (default: docs/screenshots/routing.png)

Without --run it first trains the README's model (a few seconds) into a temporary folder:

    python -m desktop_app train --task text --family mixtral --layers 2 --d-model 32 --steps 122 \\
        --router-aux-loss-coef 0 --seed 0 --text-file resources/demo-text.txt --out MODEL_DIR

Prints the Routing heatmap's title and each expert's mean router probability.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, click_tab, exit_status, given_or_trained, save_grab, shown_window  # noqa: E402
from figure_kit import open_model, wait_until  # noqa: E402

TEXT = "Alice was beginning to get very tired of sitting by her sister"
DEPTH = 2  # after block 1: block 1's router


def _wait(app, done, seconds: float = 300.0, what: str = "the work") -> None:
    wait_until(app, done, seconds, what, "make_routing_figure")


def main(argv: list[str] | None = None) -> int:
    from desktop_app.paths import demo_text_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="a mixture-of-experts model folder (default: train the README's one)")
    p.add_argument("out", nargs="?", default=str(Path(__file__).resolve().parents[1] / "docs" / "screenshots"
                                                 / "routing.png"))
    args = p.parse_args(argv)
    train = ("train --task text --family mixtral --layers 2 --d-model 32 --steps 122 --router-aux-loss-coef 0 "
             "--seed 0").split() + ["--text-file", str(demo_text_path())]
    with given_or_trained(args.run, train, "moe_demo") as run:
        if run is None:
            return 1
        return exit_status(lambda: show(run, Path(args.out)))


def show(run: str, out: Path) -> None:
    """The window on `run`'s Routing view of block 1, grabbed to `out`; prints what it shows."""
    app = application()
    with shown_window(1100, 760) as (state, window):
        state.text = TEXT
        open_model(app, window, run, "make_routing_figure")
        _wait(app, lambda: state.loaded is not None and state.trace is not None and len(state.token_ids) == len(TEXT),
              what="the model and its trace")
        window.show_panel("Layers")
        panel = window.panel("Layers")
        _wait(app, lambda: panel.data is not None, what="the Layers panel")
        click_tab(panel.tabs, "Routing")
        panel.set_depth(DEPTH)
        heatmap = panel.widgets["routing"]
        _wait(app, lambda: heatmap.values is not None and "block L1" in heatmap.plot.titleLabel.text,
              what="the Routing view")
        window.statusBar().clearMessage()  # the opening's message names the temporary folder
        save_grab(window, out, "make_routing_figure")
        print(heatmap.plot.titleLabel.text)
        print("mean router probability per expert:", " ".join(f"E{e} {p:.3f}" for e, p in
                                                            enumerate(heatmap.values.mean(axis=0))))


if __name__ == "__main__":
    sys.exit(main())

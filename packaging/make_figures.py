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
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, exit_status, wait_until  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"  # the README's


def make(out: Path) -> None:
    """lipschitz_demo.png and lipschitz_demo.csv in `out`; prints each run's exponent."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.offscreen import dispose
    from desktop_app.ui.panels.lipschitz import LipschitzPanel
    from desktop_app.ui.state import AppState

    app = application()
    state = AppState()
    state.loaded = load_model_folder(demo_model_dir())
    panel = LipschitzPanel(state)  # not shown: the plot is exported at its own size
    state.model_changed.emit(state.loaded)
    try:
        panel.resize(1400, 900)
        panel.plot.resize(1100, 700)
        panel.screenshot_demo()
        wait_until(app, panel.screenshot_ready, 600, "the sweeps", "make_figures")
        panel.plot.setTitle("Demo model, layer 0: local Lipschitz constant vs sequence length", color="#555")
        out.mkdir(parents=True, exist_ok=True)
        panel.export(out / "lipschitz_demo.png")
        panel.export(out / "lipschitz_demo.csv")
        for run in panel.runs:
            r = run.result
            print(f"{run.label}: exponent {r.exponent:.3f} [{r.exponent_ci[0]:.3f}, {r.exponent_ci[1]:.3f}]")
        print(f"wrote {out / 'lipschitz_demo.png'} and {out / 'lipschitz_demo.csv'}")
    finally:
        dispose(panel)


def main(argv: list[str]) -> int:
    return exit_status(lambda: make(Path(argv[0]) if argv else FIGURES))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The README's two Dynamics screenshots, made by the app's own window (offscreen) on the demo model by setting
the panel's form and clicking Reset, then Step.

    .venv/bin/python packaging/make_dynamics_figures.py [OUTDIR]     (default: docs/screenshots)

dynamics_sphere.png: 400 particles uniform on the sphere, Q = K = V = I, d = 3, 71 steps of dt 0.1 (t = 7.1);
dynamics_model.png: the app's starting text's tokens at layer 0 driven by the demo model's layer 0 head 0, 10 steps a
frame, curves every 2 steps, 220 steps (t = 22). Each is the panel alone (the window's grab of it).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import SCREENSHOTS, application, click_tab, exit_status, save_grab, shown_window  # noqa: E402
from figure_kit import open_model, wait_until  # noqa: E402
from figure_kit import click as _click  # noqa: E402


def _wait(app, done, what: str) -> None:
    wait_until(app, done, 600.0, what, "make_dynamics_figures")


def _choose(combo, key: str) -> None:
    combo.setCurrentIndex(combo.findData(key))  # what choosing the item in its list does


def _set(spin, value) -> None:
    spin.setValue(value)  # what typing the value does


def _run(app, panel, steps: int) -> None:
    """Reset, then Step until `steps` frames past the start are drawn."""
    _click(panel.reset_button)
    _wait(app, lambda: panel.sim is not None and not panel.is_running(), "the particles")
    for k in range(steps):
        _click(panel.step_button)
        _wait(app, lambda: len(panel._frames) == k + 2 and not panel.is_running(), f"step {k + 1}")
    app.processEvents()


def _save(widget, path: Path) -> None:
    save_grab(widget, path, "make_dynamics_figures", widget.status.text())


def make(app, out: Path, sphere_steps: int = 71, model_steps: int = 22) -> None:
    """dynamics_sphere.png after `sphere_steps` Steps and dynamics_model.png after `model_steps` (the README's:
    71 and 22) into `out`."""
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.app import demo_text

    out.mkdir(parents=True, exist_ok=True)
    with shown_window(1280, 800) as (state, window):
        state.set_text(demo_text())  # the app's text at its start (55 tokens)
        open_model(app, window, demo_model_dir(), "make_dynamics_figures")
        click_tab(window.tabs, "Dynamics")
        panel = window.slot("Dynamics").panel
        _wait(app, lambda: panel.screenshot_ready() if hasattr(panel, "screenshot_ready") else True,
              "the Dynamics panel")
        _choose(panel.init, "sphere")
        _choose(panel.qkv, "identity")
        _set(panel.steps_per_frame, 1)
        _run(app, panel, sphere_steps)
        _save(panel, out / "dynamics_sphere.png")

        window.resize(1400, 900)
        _choose(panel.init, "tokens")
        _choose(panel.qkv, "model")
        _set(panel.model_layer, 0)
        _set(panel.model_head, 0)
        _set(panel.token_layer, 0)
        _set(panel.steps_per_frame, 10)
        _set(panel.record_every, 2)
        _run(app, panel, model_steps)
        _save(panel, out / "dynamics_model.png")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="make_dynamics_figures")
    ap.add_argument("outdir", nargs="?", default=str(SCREENSHOTS))
    args = ap.parse_args(argv)
    app = application()
    return exit_status(lambda: make(app, Path(args.outdir)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

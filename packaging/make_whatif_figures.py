"""The README's What if figures, made by the app's own panels (offscreen) by typing into their boxes
and clicking their buttons.

    .venv/bin/python packaging/make_whatif_figures.py [--motif MOTIF_DIR] [OUTDIR]   (default: docs/screenshots)

On the demo model, the whole window at 1280 x 800: whatif_attribution.png (the top next token of the
demo text, attributed), whatif_patching.png ("Alice and the rabbit" against "Alice and the hole"),
whatif_generate.png (Generate with layer 1's head 2 zero-ablated) and whatif_steer.png (Generate
steered at layer 2 towards "the Queen shouted", away from "Alice thought", x6).

With --motif, also whatif_motif.png: the What if panel alone on a motif model trained as in the README:

    .venv/bin/python -m desktop_app train --task motif --family gpt2 --layers 2 --heads 1 --d-model 32 \\
        --d-ff 64 --context 20 --lr 1e-3 --steps 3000 --warmup 50 --batch-size 64 --seed 0 --out runs/motif2

The clean text's last A (position 15) is followed by B, and the text ends in C, so the answer must be
read from position 16; the corrupted text has a D there (answer B, wrong D). Prints each panel's status
line.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import SCREENSHOTS, application, click_tab, exit_status, save_grab, shown_panel  # noqa: E402
from figure_kit import click as _click  # noqa: E402
from figure_kit import open_model, shown_window, wait_until  # noqa: E402

MOTIF_CLEAN = "C D D C B B B D A A B D A C A A B D B C"
MOTIF_CORRUPTED = "C D D C B B B D A A B D A C A A D D B C"
DEMO_TEXT = "Alice was beginning to get very tired of sitting by her sister on the bank"


def _wait(app, done, seconds: float = 300.0, what: str = "the work") -> None:
    wait_until(app, done, seconds, what, "make_whatif_figures")


def _type(edit, text: str) -> None:
    from PySide6.QtTest import QTest

    edit.clear()
    QTest.keyClicks(edit, text)


def _save(widget, path: Path) -> None:
    save_grab(widget, path, "make_whatif_figures")


def demo_figures(app, out: Path) -> None:
    import torch

    from desktop_app.core.interventions import Intervention
    from desktop_app.paths import demo_model_dir

    with shown_window(1280, 800) as (state, window):
        state.text = DEMO_TEXT
        open_model(app, window, demo_model_dir(), "make_whatif_figures")
        traced = lambda: state.loaded is not None and (state._trace_job is None or state._trace_job.done)  # noqa: E731

        def tab(title: str):
            click_tab(window.tabs, title)
            return window.slot(title).panel

        whatif = tab("What if")
        whatif.tabs.setCurrentIndex(0)
        _click(whatif.attribute_button)  # the last position, the model's top next token
        _wait(app, lambda: whatif.attribute_button.isEnabled()
              and whatif.dla_status.text().startswith(("logit", "Cannot")), what="the attribution")
        print(whatif.dla_status.text())
        _save(window, out / "whatif_attribution.png")

        whatif.tabs.setCurrentIndex(1)
        tok, model = state.loaded.tokenizer, state.loaded.model
        clean, corrupted = "Alice and the rabbit", "Alice and the hole"
        with torch.no_grad():  # the answers: each text's top next token
            top = [int(model(torch.tensor([tok.encode(t)])).logits[0, -1].argmax()) for t in (clean, corrupted)]
        answer, wrong = tok.token_strings(top)  # as a person types them (ids would do too: #386)
        for edit, text in ((whatif.clean_edit, clean), (whatif.corrupted_edit, corrupted),
                           (whatif.answer_edit, answer), (whatif.wrong_edit, wrong)):
            _type(edit, text)
        whatif.patching = None
        _click(whatif.run_button)
        _wait(app, lambda: whatif.patching is not None and whatif.run_button.isEnabled(), what="the patching")
        print(whatif.patch_status.text())
        _save(window, out / "whatif_patching.png")

        generate = tab("Generate")

        def generate_steps(prompt: str, steps: int) -> None:
            _type(generate.prompt, prompt)
            for _ in range(steps):
                _click(generate.step_button)
                _wait(app, lambda: generate.session is not None and not generate.busy, what="a step")
            _wait(app, lambda: "log p" in generate.plain_label.text() and generate.screenshot_ready(),
                  what="the comparison")
            print(generate.plain_label.text())

        state.set_interventions([Intervention("blocks.1.attn.head.2")])
        _wait(app, traced, what="tracing the ablated model")
        generate_steps("Alice was beginning", 3)
        _save(window, out / "whatif_generate.png")

        state.set_interventions([])
        _wait(app, traced, what="tracing the model as trained")
        whatif = tab("What if")
        whatif.tabs.setCurrentIndex(2)
        _type(whatif.towards_edit, "the Queen shouted")
        _type(whatif.away_edit, "Alice thought")
        whatif.steer_layer_spin.setValue(2)
        whatif.set_scale(6.0)
        _click(whatif.apply_steer_button)
        _wait(app, lambda: bool(state.interventions), what="the steering vector")
        print(whatif.steer_status.text())
        generate = tab("Generate")
        generate.session = None
        generate_steps("Alice said", 4)
        _save(window, out / "whatif_steer.png")


def motif_figure(app, folder: str, out: Path) -> None:
    from desktop_app.ui.panels.whatif import WhatIfPanel

    with shown_panel(WhatIfPanel, folder, 1300, 560) as panel:
        panel.tabs.setCurrentIndex(1)
        for edit, text in ((panel.clean_edit, MOTIF_CLEAN), (panel.corrupted_edit, MOTIF_CORRUPTED),
                           (panel.answer_edit, "B"), (panel.wrong_edit, "D")):
            _type(edit, text)
        _click(panel.run_button)
        _wait(app, lambda: panel.patching is not None and panel.run_button.isEnabled(), what="the patching")
        print(panel.patch_status.text())
        _save(panel, out / "whatif_motif.png")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="make_whatif_figures")
    ap.add_argument("outdir", nargs="?", default=str(SCREENSHOTS))
    ap.add_argument("--motif", help="a motif model folder: also make whatif_motif.png")
    args = ap.parse_args(argv)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    app = application()

    def make() -> None:
        demo_figures(app, out)
        if args.motif:
            motif_figure(app, args.motif, out)

    return exit_status(make)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The README's figures of an encoder-decoder in the Model and Attention panels (issue 28), grabbed offscreen
from the main window: the source "the black dog sees a white cow" and the target "le chien blanc voit une vache
blanche [END]" (one adjective wrong) in the Model panel (the target's chips coloured by the probability the
model gave each target token), then, with the right target, "le chien noir voit une vache blanche [END]", the
Attention panel's heatmap of the last layer's head H (--head, default 0) in each of its three kinds:
cross-attention (the target tokens' rows over the source tokens' columns), the encoder's self-attention (source
over source) and the decoder's causal self-attention (target over target, the masked upper triangle grey).

    .venv/bin/python packaging/make_seq2seq_figures.py MODEL_DIR [OUTDIR] [--head H] [--generate GEN_MODEL_DIR]
        (default OUTDIR: docs/screenshots)

MODEL_DIR: a model trained on the translation task, e.g. (about two minutes on an idle CPU thread)
    .venv/bin/python -m desktop_app train --task translate --family marian --layers 2 --heads 4 --d-model 64 \\
        --d-ff 128 --lr 3e-3 --steps 600 --warmup 50 --batch-size 64 --seed 0 --out runs/translate
Writes OUTDIR/seq2seq_model.png, OUTDIR/seq2seq_attention.png (cross-attention),
OUTDIR/seq2seq_attention_encoder.png and OUTDIR/seq2seq_attention_decoder.png (the README's four figures).
The head shown is the one whose cross-attention reads the source word being written: which head learns that
depends on the run (head 0 in an older one, head 1 in the README's: --head 1).

With --generate, also OUTDIR/generate_seq2seq.png: the Generate panel alone (1300 x 760) on GEN_MODEL_DIR, the
model of the README's Generate paragraph (train ... --steps 1500 --batch-size 32, otherwise as above), the source
"the black dog runs" stepped to its end, the third generated token clicked in the strip.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, exit_status, open_model, save_grab, shown_panel, shown_window  # noqa: E402
from figure_kit import wait_until  # noqa: E402

SOURCE = "the black dog sees a white cow"
TARGET = "le chien noir voit une vache blanche [END]"
WRONG = "le chien blanc voit une vache blanche [END]"  # the Model panel's: one adjective wrong, its chip pale
GENERATE_SOURCE = "the black dog runs"
GENERATE_SHOWN = 3  # the strip's token on show: [start] le chien noir ...


def generate_figure(app, model: str, out: Path) -> None:
    """The Generate panel alone on `model`: GENERATE_SOURCE stepped until the target ends (or 12 steps), then
    the strip's token GENERATE_SHOWN chosen as a click on it does."""
    from desktop_app.ui.panels.generation import GenerationPanel

    with shown_panel(GenerationPanel, model, 1300, 760) as panel:
        panel.prompt.setText(GENERATE_SOURCE)

        def wait(condition) -> None:
            wait_until(app, condition, 120, "a Generate step", "make_seq2seq_figures")

        for _ in range(12):
            panel.step()
            wait(lambda: panel.session is not None and panel.screenshot_ready())
            if panel.session.finished:
                break
        panel._strip_selected(GENERATE_SHOWN)
        wait(panel.screenshot_ready)
        save_grab(panel, out / "generate_seq2seq.png", "make_seq2seq_figures")
        print(panel.status.text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = [a for a in argv if a != "--all"]  # (--all: what an older version wrote only when asked)
    options = {}
    for flag in ("--generate", "--head"):
        if flag in args:
            at = args.index(flag)
            if at + 1 >= len(args):
                print(f"make_seq2seq_figures: {flag} needs a value", file=sys.stderr)
                return 2
            options[flag] = args[at + 1]
            del args[at:at + 2]
    generate = options.get("--generate")
    try:
        head = int(options.get("--head", "0"))
    except ValueError:
        print(f"make_seq2seq_figures: --head {options['--head']!r} is not a head number", file=sys.stderr)
        return 2
    if not args:
        print(__doc__)
        return 2
    model, out = args[0], Path(args[1] if len(args) > 1 else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = application()

    def make() -> None:
        with shown_window(1400, 640) as (state, window):
            encoder_decoder_figures(app, state, window, model, out, head)
        if generate is not None:
            generate_figure(app, generate, out)

    return exit_status(make)


def encoder_decoder_figures(app, state, window, model: str, out: Path, head: int) -> None:
    """The Model panel on the wrong target, the Attention panel's three kinds of heatmap on the right one."""
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
    open_model(app, window, model, "make_seq2seq_figures")
    wait(lambda: state._trace_job is None)
    if state.text != SOURCE:
        state.set_text(SOURCE)
    state.set_target(WRONG)
    wait(lambda: state._trace_job is None and len(state.decoder_ids) > 1)
    model_panel = panel("Model")
    settle()
    save_grab(model_panel, out / "seq2seq_model.png", "make_seq2seq_figures")
    print(model_panel.target_count.text(), [round(p, 4) for p in model_panel.target_probabilities[1:]])
    state.set_target(TARGET)
    wait(lambda: state._trace_job is None and state.token_strings(state.decoder_ids)[3] == "noir")
    attention = panel("Attention")
    for kind in ("cross", "encoder", "decoder"):
        attention.kind_combo.setCurrentIndex(attention.kind_combo.findData(kind))
        wait(lambda: attention.screenshot_ready() and attention.data is not None and attention.data.aggregated)
        attention.open_head(attention.data.n_layers - 1, head)  # the heatmap of the last layer's head
        settle()
        name = "seq2seq_attention.png" if kind == "cross" else f"seq2seq_attention_{kind}.png"
        save_grab(attention, out / name, "make_seq2seq_figures")


if __name__ == "__main__":
    sys.exit(main())

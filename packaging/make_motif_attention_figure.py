"""The README's figure of a motif model's attention (docs/screenshots/training-motif-attention.png), made by the
app's own window (offscreen): the Attention panel's heatmap of layer 1's head on a motif sequence.

    .venv/bin/python packaging/make_motif_attention_figure.py [--run MODEL_DIR] [OUT.png]
        (default: docs/screenshots/training-motif-attention.png)

Without --run it first trains the README's motif transformer into a temporary folder, with the settings of
`pytest -m slow -k motif_reaches` (the lectures' shape: 3 encoder blocks, 1 head, width 32, pre-LN, learned
positions, 40,165 parameters; learning rate 1e-3, 8,000 steps of 64 fresh sequences, seed 0: about 1.5 minutes
on one core), and prints its held-out accuracy.

The window at 1300 x 892 on TEXT, the panel (1300 x 820) grabbed on its Heatmap tab, layer 1, head 0. Prints
the position the last query reads most and its share of that head's attention: the letter right after the last
A is the answer, and layer 1 reads it there.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import SCREENSHOTS, application, exit_status, open_model, save_grab, shown_window  # noqa: E402
from figure_kit import wait_until  # noqa: E402

TEXT = "B C A D B B A C D C A B D D C B D C B C"  # the earlier figure's: its last A at 10, the answer B at 11
LAYER, HEAD = 1, 0
STEPS = 8000


def train_readme_model(folder: Path, steps: int = STEPS) -> dict:
    """The README's motif transformer (tests/core/training/test_training_loop.py's motif_reaches) trained for
    `steps` steps into `folder`; the run's summary."""
    from desktop_app.core.training import TrainConfig, train

    cfg = TrainConfig(task="motif", task_options={"val_size": 2000}, family="bert",
                      model={"n_layers": 3, "n_heads": 1, "d_model": 32, "d_ff": 128, "type_vocab_size": 0,
                             "norm_placement": "pre"},
                      lr=1e-3, steps=steps, warmup_steps=min(100, steps), batch_size=64,
                      eval_every=min(1000, steps), checkpoint_every=steps, seed=0)
    return train(cfg, folder)


def answer_position(text: str = TEXT) -> int:
    """Where the answer is: the position right after the last A."""
    letters = text.split()
    return len(letters) - letters[::-1].index("A")


def make(app, run: str, out: Path) -> dict:
    """The panel on `run` grabbed to `out`; what it shows: {"read" (the position the last query reads most),
    "share" (its attention there), "answer" (the position after the last A), "tokens"}."""
    with shown_window(1300, 892) as (state, window):
        state.text = TEXT
        open_model(app, window, run, "make_motif_attention_figure")
        window.show_panel("Attention")
        attention = window.panel("Attention")
        wait_until(app, lambda: attention.screenshot_ready() and attention.data is not None, 120,
                   "the Attention panel", "make_motif_attention_figure")
        attention.open_head(LAYER, HEAD)  # the heatmap of layer 1's head
        wait_until(app, attention.screenshot_ready, 120, "the heatmap", "make_motif_attention_figure")
        last = attention.data.patterns[LAYER][HEAD][-1]  # the last query's row
        shown = {"read": int(last.argmax()), "share": float(last.max()), "answer": answer_position(),
                 "tokens": state.token_strings(list(state.token_ids))}
        save_grab(attention, out, "make_motif_attention_figure")
        print(f"layer {LAYER} head {HEAD}: the last query reads position {shown['read']} "
              f"({shown['share']:.0%} of its attention); the answer is at {shown['answer']}, after the last A")
        return shown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="a motif model folder (default: train the README's one)")
    p.add_argument("out", nargs="?", default=str(SCREENSHOTS / "training-motif-attention.png"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            run = str(Path(tmp) / "motif")
            summary = train_readme_model(Path(run))
            print(f"trained {STEPS} steps: held-out accuracy {summary['val_accuracy']:.4f}")
        app = application()
        return exit_status(lambda: make(app, run, Path(args.out)))


if __name__ == "__main__":
    sys.exit(main())

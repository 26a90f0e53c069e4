"""One module per CLI subcommand (see desktop_app/cli.py)."""
from __future__ import annotations

from ..app.images import set_image_codec
from ..image_codec import decode_image

set_image_codec(decode_image)  # image files other than .npy are decoded by Qt's QImage (app/ never imports Qt)


def input_ids(loaded, text: str | None, ids: str | None) -> list[int]:
    """Token ids from --text (needs the model's tokenizer) or --ids (spaces and/or commas), checked
    against the model's vocabulary; longer than the context is refused (not silently cut)."""
    from ..core.inputs import check_ids, encode, parse_token_ids

    cfg = loaded.config
    if ids is not None:
        out = check_ids(parse_token_ids(ids, "--ids"), cfg.vocab_size, cfg.context_length, cut=False).ids
    elif text is not None:
        if loaded.tokenizer is None:
            raise ValueError(f"{loaded.path}: {loaded.tokenizer_missing}; pass --ids instead of --text")
        out = encode(loaded, text, cut=False).ids
    else:
        raise ValueError("give --text or --ids")
    if not out:
        raise ValueError("the input is empty")
    return out


class Progress:
    """A core function's job (JobControl's check / progress) on the command line: nothing cancels it but Ctrl-C,
    and after the first few seconds it prints a line on stderr every few seconds ("window 120/4000, 3.1 windows/s,
    about 21.0 min left"), so a long run is not silent. `counts_checks`: a function that only calls check()
    once per `unit` (the dynamics' steps) is counted by its checks."""

    EVERY_S = 5.0

    def __init__(self, unit: str, total: int = 0, counts_checks: bool = False) -> None:
        from ..core.jobs import TimeLeft

        self.unit, self.total, self.done, self.counts_checks = unit, total, 0, counts_checks
        self.time_left = TimeLeft()
        self.last = self.time_left.start

    def check(self) -> None:
        if self.counts_checks:
            self.done += 1
            self._say()

    def progress(self, done: int, total: int, message: str = "") -> None:
        self.done, self.total = done, total
        self._say()

    def _say(self) -> None:
        import sys

        now = self.time_left.clock()
        if now - self.last < self.EVERY_S or not 0 < self.done < self.total:
            return
        print(f"{self.unit} {self.done}/{self.total}, {self.time_left.rate(self.done):.3g} {self.unit}s/s, "
              f"{self.time_left.phrase(self.done, self.total)}", file=sys.stderr, flush=True)
        self.last = now


MODEL_HELP = ("model folder, a .gguf file (llama.cpp, Ollama, LM Studio), or org/name[@revision] from the local "
              "Hugging Face cache (nothing is downloaded)")


def add_model_and_text_arguments(p):
    """The model folder and one of --text / --ids (input_ids reads them) that the commands running a
    text take; returns the --text / --ids group, for a command taking another kind of input too."""
    p.add_argument("model_dir", help=MODEL_HELP)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--ids", help="comma-separated token ids")
    add_special_tokens_argument(p)
    add_dtype_argument(p)
    return g


def add_dtype_argument(p):
    """--dtype, for every command that loads a model: load_model(dtype=...) reads it."""
    from ..core.devices import DTYPE_CHOICES

    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the dtype to compute in (default auto: the checkpoint's own dtype, except a half-precision "
                        "one on a CPU without matrix instructions for it (bfloat16: AVX-512 BF16 or AMX), which "
                        "computes in float32 when that fits in memory)")


def add_special_tokens_argument(p):
    """--no-special-tokens, for every command that encodes a text: load_model(special_tokens=...) reads it."""
    p.add_argument("--no-special-tokens", dest="special_tokens", action="store_false",
                   help="encode text without the tokenizer's special tokens ([CLS] ... [SEP], <s> ... </s>, "
                        "BOS), which are added by default as transformers adds them")


STEP_HELP = ("with a training run's folder as the model: open the model as it was at step N (a step the run kept, "
             "train --keep-every K, or its latest checkpoint's step); a kept step's folder "
             "(RUN/checkpoints/step-000200) also opens directly")


def add_step_arguments(sub) -> None:
    """`--step N` on every subcommand that takes a model (a "model_dir" positional), once for all of them
    (cli.build_parser calls it): before the command runs, RUN_DIR --step N becomes the folder of that step
    (resolve_step)."""
    from .args import count

    for parser in sub.choices.values():
        if not any(a.dest == "model_dir" and not a.option_strings for a in parser._actions):
            continue
        parser.add_argument("--step", type=count, metavar="N", help=STEP_HELP)
        run = parser.get_default("func")
        if run is not None:
            parser.set_defaults(func=_at_step(run))


def _at_step(run):
    def run_at_step(args):
        resolve_step(args)
        return run(args)
    run_at_step.__wrapped__ = run
    return run_at_step


def resolve_step(args) -> None:
    """args.model_dir becomes the model folder of step args.step of that run (core.training.timeline.step_folder:
    a kept step, or the run's own checkpoint); a step not kept or deleted raises KeptStepError (one line)."""
    step = getattr(args, "step", None)
    if step is None:
        return
    if not getattr(args, "model_dir", None):
        raise ValueError("--step N needs a training run's folder as the model")
    from ..core.hf_cache import resolve_model_ref
    from ..core.training.timeline import step_folder

    args.model_dir = str(step_folder(resolve_model_ref(args.model_dir), step))


def load_model(model_ref: str, special_tokens: bool = True, dtype: str | None = "auto", **kwargs):
    """Every command's model argument: a folder, a GGUF file, or a repository id resolved in the local
    Hugging Face cache only (NotInCacheError, one line, when it is not there); then
    formats.load_model_file(**kwargs).
    `special_tokens`: whether text encoded for it gets the tokenizer's special tokens (--no-special-tokens);
    `dtype`: --dtype ("auto": what suits the device, core.devices.choose_compute_dtype)."""
    from ..core.formats import load_model_file
    from ..core.hf_cache import resolve_model_ref

    loaded = load_model_file(resolve_model_ref(model_ref), dtype=dtype, **kwargs)
    if loaded.tokenizer is not None:
        loaded.tokenizer.special_tokens = special_tokens
    return loaded

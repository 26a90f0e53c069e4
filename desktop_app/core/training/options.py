"""Every training option, declared once: its place in TrainConfig, kind, default, range, choices and help.

The one table that the run config (TrainConfig checks itself against it: a `train --config FILE`, a
workspace and the Train panel meet the same limits), the CLI (app/training.py derives `train`'s flags,
their argparse types and help from it), the Train panel (its boxes' ranges, defaults and tooltips) and
the workspace (what it keeps of the form) all read. A task says which task options it reads in its
declaration (core.training.tasks.declare_task); a new task option is one row here.

`part` says where an option lives in TrainConfig: "run" (a field), "model" (a key of .model, a
ModelConfig override over the family preset) or "task" (a key of .task_options). `default` None means
no default of its own: the family preset's (model), the task's own (task), or not given. `form` is the
Train panel's box when it offers a narrower range than the option allows: (lo, hi, step) for integers,
(lo, hi, step, decimals) for numbers; a form value of `form_none` means "not given" (its special text).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ACTIVATIONS, ATTENTION_KINDS, INITS, MAX_CONTEXT, NORMS, PLACEMENTS, POSITIONS
from ..numbers import MAX_COUNT, MAX_SEED, Range
from .optim import OPTIMIZERS
from .schedules import SCHEDULES

PRECISIONS = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Option:
    key: str  # its name in TrainConfig: a field (part "run") or a key of .model / .task_options
    part: str  # "run" | "model" | "task"
    kind: type  # int, float or str
    default: Any = None
    limit: Range | None = None
    choices: tuple = ()
    flag: str = ""  # the CLI flag's name without "--" and with "_" (default: the key)
    help: str = ""
    form: tuple = ()  # the Train panel's box range when narrower: (lo, hi, step[, decimals])
    form_none: Any = None  # the form value meaning "not given" (0: "fresh samples", "the images' own")
    form_default: Any = None  # the form's value when the option has no default of its own

    @property
    def dest(self) -> str:
        return self.flag or self.key

    @property
    def initial(self) -> Any:
        """The form's first value: the option's default, else the form's own."""
        return self.default if self.default is not None else self.form_default

    def problem(self, value) -> str:
        """'' when `value` is allowed, else what is wrong ('must be ..., got ...')."""
        if self.choices:
            return "" if value in self.choices else \
                f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if self.limit is not None:
            return self.limit.problem(value)
        if self.kind is str and not isinstance(value, str):
            return f"must be a string, got {value!r}"
        return ""


def _int(lo, hi=MAX_COUNT) -> Range:
    return Range(int, lo, hi)


OPTIONS: tuple[Option, ...] = (
    # -- task ----------------------------------------------------------------------------------
    Option("text_file", "task", str, help="UTF-8 text for --task text"),
    Option("image_folder", "task", str, help="for --task image-folder: a folder with one sub-folder of images per "
                                             "class (class names = sub-folder names, sorted)"),
    Option("image_size", "task", int, None, _int(1, 4096), form=(0, 1024, 1), form_none=0, form_default=0,
           help="image-folder: resize every image to this size (default: the images' own size, which must then be "
                "one square size)"),
    Option("channels", "task", int, 3, choices=(3, 1), help="image-folder: 1 (grey) or 3 (RGB, default)"),
    Option("tokenizer", "task", str, "char", choices=("char", "bpe"), help="text task tokenizer"),
    Option("vocab_size", "task", int, 512, _int(1, 10**6), form=(260, 65536, 64), help="BPE vocabulary size (text task)"),
    Option("length", "task", int, None, _int(1, 10**5), form=(2, 512, 1), form_default=20,
           help="sequence length (motif, copy, reverse, sort, induction)"),
    Option("symbols", "task", int, None, _int(2, 10**6), form=(2, 1000, 1), form_default=10, help="alphabet size (copy, reverse, sort, "
                                                                               "induction)"),
    Option("min_length", "task", int, None, _int(1, 10**5), form=(0, 512, 1), form_none=0, form_default=0,
           help="induction: each sequence repeats a half of its own length, drawn from min_length to --length, "
                "after random tokens, so only an induction head predicts it (default: always --length)"),
    Option("p", "task", int, 97, _int(2, 10**4), form=(2, 1000, 1), help="modulus (modadd)"),
    Option("train_fraction", "task", float, 0.5, Range(float, 0, 1, lo_open=True, hi_open=True),
           form=(0.05, 0.95, 0.05, 2), help="share of the p^2 pairs used for training (modadd)"),
    Option("n_train", "task", int, None, _int(1, 10**7), flag="train_size", form=(0, 1_000_000, 500), form_none=0,
           form_default=0,
           help="a fixed training set of this many samples (motif; the lectures use 1500) instead of fresh samples"),
    # -- model ---------------------------------------------------------------------------------
    Option("n_layers", "model", int, 2, _int(1, 1000), flag="layers", form=(1, 48, 1), help="transformer blocks"),
    Option("n_decoder_layers", "model", int, None, _int(1, 1000), flag="decoder_layers", form=(1, 48, 1),
           form_default=2, help="an encoder-decoder's decoder blocks (--layers are its encoder's; default: as many)"),
    Option("n_heads", "model", int, 4, _int(1, 1024), flag="heads", form=(1, 32, 1), help="attention heads per block"),
    Option("d_model", "model", int, 64, _int(1, 65536), form=(8, 2048, 8), help="residual stream width"),
    Option("d_ff", "model", int, None, _int(1, 10**6), form=(8, 8192, 32), form_default=256, help="MLP width (default 4 x d_model)"),
    Option("context_length", "model", int, 128, _int(1, MAX_CONTEXT), flag="context", form=(4, 4096, 16),
           help="context length (text task window)"),
    Option("patch_size", "model", int, None, _int(1, 4096), form=(1, 8, 1), form_default=2,
           help="ViT patch size in pixels (vit; digits default 2: 16 patches)"),
    Option("norm", "model", str, None, choices=NORMS, help="normalisation (default: the family's)"),
    Option("norm_placement", "model", str, None, choices=PLACEMENTS, help="pre-norm, post-norm or output norms (OLMo 2) (default: the family's)"),
    Option("activation", "model", str, None, choices=ACTIVATIONS, help="MLP activation (default: the family's; marian: relu, the original Transformer's)"),
    Option("positions", "model", str, None, choices=POSITIONS, help="position encoding (default: the family's)"),
    Option("attention_kind", "model", str, None, choices=ATTENTION_KINDS, flag="attention",
           help="attention map (default softmax)"),
    Option("init", "model", str, None, choices=INITS, help="weight initialisation"),
    # a mixture of experts' (the mixtral, qwen2_moe, qwen3_moe, olmoe families; default: the family's)
    Option("num_experts", "model", int, None, _int(1, 1024), flag="experts", form=(1, 256, 1), form_default=8,
           help="experts per mixture-of-experts layer (default: the family's, 8)"),
    Option("experts_per_token", "model", int, None, _int(1, 1024), flag="top_k", form=(1, 64, 1), form_default=2,
           help="experts each token is routed to (default: the family's)"),
    Option("router_aux_loss_coef", "model", float, None, Range(float, 0, 1e3),
           form=(0.0, 10.0, 0.001, 4), form_default=0.001,
           help="weight of the router's load-balancing loss added to the training loss (Mixtral's, transformers' "
                "load_balancing_loss_func; 0: none; default: the family's config, 0.001, OLMoE 0.01)"),
    Option("dropout", "model", float, None, Range(float, 0, 1, hi_open=True), form=(0.0, 0.9, 0.05, 2), form_default=0.0,
           help="dropout probability"),
    # -- optimisation --------------------------------------------------------------------------
    Option("optimizer", "run", str, "adamw", choices=OPTIMIZERS, help="optimiser"),
    Option("lr", "run", float, 1e-3, Range(float, 0, 10, lo_open=True), form=(1e-6, 10.0, 1e-4, 6),
           help="peak learning rate (the Noam schedule's factor)"),
    Option("weight_decay", "run", float, 0.01, Range(float, 0, 10), form=(0.0, 10.0, 0.01, 4), help="weight decay"),
    Option("momentum", "run", float, 0.9, Range(float, 0, 1), help="SGD momentum"),
    Option("schedule", "run", str, "cosine", choices=SCHEDULES, help="learning-rate schedule"),
    Option("warmup_steps", "run", int, 50, _int(0), flag="warmup", form=(0, 100_000, 10), help="warmup steps"),
    Option("batch_size", "run", int, 32, _int(1), form=(1, 4096, 8), help="samples per step"),
    Option("grad_clip", "run", float, 1.0, Range(float, 0, 1e6), form=(0.0, 1000.0, 0.5, 2),
           help="0 disables clipping"),
    Option("steps", "run", int, 1000, _int(1), form=(1, 10_000_000, 100), help="training steps"),
    Option("eval_every", "run", int, 100, _int(1), form=(1, 1_000_000, 50), help="steps between evaluations"),
    Option("checkpoint_every", "run", int, 500, _int(1), form=(1, 1_000_000, 100), help="steps between checkpoints"),
    Option("log_every", "run", int, 10, _int(1), help="steps between logged steps"),
    # -- kept checkpoints (core.training.timeline) ----------------------------------------------
    Option("keep_every", "run", int, 0, _int(0), form=(0, 1_000_000, 100),
           help="keep a model folder every K steps (0, K, 2K, ...) under OUT/checkpoints/step-NNNNNN, to look at "
                "the model at those steps later (--step N); 0 keeps none"),
    Option("keep_spacing", "run", str, "linear", choices=("linear", "log"),
           help="log: keep steps 0, 1, 2, 4, 8, ... below --keep-every too, then every --keep-every (as Pythia; "
                "with --keep-every 0, powers of two to the end)"),
    Option("keep_max_gb", "run", float, 2.0, Range(float, 0, 1e6, lo_open=True), form=(0.01, 100_000.0, 0.5, 2),
           help="stop keeping checkpoints once they would take more than this many GB (said when it happens)"),
    Option("seed", "run", int, 0, _int(0, MAX_SEED), form=(0, 2**31 - 1, 1), help="random seed"),
    Option("precision", "run", str, None, choices=PRECISIONS,
           help="autocast precision (default: bfloat16 on CUDA, float16 where it lacks bfloat16, else float32; "
                "bfloat16 trains ~1.5x faster than float32 at width 128 and up on a CPU with AVX-512 BF16 or AMX)"),
)
OPTION = {o.key: o for o in OPTIONS}
MODEL_OPTIONS = tuple(o for o in OPTIONS if o.part == "model")
TASK_OPTIONS = tuple(o for o in OPTIONS if o.part == "task")
RUN_OPTIONS = tuple(o for o in OPTIONS if o.part == "run")


def settings_problem(run: dict, model: dict, task_options: dict) -> str:
    """'' when every declared setting present is in its range, else the first problem, naming the setting
    ("setting 'lr' must be in (0, 10], got 0"). Keys the table does not declare (a declared task's own
    options) are the task's to check; grad_clip None means no clipping and precision '' the device's."""
    for part, values in (("run", run), ("model", model), ("task", task_options)):
        for key, value in values.items():
            option = OPTION.get(key)
            if option is None or option.part != part or value is None:
                continue
            if key == "precision" and value == "":
                continue
            problem = option.problem(value)
            if problem:
                where = {"run": "", "model": "model.", "task": "task_options."}[part]
                return f"setting {where + key!r} {problem}"
    return ""

"""Training settings and their command-line form: what the Train panel and `train` both use.

The options themselves (names, defaults, ranges, choices, help) are declared once in
core.training.options; TrainConfig checks itself against them. Here is what a front end does with
them: the run's flags as `train` takes them (their names, which settings each task takes from them),
turned into a TrainConfig (`config_from_flags`) and back (`config_to_flags`), so the Train panel can
show the same run as a command a person would type, and the CLI builds the same config the panel does.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ..core.families import trainable_families
from ..core.training.options import MODEL_OPTIONS, OPTION, RUN_OPTIONS, TASK_OPTIONS, Option
from ..core.training.tasks import DECLARED_TASKS
from ..core.training.trainer import TrainConfig, best_device, default_precision

# the model options every run states (the family preset gives the others unless a flag does)
_ALWAYS_MODEL = ("n_layers", "n_heads", "d_model", "d_ff", "context_length")
# the run's settings that are not options of the table: which task and family, how long, where, how precise
_PATH_OPTIONS = ("text_file", "image_folder")  # absolute: the run may resume from elsewhere


# the family an encoder-decoder task starts on, and the switches the builder gives a family over its preset (the
# Train panel's boxes and `train`'s flags alike, where none is given):
# marian's layout is the original Transformer's (Vaswani et al. 2017: post-LN, sinusoidal positions), whose
# MLP is ReLU (opus-mt's preset: swish)
DEFAULT_ENCODER_DECODER = "marian"
BUILDER_SWITCHES = {"marian": {"activation": "relu"}}


def families_for_task(task: str) -> list[str]:
    """The trainable families a run of `task` can build, in REGISTRY order: the image families (vit) for an
    image task; encoder-decoders (marian, t5) for a task that has a sequence-to-sequence version (copy,
    reverse, sort: trained with teacher forcing) or is one (translate: encoder-decoders only); decoders and
    encoders for every other text task. What the Train panel's family list offers for the chosen task."""
    from ..core.families import REGISTRY

    declared = DECLARED_TASKS.get(task)
    if declared is not None and declared.image:
        return trainable_families("patches")
    seq2seq = declared is not None and declared.seq2seq is not None
    decoders = declared is None or declared.decoders
    return [name for name in trainable_families()
            if (seq2seq if REGISTRY[name].encoder_decoder else decoders)]


def flag(dest: str) -> str:
    """The flag of an argparse dest: "train_size" -> "--train-size"."""
    return "--" + dest.replace("_", "-")


def option_flag(option: Option) -> str:
    return flag(option.dest)


def task_options_of(task: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The task options a run of `task` takes: the ones given (by their option keys), and for the options
    the task declares, its own default or the option's where none was given (what the form fills in)."""
    declared = DECLARED_TASKS.get(task)
    out = {key: value for key, value in given.items() if value is not None}
    for key in (declared.options if declared else ()):
        if key in out:
            continue
        option = OPTION.get(key)
        default = declared.defaults.get(key, option.default if option is not None else None)
        if default is not None:
            out[key] = default
    for key in _PATH_OPTIONS:
        if out.get(key):
            out[key] = os.path.abspath(os.path.expanduser(str(out[key])))
    return out


def config_from_flags(values: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of `train`'s parsed flags (argparse dests -> values, None where not given).
    ValueError (one line) for a run the flags cannot describe."""
    v = dict(values)
    missing = [flag(d) for d in ("task", "steps") if v.get(d) is None]
    if missing:
        raise ValueError(f"train needs {' and '.join(missing)} (or --config FILE)")
    task = v["task"]
    if task == "text" and not v.get("text_file"):
        raise ValueError("--task text needs --text-file")
    if task == "image-folder" and not v.get("image_folder"):
        raise ValueError("--task image-folder needs --image-folder DIR (one sub-folder of images per class)")
    task_options = task_options_of(task, {o.key: v.get(o.dest) for o in TASK_OPTIONS})
    model = {}
    for o in MODEL_OPTIONS:
        value = v.get(o.dest)
        value = o.default if value is None else value
        if value is not None:
            model[o.key] = value
    model["d_ff"] = model.get("d_ff") or 4 * model["d_model"]
    model = {**{k: model[k] for k in _ALWAYS_MODEL}, **{k: x for k, x in model.items() if k not in _ALWAYS_MODEL}}
    family = v.get("family") or "gpt2"
    for key, value in BUILDER_SWITCHES.get(family, {}).items():  # the builder's switches (the Train panel's) unless given
        model.setdefault(key, value)
    if family in trainable_families("patches"):  # a ViT's context is 1 + its patches, never a free choice
        model.pop("context_length")
    run = {o.key: (o.default if v.get(o.dest) is None else v[o.dest]) for o in RUN_OPTIONS}
    device = v.get("device")
    device = best_device() if device in (None, "", "auto") else device
    run.update(steps=v["steps"], grad_clip=run["grad_clip"] or None, device=device,
               precision=v.get("precision") or default_precision(device))
    return TrainConfig(task=task, task_options=task_options, family=family, model=model, **run)


def config_to_flags(cfg: TrainConfig) -> list[str]:
    """The flags config_from_flags turns back into `cfg` (its inverse): the run's command line as a person
    would type it. ValueError for a setting no flag can give (then only --config FILE can)."""
    if cfg.betas is not None:
        raise ValueError("the optimizer's betas have no flag; give them with --config FILE")
    args = ["--task", cfg.task, "--family", cfg.family]
    for o in RUN_OPTIONS:
        value = getattr(cfg, o.key)
        if o.key == "grad_clip":
            value = value or 0  # --grad-clip 0 is no clipping
        if o.key in ("steps", "precision"):
            continue  # said last, with the device
        args += [option_flag(o), repr(value) if isinstance(value, float) else str(value)]
    for o in MODEL_OPTIONS:
        if o.key in cfg.model:
            args += [option_flag(o), str(cfg.model[o.key])]
    for key, value in cfg.task_options.items():
        option = OPTION.get(key)
        if option is None or option.part != "task":
            raise ValueError(f"the task option {key!r} has no flag; give it with --config FILE")
        args += [option_flag(option), str(value)]
    return args + ["--steps", str(cfg.steps), "--device", cfg.device, "--precision", cfg.precision]


def model_flag_keys() -> dict[str, str]:
    """argparse dest -> TrainConfig.model key, for the model flags."""
    return {o.dest: o.key for o in MODEL_OPTIONS}


def run_flag_keys() -> dict[str, str]:
    """argparse dest -> TrainConfig field, for the flags a resume may take anew (see trainer.TUNABLE_ON_RESUME)
    or refuses (task, family...)."""
    return {"task": "task", "family": "family", **{o.dest: o.key for o in RUN_OPTIONS
                                                   if o.key not in ("steps", "precision")}}


def task_option_dest(key: str) -> str:
    """The argparse dest of a task option key ("n_train" -> "train_size")."""
    option = OPTION.get(key)
    return option.dest if option is not None else key

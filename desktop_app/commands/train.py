"""`python -m desktop_app train`: the training loop of core/training, headless.

Prints one line per evaluation (or every event as a JSON line with --jsonl, which the Train panel
reads), and always ends with one JSON line {step, train_loss, train_accuracy, val_loss, val_accuracy} (an
encoder-decoder's also val_exact_match: held-out sources whose greedy decoding is the whole target).
Without --device it runs on the best device (cuda, mps, cpu); without --precision it uses bfloat16
autocast on CUDA (float16 with loss scaling where bfloat16 is unsupported) and float32 elsewhere.
With --control-stdin it obeys the lines "pause", "resume" and "stop" on standard input.
The run's settings come from the flags or, the same settings as JSON, from --config FILE (what
run_config.json holds: TrainConfig.to_json); the Train panel starts its runs with --config.
Runs data-parallel under torchrun (gloo on CPU, nccl on GPUs) with the same arguments.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from ..app.training import (config_from_flags, config_to_flags, flag as _flag, model_flag_keys, run_flag_keys,
                            task_option_dest)
from .args import Number, device_or_auto
from .control import take_control

config_to_args = config_to_flags  # the run's flags (app.training: what the Train panel shows as a command)


class _Given(argparse.Action):
    """Stores a value like "store" and notes that the user gave it (a resume applies only those)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", None) or ())
        setattr(namespace, "given", given | {self.dest})


def _add_option(group, option, default=None, help_suffix: str = "") -> None:
    """One training option's flag, from its declaration (core.training.options): its range is argparse's type."""
    kw = {"help": (option.help + help_suffix) or None, "default": default}
    if option.choices:
        kw["choices"] = option.choices
        if option.kind is not str:
            kw["type"] = option.kind
    elif option.limit is not None:
        kw["type"] = Number.of(option.limit)
    group.add_argument(_flag(option.dest), **kw)


def add_parser(sub) -> None:
    from ..core.training.tasks import task_names  # (torch is imported by the parser's other commands already)

    p = sub.add_parser("train", help="train a small transformer on a task (checkpoints, resume, metrics)")
    p.register("action", None, _Given)  # every plain option records that it was given
    c = p.add_argument_group("settings file")
    c.add_argument("--config", metavar="FILE",
                   help="the run's settings as JSON, as a run's run_config.json holds them (settings left out "
                        "take their defaults): instead of the task, model and optimisation flags, which are "
                        "refused beside it; --out, --resume, --overwrite, --export, --baseline, --jsonl and "
                        "--control-stdin still apply")
    from ..core.training.options import MODEL_OPTIONS, RUN_OPTIONS, TASK_OPTIONS
    from ..core.training.sae import SAE_TASKS

    t = p.add_argument_group("task")
    t.add_argument("--task", choices=task_names() + SAE_TASKS,  # the registry (core.training.tasks.declare_task);
                   # sae, transcoder, clt: on a model's activations (core.training.sae, its own flags below)
                   help="required unless --config gives it (digits: the 8 x 8 handwritten digits, --family vit; "
                        "image-folder: a folder of images, one sub-folder per class, --family vit; transcoder / clt: per-layer / "
                        "cross-layer transcoders on --model's MLPs over --text-file, in circuit-tracer's format)")
    for option in TASK_OPTIONS:  # given or the task's own defaults (app.training.task_options_of)
        _add_option(t, option)
    t.add_argument("--baseline", choices=("mlp",), help="train the lectures' MLP baseline instead (motif only)")
    from ..core.training.sae import SAE_OPTIONS
    s = p.add_argument_group("sparse dictionary (--task sae, transcoder, clt: on --model's activations over --text-file)")
    for option in SAE_OPTIONS:
        _add_option(s, option)
    m = p.add_argument_group("model")
    from ..core.families import trainable_families  # the registry's, as the Train panel offers them
    m.add_argument("--family", choices=trainable_families() + trainable_families("patches"), default="gpt2")
    for option in MODEL_OPTIONS:
        _add_option(m, option, option.default)
    o = p.add_argument_group("optimisation")
    for option in RUN_OPTIONS:
        if option.key == "steps":
            _add_option(o, option, None, " (required unless --config gives it)")
        else:
            _add_option(o, option, option.default)
    o.add_argument("--device", type=device_or_auto, help="cpu, cuda, cuda:N, mps or auto (default: the best present, cuda > mps > cpu)")
    r = p.add_argument_group("output")
    r.add_argument("--out", required=True, help="checkpoint folder (a model folder plus optimiser state)")
    r.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --out; the optimisation settings given here "
                        "(--lr, --grad-clip, ...) apply from now on, a different task or model is refused")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the app's earlier run in --out (and its earlier --export); never "
                        "a folder holding other files")
    r.add_argument("--export", help="also write a clean model folder (no optimiser state) here at the end")
    r.add_argument("--jsonl", action="store_true", help="print every event as a JSON line")
    r.add_argument("--control-stdin", action="store_true", help="obey pause / resume / stop lines on stdin")
    p.set_defaults(func=run)


# what may stand beside --config: where the run goes and how it is driven, not what it trains
_BESIDE_CONFIG = {"config", "out", "export", "baseline"}


def config_from_file(path: str):
    """The TrainConfig of a --config FILE; ValueError naming the file and its problem (TrainConfig checks
    its own settings: the flags' ranges, a known task and family)."""
    from ..core.training import TrainConfig
    from ..core.training.trainer import best_device, default_precision

    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the training configuration ({exc.strerror or exc})") from None
    try:
        cfg = TrainConfig.from_json(text, path)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to be a training configuration") from None
    if cfg.device in ("", "auto"):  # as --device auto: the best device present
        cfg.device = best_device()
    if not cfg.precision:
        cfg.precision = default_precision(cfg.device)
    return cfg


def config_from_args(args):
    """The run's TrainConfig: from --config FILE, or built from the flags (two ways to the same config)."""
    if getattr(args, "config", None):
        beside = sorted((getattr(args, "given", None) or set()) - _BESIDE_CONFIG)
        if beside:
            raise ValueError(f"--config {args.config} holds the run's settings; leave out "
                             f"{', '.join(_flag(d) for d in beside)} (or change the file)")
        return config_from_file(args.config)
    return config_from_flags(vars(args))


def _human(ev: dict) -> str | None:
    kind = ev["event"]
    if kind == "start":
        where = f", to {ev['out']}" if ev["out"] else ""
        line = "".join(f"{note}\n" for note in ev.get("notes", ()))  # e.g. a killed run's lock taken over
        line += f"training {ev['parameters']:,} parameters on {ev['task']['task']} ({ev['device']}){where}"
        if ev.get("keep"):
            from ..core.training.timeline import describe_keep_plan
            line += "\n" + describe_keep_plan(ev["keep"])
        if ev.get("changed"):
            line += "\nresuming with new settings: " + ", ".join(
                f"{k} {was!r} -> {now!r}" for k, (was, now) in ev["changed"].items())
        return line
    if kind == "eval":
        train_acc = f" train_accuracy {ev['train_accuracy']:.4f}" if ev.get("train_accuracy") is not None else ""
        exact = f" val_exact_match {ev['val_exact_match']:.4f}" if ev.get("val_exact_match") is not None else ""
        return (f"step {ev['step']}: val_loss {ev['val_loss']:.4f} val_accuracy {ev['val_accuracy']:.4f}{exact}"
                f"{train_acc}")
    if kind == "step" and ev["step"] % 100 == 0:
        return (f"step {ev['step']}/{ev['steps']}: train_loss {ev['train_loss']:.4f} lr {ev['lr']:.2e} "
                f"{ev['tokens_per_s']:.0f} tok/s eta {ev['eta']:.0f}s")
    if kind in ("error", "stopped", "keep_stopped"):
        return ev.get("message") or f"stopped at step {ev['step']}"
    return None


def check_outputs(args) -> None:
    """Refuse, before training, an --out or --export folder this run may not write (core/files.py's rule)."""
    from ..core.files import OutputFolderError, check_output_folder
    from ..core.training.trainer import EXPORT_FILES, RUN_FILE, RUN_FILES, STATE_FILE

    out = check_output_folder(args.out, overwrite=args.overwrite, resume=args.resume, marker=STATE_FILE,
                              legacy_names=RUN_FILES)
    if args.export:
        export = check_output_folder(args.export, overwrite=args.overwrite, legacy_names=EXPORT_FILES,
                                     legacy_marker=RUN_FILE, what="export")
        if export == out or out in export.parents or export in out.parents:
            raise OutputFolderError(args.export, "--export must be a folder beside --out, not it or inside it")


def resumed_config(saved, cfg, args):
    """The checkpoint's settings, with what the user gave on this command line on top (the trainer refuses
    a different task or model and applies new optimisation settings); how long, where and how precise
    come from this command line."""
    from_file = bool(getattr(args, "config", None))  # a --config file gives every setting
    given = getattr(args, "given", None) or set()
    d = saved.to_dict()
    for dest, key in run_flag_keys().items():
        if from_file or dest in given or dest == "task":  # --task is required: always the user's word
            d[key] = getattr(cfg, key)
    if from_file:
        d["betas"] = cfg.betas
    d["task_options"] = {**saved.task_options, **{k: v for k, v in cfg.task_options.items()
                                                 if from_file or task_option_dest(k) in given}}
    d["model"] = {**saved.model, **{key: cfg.model[key] for dest, key in model_flag_keys().items()
                                   if (from_file or dest in given) and key in cfg.model}}
    precision = cfg.precision if from_file else args.precision or saved.precision
    if precision == "float16" and not cfg.device.startswith("cuda"):
        precision = cfg.precision
    d.update(steps=cfg.steps, device=cfg.device, precision=precision)
    return saved.__class__(**d)


def check_training_memory(cfg) -> None:
    """Refuse, before building anything, a run whose weights, optimiser state and activations cannot fit:
    4 copies of the parameters, and per layer about 16 x d_model + 2 x d_ff + 2 x heads x T floats per token."""
    from ..core.devices import check_memory

    m = cfg.model
    d, layers, heads = m.get("d_model", 64), m.get("n_layers", 2), m.get("n_heads", 4)
    d_ff, T = m.get("d_ff") or 4 * d, m.get("context_length", 128)
    vocab = cfg.task_options.get("vocab_size") or 1024
    params = vocab * d + T * d + layers * (4 * d * d + 2 * d * d_ff)
    per_token = layers * (16 * d + 2 * d_ff + 2 * heads * T) + 2 * vocab
    width = 2 if cfg.precision in ("bfloat16", "float16") else 4
    need = 16.0 * params + float(cfg.batch_size) * T * per_token * width
    check_memory(need, f"--batch-size {cfg.batch_size} x --context {T} x --d-model {d} x --layers {layers}",
                 "for the weights, optimiser state and activations", cfg.device)


def run(args) -> int:
    from ..core.training import TrainControl, TrainingDiverged, train
    from ..app.command_line import EXIT_DIVERGED
    from ..core.training.sae import SAE_TASKS
    from ..core.training.trainer import EXACT_MATCH, SUMMARY_KEYS, export_model, read_run_config

    if args.task in SAE_TASKS and not getattr(args, "config", None):
        from .features import run_train_sae
        return run_train_sae(args)
    if args.baseline == "mlp" and args.task not in (None, "motif"):  # before the flags' own checks
        raise ValueError("--baseline mlp is the motif task's baseline; use --task motif")
    cfg = config_from_args(args)
    if cfg.task == "image-folder":  # core reads no image files: it is handed Qt's decoder
        from ..core.training.image_tasks import set_image_decoder
        from .trace import read_image_file
        set_image_decoder(read_image_file)
    if args.baseline == "mlp" and cfg.task != "motif":
        raise ValueError("--baseline mlp is the motif task's baseline; use --task motif")
    if args.baseline is None:  # before any work: may we write there? (nothing is ever deleted)
        check_outputs(args)
    if args.resume and args.baseline is None:
        cfg = resumed_config(read_run_config(args.out), cfg, args)
    check_training_memory(cfg)
    control = TrainControl()
    lock = threading.Lock()

    def on_event(ev: dict) -> None:
        with lock:
            if args.jsonl:
                print(json.dumps(ev), flush=True)
            else:
                line = _human(ev)
                if line:
                    print(line, flush=True)

    previous = take_control(args, control)
    try:
        if args.baseline == "mlp":  # the lectures' comparison: same batches, same held-out set, no checkpoint
            from ..core.training.baselines import train_motif_mlp
            summary = train_motif_mlp(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                                      n_train=cfg.task_options.get("n_train"), weight_decay=cfg.weight_decay,
                                      length=cfg.task_options.get("length") or 20, eval_every=cfg.eval_every,
                                      log_every=cfg.log_every, on_event=on_event, control=control)
            print(json.dumps({k: summary.get(k) for k in ("step", *SUMMARY_KEYS, "parameters")}), flush=True)
            return 0
        summary = train(cfg, args.out, resume=args.resume, on_event=on_event, control=control)
    except TrainingDiverged as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(json.dumps({"step": None, **{k: None for k in SUMMARY_KEYS}, "error": str(exc)}), flush=True)
        return EXIT_DIVERGED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    import os
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if args.export:
        export_model(args.out, args.export)
    print(json.dumps({k: summary.get(k) for k in ("step", *SUMMARY_KEYS, EXACT_MATCH) if k in summary}), flush=True)
    return 0

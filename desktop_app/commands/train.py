"""`python -m desktop_app train`: the training loop of core/training, headless.

Prints one line per evaluation (or every event as a JSON line with --jsonl, which the Train panel
reads), and always ends with one JSON line {step, train_loss, train_accuracy, val_loss, val_accuracy}.
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
import os
import signal
import sys
import threading

from .args import count, device_or_auto, float_in, int_in, non_negative, positive_int, seed, unit

# the ranges of the settings a run takes from flags or from a --config file alike (TrainConfig fields)
LIMITS = {"lr": float_in(0, 10, lo_open=True), "weight_decay": float_in(0, 10), "momentum": unit,
          "warmup_steps": count, "batch_size": positive_int, "steps": positive_int, "eval_every": positive_int,
          "checkpoint_every": positive_int, "log_every": positive_int, "grad_clip": float_in(0, 1e6), "seed": seed}

class _Given(argparse.Action):
    """Stores a value like "store" and notes that the user gave it (a resume applies only those)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", None) or ())
        setattr(namespace, "given", given | {self.dest})


# TrainConfig.model keys of the model arguments
_MODEL_KEYS = {"layers": "n_layers", "heads": "n_heads", "d_model": "d_model", "d_ff": "d_ff", "context": "context_length",
               "norm": "norm", "norm_placement": "norm_placement", "activation": "activation", "positions": "positions",
               "attention": "attention_kind", "init": "init", "dropout": "dropout", "patch_size": "patch_size"}
# TrainConfig fields of the other arguments a resume may take anew (see trainer.TUNABLE_ON_RESUME) or refuses
_FIELDS = {"task": "task", "family": "family", "optimizer": "optimizer", "seed": "seed", "lr": "lr",
           "weight_decay": "weight_decay", "momentum": "momentum", "schedule": "schedule", "warmup": "warmup_steps",
           "batch_size": "batch_size", "grad_clip": "grad_clip", "eval_every": "eval_every",
           "checkpoint_every": "checkpoint_every", "log_every": "log_every"}


def add_parser(sub) -> None:
    from ..core.config import MAX_CONTEXT
    from ..core.training.tasks import task_names  # (torch is imported by the parser's other commands already)

    p = sub.add_parser("train", help="train a small transformer on a task (checkpoints, resume, metrics)")
    p.register("action", None, _Given)  # every plain option records that it was given
    c = p.add_argument_group("settings file")
    c.add_argument("--config", metavar="FILE",
                   help="the run's settings as JSON, as a run's run_config.json holds them (settings left out "
                        "take their defaults): instead of the task, model and optimisation flags, which are "
                        "refused beside it; --out, --resume, --overwrite, --export, --baseline, --jsonl and "
                        "--control-stdin still apply")
    t = p.add_argument_group("task")
    t.add_argument("--task", choices=task_names(),  # the task registry (core.training.tasks.declare_task)
                   help="required unless --config gives it (digits: the 8 x 8 handwritten digits, --family vit; "
                        "image-folder: a folder of images, one sub-folder per class, --family vit)")
    t.add_argument("--text-file", help="UTF-8 text for --task text")
    t.add_argument("--image-folder", help="for --task image-folder: a folder with one sub-folder of images per class "
                                          "(class names = sub-folder names, sorted)")
    t.add_argument("--image-size", type=int_in(1, 4096), help="image-folder: resize every image to this size (default: the "
                                                  "images' own size, which must then be one square size)")
    t.add_argument("--channels", type=int, choices=(1, 3), help="image-folder: 1 (grey) or 3 (RGB, default)")
    t.add_argument("--tokenizer", choices=("char", "bpe"), default="char", help="text task tokenizer")
    t.add_argument("--vocab-size", type=int_in(1, 10**6), default=512, help="BPE vocabulary size (text task)")
    t.add_argument("--length", type=int_in(1, 10**5), help="sequence length (motif, copy, reverse, sort, induction)")
    t.add_argument("--symbols", type=int_in(2, 10**6), help="alphabet size (copy, reverse, sort, induction)")
    t.add_argument("--p", type=int_in(2, 10**4), help="modulus (modadd)")
    t.add_argument("--train-fraction", type=float_in(0, 1, lo_open=True, hi_open=True), help="share of the p^2 pairs used for training (modadd)")
    t.add_argument("--train-size", type=int_in(1, 10**7), help="a fixed training set of this many samples (motif; "
                                                  "the lectures use 1500) instead of fresh samples")
    t.add_argument("--baseline", choices=("mlp",), help="train the lectures' MLP baseline instead (motif only)")
    m = p.add_argument_group("model")
    from ..core.families import trainable_families  # the registry's, as the Train panel offers them
    m.add_argument("--family", choices=trainable_families() + trainable_families("patches"), default="gpt2")
    m.add_argument("--layers", type=int_in(1, 1000), default=2)
    m.add_argument("--heads", type=int_in(1, 1024), default=4)
    m.add_argument("--d-model", type=int_in(1, 65536), default=64)
    m.add_argument("--d-ff", type=int_in(1, 10**6), help="MLP width (default 4 x d_model)")
    m.add_argument("--context", type=int_in(1, MAX_CONTEXT), default=128, help="context length (text task window)")
    m.add_argument("--patch-size", type=int_in(1, 4096), help="ViT patch size in pixels (vit; digits default 2: 16 patches)")
    m.add_argument("--norm", choices=("layernorm", "rmsnorm"))
    m.add_argument("--norm-placement", choices=("pre", "post"))
    m.add_argument("--activation", choices=("gelu", "gelu_tanh", "relu", "swiglu"))
    m.add_argument("--positions", choices=("learned", "sinusoidal", "rotary", "none"))
    m.add_argument("--attention", choices=("softmax", "l2", "sinkhorn"))
    m.add_argument("--init", choices=("default", "glorot", "he"))
    m.add_argument("--dropout", type=float_in(0, 1, hi_open=True))
    o = p.add_argument_group("optimisation")
    o.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "lion"), default="adamw")
    o.add_argument("--lr", type=LIMITS["lr"], default=1e-3)
    o.add_argument("--weight-decay", type=LIMITS["weight_decay"], default=0.01)
    o.add_argument("--momentum", type=LIMITS["momentum"], default=0.9, help="SGD momentum")
    o.add_argument("--schedule", choices=("cosine", "noam", "constant"), default="cosine")
    o.add_argument("--warmup", type=LIMITS["warmup_steps"], default=50)
    o.add_argument("--batch-size", type=LIMITS["batch_size"], default=32)
    o.add_argument("--grad-clip", type=LIMITS["grad_clip"], default=1.0, help="0 disables clipping")
    o.add_argument("--steps", type=LIMITS["steps"], help="required unless --config gives it")
    o.add_argument("--eval-every", type=LIMITS["eval_every"], default=100)
    o.add_argument("--checkpoint-every", type=LIMITS["checkpoint_every"], default=500)
    o.add_argument("--log-every", type=LIMITS["log_every"], default=10)
    o.add_argument("--seed", type=LIMITS["seed"], default=0)
    o.add_argument("--device", type=device_or_auto, help="cpu, cuda, cuda:N, mps or auto (default: the best present, cuda > mps > cpu)")
    o.add_argument("--precision", choices=("float32", "bfloat16", "float16"),
                   help="autocast precision (default: bfloat16 on CUDA, float16 where it lacks bfloat16, else float32)")
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


def _device(args) -> str:
    from ..core.training.trainer import best_device

    return best_device() if args.device in (None, "", "auto") else args.device


# what may stand beside --config: where the run goes and how it is driven, not what it trains
_BESIDE_CONFIG = {"config", "out", "export", "baseline"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def config_from_file(path: str):
    """The TrainConfig of a --config FILE; ValueError naming the file and its problem."""
    from ..core.training import TrainConfig
    from ..core.training.tasks import task_names
    from ..core.training.trainer import default_precision

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
    for key, limit in LIMITS.items():
        value = getattr(cfg, key)
        problem = "" if key == "grad_clip" and value is None else limit.problem(value)
        if problem:
            raise ValueError(f"{path}: setting {key!r} {problem}")
    if cfg.task not in task_names():
        raise ValueError(f"{path}: unknown task {cfg.task!r} (known: {', '.join(task_names())})")
    from ..core.config import FAMILIES
    if cfg.family not in FAMILIES:
        raise ValueError(f"{path}: unknown family {cfg.family!r} ({', '.join(FAMILIES)})")
    if cfg.device in ("", "auto"):  # as --device auto: the best device present
        from ..core.training.trainer import best_device
        cfg.device = best_device()
    if not cfg.precision:
        cfg.precision = default_precision(cfg.device)
    return cfg


def config_from_args(args):
    """The run's TrainConfig: from --config FILE, or built from the flags (two ways to the same config)."""
    from ..core.families import trainable_families
    from ..core.training import TrainConfig
    from ..core.training.trainer import default_precision

    if getattr(args, "config", None):
        beside = sorted((getattr(args, "given", None) or set()) - _BESIDE_CONFIG)
        if beside:
            raise ValueError(f"--config {args.config} holds the run's settings; leave out "
                             f"{', '.join(_flag(d) for d in beside)} (or change the file)")
        return config_from_file(args.config)
    missing = [flag for flag, value in (("--task", args.task), ("--steps", args.steps)) if value is None]
    if missing:
        raise ValueError(f"train needs {' and '.join(missing)} (or --config FILE)")
    task_options = {}
    for key in ("length", "symbols", "p", "train_fraction"):
        value = getattr(args, key)
        if value is not None:
            task_options[key] = value
    if args.train_size is not None:
        task_options["n_train"] = args.train_size
    if args.task == "text":
        if not args.text_file:
            raise ValueError("--task text needs --text-file")
        task_options.update(text_file=args.text_file, tokenizer=args.tokenizer, vocab_size=args.vocab_size)
    if args.task == "image-folder":
        if not args.image_folder:
            raise ValueError("--task image-folder needs --image-folder DIR (one sub-folder of images per class)")
        task_options["image_folder"] = os.path.abspath(args.image_folder)  # the run may resume from elsewhere
        for key in ("channels", "image_size"):
            if getattr(args, key) is not None:
                task_options[key] = getattr(args, key)
    model = {"n_layers": args.layers, "n_heads": args.heads, "d_model": args.d_model,
             "d_ff": args.d_ff or 4 * args.d_model, "context_length": args.context}
    for arg, key in (("norm", "norm"), ("norm_placement", "norm_placement"), ("activation", "activation"),
                     ("positions", "positions"), ("attention", "attention_kind"), ("init", "init"),
                     ("dropout", "dropout"), ("patch_size", "patch_size")):
        value = getattr(args, arg)
        if value is not None:
            model[key] = value
    if args.family in trainable_families("patches"):  # a ViT's context is 1 + its patches, never a free choice
        model.pop("context_length")
    device = _device(args)
    return TrainConfig(task=args.task, task_options=task_options, family=args.family, model=model,
                       optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                       momentum=args.momentum, schedule=args.schedule, warmup_steps=args.warmup,
                       batch_size=args.batch_size, steps=args.steps, eval_every=args.eval_every,
                       checkpoint_every=args.checkpoint_every, log_every=args.log_every,
                       grad_clip=args.grad_clip or None, seed=args.seed, device=device,
                       precision=args.precision or default_precision(device))


def config_to_args(cfg) -> list[str]:
    """The flags config_from_args turns back into `cfg` (its inverse): the run's command line as a person
    would type it. ValueError for a setting no flag can give (then only --config FILE can)."""
    if cfg.betas is not None:
        raise ValueError("the optimizer's betas have no flag; give them with --config FILE")
    args: list[str] = []
    for dest, key in _FIELDS.items():
        value = getattr(cfg, key)
        if key == "grad_clip":
            value = value or 0  # --grad-clip 0 is no clipping
        args += [_flag(dest), repr(value) if isinstance(value, float) else str(value)]
    for dest, key in _MODEL_KEYS.items():
        if key in cfg.model:
            args += [_flag(dest), str(cfg.model[key])]
    known = {"length", "symbols", "p", "train_fraction", "n_train", "text_file", "tokenizer", "vocab_size",
             "image_folder", "channels", "image_size"}
    for key, value in cfg.task_options.items():
        if key not in known:
            raise ValueError(f"the task option {key!r} has no flag; give it with --config FILE")
        args += [_flag(_option_dest(key)), str(value)]
    return args + ["--steps", str(cfg.steps), "--device", cfg.device, "--precision", cfg.precision]


def _human(ev: dict) -> str | None:
    kind = ev["event"]
    if kind == "start":
        where = f", to {ev['out']}" if ev["out"] else ""
        line = "".join(f"{note}\n" for note in ev.get("notes", ()))  # e.g. a killed run's lock taken over
        line += f"training {ev['parameters']:,} parameters on {ev['task']['task']} ({ev['device']}){where}"
        if ev.get("changed"):
            line += "\nresuming with new settings: " + ", ".join(
                f"{k} {was!r} -> {now!r}" for k, (was, now) in ev["changed"].items())
        return line
    if kind == "eval":
        train_acc = f" train_accuracy {ev['train_accuracy']:.4f}" if ev.get("train_accuracy") is not None else ""
        return f"step {ev['step']}: val_loss {ev['val_loss']:.4f} val_accuracy {ev['val_accuracy']:.4f}{train_acc}"
    if kind == "step" and ev["step"] % 100 == 0:
        return (f"step {ev['step']}/{ev['steps']}: train_loss {ev['train_loss']:.4f} lr {ev['lr']:.2e} "
                f"{ev['tokens_per_s']:.0f} tok/s eta {ev['eta']:.0f}s")
    if kind in ("error", "stopped"):
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
    for dest, key in _FIELDS.items():
        if from_file or dest in given or dest == "task":  # --task is required: always the user's word
            d[key] = getattr(cfg, key)
    if from_file:
        d["betas"] = cfg.betas
    d["task_options"] = {**saved.task_options, **{k: v for k, v in cfg.task_options.items()
                                                 if from_file or _option_dest(k) in given}}
    d["model"] = {**saved.model, **{key: cfg.model[key] for dest, key in _MODEL_KEYS.items()
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


def _option_dest(key: str) -> str:
    return {"n_train": "train_size"}.get(key, key)


def run(args) -> int:
    from ..core.training import TrainControl, TrainingDiverged, train
    from ..cli import EXIT_DIVERGED
    from ..core.training.trainer import SUMMARY_KEYS, export_model, read_run_config

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

    if args.control_stdin:
        def read_commands() -> None:
            for line in sys.stdin:
                cmd = line.strip().lower()
                if cmd == "pause":
                    control.pause()
                elif cmd == "resume":
                    control.resume()
                elif cmd == "stop":
                    control.resume()
                    control.cancel()
            control.resume()  # stdin closed: the controlling window is gone, stop with a checkpoint
            control.cancel()
        threading.Thread(target=read_commands, daemon=True).start()
    previous = {}
    try:  # SIGTERM and the first Ctrl-C stop cleanly, with a checkpoint; a second Ctrl-C interrupts
        def stop(signum, frame):
            control.cancel()
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread (tests calling run() from a worker)
        pass
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
    print(json.dumps({k: summary.get(k) for k in ("step", *SUMMARY_KEYS)}), flush=True)
    return 0

"""A model's training run (in loop.py's loop): batches from a task, the fused path, metric events, checkpoints.

`train(cfg, out_dir, resume=..., on_event=..., control=...)` runs one training run. It emits plain
dict events through `on_event` (see EVENT KINDS below), writes checkpoints into `out_dir` in the
model-folder format with everything needed to resume beside the weights, and returns the last
summary {step, train_loss, train_accuracy, val_loss, val_accuracy, ...}. train_accuracy is the share of
scored training tokens predicted right since the last evaluation (counted on the training batches
themselves, so it costs nothing extra); "step" events carry it running, "eval" events over the interval.

Checkpoint folder (written with save_model_folder: atomic, so kill -9 leaves the previous one):
    config.json, model.safetensors, tokenizer.json     the model (loads in this app and transformers)
    optimizer.safetensors                              optimiser tensors (never pickle)
    trainer_state.json                                 step, optimiser hyper-parameters, RNG states, float16 loss scale
    run_config.json                                    the TrainConfig of the run
    metrics.json, metrics.csv                          the metric history
    checkpoints/step-NNNNNN/                           kept steps (keep_every, keep_spacing): model folders
                                                       without optimiser state; see timeline.py

Kept steps: a kept step is also a checkpoint of the run; the start event's "keep" entry is the estimate
made before the first step (steps, bytes, the bound, the last step within it), a "keep_stopped" event
says when the disk bound (keep_max_gb) stops the keeping. A resumed run goes on adding kept steps.

Event kinds: "start", "step" (every log_every steps), "eval" (an encoder-decoder's then "cross_attention": a
held-out sentence's, see cross_attention_event; not kept in metrics.json), "checkpoint" (with "kept": true at a kept
step), "keep_stopped" (message), "paused", "resumed", "done", "stopped", "error" (message). A non-finite
loss or gradient stops the run with an "error" event and a TrainingDiverged exception; the last good checkpoint stays as it was.

Under torchrun (WORLD_SIZE > 1) the run is data-parallel: every rank draws the same global batch and
takes its slice, DistributedDataParallel averages gradients, rank 0 alone writes and reports.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import get_total_norm
from safetensors.torch import save as st_save

from ..checkpoints import ModelLoadError, load_model_folder, model_class, new_model, save_model_folder
from ..config import ModelConfig
from ..files import WriteError, interrupted_copy, lock_folder, probe_writable, remove_leftovers
from ..devices import default_device, resolve_device
from ..families import REGISTRY
from ..jobs import JobControl
from ..model import Transformer
from ..moe import RouterLogits, expert_load, load_balancing_loss
from ..seq2seq import greedy_batch
from .optim import make_optimizer, optimizer_state_from_tensors, optimizer_state_to_tensors, use_fused_step
from .schedules import lr_at
from .options import RUN_OPTIONS, settings_problem
from .tasks import IGNORE, Batch, Task, make_task, task_names
from .loop import Loop, Run, RunConfig, TrainControl, pause_point  # noqa: F401 - TrainControl, pause_point: re-exported
from .timeline import Keeper, model_bytes
# the run's state files and their one checked reader (STATE_FILE ... re-exported: trainer.STATE_FILE)
from .state import (FORMAT, METRICS_JSON, OPTIM_FILE, STATE_FILE, read_metrics, read_optimizer_tensors,
                    read_step, read_trainer_state)

RUN_FILE = "run_config.json"
METRICS_CSV = "metrics.csv"
SUMMARY_KEYS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
EXACT_MATCH = "val_exact_match"  # an encoder-decoder run's eval events and summary also carry it (evaluate)
RUN_FILES = ("config.json", "model.safetensors", "tokenizer.json", OPTIM_FILE, STATE_FILE, RUN_FILE,
             METRICS_JSON, METRICS_CSV)  # what a checkpoint folder holds (recognises runs older than manifests)
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", RUN_FILE, METRICS_JSON, METRICS_CSV)
# What a resumed run keeps from its checkpoint (a different value is refused), and what it takes anew
# from the caller (applied, and listed in the "start" event's "changed").
FIXED_ON_RESUME = ("task", "task_options", "family", "optimizer", "seed")
TUNABLE_ON_RESUME = ("lr", "weight_decay", "betas", "momentum", "schedule", "warmup_steps", "batch_size",
                     "grad_clip", "eval_every", "checkpoint_every", "log_every", "keep_every", "keep_spacing",
                     "keep_max_gb")


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite."""


@dataclass(kw_only=True)
class TrainConfig(RunConfig):
    """A model's training run: RunConfig's settings and the task, model, optimiser, schedule and kept steps."""
    task: str = "motif"
    task_options: dict[str, Any] = field(default_factory=dict)
    family: str = "gpt2"
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides over the family preset
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    betas: tuple[float, float] | None = None
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup_steps: int = 50
    keep_every: int = 0  # kept checkpoints (timeline.py): every K steps, 0 none
    keep_spacing: str = "linear"  # "log": 0, 1, 2, 4, ... below keep_every too
    keep_max_gb: float = 2.0  # the kept checkpoints' disk bound
    grad_clip: float | None = 1.0
    precision: str = "float32"  # float32 | bfloat16 | float16 (autocast; float16 only on CUDA)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training settings: {', '.join(sorted(unknown))}")
        return cls(**d)

    def to_json(self) -> str:
        """The run's settings as run_config.json holds them (and `train --config FILE` reads them)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str, source: str | Path = "<config>") -> "TrainConfig":
        """The inverse of to_json; settings a file leaves out take their defaults. A file that is not such
        a JSON object, or has a setting of the wrong kind, raises ValueError naming `source`."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{source}: not a training configuration (a JSON object of settings)")
        try:
            cfg = cls.from_dict(d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None
        problem = cfg._type_problem() or cfg.problem()
        if problem:
            raise ValueError(f"{source}: {problem}")
        if cfg.betas is not None:
            cfg.betas = tuple(cfg.betas)
        return cfg

    def problem(self) -> str:
        """'' when the settings are within the ranges and choices core.training.options declares (the ones
        the CLI's flags and the Train panel's boxes take) and name a known task and family, else the first
        problem in one line."""
        run = {o.key: getattr(self, o.key) for o in RUN_OPTIONS}
        problem = settings_problem(run, self.model, self.task_options)
        if problem:
            return problem
        if self.task not in task_names():
            return f"unknown task {self.task!r} (known: {', '.join(task_names())})"
        if self.family not in REGISTRY:
            return f"unknown family {self.family!r} ({', '.join(REGISTRY)})"
        return ""

    def _type_problem(self) -> str:
        """'' when every setting has the kind of value its field holds, else what is wrong (first one)."""
        kinds = {"task": str, "task_options": dict, "family": str, "model": dict, "optimizer": str,
                 "schedule": str, "device": str, "precision": str, "lr": float, "weight_decay": float,
                 "momentum": float, "grad_clip": float, "warmup_steps": int, "batch_size": int, "steps": int,
                 "eval_every": int, "checkpoint_every": int, "log_every": int, "seed": int, "betas": list,
                 "keep_every": int, "keep_spacing": str, "keep_max_gb": float}
        for name, kind in kinds.items():
            value = getattr(self, name)
            if value is None and name in ("grad_clip", "betas"):
                continue
            ok = (isinstance(value, (int, float)) if kind is float else
                  isinstance(value, (list, tuple)) if kind is list else isinstance(value, kind))
            if not ok or isinstance(value, bool):
                wanted = {str: "a string", dict: "an object", float: "a number", int: "an integer",
                          list: "a list of two numbers"}[kind]
                return f"setting {name!r} must be {wanted}, not {json.dumps(value)}"
        return ""


def best_device() -> str:
    """The device a run gets unless told otherwise: cuda, then mps, then cpu (cpu too under torchrun
    when this machine has fewer GPUs than local processes)."""
    device = default_device()
    if device.startswith("cuda") and torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
        return "cpu"
    return device


def default_precision(device: str) -> str:
    """bfloat16 autocast on CUDA (float16 with loss scaling where bfloat16 is unsupported), else float32."""
    if str(device).startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


# -- model ------------------------------------------------------------------------------------


def model_config_for(cfg: TrainConfig, task: Task | None = None, vocab_size: int | None = None) -> ModelConfig:
    """The family preset with the builder's overrides; vocabulary and context fitted to the task."""
    preset = _trainable_family(cfg).preset
    over = dict(cfg.model)
    images = getattr(task, "model_settings", None)  # an image task (image_tasks.py): a ViT reads its images
    if task is not None and (images is not None) != (preset().input_kind == "patches"):
        raise ValueError(f"the {task.name} task trains " + ("a vision model: choose the vit family" if images else
                         f"a text model; the {cfg.family} family reads images (choose the digits task)"))
    if images:
        over.update(image_size=images["image_size"], num_channels=images["num_channels"],
                    extra={**over.get("extra", {}), **images["extra"]})
        over.setdefault("patch_size", images["patch_size"])
    if task is not None:
        over["vocab_size"] = task.vocab_size
        over["context_length"] = max(int(over.get("context_length", 0) or 0), task.seq_len)
    if getattr(task, "encoder_decoder", False):  # seq2seq_tasks.py: its specials are the model's
        over.update(pad_token_id=task.pad_id, eos_token_id=task.end_id, decoder_start_token_id=task.start_id)
    elif vocab_size is not None:
        over["vocab_size"] = vocab_size
    over.setdefault("lm_head", True)
    if over.get("norm_placement") in ("pre", "output"):
        over.setdefault("final_norm", True)  # a pre-LN (or OLMo 2) stack ends unnormalised without it (GPT-2's ln_f)
    model_cfg = preset(**over)
    if (task is not None or vocab_size is not None) and model_cfg.positions_from_pad \
            and not model_cfg.is_encoder_decoder:
        # RoBERTa reads id pad_token_id (its preset's 1) as padding: no position of its own. The task's ids are
        # all real tokens and none pads, so the pad is one id past them (a row no text encodes to), as
        # transformers' RobertaModel needs it (pad < vocab_size; positions from pad + 1)
        pad = model_cfg.vocab_size
        model_cfg = model_cfg.replace(vocab_size=pad + 1, pad_token_id=pad, position_offset=pad + 1)
    if "n_decoder_layers" in over and not model_cfg.is_encoder_decoder:  # else silently a one-stack model
        raise ValueError(f"decoder layers (model.n_decoder_layers, --decoder-layers) are an encoder-decoder's; the "
                         f"{cfg.family} family has one stack of --layers blocks")
    return model_cfg


def task_options_for(cfg: TrainConfig) -> dict[str, Any]:
    """The options the run's task is built with: the text task's window is the model's context."""
    opts = dict(cfg.task_options)
    if cfg.task == "text":
        opts.setdefault("seq_len", int(cfg.model.get("context_length", 128)))
    return opts


def _trainable_family(cfg: TrainConfig):
    """The registry's record of the run's family; ValueError naming the trainable ones if it is none of them."""
    from ..families import REGISTRY  # the only list of families
    trainable = [name for name, family in REGISTRY.items() if family.trainable]
    if cfg.family not in trainable:
        raise ValueError(f"unknown family {cfg.family!r} (trainable here: {', '.join(trainable)})")
    return REGISTRY[cfg.family]


def trains_causal(cfg: TrainConfig) -> bool:
    """Does a new run of `cfg` train next-token (True: a causal model) or masked tokens (False: a
    bidirectional encoder)? The one answer, read by the run, its parameter count and the Train panel. It is
    the attention mask of the model the run builds (model_config_for: the family preset with cfg.model
    over it): cfg.model's "causal" where the run overrides it, else the registry's Family.decoder, which is
    the family preset's `causal` (tests/core/training/test_training_objective.py checks both for every family).
    Never a family's name: RoBERTa and DistilBERT are encoders as BERT is. A resumed run reads its loaded
    model's own flag."""
    family = _trainable_family(cfg)
    return bool(cfg.model.get("causal", family.decoder))


def trains_seq2seq(cfg: TrainConfig) -> bool:
    """Does a new run of `cfg` build an encoder-decoder (its family preset's is_encoder_decoder)? Then the
    task is its sequence-to-sequence version (tasks.declare_seq2seq_task), trained with teacher forcing."""
    return bool(getattr(_trainable_family(cfg).preset(), "is_encoder_decoder", False))


def task_for(cfg: TrainConfig, causal: bool, tokenizer=None, encoder_decoder: bool | None = None) -> Task:
    """The run's task; `encoder_decoder` None: as the run's family builds it (trains_seq2seq)."""
    if encoder_decoder is None:
        encoder_decoder = trains_seq2seq(cfg)
    return make_task(cfg.task, task_options_for(cfg), causal=causal, tokenizer=tokenizer,
                     encoder_decoder=encoder_decoder)


class LossModel(nn.Module):
    """Wraps the Transformer so one forward returns (loss, correct, count): the unit DDP wraps.

    Logits are computed only where targets are scored (the last position for classification).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, src: torch.Tensor | None = None):
        if src is not None:  # an encoder-decoder, teacher-forced: the decoder reads inputs ([START] + target)
            logits = self.model(src, inputs, src_mask=source_mask(self.model, src)).logits
            scored = targets != IGNORE
            logits, y = logits[scored], targets[scored]
            loss = F.cross_entropy(logits.float(), y)
            return loss, hits(logits, y), y.numel()
        cfg = self.model.cfg
        # a mixture of experts trains with its router's load-balancing loss too (Mixtral's router_aux_loss_coef)
        routers = RouterLogits() if cfg.num_experts and cfg.router_aux_loss_coef else None
        hidden = self.model(inputs, compute_logits=False, trace=routers).hidden
        if self.model.cfg.lm_head_kind == "classifier":  # ViT: one class per image, read from [CLS] (targets [B, 1])
            logits, y = self.model.unembed(hidden), targets[:, 0]
            loss = F.cross_entropy(logits.float(), y)
            return loss, hits(logits, y), y.numel()
        scored = targets != IGNORE
        if bool(scored.all()):  # next-token tasks score every position: no gather (a copy) and its backward
            logits, y = self.model.unembed(hidden).flatten(0, -2), targets.flatten()
        else:
            logits, y = self.model.unembed(hidden[scored]), targets[scored]
        loss = F.cross_entropy(logits.float(), y)
        if routers is not None:
            loss = loss + cfg.router_aux_loss_coef * load_balancing_loss(routers.logits(), cfg.num_experts,
                                                                         cfg.experts_per_token)
        return loss, hits(logits, y), y.numel()


def hits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """How many rows of logits [N, classes] have their target as argmax. In float32, as the count of targets
    whose logit is the row's max: on the CPU argmax took ~10x the time of that max (bench training: ~2.5 ms of
    a 4-layer step on one thread); the two differ only where two logits tie exactly at the top, which rounding
    to 24 bits makes as good as impossible (bfloat16's 8 are not: there argmax counts, over the values made
    float32 exactly: the same index, where the CPU's bfloat16 argmax took 3.8 ms against 1.2 ms at 2048 x 512)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        return (logits.float().argmax(-1) == targets).sum()
    if logits.dtype != torch.float32:
        return (logits.argmax(-1) == targets).sum()
    return (logits.gather(-1, targets[..., None])[..., 0] >= logits.amax(-1)).sum()


def layer_groups(model: Transformer) -> dict[str, list[torch.nn.Parameter]]:
    """Parameters grouped as the plots show them: embed, blocks.0 .. blocks.L-1, head (an encoder-decoder:
    embed, encoder.blocks.0 ..., decoder.blocks.0 ..., head)."""
    groups: dict[str, list] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        parts = name.split(".")
        stack = parts[0] in ("encoder", "decoder")  # core.seq2seq's stacks
        if name.startswith("blocks.") or (stack and parts[1] == "blocks"):
            key = ".".join(parts[:3 if stack else 2])
        elif parts[stack] in ("tok_embed", "pos_embed", "type_embed", "embed_norm"):
            key = "embed"
        else:
            key = "head"
        groups.setdefault(key, []).append(p)
    return groups


def grad_norms(groups: dict[str, list[torch.nn.Parameter]]) -> dict[str, float]:
    """Each group's gradient norm (layer_groups' keys -> float)."""
    return {key: float(norm) for key, norm in _group_norms(groups).items()}


def _group_norms(groups: dict[str, list[torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    # torch's foreach norm: one op per group, where a norm per parameter took three (and a host read)
    norms = {}
    for key, params in groups.items():
        grads = [p.grad for p in params if p.grad is not None]
        norms[key] = get_total_norm(grads) if grads else torch.zeros((), device=params[0].device)
    return norms


def clip_gradients(model: nn.Module, groups: dict[str, list[torch.nn.Parameter]], clip: float | None,
                   per_group: bool) -> tuple[float, dict[str, float] | None]:
    """(the total gradient norm before clipping, each group's too when `per_group`), after scaling the
    gradients down to norm `clip` where they exceed it (None or 0: no clipping). The total is measured over
    all gradients at every step, never as the norm of the groups' norms: that rounds differently, and the
    clipping factor, so the trained model, then depended on log_every (the What if motif run: 86% or 100%)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = float(get_total_norm(grads))
    norms = _group_norms(groups) if per_group else None
    if clip and total + 1e-6 > clip:  # torch's clip_grad_norm_ factor, clip / (norm + 1e-6), where it is below 1
        # (where it is not, torch multiplies by 1): by a Python number, the norm being read already for the
        # events, ~3.5x faster on the CPU than torch's multiply by a 0-dim tensor
        torch._foreach_mul_(grads, clip / (total + 1e-6))
    return total, (None if norms is None else {k: float(v) for k, v in norms.items()})


def source_mask(model, src: torch.Tensor) -> torch.Tensor | None:
    """[B, S] True on an encoder-decoder's source tokens, False on its padding (None: no padding)."""
    pad = model.cfg.pad_token_id
    if pad is None:
        return None
    mask = src != pad
    return None if bool(mask.all()) else mask


@torch.no_grad()
def greedy_targets(model, src: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, steps] the tokens an encoder-decoder writes greedily for a batch of padded sources
    (core.seq2seq.greedy_batch; nothing stops at [END]: the caller reads up to it)."""
    return greedy_batch(model, src, steps, src_mask=source_mask(model, src))


@torch.no_grad()
def evaluate(model: Transformer, batch: Batch, batch_size: int, device, autocast,
             scores: dict[str, float] | None = None) -> tuple[float, float]:
    """Mean loss per scored token and token accuracy over a held-out set. For an encoder-decoder's set
    (batch.src), `scores` also gets EXACT_MATCH: the share of sources whose greedy decoding is the whole
    target up to and including its [END] (teacher forcing plays no part in it)."""
    was_training = model.training
    model.eval()
    wrapper = LossModel(model)
    total_loss, total_correct, total, exact = 0.0, 0, 0, 0
    for i in range(0, len(batch), batch_size):
        part = batch.rows(slice(i, i + batch_size)).to(device)
        with autocast():
            loss, correct, n = wrapper(part.inputs, part.targets, part.src)
            if part.src is not None:
                written = greedy_targets(model, part.src, part.targets.shape[1])
                exact += int(((written == part.targets) | (part.targets == IGNORE)).all(-1).sum())
        total_loss += float(loss) * n
        total_correct += int(correct)
        total += n
    model.train(was_training)
    if scores is not None and batch.src is not None:
        scores[EXACT_MATCH] = exact / max(len(batch), 1)
    return total_loss / max(total, 1), total_correct / max(total, 1)


@torch.no_grad()
def cross_attention_event(model, task: Task, val: Batch, step: int, candidates: int = 32) -> dict:
    """An encoder-decoder's "cross_attention" event at an evaluation: the last decoder layer's cross-attention
    [heads, T, S] of one held-out sentence (the longest source of the first `candidates`, the same at every
    evaluation), teacher-forced on its reference target: row i is the decoder writing target token i
    (`target`, ending with [END]), column j source token j (`source`); `written` is the model's own greedy
    translation of it. Plain lists, for the JSON-lines stream the Train panel draws live."""
    pad = getattr(task, "pad_id", None)
    lengths = (val.src[:candidates] != pad).sum(-1)
    i = int(lengths.argmax())
    src = val.src[i][val.src[i] != pad][None]
    n = int((val.targets[i] != IGNORE).sum())
    inputs, targets = val.inputs[i, :n][None], val.targets[i, :n]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    last = model.cfg.n_decoder_layers - 1
    name = f"decoder.blocks.{last}.cross_attn.pattern"
    _, trace = model.run_with_trace(src.to(device), inputs.to(device), names=(name,))
    written = greedy_targets(model, src.to(device), n)[0].tolist()
    model.train(was_training)
    end = getattr(task, "end_id", None)
    written = written[:written.index(end) + 1] if end in written else written
    pattern = trace[name][0].float().cpu()
    return {"event": "cross_attention", "step": step, "layer": last,
            "source": task.tokenizer.token_strings(src[0].tolist()),
            "target": task.tokenizer.token_strings(targets.tolist()),
            "written": task.tokenizer.token_strings(written),
            "pattern": [[[round(float(x), 5) for x in row] for row in head] for head in pattern]}


# -- checkpoints ------------------------------------------------------------------------------


def _rng_tensors(gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {"rng.batches": gen.get_state(), "rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def _restore_rng(rng: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    """Put back the RNG states _rng_tensors saved (CUDA ones only where this machine has those devices)."""
    gen.set_state(rng["rng.batches"])
    torch.set_rng_state(rng["rng.torch"])
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            if f"rng.cuda.{i}" in rng:
                torch.cuda.set_rng_state(rng[f"rng.cuda.{i}"], i)


def _metrics_csv(history: list[dict]) -> str:
    cols: list[str] = []
    for ev in history:
        for k, v in ev.items():
            if k not in cols and not isinstance(v, (dict, list)):
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for ev in history:
        w.writerow(ev)
    return buf.getvalue()


def save_checkpoint(out_dir: Path, model: Transformer, task: Task, opt: torch.optim.Optimizer,
                    cfg: TrainConfig, step: int, gen: torch.Generator, history: list[dict],
                    elapsed: float, scaler: "torch.amp.GradScaler | None" = None,
                    keeper: Keeper | None = None, keep: bool = False) -> None:
    """The run folder at `step` (atomic); with a `keeper`, its kept steps carried over, and this step kept
    too when `keep` (a model folder under checkpoints/, without the optimiser state)."""
    tensors, rest = optimizer_state_to_tensors(opt)
    tensors.update(_rng_tensors(gen))
    state = {"format": FORMAT, "step": step, "elapsed": elapsed, "optimizer": rest}
    if scaler is not None:  # float16: the loss scale and its growth count, so a resumed run goes on from them
        state["scaler"] = scaler.state_dict()
    run_file = cfg.to_json().encode()
    task_files = task.extra_files() if hasattr(task, "extra_files") else {}  # an image task's preprocessor_config.json
    extra_fill = None
    if keeper is not None:
        def write_kept(folder: Path) -> None:
            save_model_folder(model, folder, tokenizer=task.tokenizer, extra_files={RUN_FILE: run_file, **task_files})
        extra_fill = keeper.fill(step if keep else None, write_kept)
    save_model_folder(model, out_dir, tokenizer=task.tokenizer, extra_files={
        OPTIM_FILE: st_save(tensors),
        STATE_FILE: json.dumps(state, indent=1).encode(),
        RUN_FILE: run_file,
        METRICS_JSON: json.dumps(history).encode(),
        METRICS_CSV: _metrics_csv(history).encode(),
        **task_files,
    }, extra_fill=extra_fill)


def checkpoint_folder(out_dir: str | Path) -> Path | None:
    """The folder holding out_dir's checkpoint (out_dir, or the app's own .old twin an interrupted
    checkpoint left), None when there is none (no trainer_state.json)."""
    for d in (Path(out_dir), interrupted_copy(out_dir)):
        if d is not None and (d / STATE_FILE).is_file():
            return d
    return None


def checkpoint_step(out_dir: str | Path) -> int | None:
    """The step of the checkpoint in out_dir (or its .old twin), None when there is none or its
    trainer_state.json cannot be read (a resumed run says why: read_trainer_state)."""
    d = checkpoint_folder(out_dir)
    try:
        return read_step(d) if d is not None else None
    except ModelLoadError:
        return None


def read_run_config(out_dir: str | Path) -> TrainConfig:
    d = Path(out_dir)
    if not (d / RUN_FILE).is_file():
        d = interrupted_copy(d) or d  # never a user's own folder that happens to be called RUN.old
    f = d / RUN_FILE
    if not f.is_file():
        raise ModelLoadError(d, f"no {RUN_FILE}: not a training checkpoint, cannot resume")
    return TrainConfig.from_json(f.read_text(encoding="utf-8"), f)


def run_sample_text(run_dir: str | Path, loaded) -> tuple[str, str] | None:
    """(task name, one sample of the task as text) for a model folder a training run wrote, or None
    when the folder has no run notes or the task cannot be rebuilt (its text file is gone...). A task
    model's tokenizer knows only the task's tokens, so this is the text the app shows for it."""
    from .tasks import TaskError, sample_text

    if not (Path(run_dir) / RUN_FILE).is_file() and interrupted_copy(run_dir) is None:
        return None
    try:
        cfg = read_run_config(run_dir)
        return cfg.task, sample_text(task_for(cfg, loaded.config.causal, tokenizer=loaded.tokenizer), cfg.seed)
    except (ModelLoadError, TaskError, ValueError, OSError):
        return None


# -- the loop ---------------------------------------------------------------------------------


def _dist_info() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world


def _autocast_factory(device: torch.device, precision: str):
    if precision == "float32":
        return lambda: torch.autocast(device.type, enabled=False)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(precision)
    if dtype is None:
        raise ValueError(f"unknown precision {precision!r} (float32, bfloat16, float16)")
    if dtype == torch.float16 and device.type != "cuda":
        raise ValueError("float16 mixed precision needs CUDA; use bfloat16 on CPU")
    return lambda: torch.autocast(device.type, dtype=dtype)


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False,
          on_event: Callable[[dict], None] | None = None, control: JobControl | None = None) -> dict:
    """Train (or resume) a run into `out_dir`, which is locked while the run writes it (files.lock_folder):
    a second run on the same folder is refused at once (FolderLockedError, naming the holder); the
    lock of a killed run is taken over, and the start event's "notes" say so."""
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to build the temporary sibling from
    if _dist_info()[0] != 0:  # under torchrun rank 0 holds the lock; the other ranks write nothing
        return _train(cfg, out_dir, resume, on_event, control)
    notes: list[str] = []
    with lock_folder(out_dir, on_note=notes.append):
        return _train(cfg, out_dir, resume, on_event, control, notes)


def _train(cfg: TrainConfig, out_dir: Path, resume: bool, on_event: Callable[[dict], None] | None,
           control: JobControl | None, notes: list[str] = ()) -> dict:
    rank, world = _dist_info()
    is_main = rank == 0
    if resume and checkpoint_folder(out_dir) is None:  # never start over silently
        raise ValueError(f"{out_dir}: no checkpoint to resume from; start a new run without --resume")
    if is_main:  # before the first step, not at the first checkpoint
        remove_leftovers(out_dir)
        probe_writable(out_dir)
    emit = (on_event if (on_event is not None and is_main) else (lambda ev: None))
    device = resolve_device(cfg.device)
    if world > 1:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if cfg.batch_size % world:
            raise ValueError(f"batch size {cfg.batch_size} is not divisible by {world} processes")

    history: list[dict] = []
    start_step, elapsed_before = 0, 0.0
    state: dict | None = None
    changed: dict[str, list] = {}
    if resume:
        loaded = load_model_folder(out_dir, device=device, for_training=True)
        ckpt_dir = loaded.path if (loaded.path / STATE_FILE).is_file() else (interrupted_copy(out_dir) or out_dir)
        saved = read_run_config(ckpt_dir)
        fixed = [(key, getattr(saved, key), getattr(cfg, key)) for key in FIXED_ON_RESUME]
        fixed += [(f"model.{k}", getattr(loaded.config, k), v) for k, v in cfg.model.items()
                  if hasattr(loaded.config, k) and k not in ("init", "dropout")]
        for key, was, now in fixed:
            if was != now:
                raise ValueError(f"{out_dir}: the checkpoint was trained with {key}={was!r}, not {now!r}; a resumed "
                                 "run keeps its task and model (train a new run in another folder to change them)")
        changed = {k: [getattr(saved, k), getattr(cfg, k)] for k in TUNABLE_ON_RESUME
                   if getattr(saved, k) != getattr(cfg, k)}
        model = loaded.model
        model_cfg = loaded.config
        task = task_for(cfg, model_cfg.causal, tokenizer=loaded.tokenizer,
                        encoder_decoder=bool(getattr(model_cfg, "is_encoder_decoder", False)))
        checked = read_trainer_state(ckpt_dir)  # every field checked, naming the file and the field
        state = {"step": checked.step, "elapsed": checked.elapsed, "optimizer": checked.optimizer,
                 "scaler": checked.scaler}
        opt_tensors = read_optimizer_tensors(ckpt_dir)
        history = read_metrics(ckpt_dir)
        start_step, elapsed_before = checked.step, checked.elapsed
    else:
        torch.manual_seed(cfg.seed)
        task = task_for(cfg, trains_causal(cfg))
        model_cfg = model_config_for(cfg, task)
        model = new_model(model_cfg, seed=cfg.seed).to(device)
        opt_tensors = None

    model.train()
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)  # no decay on biases and norm gains
    opt = make_optimizer(cfg.optimizer, [{"params": decay, "weight_decay": cfg.weight_decay},
                                         {"params": no_decay, "weight_decay": 0.0}],
                         lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, momentum=cfg.momentum)
    gen = torch.Generator().manual_seed(cfg.seed)
    if state is not None:
        rng = {k: v for k, v in opt_tensors.items() if k.startswith("rng.")}
        try:  # shapes and groups that do not fit this model: torch's words, with the files named
            opt.load_state_dict(optimizer_state_from_tensors(
                {k: v.to(device) for k, v in opt_tensors.items() if not k.startswith("rng.")}, state["optimizer"]))
            _restore_rng(rng, gen)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelLoadError(ckpt_dir / STATE_FILE, f"the optimiser state (with {OPTIM_FILE}) does not fit "
                                                        f"this model: {why}") from None
        use_fused_step(opt)  # the saved groups carry the writing run's choice; this machine's applies
        # the saved groups carry the old hyper-parameters; the caller's apply from here on (lr is set per step)
        for g, decay in zip(opt.param_groups, (cfg.weight_decay, 0.0)):
            g["weight_decay"] = decay
            if "momentum" in g:
                g["momentum"] = cfg.momentum
            if cfg.betas is not None and "betas" in g:
                g["betas"] = tuple(cfg.betas)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "float16" else None
    if scaler is not None and state is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])  # else (an older checkpoint) it starts again at 65536

    loop = Loop(cfg, start_step, elapsed_before, resumed=state is not None)
    run = _ModelRun(cfg, model, task, opt, scaler, gen, history, out_dir, device, world, rank, emit, start_step,
                    resume)
    keep_plan = run.keeper.plan(start_step if state is None else start_step + 1, cfg.steps,
                                model_bytes(model, task.tokenizer))
    emit({"event": "start", "step": start_step, "steps": cfg.steps, "parameters": model.num_parameters(),
          "task": task.describe(), "model": model_cfg.to_dict(), "out": str(out_dir), "world_size": world,
          "device": str(device), **({"changed": changed} if changed else {}),
          **({"notes": list(notes)} if notes else {}), **({"keep": keep_plan} if keep_plan else {})})
    try:
        stopped = loop.run(run, control, emit)
    except TrainingDiverged as exc:
        where = (f"the last good checkpoint (step {loop.last_checkpoint}) in {out_dir} is kept"
                 if loop.last_checkpoint is not None else "no checkpoint had been written yet")
        msg = f"{exc}; training stopped, {where}. Try a lower learning rate or gradient clipping."
        emit({"event": "error", "step": loop.step, "message": msg})
        raise TrainingDiverged(msg) from None
    finally:
        if world > 1:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
    summary = run.summary
    summary["step"] = loop.step
    if stopped:
        emit({"event": "stopped", "step": loop.step, **{k: summary[k] for k in SUMMARY_KEYS}})
    else:
        emit({"event": "done", **summary, "elapsed": loop.elapsed})
    return summary


class _ModelRun(Run):
    """A model's training run in the loop (loop.py): the steps on the task's batches, the "step" and "eval"
    events, the run folder's checkpoints and kept steps."""

    def __init__(self, cfg: TrainConfig, model: Transformer, task: Task, opt: torch.optim.Optimizer, scaler,
                 gen: torch.Generator, history: list[dict], out_dir: Path, device: torch.device, world: int,
                 rank: int, emit: Callable[[dict], None], start_step: int, resume: bool) -> None:
        self.cfg, self.model, self.task, self.opt, self.scaler, self.gen = cfg, model, task, opt, scaler, gen
        self.history, self.out_dir, self.device, self.world, self.rank, self.emit = \
            history, out_dir, device, world, rank, emit
        self.wrapped: nn.Module = LossModel(model)
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.wrapped = DDP(self.wrapped, device_ids=[device.index] if device.type == "cuda" else None)
        self.groups = layer_groups(model)
        self.autocast = _autocast_factory(device, cfg.precision)
        self.val = task.val_set(cfg.seed)
        self.d_model = model.cfg.d_model
        self.summary: dict[str, Any] = {"step": start_step, **{k: None for k in SUMMARY_KEYS}}
        for ev in history:
            self.summary.update({k: ev[k] for k in (*SUMMARY_KEYS, EXACT_MATCH) if k in ev})
        self.keeper = Keeper(out_dir, cfg.keep_every, cfg.keep_spacing, cfg.keep_max_gb, start_step, resume, emit)
        # the last step's measures, and those since the last "step" event and the last evaluation
        self.lr, self.grad_norm, self.grad_norms = 0.0, 0.0, None
        self.window_tokens, self.window_time, self.window_loss, self.window_n = 0, 0.0, 0.0, 0
        self.interval_correct, self.interval_scored = 0, 0  # training accuracy since the last evaluation

    def step(self, loop: Loop) -> None:
        cfg, opt, scaler, device, world = self.cfg, self.opt, self.scaler, self.device, self.world
        step = loop.step
        t0 = time.perf_counter()
        lr = self.lr = lr_at(step - 1, cfg.schedule, cfg.lr, cfg.steps, cfg.warmup_steps, self.d_model)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = self.task.train_batch(cfg.batch_size, self.gen)
        if world > 1:
            batch = batch.rows(slice(self.rank, None, world))
        x, y = batch.inputs.to(device), batch.targets.to(device)
        src = None if batch.src is None else batch.src.to(device)
        with self.autocast():
            loss, correct, scored = self.wrapped(x, y, src) if src is not None else self.wrapped(x, y)
        loss_value = float(loss.detach())
        if world > 1:  # report the global batch's loss and accuracy, as one process would
            import torch.distributed as dist
            t = torch.stack([loss.detach().float(), correct.float(),
                             torch.tensor(float(scored), device=correct.device)])
            dist.all_reduce(t)
            loss_value = float(t[0]) / world
            correct, scored = t[1], t[2]
        self.interval_correct += int(correct)
        self.interval_scored += int(scored)
        if not math.isfinite(loss_value):
            raise TrainingDiverged(f"the loss became {loss_value} at step {step}")
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        total_norm, self.grad_norms = clip_gradients(self.model, self.groups, cfg.grad_clip, loop.logs(step))
        self.grad_norm = total_norm
        if not math.isfinite(total_norm) and scaler is None:
            raise TrainingDiverged(f"the gradient norm became {total_norm} at step {step}")
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        self.window_tokens += (x.shape[0] * self.task.seq_len if x.dim() == 4 else x.numel()) * world  # images: [CLS] + patches
        if src is not None:  # an encoder-decoder reads its source too
            self.window_tokens += src.numel() * world
        self.window_time += time.perf_counter() - t0
        self.window_loss += loss_value
        self.window_n += 1

    def log(self, loop: Loop) -> None:
        ev = {"event": "step", "step": loop.step, "steps": loop.steps, "train_loss": self.window_loss / self.window_n,
              "train_accuracy": self.interval_correct / max(self.interval_scored, 1), "lr": self.lr,
              "grad_norm": self.grad_norm, "grad_norms": self.grad_norms,
              "tokens_per_s": self.window_tokens / max(self.window_time, 1e-9), "elapsed": loop.elapsed,
              "eta": loop.eta}
        self.history.append({k: v for k, v in ev.items() if k != "grad_norms"} |
                            {f"grad_norm.{k}": v for k, v in self.grad_norms.items()})
        self.summary.update(step=loop.step, train_loss=ev["train_loss"], train_accuracy=ev["train_accuracy"])
        self.emit(ev)
        self.window_tokens, self.window_time, self.window_loss, self.window_n = 0, 0.0, 0.0, 0

    def evaluate(self, loop: Loop) -> None:
        cfg, model, val, step = self.cfg, self.model, self.val, loop.step
        scores: dict[str, float] = {}  # an encoder-decoder's held-out exact match
        val_loss, val_acc = evaluate(model, val, cfg.batch_size * 4, self.device, self.autocast, scores)
        if not math.isfinite(val_loss):
            raise TrainingDiverged(f"the validation loss became {val_loss} at step {step}")
        train_acc = self.interval_correct / self.interval_scored if self.interval_scored else None
        ev = {"event": "eval", "step": step, "val_loss": val_loss, "val_accuracy": val_acc,
              "train_accuracy": train_acc, **scores, "elapsed": loop.elapsed}
        if model.cfg.num_experts:  # a mixture's router balance over the held-out inputs (not kept per expert)
            load = expert_load(model, val.inputs[:cfg.batch_size * 4].to(self.device))
            ev.update(expert_load=load.tolist(), expert_load_max=float(load.max()) * model.cfg.num_experts)
        self.history.append({k: v for k, v in ev.items() if k != "expert_load"})
        self.summary.update(step=step, val_loss=val_loss, val_accuracy=val_acc, **scores)
        if train_acc is not None:
            self.summary["train_accuracy"] = train_acc
        self.interval_correct, self.interval_scored = 0, 0
        self.emit(ev)
        if val.src is not None and self.rank == 0:  # the live cross-attention of a held-out sentence (not kept)
            self.emit(cross_attention_event(model, self.task, val, step))

    def keeps(self, step: int) -> bool:
        return self.keeper.wants(step)

    def checkpoint(self, loop: Loop) -> None:
        step = loop.step
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # never overwrite a good checkpoint with broken weights
            raise TrainingDiverged(f"parameters became non-finite by step {step} ({bad[0]})")
        if self.rank == 0:
            keep = self.keeper.decide(step)
            save_checkpoint(self.out_dir, self.model, self.task, self.opt, self.cfg, step, self.gen, self.history,
                            loop.elapsed, self.scaler, self.keeper, keep)
            self.emit({"event": "checkpoint", "step": step, "path": str(self.out_dir),
                       **({"kept": True} if keep else {})})


def export_model(checkpoint_dir: str | Path, export_dir: str | Path) -> None:
    """Write a clean model folder (no optimiser state or RNG) from a checkpoint, with its run notes."""
    checkpoint_dir = Path(checkpoint_dir)
    with contextlib.ExitStack() as held:  # no run swaps either folder while this reads and writes
        try:
            held.enter_context(lock_folder(checkpoint_dir))
        except WriteError:  # a checkpoint beside which nothing can be written (read-only) is read as it is
            pass
        held.enter_context(lock_folder(export_dir))
        _export_model(checkpoint_dir, Path(export_dir))


def _export_model(checkpoint_dir: Path, export_dir: Path) -> None:
    loaded = load_model_folder(checkpoint_dir)
    src = checkpoint_dir if (checkpoint_dir / RUN_FILE).is_file() else (interrupted_copy(checkpoint_dir)
                                                                       or checkpoint_dir)
    extra = {name: (src / name).read_bytes() for name in (RUN_FILE, METRICS_JSON, METRICS_CSV, "preprocessor_config.json")
             if (src / name).is_file()}
    save_model_folder(loaded.model, export_dir, tokenizer=loaded.tokenizer, extra_files=extra)


def parameter_count(model_cfg: ModelConfig) -> int:
    """Parameters of a configuration without allocating it (built on the meta device)."""
    with torch.device("meta"):
        return model_class(model_cfg)(model_cfg).num_parameters()


def task_vocab_size(cfg: TrainConfig) -> int | None:
    """The vocabulary a run will have, cheaply (None when it needs the text read and tokenized)."""
    if cfg.task != "text":
        return task_for(cfg, trains_causal(cfg)).vocab_size
    opts = cfg.task_options
    return int(opts.get("vocab_size", 512)) if opts.get("tokenizer") == "bpe" else None

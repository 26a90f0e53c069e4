"""Training a sparse dictionary (an SAE, or a transcoder) on a loaded model's activations over a text.

Three tasks share this trainer (SaeTrainConfig.task; its steps run in loop.py's loop):
    sae         one dictionary at `hook` (a SAELens transcoder when `hook_out` is given), SAELens' format
    transcoder  a per-layer transcoder at every layer (circuit-tracer's PLT): layer l's features read the MLP
                input after the pre-MLP norm's gain (circuit-tracer's mlp.hook_in, the app's blocks.l.mlp.input)
                and reconstruct that layer's MLP output (mlp.hook_out)
    clt         a cross-layer transcoder: layer l's encoder reads layer l's MLP input and its decoder writes to
                every MLP output from l on (the reconstruction of layer t's output sums layers l <= t)
The last two train with relu (an L1 penalty scaled by the decoder norms, summed over the layers written),
the squared error of each layer weighted by 1 / its output's variance (the layers count alike), and save in
circuit-tracer's format (core.graphs.transcoders: `graph --transcoders` reads the folder); their evaluations
add each layer's variance explained and L0 and the replacement score of the graph (core.graphs) of the
first REPLACEMENT_TOKENS held-out tokens.

`train_sae(cfg, loaded, out_dir, on_event=..., control=...)`: the text file is tokenized in pieces
(core.inputs.text_file_ids), its last `heldout_fraction` of tokens held out, and the model run over
windows of its context (up to `max_tokens` tokens) to collect the activation at `hook` (and at
`hook_out` for a transcoder). The inputs are scaled by one constant so that their mean squared norm
is d_in (SAELens' "expected_average_only_in"); the scale is folded back into the weights on saving,
so the saved dictionary reads the model's own activations.

Architectures:
    topk   acts = relu of the k largest pre-activations; loss = |x - x_hat|^2 (summed over d, mean over tokens)
    relu   acts = relu(pre); loss = |x - x_hat|^2 + l1_coefficient x sum_i acts_i |W_dec_i| (SAELens' standard
           SAE, its L1 scaled by the decoder norms)
A transcoder (`hook_out` given: it reads `hook` and reconstructs `hook_out`) trains with relu only (SAELens'
format has no TopK transcoder); its input is not centred by b_dec.
Adam, a linear warmup over the first 5% of steps, shuffled tokens. Events (plain dicts, like the
trainer's): "start", "step" every log_every steps (loss, mse, l0, variance_explained on the batch,
dead: features that have not fired in the last DEAD_STEPS steps, lr), "eval" every eval_every steps and
at the end (the same measured on the held-out tokens), "checkpoint", "paused"/"resumed", "stopped", "done".
The dictionary is saved in SAELens' format (cfg.json + sae_weights.safetensors) with metrics.json and the
training state beside (SAE_STATE_FILE, SAE_STATE_TENSORS: the weights in the training scale, Adam's moments,
the batch order and RNG), atomically, every checkpoint_every steps, at a stop and at the end; the folder is
locked while the run writes it. `train_sae(..., resume=True)` goes on from that state exactly (the same
weights as an uninterrupted run); it refuses another text, model, hook or shape (SAE_FIXED_ON_RESUME).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..jobs import JobControl
from ..numbers import MAX_COUNT, Range
from .loop import RunConfig
from .options import Option

SAE_ARCHITECTURES = ("topk", "relu")
SAE_TASKS = ("sae", "transcoder", "clt")  # `train --task`: a dictionary, a per-layer or a cross-layer transcoder
REPLACEMENT_TOKENS = 32  # the held-out prompt whose graph's replacement score an evaluation reports
REPLACEMENT_FEATURE_NODES = 2048  # at most this many feature rows for that graph (all of a small model's)
DEAD_STEPS = 200
SAE_STATE_FILE = "sae_trainer_state.json"  # beside the dictionary: what a resumed run goes on from
SAE_STATE_TENSORS = "sae_trainer_state.safetensors"  # its weights in the training scale, Adam's moments, RNG, order
SAE_STATE_FORMAT = 1
# what a resumed run keeps (the activations it reads and the dictionary's shape); the rest may change
SAE_FIXED_ON_RESUME = ("task", "text_file", "hook", "hook_out", "architecture", "d_sae", "k", "seed", "max_tokens",
                       "heldout_fraction")
SAE_OPTIONS: tuple[Option, ...] = (  # `train --task sae`'s own flags (beside --text-file, --steps, --lr, ...)
    Option("model_dir", "sae", str, flag="model", help="sae: the model folder whose activations are read"),
    Option("hook", "sae", str, "blocks.0.hook_resid_post",
           help="sae: the activation read (TransformerLens name, e.g. blocks.2.hook_resid_post, or the app's)"),
    Option("hook_out", "sae", str, help="sae: train a transcoder writing this activation (e.g. blocks.2.hook_mlp_out)"),
    Option("architecture", "sae", str, "topk", choices=SAE_ARCHITECTURES, help="sae: topk or relu (with L1)"),
    Option("d_sae", "sae", int, 512, Range(int, 1, 2**20), help="sae: number of features"),
    Option("k", "sae", int, 16, Range(int, 1, 2**20), help="sae: active features per token (topk)"),
    Option("l1_coefficient", "sae", float, 2.0, Range(float, 0, 1e6), help="sae: L1 penalty (relu)"),
    Option("max_tokens", "sae", int, 500_000, Range(int, 1, MAX_COUNT), help="sae: at most this many tokens of "
                                                                            "activations are collected"),
)


@dataclass(kw_only=True)
class SaeTrainConfig(RunConfig):
    """A dictionary's training run: RunConfig's settings (a step's batch is of tokens) and the dictionary's."""
    text_file: str
    task: str = "sae"  # SAE_TASKS
    hook: str = "blocks.0.hook_resid_post"
    hook_out: str | None = None
    architecture: str = "topk"
    d_sae: int = 512
    k: int = 16
    l1_coefficient: float = 2.0
    steps: int = 2000
    batch_size: int = 256  # tokens per step
    eval_every: int = 200
    max_tokens: int = 500_000
    heldout_fraction: float = 0.1

    @property
    def layered(self) -> bool:
        """A transcoder at every layer (per-layer or cross-layer) rather than one dictionary at `hook`."""
        return self.task in ("transcoder", "clt")

    def problem(self) -> str:
        if self.task not in SAE_TASKS:
            return f"task must be one of {', '.join(SAE_TASKS)}, got {self.task!r}"
        if self.layered and self.architecture != "relu":
            return (f"--task {self.task} trains with architecture relu (an L1 penalty); circuit-tracer's TopK "
                    f"keeps negative values, which this trainer does not")
        if self.architecture not in SAE_ARCHITECTURES:
            return f"architecture must be one of {', '.join(SAE_ARCHITECTURES)}, got {self.architecture!r}"
        for key, lo in (("d_sae", 1), ("k", 1), ("steps", 1), ("batch_size", 1), ("log_every", 1),
                        ("eval_every", 1), ("checkpoint_every", 1), ("max_tokens", 2)):
            value = getattr(self, key)
            if not isinstance(value, int) or value < lo:
                return f"{key} must be an integer >= {lo}, got {value!r}"
        if self.hook_out and self.architecture == "topk":
            return "a transcoder (hook_out) trains with architecture relu: SAELens' format has no TopK transcoder"
        if self.architecture == "topk" and self.k > self.d_sae:
            return f"k ({self.k}) must be at most d_sae ({self.d_sae})"
        if not (math.isfinite(self.lr) and self.lr > 0):
            return f"lr must be > 0, got {self.lr!r}"
        if not (math.isfinite(self.l1_coefficient) and self.l1_coefficient >= 0):
            return f"l1_coefficient must be >= 0, got {self.l1_coefficient!r}"
        if not 0 < self.heldout_fraction < 1:
            return f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}"
        return ""


def collect_activations(loaded, ids, reads, writes, max_tokens: int, window: int | None = None,
                        control: JobControl | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_in [N, len(reads), d_in], target [N, len(writes), d_out]) float32 of the model over `ids` in windows
    of its context (the same tensor twice when reads and writes are the same points)."""
    from ..features.activations import read_point, record_points

    model = loaded.model
    window = window or model.cfg.context_length
    same = [p.name for p in reads] == [p.name for p in writes]
    xs, ys, n = [], [], 0
    for s in range(0, len(ids), window):
        if control is not None:
            control.check()
        chunk = list(ids[s:s + window])[: max_tokens - n]
        if not chunk:
            break
        trace = record_points(model, chunk, (*reads, *writes))  # an encoder-decoder: the chunk as its source
        xs.append(torch.stack([read_point(trace, p).float().cpu() for p in reads], 1))
        ys.append(xs[-1] if same else torch.stack([read_point(trace, p).float().cpu() for p in writes], 1))
        n += len(chunk)
        if n >= max_tokens:
            break
    x = torch.cat(xs)
    return x, (x if same else torch.cat(ys))


class _Sae(torch.nn.Module):
    def __init__(self, d_in: int, d_out: int, d_sae: int, transcoder: bool, gen: torch.Generator) -> None:
        super().__init__()
        W_dec = torch.randn(d_sae, d_out, generator=gen)
        W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True) * 0.1
        self.W_dec = torch.nn.Parameter(W_dec)
        self.W_enc = torch.nn.Parameter(W_dec.T.clone() if not transcoder else
                                        torch.randn(d_in, d_sae, generator=gen) * (0.1 / math.sqrt(d_in)))
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_out))
        self.transcoder = transcoder

    def forward(self, x: torch.Tensor, arch: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        pre = (x if self.transcoder else x - self.b_dec) @ self.W_enc + self.b_enc
        if arch == "topk":
            top = pre.topk(k, dim=-1, sorted=False)
            acts = torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        else:
            acts = torch.relu(pre)
        return acts, acts @ self.W_dec + self.b_dec


class _LayerTranscoders(torch.nn.Module):
    """A transcoder at every layer, per-layer or cross-layer, in the training scale: x [B, L, d] (each layer's
    MLP input) -> (acts [B, L, F], recon [B, L, d] of each layer's MLP output). W_dec.l is [F, outputs, d]:
    source layer l's decoder to the outputs l..L-1 (cross-layer) or to l alone."""

    def __init__(self, n_layers: int, d_in: int, d_out: int, d_sae: int, cross_layer: bool,
                 gen: torch.Generator) -> None:
        super().__init__()
        self.cross_layer = cross_layer
        self.W_enc = torch.nn.Parameter(torch.randn(n_layers, d_in, d_sae, generator=gen) * (0.1 / math.sqrt(d_in)))
        self.b_enc = torch.nn.Parameter(torch.zeros(n_layers, d_sae))
        decoders = []
        for l in range(n_layers):
            W = torch.randn(d_sae, n_layers - l if cross_layer else 1, d_out, generator=gen)
            decoders.append(torch.nn.Parameter(W / W.norm(dim=-1, keepdim=True) * (0.1 / (n_layers - l if cross_layer else 1))))
        self.W_dec = torch.nn.ParameterList(decoders)
        self.b_dec = torch.nn.Parameter(torch.zeros(n_layers, d_out))

    def decoder_norms(self) -> torch.Tensor:
        """[L, F]: each feature's decoder norm summed over the layers it writes to (the L1 penalty's scale)."""
        return torch.stack([W.norm(dim=-1).sum(-1) for W in self.W_dec])

    def forward(self, x: torch.Tensor, arch: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        acts = torch.relu(torch.einsum("bld,ldf->blf", x, self.W_enc) + self.b_enc)
        outs = [self.b_dec[t].expand(len(x), -1) for t in range(len(self.W_dec))]
        for l, W in enumerate(self.W_dec):
            written = torch.einsum("bf,fod->bod", acts[:, l], W)  # [B, outputs, d]
            for o in range(W.shape[1]):
                outs[l + o] = outs[l + o] + written[:, o]
        return acts, torch.stack(outs, 1)


def _measure(sae, x: torch.Tensor, y: torch.Tensor, cfg: SaeTrainConfig, batch: int = 4096) -> dict:
    """Held-out metrics over every token (in batches): mse, l0, variance_explained, dead (never fired); for
    a transcoder at every layer (x [N, L, d]) also each layer's variance_explained and l0 (l0: per layer)."""
    layered = x.dim() == 3
    L = y.shape[1] if layered else 1
    err, total, l0 = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64), torch.zeros(L)
    fired = None
    mean = y.double().mean(0)
    with torch.no_grad():
        for s in range(0, len(x), batch):
            acts, recon = sae(x[s:s + batch], cfg.architecture, cfg.k)
            yb = y[s:s + batch]
            diff, dev = (yb - recon).double().pow(2), (yb.double() - mean).pow(2)
            err += diff.sum(-1).sum(0) if layered else diff.sum()
            total += dev.sum(-1).sum(0) if layered else dev.sum()
            on = acts > 0
            l0 += on.sum(-1).sum(0).float() if layered else on.sum().float()
            fired = on.any(0) if fired is None else fired | on.any(0)
    n = max(len(x), 1)
    tot = float(total.sum())
    out = {"mse": float(err.sum()) / n, "l0": float(l0.sum()) / n / L,
           "variance_explained": 1 - float(err.sum()) / tot if tot > 0 else float("nan"),
           "dead": int((~fired).sum()) if fired is not None else 0}
    if layered:
        out["variance_explained_per_layer"] = [1 - float(e) / float(t) if t > 0 else float("nan")
                                               for e, t in zip(err, total)]
        out["l0_per_layer"] = [float(v) / n for v in l0]
    return out


def _replacement_score(loaded, transcoders, ids: list[int]) -> float | None:
    """The replacement score (core.graphs.graph_scores) of the graph of the model's prediction after `ids`
    (a special token put first, as `graph` does) over `transcoders`; None when the prompt is too short."""
    from ..graphs import attribute, build_context, graph_scores, salient_targets, with_leading_special

    # the special token put first must not push the prompt past the model's context
    ids = with_leading_special(ids, loaded.tokenizer)[:loaded.model.cfg.context_length]
    if len(ids) < 2:
        return None
    with torch.no_grad():
        ctx = build_context(loaded.model, ids, transcoders)
    targets = salient_targets(loaded.model, ctx.frozen.logits[-1], 10, 0.95, str)
    graph = attribute(ctx, targets, max_feature_nodes=REPLACEMENT_FEATURE_NODES)
    return graph_scores(graph)[0]


def _state_problem(state, tensors: dict, cfg: SaeTrainConfig, n_layers: int = 1) -> str:
    """'' when a read checkpoint state (JSON object, tensors) can be resumed, else what is wrong with it."""
    if not isinstance(state, dict) or state.get("format") != SAE_STATE_FORMAT:
        return f"not a dictionary training state of format {SAE_STATE_FORMAT}"
    kinds = {int: ("an integer", int), float: ("a number", (int, float)), dict: ("an object", dict),
             list: ("a list", list)}
    for key, kind in (("step", int), ("pos", int), ("tokens", int), ("scale", float), ("out_scale", float),
                      ("elapsed", float), ("config", dict), ("history", list), ("optimizer", dict)):
        value = state.get(key)
        what, types = kinds[kind]
        if isinstance(value, bool) or not isinstance(value, types):
            return f"'{key}' must be {what}, got {value!r:.60}"
        if kind is float and not (math.isfinite(value) and value >= 0):
            return f"'{key}' must be a finite number >= 0, got {value!r}"
    if not 0 <= state["pos"] <= state["tokens"] or state["step"] < 0:
        return f"'step' {state['step']} / 'pos' {state['pos']} out of range"
    need = {f"sae.{k}" for k in ("W_enc", "b_enc", "b_dec")} | {"rng.batches", "last_fired", "perm"}
    need |= {f"sae.W_dec.{l}" for l in range(n_layers)} if cfg.layered else {"sae.W_dec"}
    missing = sorted(need - set(tensors))
    if missing:
        return f"no tensor {missing[0]!r}"
    features = (n_layers, cfg.d_sae) if cfg.layered else (cfg.d_sae,)
    if tuple(tensors["last_fired"].shape) != features or tuple(tensors["perm"].shape) != (state["tokens"],):
        return "its tensors do not match its settings"
    return ""


def read_sae_checkpoint(out_dir: str | Path) -> tuple[dict, dict] | None:
    """(state, tensors) of the resumable checkpoint in a dictionary training folder (or the .old copy an
    interrupted save left), None when it holds none; ValueError naming the file for a damaged one."""
    from safetensors.torch import load as st_load

    from ..files import JsonFileError, interrupted_copy, read_json

    folder = next((d for d in (Path(out_dir), interrupted_copy(out_dir))
                   if d is not None and (d / SAE_STATE_FILE).is_file()), None)
    if folder is None:
        return None
    try:
        state = read_json(folder / SAE_STATE_FILE)
    except JsonFileError as exc:
        raise ValueError(str(exc)) from None
    path = folder / SAE_STATE_TENSORS
    try:
        tensors = st_load(path.read_bytes())
    except FileNotFoundError:
        raise ValueError(f"{path}: is missing; the checkpoint is incomplete") from None
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors: a corrupt or truncated file
        raise ValueError(f"{path}: corrupt or truncated safetensors file ({str(exc)[:80]})") from None
    return state, tensors


def sae_checkpoint_step(out_dir: str | Path) -> int | None:
    """The step of a dictionary training folder's checkpoint, None when it holds none (or an unreadable one)."""
    try:
        read = read_sae_checkpoint(out_dir)
    except ValueError:
        return None
    step = read[0].get("step") if read is not None and isinstance(read[0], dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _fixed(values: dict) -> dict:
    """The settings a resumed run keeps (SAE_FIXED_ON_RESUME), the text file as an absolute path."""
    defaults = {"task": "sae"}  # a run saved before the task was a setting trained a dictionary
    return {k: os.path.abspath(str(values.get(k))) if k == "text_file" else values.get(k, defaults.get(k))
            for k in SAE_FIXED_ON_RESUME}


def _model_name(loaded) -> str:
    return str(Path(loaded.path).resolve()) if getattr(loaded, "path", None) else str(loaded.name)


def sae_resume_problem(out_dir: str | Path, state, tensors: dict, cfg: SaeTrainConfig, loaded) -> str:
    """'' when the checkpoint read from `out_dir` (read_sae_checkpoint's state and tensors) can go on with
    `cfg` on `loaded`, else one line naming the folder: a change of what a resumed run keeps
    (SAE_FIXED_ON_RESUME), a damaged state, another model, no steps left to train."""
    out_dir = Path(out_dir)
    saved = state.get("config") if isinstance(state, dict) else None
    if isinstance(saved, dict):  # a change of what the run keeps first: its tensors would not fit either
        was, now = _fixed(saved), _fixed(asdict(cfg))
        changed = [k for k in SAE_FIXED_ON_RESUME if was[k] != now[k]]
        if changed:
            k = changed[0]
            return (f"{out_dir}: its dictionary was trained with {k} {saved.get(k)!r}, not "
                    f"{getattr(cfg, k)!r}; a resumed run keeps {k} (start a new run to change it)")
    problem = _state_problem(state, tensors, cfg, loaded.config.n_layers)
    if problem:
        return f"{out_dir / SAE_STATE_FILE}: {problem}"
    if state.get("model") != _model_name(loaded):
        return f"{out_dir}: its dictionary reads the model {state.get('model')}, not {_model_name(loaded)}"
    if state["step"] >= cfg.steps:
        return (f"{out_dir}: its checkpoint is at step {state['step']} already; give more steps "
                f"(--steps above {state['step']}) to train on")
    return ""


def check_dictionary_memory(cfg: SaeTrainConfig, n_layers: int, d_in: int, d_out: int) -> None:
    """Refuse, before any weight exists, a dictionary whose training will not fit in memory: its parameters
    (a cross-layer transcoder's layer l decodes to every layer from l on) in float32, each with its gradient
    and Adam's two moments, and one more copy as it is saved (20 bytes a parameter)."""
    from ..devices import check_memory

    if cfg.layered:
        outputs = n_layers * (n_layers + 1) // 2 if cfg.task == "clt" else n_layers
        params = n_layers * (d_in + 1) * cfg.d_sae + outputs * cfg.d_sae * d_out + n_layers * d_out
    else:
        params = (d_in + 1) * cfg.d_sae + cfg.d_sae * d_out + d_out
    check_memory(20 * params, f"--task {cfg.task} with --d-sae {cfg.d_sae:,} ({params:,} parameters)", "to train")


def train_sae(cfg: SaeTrainConfig, loaded, out_dir: str | Path | None = None,
              on_event: Callable[[dict], None] | None = None, control: JobControl | None = None,
              resume: bool = False):
    """Train (or, with `resume`, go on from the checkpoint in `out_dir`); returns (summary dict, the
    SparseDictionary on the model's own activations). `out_dir` (SAELens' format, plus the resumable
    training state) is written at every checkpoint_every steps, at a stop and at the end, atomically, and
    locked while the run writes it. ValueError (one line) for a setting, a text or a checkpoint that
    cannot be used."""
    problem = cfg.problem()
    if problem:
        raise ValueError(f"sae training: {problem}")
    if out_dir is None:
        if resume:
            raise ValueError("sae training: resuming needs the run's folder")
        return _train_sae(cfg, loaded, None, on_event, control, False, [])
    from ..files import lock_folder

    out_dir = Path(os.path.abspath(out_dir))
    notes: list[str] = []
    with lock_folder(out_dir, on_note=notes.append):
        return _train_sae(cfg, loaded, out_dir, on_event, control, resume, notes)


def _train_sae(cfg: SaeTrainConfig, loaded, out_dir: Path | None, on_event, control, resume: bool,
               notes: list[str]):
    from ..features.activations import attach
    from ..features.dictionary import SparseDictionary, saelens_cfg, save_dictionary
    from ..features.hooks import hook_point, point_width
    from ..inputs import text_file_ids
    from .optim import optimizer_state_from_tensors, optimizer_state_to_tensors
    from .loop import Loop, Run

    emit = on_event or (lambda ev: None)
    state = tensors = None
    if resume:
        read = read_sae_checkpoint(out_dir)
        if read is None:
            raise ValueError(f"{out_dir}: no dictionary checkpoint to resume from; start a new run without --resume")
        state, tensors = read
        problem = sae_resume_problem(out_dir, state, tensors, cfg, loaded)
        if problem:
            raise ValueError(problem)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    mcfg = loaded.config
    if cfg.layered:  # circuit-tracer's mlp.hook_in -> mlp.hook_out at every layer
        from ..graphs import graph_problem
        problem = graph_problem(mcfg)
        if problem:
            raise ValueError(f"--task {cfg.task}: its transcoders are for attribution graphs, and {problem}")
        reads = [hook_point(f"blocks.{l}.mlp.input", mcfg) for l in range(mcfg.n_layers)]
        writes = [hook_point(f"blocks.{l}.mlp.out", mcfg) for l in range(mcfg.n_layers)]
    else:
        reads = [hook_point(cfg.hook, mcfg)]
        writes = [hook_point(cfg.hook_out, mcfg)] if cfg.hook_out else reads
    read, write = reads[0], writes[0]
    d_in, d_out = point_width(read, mcfg), point_width(write, mcfg)
    check_dictionary_memory(cfg, mcfg.n_layers, d_in, d_out)
    ids = text_file_ids(loaded, cfg.text_file)
    cut = int(len(ids) * (1 - cfg.heldout_fraction))
    if cut < 1 or len(ids) - cut < 1:
        raise ValueError(f"{cfg.text_file}: {len(ids)} tokens are too few to hold some out")
    x, y = collect_activations(loaded, ids[:cut], reads, writes, cfg.max_tokens, control=control)
    vx, vy = collect_activations(loaded, ids[cut:], reads, writes, max(cfg.max_tokens // 9, 1), control=control)
    if not cfg.layered:  # one dictionary: [N, d]
        x, y, vx, vy = x[:, 0], y[:, 0], vx[:, 0], vy[:, 0]
    score_ids = list(ids[cut:cut + REPLACEMENT_TOKENS])
    if state is not None:
        if state["tokens"] != len(x):
            raise ValueError(f"{out_dir}: its dictionary was trained on {state['tokens']:,} tokens of activations, "
                             f"the text and model give {len(x):,} now (changed since?); start a new run")
        scale, out_scale = state["scale"], state["out_scale"]
    else:
        scale = math.sqrt(d_in / float(x.double().pow(2).sum(-1).mean())) if float(x.abs().max()) > 0 else 1.0
        out_scale = scale if read.name == write.name else \
            math.sqrt(d_out / max(float(y.double().pow(2).sum(-1).mean()), 1e-30))
    x, vx = x * scale, vx * scale
    y, vy = (x, vx) if write.name == read.name else (y * out_scale, vy * out_scale)
    transcoder = write.name != read.name
    if cfg.layered:
        sae = _LayerTranscoders(mcfg.n_layers, d_in, d_out, cfg.d_sae, cfg.task == "clt", gen)
        variance = (y.double() - y.double().mean(0)).pow(2).sum(-1).mean(0)  # [L] each output's variance
        inverse = 1 / variance.clamp_min(1e-12)
        layer_weights = (inverse / inverse.mean()).float()  # the layers count alike in the loss
    else:
        sae = _Sae(d_in, d_out, cfg.d_sae, transcoder, gen)
        layer_weights = None
    with torch.no_grad():
        sae.b_dec.copy_(y.mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    warmup = max(1, cfg.steps // 20)
    n = len(x)
    last_fired = torch.zeros((mcfg.n_layers, cfg.d_sae) if cfg.layered else cfg.d_sae, dtype=torch.long)
    perm, pos = torch.randperm(n, generator=gen), 0
    start_step, elapsed_before, history = 0, 0.0, []
    if state is not None:
        try:
            with torch.no_grad():
                for name, p in sae.named_parameters():
                    p.copy_(tensors[f"sae.{name}"])
            opt.load_state_dict(optimizer_state_from_tensors(
                {k: v for k, v in tensors.items() if k.startswith("state.")}, state["optimizer"]))
            gen.set_state(tensors["rng.batches"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{out_dir / SAE_STATE_TENSORS}: does not fit this dictionary ({str(exc)[:80]})") from None
        last_fired, perm, pos = tensors["last_fired"].long(), tensors["perm"].long(), state["pos"]
        start_step, elapsed_before, history = state["step"], state["elapsed"], list(state["history"])
    emit({"event": "start", "step": start_step, "steps": cfg.steps, "task": cfg.task,
          "hook": "mlp.hook_in" if cfg.layered else cfg.hook,
          "hook_out": "mlp.hook_out" if cfg.layered else cfg.hook_out, "architecture": cfg.architecture, "d_sae": cfg.d_sae, "tokens": n,
          "heldout_tokens": len(vx), "parameters": sum(p.numel() for p in sae.parameters()),
          "out": str(out_dir or ""), **({"resumed": True} if state is not None else {}),
          **({"notes": list(notes)} if notes else {})})
    loop = Loop(cfg, start_step, elapsed_before, resumed=state is not None)

    def dictionary() -> SparseDictionary:  # the input scale folded back: it reads the model's own activations
        with torch.no_grad():
            W_enc = sae.W_enc.detach() * scale
            W_dec = sae.W_dec.detach() / out_scale
            b_dec = sae.b_dec.detach() / out_scale
        d = SparseDictionary(W_enc.contiguous(), sae.b_enc.detach().clone(), W_dec.contiguous(), b_dec.contiguous(),
                             architecture="topk" if cfg.architecture == "topk" else "standard", hook=cfg.hook,
                             hook_out=cfg.hook_out, k=cfg.k if cfg.architecture == "topk" else None,
                             apply_b_dec_to_input=not transcoder, path=str(out_dir or ""))
        attach(d, mcfg)  # its shapes are the model's (a check, cheap)
        return d

    def transcoder_tensors() -> tuple[list[dict], list[torch.Tensor]]:  # circuit-tracer's, on the model's scale
        with torch.no_grad():
            encoders = [{"W_enc": (sae.W_enc[l] * scale).T.contiguous(), "b_enc": sae.b_enc[l].detach().clone(),
                         "b_dec": (sae.b_dec[l] / out_scale).contiguous()} for l in range(mcfg.n_layers)]
            decoders = [(W.detach() / out_scale) if cfg.task == "clt" else (W.detach()[:, 0] / out_scale)
                        for W in sae.W_dec]
        return encoders, [d.contiguous() for d in decoders]

    def trained():  # what the run has made: a SparseDictionary, or Transcoders at every layer
        if not cfg.layered:
            return dictionary()
        from ..graphs.transcoders import transcoders_in_memory
        return transcoders_in_memory(*transcoder_tensors(), cfg.task == "clt", folder=out_dir or "(in memory)")

    def measure(step: int) -> dict:
        summary = {"event": "eval", "step": step, **_measure(sae, vx, vy, cfg)}
        if cfg.layered:
            summary["replacement_score"] = _replacement_score(loaded, trained(), score_ids)
        return summary

    def save(step: int):
        d = trained()
        if out_dir is None:
            return d
        if not all(bool(torch.isfinite(p).all()) for p in sae.parameters()):  # never over a good checkpoint
            raise ValueError(f"sae training diverged by step {step} (non-finite weights); lower --lr")
        opt_tensors, opt_rest = optimizer_state_to_tensors(opt)
        from safetensors.torch import save as st_save
        blob = st_save({**{f"sae.{k}": v.detach().contiguous() for k, v in sae.named_parameters()}, **opt_tensors,
                        "rng.batches": gen.get_state(), "last_fired": last_fired.contiguous(),
                        "perm": batches.perm.contiguous()})
        run_state = {"format": SAE_STATE_FORMAT, "step": step, "pos": batches.pos, "tokens": n, "scale": scale,
                     "out_scale": out_scale, "elapsed": loop.elapsed, "model": _model_name(loaded),
                     "config": asdict(cfg), "history": history, "optimizer": opt_rest}
        extra = {"metrics.json": json.dumps({"config": asdict(cfg), "history": history, "summary": result()}, indent=1),
                 SAE_STATE_FILE: json.dumps(run_state, indent=1), SAE_STATE_TENSORS: blob}
        if cfg.layered:
            from ..graphs.transcoders import save_transcoders
            save_transcoders(out_dir, *transcoder_tensors(), cfg.task == "clt", "mlp.hook_in", "mlp.hook_out",
                             extra_config={"model_name": str(loaded.path or loaded.name)}, extra_files=extra)
        else:  # the contexts are windows of the file's token stream: no BOS is put before each (prepend_bos false)
            saved = saelens_cfg(d, model_name=str(loaded.path or loaded.name), context_size=mcfg.context_length,
                                dataset_path=str(cfg.text_file), prepend_bos=False)
            save_dictionary(d, out_dir, cfg=saved, extra_files=extra)
        emit({"event": "checkpoint", "step": step, "path": str(out_dir)})
        return d

    last: dict = {}  # the last evaluation ("eval" event), and what the last checkpoint made
    if history:
        last["eval"] = dict(history[-1])
    batches = _Batches(n, cfg.batch_size, gen, perm, pos)

    def result() -> dict:
        return {k: v for k, v in last.get("eval", {}).items() if k != "event"}

    class DictionaryRun(Run):
        def step(self, loop: Loop) -> None:
            step = loop.step
            idx = batches.next()
            xb, yb = x[idx], y[idx]
            lr = cfg.lr * min(1.0, step / warmup)
            for group in opt.param_groups:
                group["lr"] = lr
            acts, recon = sae(xb, cfg.architecture, cfg.k)
            sq = (recon - yb).pow(2).sum(-1)
            mse = (sq * layer_weights).sum(-1).mean() if cfg.layered else sq.mean()
            loss = mse
            if cfg.architecture == "relu" and cfg.l1_coefficient > 0:
                norms = sae.decoder_norms() if cfg.layered else sae.W_dec.norm(dim=-1)
                loss = loss + cfg.l1_coefficient * (acts * norms).reshape(len(acts), -1).sum(-1).mean()
            if not torch.isfinite(loss):
                raise ValueError(f"sae training diverged at step {step} (loss {float(loss)}); lower --lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                last_fired[(acts > 0).any(0)] = step
            last["step"] = (lr, loss, mse, acts, recon, yb)

        def log(self, loop: Loop) -> None:
            step, (lr, loss, mse, acts, recon, yb) = loop.step, last["step"]
            with torch.no_grad():
                total = float((yb.double() - yb.double().mean(0)).pow(2).sum())
                emit({"event": "step", "step": step, "steps": cfg.steps, "loss": float(loss), "mse": float(mse),
                      "l0": float((acts > 0).sum(-1).float().mean()),
                      "variance_explained": 1 - float((recon - yb).double().pow(2).sum()) / total if total else None,
                      "dead": int((step - last_fired >= DEAD_STEPS).sum()) if step >= DEAD_STEPS else 0,
                      "lr": lr, "elapsed": loop.elapsed})

        def evaluate(self, loop: Loop) -> None:
            last["eval"] = measure(loop.step)
            history.append(last["eval"])
            emit(last["eval"])

        def checkpoint(self, loop: Loop) -> None:
            last["made"] = save(loop.step)

        def stopped(self, loop: Loop) -> None:  # measured and saved where it stopped
            last["eval"] = measure(loop.step)
            history.append(last["eval"])
            self.checkpoint(loop)

    stopped = loop.run(DictionaryRun(), control, emit)
    made = last["made"] if "made" in last else save(loop.step)
    emit({"event": "stopped" if stopped else "done", **result(), "elapsed": loop.elapsed})
    return result(), made


class _Batches:
    """The training tokens' order: a shuffled permutation read batch by batch, reshuffled when used up
    (its permutation and position are saved, so a resumed run draws the same batches)."""

    def __init__(self, n: int, batch_size: int, gen: torch.Generator, perm: torch.Tensor, pos: int) -> None:
        self.n, self.batch_size, self.gen, self.perm, self.pos = n, batch_size, gen, perm, pos

    def next(self) -> torch.Tensor:
        if self.pos + self.batch_size > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx


def sae_config_from(values: dict[str, Any]) -> tuple[str, SaeTrainConfig]:
    """(the model folder, the SaeTrainConfig) of `train --task sae|transcoder|clt`'s parsed flags (argparse dests -> values,
    None where not given): SAE_OPTIONS by their flags, and the shared text_file, steps, batch_size, lr, seed,
    log_every, eval_every and device."""
    v = {k: val for k, val in values.items() if val is not None}
    if v.get("task") in ("transcoder", "clt"):  # not silently ignored: they read mlp.hook_in at every layer
        given = [f"--{o.dest.replace('_', '-')}" for o in SAE_OPTIONS if o.key in ("hook", "hook_out") and o.dest in v]
        if given:
            raise ValueError(f"{' and '.join(given)}: --task {v['task']} reads every layer's MLP input (mlp.hook_in) "
                             f"and writes its output (mlp.hook_out); drop {'them' if len(given) > 1 else 'it'}, or "
                             "use --task sae for one dictionary at a hook")
    for o in SAE_OPTIONS:  # an option's flag may differ from its key (--model: model_dir)
        if o.dest in v:
            v[o.key] = v.pop(o.dest) if o.dest != o.key else v[o.dest]
        elif o.key == "architecture" and v.get("task") in ("transcoder", "clt"):
            v[o.key] = "relu"  # what they train with
        elif o.default is not None:
            v[o.key] = o.default
    task = v.get("task") or "sae"
    if not v.get("text_file"):
        raise ValueError(f"--task {task} needs --text-file")
    v["text_file"] = os.path.abspath(os.path.expanduser(str(v["text_file"])))  # a resumed run may start elsewhere
    if not v.get("model_dir"):
        raise ValueError(f"--task {task} needs --model MODEL_DIR (the model whose activations it reads)")
    if v.get("device") in ("auto", ""):
        v.pop("device")
    keys = set(SaeTrainConfig.__dataclass_fields__)
    return v["model_dir"], SaeTrainConfig(**{k: val for k, val in v.items() if k in keys})


def resumed_sae_config(out_dir: str | Path, values: dict[str, Any], given: set[str]) -> tuple[str, SaeTrainConfig]:
    """(the model folder, the SaeTrainConfig) that `train --task sae --resume --out DIR` goes on with: the
    checkpoint's own settings, with the flags given on this command line (argparse dests in `given`) on top
    (train_sae refuses a change of what SAE_FIXED_ON_RESUME keeps). ValueError (one line) without a checkpoint."""
    read = read_sae_checkpoint(out_dir)
    if read is None:
        raise ValueError(f"{out_dir}: no dictionary checkpoint to resume from; drop --resume to start a new run")
    state, _ = read
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        raise ValueError(f"{Path(out_dir) / SAE_STATE_FILE}: 'config' must be an object")
    fields = set(SaeTrainConfig.__dataclass_fields__)
    merged = {k: v for k, v in saved.items() if k in fields}
    key_of = {o.dest: o.key for o in SAE_OPTIONS}
    for dest in given:
        key = key_of.get(dest, dest)
        if key in fields and values.get(dest) is not None:
            merged[key] = values[dest]
    if merged.get("text_file"):
        merged["text_file"] = os.path.abspath(os.path.expanduser(str(merged["text_file"])))
    if values.get("device") not in (None, "", "auto"):
        merged["device"] = values["device"]
    model_dir = values.get("model") if "model" in given and values.get("model") else state.get("model")
    if not isinstance(model_dir, str) or not model_dir:
        raise ValueError(f"{Path(out_dir) / SAE_STATE_FILE}: names no model folder; give --model MODEL_DIR")
    try:
        return model_dir, SaeTrainConfig(**merged)
    except TypeError as exc:
        raise ValueError(f"{Path(out_dir) / SAE_STATE_FILE}: 'config' is incomplete ({exc})") from None

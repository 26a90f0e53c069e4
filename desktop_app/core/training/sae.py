"""Training a sparse dictionary (an SAE, or a transcoder) on a loaded model's activations over a text.

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
at the end (the same measured on the held-out tokens), "paused"/"resumed", "stopped", "done". The
dictionary is saved in SAELens' format (cfg.json + sae_weights.safetensors) with metrics.json beside,
atomically, at the end (also when stopped).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..jobs import Cancelled, JobControl
from ..numbers import MAX_COUNT, Range
from ..trace import Trace
from .options import Option

SAE_ARCHITECTURES = ("topk", "relu")
DEAD_STEPS = 200
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


@dataclass
class SaeTrainConfig:
    text_file: str
    hook: str = "blocks.0.hook_resid_post"
    hook_out: str | None = None
    architecture: str = "topk"
    d_sae: int = 512
    k: int = 16
    l1_coefficient: float = 2.0
    steps: int = 2000
    batch_size: int = 256  # tokens per step
    lr: float = 1e-3
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    max_tokens: int = 500_000
    heldout_fraction: float = 0.1
    device: str = "cpu"

    def problem(self) -> str:
        if self.architecture not in SAE_ARCHITECTURES:
            return f"architecture must be one of {', '.join(SAE_ARCHITECTURES)}, got {self.architecture!r}"
        for key, lo in (("d_sae", 1), ("k", 1), ("steps", 1), ("batch_size", 1), ("log_every", 1),
                        ("eval_every", 1), ("max_tokens", 2)):
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


def collect_activations(loaded, ids, read, write, max_tokens: int, window: int | None = None,
                        control: JobControl | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_in [N, d_in], target [N, d_out]) float32 of the model over `ids` in windows of its context."""
    from ..features.activations import read_point

    model = loaded.model
    window = window or model.cfg.context_length
    names = list(dict.fromkeys((read.name, write.name)))
    last = max(read.layer, write.layer)
    xs, ys, n = [], [], 0
    for s in range(0, len(ids), window):
        if control is not None:
            control.check()
        chunk = list(ids[s:s + window])[: max_tokens - n]
        if not chunk:
            break
        trace = Trace(names)
        with torch.no_grad():
            model(torch.tensor([chunk], device=model.device), trace=trace, compute_logits=False,
                  stop_after_layer=last if last >= 0 else None)
        xs.append(read_point(trace, read).float().cpu())
        ys.append(read_point(trace, write).float().cpu() if write.name != read.name else xs[-1])
        n += len(chunk)
        if n >= max_tokens:
            break
    return torch.cat(xs), torch.cat(ys)


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


def _measure(sae: _Sae, x: torch.Tensor, y: torch.Tensor, cfg: SaeTrainConfig, batch: int = 4096) -> dict:
    """Held-out metrics over every token (in batches): mse, l0, variance_explained, dead (never fired)."""
    err, total, l0, fired = 0.0, 0.0, 0.0, torch.zeros(cfg.d_sae, dtype=torch.bool)
    mean = y.double().mean(0)
    with torch.no_grad():
        for s in range(0, len(x), batch):
            acts, recon = sae(x[s:s + batch], cfg.architecture, cfg.k)
            yb = y[s:s + batch]
            err += float((yb - recon).double().pow(2).sum())
            total += float((yb.double() - mean).pow(2).sum())
            l0 += float((acts > 0).sum())
            fired |= (acts > 0).any(0)
    n = max(len(x), 1)
    return {"mse": err / n, "l0": l0 / n, "variance_explained": 1 - err / total if total > 0 else float("nan"),
            "dead": int((~fired).sum())}


def train_sae(cfg: SaeTrainConfig, loaded, out_dir: str | Path | None = None,
              on_event: Callable[[dict], None] | None = None, control: JobControl | None = None):
    """Train; returns (summary dict, the SparseDictionary on the model's own activations). Written to
    `out_dir` (SAELens' format) when given. ValueError (one line) for a setting or a text that cannot be used."""
    from ..features.activations import attach
    from ..features.dictionary import SparseDictionary, saelens_cfg, save_dictionary
    from ..features.hooks import hook_point, point_width
    from ..inputs import text_file_ids
    from .trainer import pause_point

    problem = cfg.problem()
    if problem:
        raise ValueError(f"sae training: {problem}")
    emit = on_event or (lambda ev: None)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    mcfg = loaded.config
    read = hook_point(cfg.hook, mcfg)
    write = hook_point(cfg.hook_out, mcfg) if cfg.hook_out else read
    d_in, d_out = point_width(read, mcfg), point_width(write, mcfg)
    ids = text_file_ids(loaded, cfg.text_file)
    cut = int(len(ids) * (1 - cfg.heldout_fraction))
    if cut < 1 or len(ids) - cut < 1:
        raise ValueError(f"{cfg.text_file}: {len(ids)} tokens are too few to hold some out")
    x, y = collect_activations(loaded, ids[:cut], read, write, cfg.max_tokens, control=control)
    vx, vy = collect_activations(loaded, ids[cut:], read, write, max(cfg.max_tokens // 9, 1), control=control)
    scale = math.sqrt(d_in / float(x.double().pow(2).sum(-1).mean())) if float(x.abs().max()) > 0 else 1.0
    out_scale = scale if read.name == write.name else math.sqrt(d_out / max(float(y.double().pow(2).sum(-1).mean()), 1e-30))
    x, vx = x * scale, vx * scale
    y, vy = (x, vx) if write.name == read.name else (y * out_scale, vy * out_scale)
    transcoder = write.name != read.name
    sae = _Sae(d_in, d_out, cfg.d_sae, transcoder, gen)
    with torch.no_grad():
        sae.b_dec.copy_(y.mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    warmup = max(1, cfg.steps // 20)
    n = len(x)
    emit({"event": "start", "step": 0, "steps": cfg.steps, "task": "sae", "hook": cfg.hook, "hook_out": cfg.hook_out,
          "architecture": cfg.architecture, "d_sae": cfg.d_sae, "tokens": n, "heldout_tokens": len(vx),
          "parameters": sum(p.numel() for p in sae.parameters()), "out": str(out_dir or "")})
    last_fired = torch.zeros(cfg.d_sae, dtype=torch.long)
    perm, pos = torch.randperm(n, generator=gen), 0
    t0, step, summary, stopped = time.perf_counter(), 0, {}, False
    history: list[dict] = []
    try:
        for step in range(1, cfg.steps + 1):
            pause_point(control, emit, step - 1)
            if pos + cfg.batch_size > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos:pos + cfg.batch_size]
            pos += cfg.batch_size
            xb, yb = x[idx], y[idx]
            lr = cfg.lr * min(1.0, step / warmup)
            for group in opt.param_groups:
                group["lr"] = lr
            acts, recon = sae(xb, cfg.architecture, cfg.k)
            mse = (recon - yb).pow(2).sum(-1).mean()
            loss = mse
            if cfg.architecture == "relu" and cfg.l1_coefficient > 0:
                loss = loss + cfg.l1_coefficient * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()
            if not torch.isfinite(loss):
                raise ValueError(f"sae training diverged at step {step} (loss {float(loss)}); lower --lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                fired = (acts > 0).any(0)
                last_fired[fired] = step
            if step % cfg.log_every == 0 or step == cfg.steps:
                with torch.no_grad():
                    total = float((yb.double() - yb.double().mean(0)).pow(2).sum())
                    ev = {"event": "step", "step": step, "steps": cfg.steps, "loss": float(loss), "mse": float(mse),
                          "l0": float((acts > 0).sum(-1).float().mean()),
                          "variance_explained": 1 - float((recon - yb).double().pow(2).sum()) / total if total else None,
                          "dead": int((step - last_fired >= DEAD_STEPS).sum()) if step >= DEAD_STEPS else 0,
                          "lr": lr, "elapsed": time.perf_counter() - t0}
                emit(ev)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                summary = {"event": "eval", "step": step, **_measure(sae, vx, vy, cfg)}
                history.append(summary)
                emit(summary)
    except Cancelled:
        stopped = True
        summary = {"event": "eval", "step": step, **_measure(sae, vx, vy, cfg)}
        history.append(summary)
    with torch.no_grad():  # fold the input scale back: the dictionary reads the model's own activations
        W_enc = sae.W_enc.detach() * scale
        W_dec = sae.W_dec.detach() / out_scale
        b_dec = sae.b_dec.detach() / out_scale
    d = SparseDictionary(W_enc.contiguous(), sae.b_enc.detach().clone(), W_dec.contiguous(), b_dec.contiguous(),
                         architecture="topk" if cfg.architecture == "topk" else "standard", hook=cfg.hook,
                         hook_out=cfg.hook_out, k=cfg.k if cfg.architecture == "topk" else None,
                         apply_b_dec_to_input=not transcoder, path=str(out_dir or ""))
    attach(d, mcfg)  # its shapes are the model's (a check, cheap)
    result = {k: v for k, v in summary.items() if k != "event"}
    if out_dir is not None:
        saved = saelens_cfg(d, model_name=str(loaded.path or loaded.name), context_size=mcfg.context_length,
                            dataset_path=str(cfg.text_file))
        save_dictionary(d, out_dir, cfg=saved, extra_files={
            "metrics.json": json.dumps({"config": asdict(cfg), "history": history, "summary": result}, indent=1)})
    emit({"event": "stopped" if stopped else "done", **result, "elapsed": time.perf_counter() - t0})
    return result, d


def sae_config_from(values: dict[str, Any]) -> tuple[str, SaeTrainConfig]:
    """(the model folder, the SaeTrainConfig) of `train --task sae`'s parsed flags (argparse dests -> values,
    None where not given): SAE_OPTIONS by their flags, and the shared text_file, steps, batch_size, lr, seed,
    log_every, eval_every and device."""
    v = {k: val for k, val in values.items() if val is not None}
    for o in SAE_OPTIONS:  # an option's flag may differ from its key (--model: model_dir)
        if o.dest in v:
            v[o.key] = v.pop(o.dest) if o.dest != o.key else v[o.dest]
        elif o.default is not None:
            v[o.key] = o.default
    if not v.get("text_file"):
        raise ValueError("--task sae needs --text-file")
    if not v.get("model_dir"):
        raise ValueError("--task sae needs --model MODEL_DIR (the model whose activations it reads)")
    if v.get("device") in ("auto", ""):
        v.pop("device")
    keys = set(SaeTrainConfig.__dataclass_fields__)
    return v["model_dir"], SaeTrainConfig(**{k: val for k, val in v.items() if k in keys})

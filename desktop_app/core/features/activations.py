"""A dictionary attached to a model, and its features on a text: activations, reconstruction, metrics.

`attach(dictionary, cfg)` checks that the dictionary fits the model (its hooks exist, its widths
match) and returns an Attached: where it reads and where it writes. `feature_activations(model, ids,
attached)` runs one forward (edits allowed) and returns, per dictionary, a FeatureActivations:

    acts    [T, d_sae] float32   every feature at every token (dense)
    x_in    [T, d_in]            what it read;   target [T, d_out]: the activation it reconstructs
    recon   [T, d_out]           decode(acts) (+ skip);  error = target - recon
    l0      [T]                  active features per token;  mean_l0: their mean
    token_variance_explained [T] 1 - |target - recon|^2 / |target - mean(target)|^2 per token
    variance_explained           1 - sum |target - recon|^2 / sum |target - mean(target)|^2 (SAELens' definition;
                                 the mean over the text's tokens)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..jobs import JobControl, report
from ..trace import Trace
from .dictionary import SparseDictionary
from .hooks import HookPoint, hook_point, point_width


@dataclass(eq=False)
class Attached:
    """A dictionary checked against one model: `read` (its input's point), `write` (its output's; an
    SAE's is `read`)."""
    dictionary: SparseDictionary
    read: HookPoint
    write: HookPoint

    @property
    def hook(self) -> str:
        return self.dictionary.hook

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.read.name, self.write.name)))


def attach(dictionary: SparseDictionary, cfg) -> Attached:
    """The dictionary at its hooks in a model with config `cfg`; ValueError (one line, naming the
    dictionary) when a hook is not in the model or a width differs."""
    where = dictionary.path or dictionary.name
    try:
        read = hook_point(dictionary.hook, cfg)
        write = hook_point(dictionary.hook_out, cfg) if dictionary.hook_out else read
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    for point, size, what in ((read, dictionary.d_in, "d_in"), (write, dictionary.d_out, "d_out")):
        width = point_width(point, cfg)
        if size != width:
            raise ValueError(f"{where}: its {what} is {size}, but the model's {point.name} has width {width} "
                             f"(a dictionary for another model?)")
    return Attached(dictionary, read, write)


def read_point(trace: Trace, point: HookPoint, row: int = 0, unedited: bool = False) -> torch.Tensor:
    """[T, width] of a recorded activation (batch row `row`; `unedited`: its value before the edits made
    there, when the trace kept it); attn.z's [H, T, d_head] flattened to [T, H * d_head] as TransformerLens'
    hook_z is; a normalised point's derived from the norm's input."""
    recorded = trace.unedited.get(point.recorded) if unedited else None
    t = point.value((recorded if recorded is not None else trace[point.recorded])[row])
    if point.heads:
        t = t.transpose(0, 1).reshape(t.shape[1], -1)
    return t


@dataclass
class FeatureActivations:
    hook: str
    acts: torch.Tensor  # [T, d_sae] float32
    x_in: torch.Tensor
    target: torch.Tensor
    recon: torch.Tensor

    @property
    def error(self) -> torch.Tensor:
        return self.target - self.recon

    @property
    def l0(self) -> torch.Tensor:
        return (self.acts != 0).sum(-1)

    @property
    def mean_l0(self) -> float:
        return float(self.l0.double().mean()) if self.acts.shape[0] else 0.0

    @property
    def error_norm(self) -> torch.Tensor:
        return self.error.norm(dim=-1)

    @property
    def token_variance_explained(self) -> torch.Tensor:
        total = (self.target - self.target.mean(0)).pow(2).sum(-1)
        return 1 - self.error.pow(2).sum(-1) / total.clamp_min(1e-30)

    @property
    def variance_explained(self) -> float:
        return variance_explained(self.target, self.recon)

    def top(self, position: int, n: int = 10) -> list[tuple[int, float]]:
        """The `n` most active features at `position`: (feature id, activation), active ones only."""
        row = self.acts[position]
        vals, idx = row.topk(min(n, row.numel()))
        return [(int(i), float(v)) for v, i in zip(vals, idx) if v > 0]


def variance_explained(target: torch.Tensor, recon: torch.Tensor) -> float:
    """1 - sum |target - recon|^2 / sum |target - mean|^2 over tokens (rows), float64."""
    t, r = target.double(), recon.double()
    total = float((t - t.mean(0)).pow(2).sum())
    return 1.0 - float((t - r).pow(2).sum()) / total if total > 0 else float("nan")


def features_of(att: Attached, x_in: torch.Tensor, target: torch.Tensor, edits=()) -> FeatureActivations:
    """The dictionary's features on activations already read: x_in [T, d_in] (before any edit of its own
    features), target [T, d_out]; `edits`: its feature edits (Interventions) in force, whose edited
    activations are the ones shown and decoded (a zeroed feature is 0, not what the edited activation
    re-encodes to)."""
    d = att.dictionary
    with torch.no_grad():
        x = x_in.to(d.W_enc.device, torch.float32)
        acts, how = d.encode_with(x)
        for iv in edits:
            rows = torch.arange(acts.shape[0]) if iv.positions is None else \
                torch.tensor([p for p in iv.positions if 0 <= p < acts.shape[0]], dtype=torch.long)
            acts = iv.features.edited(acts, rows.to(acts.device))
        recon = d.decode(acts, how, x_in=x)
    return FeatureActivations(d.hook, acts, x, target.to(d.W_enc.device, torch.float32), recon)


def own_edits(att: Attached, interventions) -> list:
    """The feature edits among `interventions` that edit this dictionary's features."""
    return [iv for iv in interventions or () if iv.how == "features" and iv.point == att.write.name
            and iv.features.attached.dictionary is att.dictionary]


def record_points(model, ids: Sequence[int] | torch.Tensor, points: Sequence[HookPoint], interventions=None,
                  decoder_ids: Sequence[int] | torch.Tensor | None = None, unedited: Sequence[str] = (),
                  job: JobControl | None = None) -> Trace:
    """One forward of `ids` (batch [1, T] or [B, T]) recording the `points` (and no further than the last
    layer they need). An encoder-decoder's `ids` are its source; its decoder runs only for a decoder point,
    on `decoder_ids` (its input: [start] + the target), after the whole encoder (its cross-attention reads the
    encoder's output); the last stack run stops at its last layer needed. ValueError, one line, when a decoder
    point has none.
    `unedited`: recorded names whose values before the interventions' edits are kept too (trace.unedited).
    `job`: "layer k / L" of the L blocks run reported after each (core.jobs.Cancelled raised there once it is
    cancelled); an encoder-decoder's checked before and after its stacks."""
    model = getattr(model, "model", model)
    names = sorted({p.recorded for p in points})

    def batch(x):
        return x.to(model.device) if torch.is_tensor(x) else torch.tensor([list(x)], device=model.device)

    def stop_after(stack_points, prefix: str = "") -> str | None:
        last = max((p.layer for p in stack_points), default=-1)
        return f"{prefix}blocks.{last}.resid_post" if last >= 0 else None

    trace = Trace(names, unedited=unedited)
    with torch.no_grad():
        if getattr(model.cfg, "is_encoder_decoder", False):
            decoding = [p for p in points if p.stack == "decoder"]
            if decoding and (decoder_ids is None or not len(decoder_ids)):
                raise ValueError(f"{decoding[0].hook} reads the decoder, whose input ([start] + a target) is not "
                                 "given here; an encoder hook (encoder.blocks.L.*) reads the source alone")
            report(job, 0, 1)
            enc = model.encode(batch(ids), trace=trace, interventions=interventions or None,
                               stop_at=None if decoding else stop_after(points, "encoder."))
            if decoding:
                model.decode(batch(decoder_ids), enc, trace=trace, compute_logits=False,
                             interventions=interventions or None, stop_at=stop_after(decoding, "decoder."))
            report(job, 1, 1)
            return trace
        last = max((p.layer for p in points), default=-1)
        total = last + 1 if last >= 0 else model.cfg.n_layers  # the blocks run (stop_after: to the last one needed)
        report(job, 0, total, f"layer 0 / {total}")

        def block_done(layer: int) -> None:  # (the block stop_at ends in returns before its on_layer: see below)
            if layer + 1 < total:
                report(job, layer + 1, total, f"layer {layer + 1} / {total}")
        model(batch(ids), trace=trace, compute_logits=False, interventions=interventions or None,
              stop_at=stop_after(points), **({} if job is None else {"on_layer": block_done}))
        report(job, total, total, f"layer {total} / {total}")
    return trace


def feature_activations(model, ids: Sequence[int] | torch.Tensor, attached: Sequence[Attached],
                        interventions=None, decoder_ids: Sequence[int] | None = None,
                        job: JobControl | None = None) -> list[FeatureActivations]:
    """One forward of `ids` (under `interventions`, if any): each attached dictionary's features. An
    encoder-decoder's `ids` are its source, `decoder_ids` its decoder's input (needed by decoder hooks only);
    each dictionary's rows are its stack's tokens. `job`: progress and cancel (record_points)."""
    edits = [own_edits(a, interventions) for a in attached]
    # an SAE whose own features are edited reads its input before that edit (a transcoder's input is elsewhere)
    unedited = [a.read.recorded for a, e in zip(attached, edits) if e and a.read.name == a.write.name]
    trace = record_points(model, ids, [p for a in attached for p in (a.read, a.write)], interventions, decoder_ids,
                          unedited=unedited, job=job)
    return [features_of(a, read_point(trace, a.read, unedited=bool(e)).float(), read_point(trace, a.write).float(), e)
            for a, e in zip(attached, edits)]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()

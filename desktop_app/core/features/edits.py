"""Feature edits (through core/interventions.py) and direct logit attribution to features.

An edit is a list of FeatureOps on one attached dictionary:
    zero   the feature's activation -> 0
    clamp  -> value (at every edited position, active there or not)
    scale  -> value x its activation
    add    + value (steering: the output moves by value x the feature's decoder row)
At the dictionary's write point the activation x is replaced by reconstruction + error with the
edited features, i.e. x + decode_delta(acts' - acts) (the error term and everything the edit does
not touch stay as they were): an edit that changes no activation leaves x, and so the model's
outputs, bit-identical, and zeroing feature i subtracts exactly acts_i x W_dec[i] (through the
dictionary's output normalisation, if any). A transcoder's features are read where it reads (the
edit keeps that activation as the forward passes it) and change what it writes.

`feature_edit(attached, ops, positions)` returns the Intervention; pass it with any others to the
model (`interventions=`), generation, attribution or patching, like an ablation.

`feature_attribution(model, ids, attached, position, token_id)`: the direct contribution of each
active feature to one token's logit (through the final norm linearised at the last residual, as
core.interventions.direct_logit_attribution does for heads and MLPs), plus the decoder bias, a
transcoder's skip term and the error term; they sum to the direct contribution of the activation at
the write point (e.g. the MLP's row of direct_logit_attribution for a dictionary at hook_mlp_out).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..interventions import (Intervention, check_additive, check_position_and_token, direct_logit_function,
                             traced_forward)
from ..streamed import holding
from .activations import Attached, own_edits, read_point

FEATURE_HOWS = ("zero", "clamp", "scale", "add")


@dataclass(frozen=True)
class FeatureOp:
    feature: int
    how: str = "zero"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.how not in FEATURE_HOWS:
            raise ValueError(f"unknown feature edit {self.how!r} (one of {', '.join(FEATURE_HOWS)})")
        if not np.isfinite(self.value):
            raise ValueError(f"feature {self.feature}: the value must be finite, got {self.value!r}")

    @property
    def label(self) -> str:
        return {"zero": f"zero f{self.feature}", "clamp": f"clamp f{self.feature}={self.value:g}",
                "scale": f"scale f{self.feature} x{self.value:g}", "add": f"add f{self.feature} {self.value:+g}"}[self.how]


class FeatureEdit:
    """What the model calls at the write point (Intervention.features): see the module docstring."""

    def __init__(self, attached: Attached, ops: Sequence[FeatureOp]) -> None:
        d = attached.dictionary
        for op in ops:
            if not 0 <= op.feature < d.d_sae:
                raise ValueError(f"{d.name}: feature {op.feature} is not in 0..{d.d_sae - 1}")
        if not attached.write.editable:  # a sublayer's normalised input: the app reads it, never writes it
            raise ValueError(f"{d.name}: its features cannot be edited: it reconstructs {attached.write.hook} "
                             f"({attached.write.name}), a sublayer's normalised input that the app reads but does "
                             "not edit (a transcoder reading it and writing the sublayer's output can be)")
        self.attached, self.ops = attached, tuple(ops)
        self.reads = attached.read.recorded if attached.read.name != attached.write.name else None

    def apply(self, x: torch.Tensor, local: torch.Tensor, trace) -> torch.Tensor:
        att, d = self.attached, self.attached.dictionary
        heads = att.write.heads
        if heads:  # [B, H, T, dh] -> [B, T, H * dh]
            B, H, T, dh = x.shape
            flat = x.permute(0, 2, 1, 3).reshape(B, T, H * dh)
        else:
            flat = x
        if self.reads is None:
            x_in = flat
        else:
            seen = trace.seen.get(self.reads)
            if seen is None:
                raise ValueError(f"{d.name}: its input {self.reads} comes after its output {att.write.name}")
            x_in = seen.permute(0, 2, 1, 3).reshape(seen.shape[0], seen.shape[2], -1) if att.read.heads else seen
            x_in = att.read.value(x_in)
        dev = d.W_enc.device
        sel = x_in[:, local].to(dev, torch.float32)
        acts, how = d.encode_with(sel)
        new = self.edited(acts)
        if torch.equal(new, acts):
            return x
        delta = d.decode_delta(new - acts, how).to(x.device, x.dtype)
        flat = flat.clone()
        flat[:, local] += delta
        if heads:
            return flat.reshape(B, T, H, dh).permute(0, 2, 1, 3).contiguous()
        return flat

    def edited(self, acts: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of `acts` [..., T, d_sae] with the ops applied (at the rows `rows` of T; None: every row)."""
        new = acts.clone()
        part = new if rows is None else new[..., rows, :]
        for op in self.ops:
            col = part[..., op.feature]
            if op.how == "zero":
                col.zero_()
            elif op.how == "clamp":
                col.fill_(op.value)
            elif op.how == "scale":
                col.mul_(op.value)
            else:
                col.add_(op.value)
        if rows is not None:
            new[..., rows, :] = part
        return new

    @property
    def label(self) -> str:
        return f"{self.attached.dictionary.name}: " + ", ".join(op.label for op in self.ops)


def feature_edit(attached: Attached, ops: Sequence[FeatureOp], positions: Sequence[int] | None = None,
                 name: str | None = None) -> Intervention:
    """The Intervention applying `ops` to the dictionary's features at `positions` (None: every one)."""
    edit = FeatureEdit(attached, ops)
    target = attached.write.name
    return Intervention(target, "features", tuple(positions) if positions is not None else None,
                        features=edit, name=name or edit.label)


# -- direct attribution ------------------------------------------------------------------------


@dataclass
class FeatureAttribution:
    """Direct contributions to `token_id`'s logit at `position` from the dictionary's active features
    (`features`, `activations`, `contributions`, largest |contribution| first), its decoder bias, a
    transcoder's skip term and the error term. `total` = their sum = `direct`, the direct
    contribution of the activation at the write point (up to float rounding)."""
    position: int
    token_id: int
    hook: str
    features: np.ndarray  # int
    activations: np.ndarray
    contributions: np.ndarray  # float64
    bias: float
    skip: float
    error: float
    direct: float

    @property
    def total(self) -> float:
        return float(self.contributions.sum()) + self.bias + self.skip + self.error

    def rows(self) -> list[tuple]:
        out = [("feature", int(f), float(a), float(c)) for f, a, c in
               zip(self.features, self.activations, self.contributions)]
        out += [("bias", -1, 0.0, self.bias), ("skip", -1, 0.0, self.skip), ("error", -1, 0.0, self.error)]
        return out


ATTRIBUTION_COLUMNS = ("component", "feature", "activation", "contribution")


def check_seq2seq_attribution(cfg) -> None:
    """Feature attribution reads a one-stack model's residual stream; an encoder-decoder's is refused in one line."""
    if getattr(cfg, "is_encoder_decoder", False):
        raise ValueError("the features' logit attribution is for one-stack models; on an encoder-decoder the "
                         "lens, a feature's top contexts and its edits work (What if attributes its target tokens)")


def feature_attribution(loaded, ids: Sequence[int], attached: Attached, position: int, token_id: int,
                        interventions=None) -> FeatureAttribution:
    model = getattr(loaded, "model", loaded)
    cfg = model.cfg
    check_seq2seq_attribution(cfg)
    check_additive(cfg, "feature attribution")
    T = len(ids)
    position = check_position_and_token(cfg, T, position, token_id)
    last = f"blocks.{cfg.n_layers - 1}.resid_post"
    names = list(dict.fromkeys([attached.read.recorded, attached.write.recorded, last]))
    own = own_edits(attached, interventions)  # its own features edited: those activations are attributed
    _, trace = traced_forward(model, (torch.tensor([list(ids)], device=model.device),), names, interventions,
                              unedited=[attached.read.recorded] if own and attached.read.name == attached.write.name
                              else ())
    through, _ = direct_logit_function(model, trace[last][0, position], token_id)
    if attached.write.heads:  # z pieces [.., H * dh] go through W_O (its bias is not the dictionary's)
        attn = model.blocks[attached.write.layer].attn
        H, dh = cfg.n_heads, cfg.d_head

        def to_resid(c: torch.Tensor) -> torch.Tensor:
            c = c.to(attn.o.weight.device, attn.o.weight.dtype)
            z = c.reshape(*c.shape[:-1], H, 1, dh)
            return attn.head_outputs(z).sum(-3)[..., 0, :]
    else:
        def to_resid(c: torch.Tensor) -> torch.Tensor:
            return c

    def direct(c: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return through(to_resid(c).double()).numpy()

    d = attached.dictionary
    x_in = read_point(trace, attached.read, unedited=bool(own))[position:position + 1].float().to(d.W_enc.device)
    target = read_point(trace, attached.write)[position:position + 1].float().to(d.W_enc.device)
    with torch.no_grad():
        acts, how = d.encode_with(x_in)
        for iv in own:
            if iv.positions is None or position in iv.positions:
                acts = iv.features.edited(acts)
        active = torch.nonzero(acts[0]).flatten()
        one_hot = torch.zeros(len(active), d.d_sae, device=acts.device)
        one_hot[torch.arange(len(active)), active] = acts[0, active]
        pieces = d.decode_delta(one_hot, how) if len(active) else torch.zeros(0, d.d_out)
        bias_piece = d.normalize_out(d.b_dec[None].clone(), how)  # decode(0) without the skip term
        skip_piece = d.skip(x_in)  # zeros without a skip connection
        recon = d.decode(acts, how, x_in=x_in)
        error_piece = target - recon
    # z pieces go through the layer's W_O: a model read layer by layer (core/streamed.py) holds that block meanwhile
    with holding(model, attached.write.layer, only={"attn.o"}) if attached.write.heads else nullcontext():
        contributions = direct(pieces) if len(active) else np.zeros(0)
        bias, skip, error, total = (float(direct(c)[0]) for c in (bias_piece, skip_piece, error_piece, target))
    order = np.argsort(-np.abs(contributions), kind="stable")
    return FeatureAttribution(position, token_id, d.hook, active.cpu().numpy()[order],
                              acts[0, active].cpu().numpy()[order].astype(np.float64), contributions[order],
                              bias, skip, error, total)

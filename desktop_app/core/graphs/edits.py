"""Testing a graph by intervention: set active transcoder features to a value (zero, scale, clamp) and re-run.

Frozen (`frozen_logits`): the local replacement model with attention patterns, norm scales, every other
feature and every error node held at this prompt's values, so the change in a logit target is exactly
the sum over the edited features of (new - old activation) / old activation x the graph's edge to it.
Live (`feature_interventions`): the same edit as What-if edits (core.interventions.Intervention, "add" at
each MLP output the feature writes to: (new - old) x its decoder vector at its position), which the model,
generation and every panel apply with attention, norms and the real MLPs live.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..interventions import Intervention
from .attribution import Context
from .replacement import stack_prefix

HOWS = ("zero", "scale", "clamp")


@dataclass(frozen=True)
class FeatureSet:
    """One active feature (its row in ctx.active) set: zero, scale (x value) or clamp (= value)."""
    index: int
    how: str = "zero"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise ValueError(f"unknown feature edit {self.how!r} (one of {', '.join(HOWS)})")
        if not torch.isfinite(torch.tensor(float(self.value))):
            raise ValueError(f"active feature {self.index}: the value must be finite, got {self.value!r}")


def edited_activations(ctx: Context, edits: Sequence[FeatureSet]) -> torch.Tensor:
    acts = ctx.activations.clone()
    for e in edits:
        if not 0 <= e.index < len(acts):
            raise ValueError(f"active feature {e.index} is not in this graph (0..{len(acts) - 1})")
        old = ctx.activations[e.index]
        acts[e.index] = 0.0 if e.how == "zero" else old * e.value if e.how == "scale" else e.value
    return acts


def frozen_logits(ctx: Context, edits: Sequence[FeatureSet]) -> torch.Tensor:
    """Logits [T, V] of the frozen replacement model with the edits applied."""
    _, h = ctx.forward(activations=edited_activations(ctx, edits))
    return ctx.logits(h)


def feature_interventions(ctx: Context, edits: Sequence[FeatureSet]) -> list[Intervention]:
    """The edits as What-if edits on the real model: one "add" per MLP output an edited feature writes to."""
    delta = edited_activations(ctx, edits) - ctx.activations
    out = []
    for j in range(ctx.n_layers):
        idx = torch.cat([torch.arange(ctx.layer_starts[l], ctx.layer_starts[l + 1]) for l in ctx.source_layers(j)])
        moved = idx[delta[idx.to(delta.device)].cpu() != 0]
        if not len(moved):
            continue
        value = ctx.feature_writes(j, delta)  # linear in the activations: only the edited features' change
        names = ", ".join(f"L{int(ctx.active[i, 0])}/f{int(ctx.active[i, 2])}@{int(ctx.active[i, 1])}"
                          for i in moved.tolist())
        out.append(Intervention(f"{stack_prefix(ctx.model)}blocks.{j}.mlp.out", "add", value=value, name=f"transcoder features {names}"))
    return out

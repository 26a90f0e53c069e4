"""Mixture-of-experts: the MLP of a block as a router over gated experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE).

Read top to bottom, per token x (the MLP's input, after its norm):
    router logits   r = W_router x                                   [E]     blocks.l.mlp.router
    choice          the experts_per_token largest of p = softmax(r)  [k]     blocks.l.mlp.experts
    weights         p of the chosen, renormalised to sum 1 (Mixtral, norm_topk_prob) or as they are
                    (router_norm)                                    [k]     blocks.l.mlp.expert_weights
    experts         out = sum over the chosen e of weight_e * expert_e(x), expert_e a gated MLP
                    (swiglu); expert e's term at every token is       [d]     blocks.l.mlp.expert_out.e
                    (recorded or edited only when asked for by name: it is one [B, T, d] per expert)
    norms           |weight_e * expert_e(x)| of each chosen expert   [k]     blocks.l.mlp.expert_norms
                    (recorded only: the Layers panel's Expert norms)
    shared expert   Qwen2-MoE adds sigmoid(w_gate . x) * shared(x), a gated MLP every token runs.

Every name above is also an edit point (core/interventions.py): the router's logits, the chosen ids (a
forced routing replaces them: the weights are then the router's probabilities of the forced experts,
normalised by the same rule), the weights, and an expert's output (zeroing it removes the expert).
The softmax, choice and weights are computed in float32, as transformers does.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from .config import ModelConfig
from .interventions import edited_at
from .trace import Trace, point


class MoE(nn.Module):
    """Router + experts (+ shared expert), each expert a gated MLP of width cfg.d_ff that `make_expert(cfg)`
    builds (model.MLP, handed in by model.make_mlp: this module imports nothing from model.py)."""

    def __init__(self, cfg: ModelConfig, make_expert: Callable[[ModelConfig], nn.Module]) -> None:
        super().__init__()
        self.k = cfg.experts_per_token
        self.renormalise = cfg.router_norm == "renormalised"
        self.weights_float32 = cfg.expert_weights_float32
        dense = cfg.replace(num_experts=0, shared_expert_d_ff=0, shared_expert_gate=False)
        self.router = nn.Linear(cfg.d_model, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(make_expert(dense) for _ in range(cfg.num_experts))
        self.shared_expert = make_expert(dense.replace(d_ff=cfg.shared_expert_d_ff)) if cfg.shared_expert_d_ff else None
        self.shared_expert_gate = nn.Linear(cfg.d_model, 1, bias=False) if cfg.shared_expert_gate else None

    def mlps(self) -> list[nn.Module]:
        """Every gated MLP this layer holds (the routed experts, then the shared one): what
        Transformer.pack_for_decoding lays out as it does a dense MLP."""
        return list(self.experts) + ([self.shared_expert] if self.shared_expert is not None else [])

    def route(self, x: torch.Tensor, trace: Trace | None = None, prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's chosen experts [B, T, k] (ids) and their weights [B, T, k] (float32)."""
        logits = point(trace, prefix + "router", self.router(x))
        probs = torch.softmax(logits.float(), dim=-1)
        ids = point(trace, prefix + "experts", probs.topk(self.k, dim=-1).indices)
        weights = probs.gather(-1, ids)  # the top-k values themselves, or the forced experts' probabilities
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = point(trace, prefix + "expert_weights", weights)
        return ids, weights

    def forward(self, x: torch.Tensor, trace: Trace | None = None, prefix: str = "") -> torch.Tensor:
        ids, weights = self.route(x, trace, prefix)
        ids_shape, d = ids.shape, x.shape[-1]
        rows = x.reshape(-1, d)
        ids, weights = ids.reshape(rows.shape[0], -1), weights.reshape(rows.shape[0], -1)
        if not self.weights_float32:  # the weights rounded to the activations' dtype first (Qwen-MoE, OLMoE)
            weights = weights.to(x.dtype)
        # the terms summed in the weights' dtype, rounded once (Mixtral: float32 weights, a half-precision model)
        out = torch.zeros_like(rows, dtype=torch.promote_types(rows.dtype, weights.dtype))
        # each chosen expert's contribution norm |weight_e * expert_e(x)| per token and slot (after any edit)
        norms = torch.zeros(ids.shape, device=x.device) if trace is not None and trace.wants(prefix + "expert_norms") \
            else None
        hit = set(ids.unique().tolist())
        for e, expert in enumerate(self.experts):
            name = f"{prefix}expert_out.{e}"
            on_demand = trace is not None and (trace.asks_for(name, "expert_out") or edited_at(trace, name))
            if e not in hit and not on_demand:
                continue
            token, slot = torch.where(ids == e)
            y = expert(rows[token]) * weights[token, slot, None]
            if on_demand:  # expert e's term at every token (zero where it was not chosen), as recorded and edited
                full = point(trace, name, torch.zeros_like(out).index_add_(0, token, y).view(x.shape)).reshape(-1, d)
                out = out + full
                y = full[token]
            else:
                out.index_add_(0, token, y)
            if norms is not None:
                norms[token, slot] = y.float().norm(dim=-1)
        if norms is not None:
            trace.record(prefix + "expert_norms", norms.view(ids_shape))
        out = out.to(x.dtype)
        if self.shared_expert is not None:
            shared = self.shared_expert(rows)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(rows)) * shared
            out = out + shared
        return out.view(x.shape)


class RouterLogits(Trace):
    """A trace of every layer's router logits that keeps their gradients (a Trace records detached): what the
    training loss reads for load_balancing_loss."""

    def __init__(self) -> None:
        super().__init__(("blocks.*.mlp.router",))

    def record(self, name: str, tensor: torch.Tensor) -> None:
        if self.wants(name):
            self.tensors[name] = tensor

    def logits(self) -> list[torch.Tensor]:
        return list(self.tensors.values())


def load_balancing_loss(router_logits: Sequence[torch.Tensor], num_experts: int, k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss as Mixtral trains with it (transformers' load_balancing_loss_func,
    no padding mask): over every layer's tokens together, E * sum_e (share of the top-k choices that went to
    e) * (mean router probability of e); 1 * k when the load is even, larger when it is not."""
    logits = torch.cat([r.reshape(-1, num_experts) for r in router_logits]).float()
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.nn.functional.one_hot(probs.topk(k, dim=-1).indices, num_experts).float()  # [N, k, E]
    return (chosen.mean(0) * probs.mean(0)).sum() * num_experts


@torch.no_grad()
def expert_load(model, ids: torch.Tensor) -> torch.Tensor:
    """[L, E]: the share of each layer's routing choices (tokens x experts_per_token) that went to each
    expert over `ids` [B, T] (rows sum to 1; 1/E each when the router balances the load evenly). What the
    trainer logs at each evaluation of a mixture (expert_load, expert_load_max)."""
    cfg = model.cfg
    was_training = model.training
    model.eval()
    _, trace = model.run_with_trace(ids, ["blocks.*.mlp.experts"], compute_logits=False)
    model.train(was_training)
    counts = torch.stack([torch.bincount(trace[f"blocks.{l}.mlp.experts"].flatten().cpu(), minlength=cfg.num_experts)
                          for l in range(cfg.n_layers)]).double()
    return counts / counts.sum(-1, keepdim=True)

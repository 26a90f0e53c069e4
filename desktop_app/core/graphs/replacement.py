"""The local replacement model of one prompt (Ameisen et al. 2025), as circuit-tracer 0.5 builds it.

The real forward pass runs once (the model's own code, recording what it must); then, for this prompt:
  - every attention pattern and every normalisation scale (RMSNorm's 1/rms, LayerNorm's 1/std) is frozen
    at its value, so what is left of attention is x -> P (norm(x) W_V) W_O, linear in x;
  - every MLP output is a constant: the active features' decoder vectors (a_s W_dec[s], a cross-layer
    feature into each layer it writes to), the decoder bias, the error (real output - reconstruction),
    plus a transcoder's linear skip term, which stays a function of its input as in circuit-tracer.
So the residual stream, every feature's input and every logit are linear in the token embeddings and in
the MLP-output constants; `linear_forward` is that map (differentiable, or evaluated on given values).

circuit-tracer's conventions kept: position 0 (the BOS token it prepends) has no feature and no error
node (its activations and error vectors are zeroed; its MLP output is still part of the constant the
forward adds, so the forward stays exact); token nodes are the token embedding rows W_E[t] (a learned
position embedding is part of the constant, as its hook_embed does not include it).

Supported: pre-norm decoders with RMSNorm or LayerNorm, softmax attention (GQA, rotary, learned or no
positions), dense MLPs: Llama, Qwen2, Qwen3, Mistral, GPT-2 and the like. Others are refused in one
line naming what the graph does not yet handle.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..model import RMSNorm
from .transcoders import Transcoders


def graph_problem(cfg) -> str | None:
    """Why an attribution graph cannot be made for this model (None when it can)."""
    missing = []
    if getattr(cfg, "is_encoder_decoder", False):
        missing.append("an encoder-decoder")
    if cfg.input_kind != "tokens" or not cfg.lm_head or cfg.lm_head_kind not in (None, "linear"):
        missing.append("a model without a plain language-model head")
    if cfg.norm_placement != "pre" or cfg.parallel_residual or cfg.sandwich_norms:
        missing.append("post-norm, parallel or sandwich-norm blocks")
    if cfg.norm not in ("rmsnorm", "layernorm"):
        missing.append(f"the norm {cfg.norm!r}")
    if not cfg.causal or cfg.attention_kind != "softmax":
        missing.append("non-causal or non-softmax attention")
    if cfg.embed_scale is not None or cfg.embed_norm or cfg.type_vocab_size:
        missing.append("scaled or normalised embeddings")
    if cfg.final_logit_softcap is not None:
        missing.append("logit soft-capping")
    if not cfg.final_norm:
        missing.append("a model without a final norm")
    if getattr(cfg, "num_experts", 0):
        missing.append("mixture-of-experts MLPs")
    if not missing:
        return None
    return ("attribution graphs support pre-norm decoders (Llama, Qwen2/3, Mistral, GPT-2); this model has "
            + ", ".join(missing))


def _norm_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The norm's per-position scale [.., T, 1] at x (what circuit-tracer detaches)."""
    x32 = x.float()
    if isinstance(norm, nn.LayerNorm):
        return torch.rsqrt(x32.var(-1, unbiased=False, keepdim=True) + norm.eps).to(x.dtype)
    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps).to(x.dtype)


def frozen_norm(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The norm with its scale frozen: linear in x (LayerNorm keeps its centring, which is linear)."""
    if isinstance(norm, nn.LayerNorm):
        y = (x - x.mean(-1, keepdim=True)) * scale
        y = y * norm.weight if norm.weight is not None else y
        return y + norm.bias if norm.bias is not None else y
    if type(norm) is not RMSNorm:
        raise ValueError(f"a frozen {type(norm).__name__} is not supported")
    return norm.weight * (x * scale)


def frozen_attention(attn: nn.Module, x: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """Attention with its pattern [H, T, T] frozen: P (x W_V) W_O for x [T, d] (values only, linear)."""
    cfg = attn.cfg
    T = x.shape[-2]
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    v = attn.v(x).view(T, Hkv, dh).transpose(0, 1)
    if Hkv != H:
        v = v.repeat_interleave(H // Hkv, dim=0)
    y = pattern @ v  # [H, T, dh]
    return attn.o(y.transpose(0, 1).reshape(T, H * dh))


@dataclass
class Frozen:
    """One prompt's real forward: what the replacement model freezes and what the graph reads."""
    ids: list[int]
    embed_rest: torch.Tensor  # [T, d] the embedding minus the token rows (positions), a constant
    token_vectors: torch.Tensor  # [T, d] W_E[ids]
    patterns: list[torch.Tensor]  # [H, T, T] per layer
    scales1: list[torch.Tensor]  # pre-attention norm scale [T, 1] per layer
    scales2: list[torch.Tensor]  # pre-MLP norm scale
    scale_final: torch.Tensor
    feature_in: torch.Tensor  # [L, T, d] at the transcoders' input hook
    mlp_out: torch.Tensor  # [L, T, d] the real MLP outputs
    logits: torch.Tensor  # [T, V]


def freeze(model, ids: list[int], input_hook: str) -> Frozen:
    """Run the model once on ids, recording patterns, residuals and MLP inputs/outputs (its own forward)."""
    names = ("embed", "blocks.*.attn.pattern", "blocks.*.resid_mid", "blocks.*.mlp.input", "blocks.*.mlp.out",
             "blocks.*.resid_post", "logits")
    x = torch.tensor(ids, device=model.device)[None]
    out, trace = model.run_with_trace(x, names)
    L = len(model.blocks)
    embed = trace["embed"][0]
    tokens = model.tok_embed.weight[x[0]].detach()
    block_in = [embed] + [trace[f"blocks.{l}.resid_post"][0] for l in range(L - 1)]
    mid = [trace[f"blocks.{l}.resid_mid"][0] for l in range(L)]
    hook = "mlp.input" if input_hook == "mlp.hook_in" else "resid_mid"
    return Frozen(
        ids=list(ids), embed_rest=embed - tokens, token_vectors=tokens,
        patterns=[trace[f"blocks.{l}.attn.pattern"][0] for l in range(L)],
        scales1=[_norm_scale(b.norm1, xi) for b, xi in zip(model.blocks, block_in)],
        scales2=[_norm_scale(b.norm2, m) for b, m in zip(model.blocks, mid)],
        scale_final=_norm_scale(model.final_norm, trace[f"blocks.{L - 1}.resid_post"][0]),
        feature_in=torch.stack([trace[f"blocks.{l}.{hook}"][0] for l in range(L)]),
        mlp_out=torch.stack([trace[f"blocks.{l}.mlp.out"][0] for l in range(L)]),
        logits=out.logits[0].detach())


def linear_forward(model, frozen: Frozen, transcoders: Transcoders, tokens: torch.Tensor,
                   mlp_constants: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The replacement model's residual stream from token vectors [T, d] and each layer's MLP-output
    constant [T, d] (the MLP output less the skip term): (each layer's feature input [T, d], the final
    norm's output [T, d]). Linear in `tokens` and `mlp_constants`; gradients flow through nothing frozen."""
    x = tokens + frozen.embed_rest
    feature_inputs = []
    for l, block in enumerate(model.blocks):
        x = x + frozen_attention(block.attn, frozen_norm(block.norm1, x, frozen.scales1[l]), frozen.patterns[l])
        m_in = frozen_norm(block.norm2, x, frozen.scales2[l])
        f_in = m_in if transcoders.input_hook == "mlp.hook_in" else x
        feature_inputs.append(f_in)
        skip = transcoders.skip(l, f_in)
        x = x + mlp_constants[l] + (skip if skip is not None else 0)
    return feature_inputs, frozen_norm(model.final_norm, x, frozen.scale_final)

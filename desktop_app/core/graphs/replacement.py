"""The local replacement model of one prompt (Ameisen et al. 2025), as circuit-tracer 0.5 builds it.

The real forward pass runs once (the model's own code, recording its attention patterns and MLP outputs);
then, for this prompt:
  - every attention pattern and every normalisation scale (RMSNorm's 1/rms, LayerNorm's 1/std) is frozen
    at its value, so what is left of attention is x -> P (norm(x) W_V) W_O, linear in x; whatever only
    shapes the pattern (rotary of either layout, ALiBi, T5's relative bias, q/k norms, score soft-capping,
    windows) is frozen with it, and OLMo's clipped values are frozen where they were clipped;
  - every MLP output is a constant: the active features' decoder vectors (a_s W_dec[s], a cross-layer
    feature into each layer it writes to), the decoder bias, the error (real output - reconstruction),
    plus a transcoder's linear skip term, which stays a function of its input as in circuit-tracer. The
    transcoder replaces the whole MLP-like sublayer up to its output point (blocks.L.mlp.out: after Gemma's
    and OLMo 2's output norm and Granite's multiplier): a mixture of experts' router is inside it, so
    it is not in the graph (its choice is part of the error node, like the MLP's nonlinearity);
  - an encoder-decoder's decoder: its cross-attention, pattern frozen, reads the encoder's output, a
    constant, so its output is a constant too (a bias-like input), and the decoder's stream stays linear.
So the residual stream, every feature's input and every logit are linear in the token embeddings and in
the MLP-output constants; `linear_forward` is that map (differentiable, or evaluated on given values).

The forward drives the model's own blocks (Block.compose: the block's sublayer records place each norm,
post-norm, parallel residual and shared norm, output norm and residual multiplier), handing it frozen
norms, frozen-pattern attention and the replaced MLP; no family is written out here. The norm calls are
recorded in the order a replay of the real forward makes them, and the frozen forward uses them in the
same order.

circuit-tracer's conventions kept: position 0 (the BOS token it prepends) has no feature and no error
node (its activations and error vectors are zeroed; its MLP output is still part of the constant the
forward adds, so the forward stays exact); token nodes are the tokens' embedding rows (W_E[t], times the
embedding scale where there is one; a learned position embedding is part of the constant, as its
hook_embed does not include it); logit targets are read before a final soft-cap (its unembed.hook_pre).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..model import OffsetRMSNorm, RMSNorm, token_embedding
from ..streamed import holding, keeping
from .transcoders import Transcoders


def graph_problem(cfg) -> str | None:
    """Why an attribution graph cannot be made for this model (None when it can)."""
    missing = []
    if cfg.input_kind != "tokens" or not cfg.lm_head or cfg.lm_head_kind not in (None, "linear"):
        missing.append("no plain language-model head")
    if not cfg.causal:
        missing.append("non-causal attention")
    if not missing:
        return None
    return "attribution graphs are made for decoders (and encoder-decoders' decoders); this model has " + ", ".join(missing)


def stack_prefix(model) -> str:
    """The trace-name prefix of the blocks the graph runs through: "" or an encoder-decoder's "decoder."."""
    return "decoder." if getattr(model.cfg, "is_encoder_decoder", False) else ""


def _stack(model):
    """(blocks, the embedding's norm or None, the final norm or None) of the stack the graph runs through."""
    stack = model.decoder if stack_prefix(model) else model
    cfg = model.cfg
    return (stack.blocks, stack.embed_norm if cfg.embed_norm else None,
            stack.final_norm if cfg.final_norm else None)


def n_graph_layers(model) -> int:
    return len(_stack(model)[0])


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
    if type(norm) is OffsetRMSNorm:  # Gemma: (1 + g)
        return (x * scale) * (1.0 + norm.weight)
    if type(norm) is not RMSNorm:
        raise ValueError(f"a frozen {type(norm).__name__} is not supported")
    return norm.weight * (x * scale)


class _Norms:
    """The norm calls of one pass through the stack, in order: recording each call's scale (scales None),
    or replaying recorded ones (the frozen forward makes the same calls in the same order)."""

    def __init__(self, scales: list[torch.Tensor] | None = None) -> None:
        self.recording = scales is None
        self.scales = [] if scales is None else scales
        self.calls = 0

    def __call__(self, norm: nn.Module):
        def apply(x: torch.Tensor) -> torch.Tensor:
            if self.recording:
                self.scales.append(_norm_scale(norm, x))
            scale = self.scales[self.calls]
            self.calls += 1
            return frozen_norm(norm, x, scale)
        return apply


def frozen_attention(attn: nn.Module, x: torch.Tensor, pattern: torch.Tensor,
                     clipped: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention with its pattern [H, T, S] frozen: P (x W_V) W_O for x [S, d] (values only, linear).
    clipped: (where the real values were clipped, their clipped values) for OLMo's clip_qkv, held there."""
    cfg = attn.cfg
    S = x.shape[-2]
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    v = attn.v(x)
    if clipped is not None:
        v = torch.where(clipped[0], clipped[1], v)
    v = v.view(S, Hkv, dh).transpose(0, 1)
    if Hkv != H:
        v = v.repeat_interleave(H // Hkv, dim=0)
    y = pattern @ v  # [H, T, dh]
    return attn.o(y.transpose(0, 1).reshape(pattern.shape[-2], H * dh))


def _clipped_values(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    c = attn.cfg.clip_qkv
    if c is None:
        return None
    v = attn.v(x)
    return v.abs() > c, v.clamp(-c, c)


@dataclass
class Frozen:
    """One prompt's real forward: what the replacement model freezes and what the graph reads."""
    ids: list[int]
    embed_rest: torch.Tensor  # [T, d] the embedding (before its norm) minus the token rows: a constant
    token_vectors: torch.Tensor  # [T, d] the tokens' scaled embedding rows
    patterns: list[torch.Tensor]  # [H, T, T] per layer
    scales: list[torch.Tensor]  # every norm's scale [T, 1], in the order the forward calls the norms
    feature_in: torch.Tensor  # [L, T, d] at the transcoders' input hook
    mlp_out: torch.Tensor  # [L, T, d] the real MLP outputs
    logits: torch.Tensor  # [T, V]
    cross: list[torch.Tensor] = field(default_factory=list)  # [T, d] per layer: the frozen cross-attention output
    clipped: list = field(default_factory=list)  # per layer: clip_qkv's (mask, values) or None


def _parts_read(block: nn.Module) -> set[str]:
    """What _run reads of a block: its norms' weights (their scales frozen), the attention's values and
    output (its pattern frozen); not the MLP (replaced: most of a block's bytes) nor its output norm, not
    the queries and keys, nor the cross-attention (its output a constant)."""
    norms = {s.norm for s in block.sublayers} | {s.out_norm for s in block.sublayers if s.name != "mlp"}
    return {"attn.v", "attn.o"} | (norms - {None})


def keeping_parts(model):
    """Within, what _run reads of the first blocks stays in memory once read (a model read layer by layer:
    core.streamed.keeping), so that passes over the stack again and again read those parts once."""
    return keeping(model, _parts_read)


def _run(model, frozen: Frozen, norms: _Norms, tokens: torch.Tensor, mlp) -> torch.Tensor:
    """The stack from the token vectors through the model's own blocks (Block.compose) with frozen norms
    and patterns and mlp(layer, h, stream) for each MLP's whole output: the final norm's output [T, d].
    While `norms` records (the replay of the real forward), OLMo's clipped values are recorded too."""
    blocks, embed_norm, final_norm = _stack(model)
    x = tokens + frozen.embed_rest
    if embed_norm is not None:
        x = norms(embed_norm)(x)
    for l, block in enumerate(blocks):
        def attention(h, l=l, attn=block.attn):
            if norms.recording:
                frozen.clipped[l] = _clipped_values(attn, h)
            return frozen_attention(attn, h, frozen.patterns[l], frozen.clipped[l])
        run = {"attn": attention, "cross_attn": lambda h, l=l: frozen.cross[l]}
        # a model read layer by layer (core/streamed.py): compose is not its forward, and reads only these
        with holding(model, l, only=_parts_read(block)):
            x = block.compose(x, run, norm=lambda name, block=block: norms(getattr(block, name)),
                              replace={"mlp": lambda h, stream, l=l: mlp(l, h, stream)})
    return x if final_norm is None else norms(final_norm)(x)


def freeze(model, ids: list[int], input_hook: str, source: list[int] | None = None) -> Frozen:
    """Run the model once on ids (an encoder-decoder: the decoder's ids, the encoder reading `source`),
    recording patterns and MLP outputs (its own forward); then replay the stack with those, recording
    every norm's scale and each MLP's input at the transcoders' hook."""
    prefix = stack_prefix(model)
    blocks, embed_norm, _ = _stack(model)
    L = len(blocks)
    names = [prefix + n for n in ("embed", "blocks.*.attn.pattern", "blocks.*.cross_attn.pattern", "blocks.*.mlp.out")]
    x = torch.tensor(ids, device=model.device)[None]
    captured = {}
    handle = None if embed_norm is None else embed_norm.register_forward_pre_hook(
        lambda _m, args: captured.setdefault("embed", args[0]))  # the embedding before its norm
    try:
        if prefix:
            if source is None:
                raise ValueError("an encoder-decoder's graph needs the source (the encoder's input) as well")
            src = torch.tensor(source, device=model.device)[None]
            out, trace = model.run_with_trace(src, x, names)
            encoded = out.encoder_hidden[0]
        else:
            out, trace = model.run_with_trace(x, names)
    finally:
        if handle is not None:
            handle.remove()
    with torch.no_grad():
        tokens = token_embedding(model, x[0]).detach()
        embed = captured["embed"][0] if embed_norm is not None else trace[prefix + "embed"][0]
        patterns = [trace[f"{prefix}blocks.{l}.attn.pattern"][0] for l in range(L)]
        cross = [frozen_attention(b.cross_attn, encoded, trace[f"{prefix}blocks.{l}.cross_attn.pattern"][0])
                 for l, b in enumerate(blocks)] if prefix else []
        mlp_out = torch.stack([trace[f"{prefix}blocks.{l}.mlp.out"][0] for l in range(L)])
        frozen = Frozen(ids=list(ids), embed_rest=embed - tokens, token_vectors=tokens, patterns=patterns,
                        scales=[], feature_in=torch.empty(0), mlp_out=mlp_out, logits=out.logits[0].detach(),
                        cross=cross, clipped=[None] * L)
        feature_in = [None] * L
        norms = _Norms()

        def record(l, h, stream):
            feature_in[l] = h if input_hook == "mlp.hook_in" else stream
            return mlp_out[l]

        # the replay: with real inputs, frozen-pattern attention is the real attention
        _run(model, frozen, norms, tokens, record)
        frozen.scales = norms.scales
        frozen.feature_in = torch.stack(feature_in)
    return frozen


def linear_forward(model, frozen: Frozen, transcoders: Transcoders, tokens: torch.Tensor,
                   mlp_constants: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The replacement model's residual stream from token vectors [T, d] and each layer's MLP-output
    constant [T, d] (the MLP output less the skip term): (each layer's feature input [T, d], the final
    norm's output [T, d]). Linear in `tokens` and `mlp_constants`; gradients flow through nothing frozen."""
    feature_inputs = []

    def replaced(l, h, stream):
        f_in = h if transcoders.input_hook == "mlp.hook_in" else stream
        feature_inputs.append(f_in)
        skip = transcoders.skip(l, f_in)
        return mlp_constants[l] + skip if skip is not None else mlp_constants[l]

    h = _run(model, frozen, _Norms(frozen.scales), tokens, replaced)
    return feature_inputs, h

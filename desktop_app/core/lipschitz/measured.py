"""The functions measured: one attention head with parameters (A, V), several heads, a model
layer's attention sublayer exactly as the model applies it, or one head of it.

  * one head:  f(X)_i = V sum_j P_ij x_j,  P_ij = softmax_j(x_i^T A^T x_j), or with L2 / Sinkhorn
    attention weights; masked (causal) variant f^m(X)_i = f(x_1..x_i)_i;
  * multi-head f^MH = sum_h W^(h) f^(h);
  * a model layer's attention sublayer exactly as the model's Block applies it, or one head of it
    (model.head_matrices); see layer_map for what is measured under each config switch.
All of them are an `AttentionMap` (weights per head, attention kind, mask and window, rotary, score
scale, q/k norms, output norm), whose scores and masks come from core/attention.py and whose rotary,
scale and window come from the model's own helpers (layer_rotary, attention_scale, layer_window).
A model's sublayer can also be measured through the module itself (`module_function`), which tests
use as an independent reference.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..attention import ATTENTION_KINDS, attention_probs, causal_mask
from ..model import apply_rotary, attention_scale, layer_rotary, layer_rotates, layer_window, rotary_cos_sin
from ..streamed import holding


def _rotate_half_t(z: torch.Tensor) -> torch.Tensor:
    """Transpose of the 'rotate half' map R(x) = cat(-x2, x1): R^T(z) = cat(z2, -z1)."""
    z1, z2 = z.chunk(2, dim=-1)
    return torch.cat([z2, -z1], dim=-1)


def rotary_transpose(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Transpose of apply_rotary(., cos, sin) applied to g [..., k]: cos*g - R(sin*g) on the first
    cos.shape[-1] dims (partial rotary: the rest passed through, so their transpose is the identity)."""
    dims = cos.shape[-1]
    if dims == g.shape[-1]:
        return g * cos + _rotate_half_t(g * sin)
    g_rot = g[..., :dims]
    return torch.cat([g_rot * cos + _rotate_half_t(g_rot * sin), g[..., dims:]], dim=-1)


@dataclass
class HeadNorm:
    """A copy of one of the model's norms as a plain function of its last dim (the q/k norms of
    qk_norm, the post-attention norm of sandwich_norms): kind is the config's `norm`.

    Computed like the model's modules (RMSNorm in float32 at least, Gemma's offset weight 1 + w),
    but in float64 when the input is float64, where the model's RMSNorm would round to float32: the
    lab's float64 maps stay float64 throughout."""
    kind: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    @classmethod
    def of(cls, kind: str, module, dtype) -> "HeadNorm":
        bias = getattr(module, "bias", None)
        return cls(kind, module.weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype),
                   float(module.eps))

    def to(self, dtype=None, device=None) -> "HeadNorm":
        conv = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        return HeadNorm(self.kind, conv(self.weight), conv(self.bias), self.eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight.to(x.dtype),
                                None if self.bias is None else self.bias.to(x.dtype), self.eps)
        ct = torch.promote_types(x.dtype, torch.float32)
        xc = x.to(ct)
        xc = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.kind == "rmsnorm_offset":
            return (xc * (1.0 + self.weight.to(ct))).to(x.dtype)
        return self.weight.to(x.dtype) * xc.to(x.dtype)


class _MapWidths:
    """The widths of a map with W_Q [H, k, d] and W_O [H, d_out, kv]: its input d, output d_out, heads."""

    @property
    def d(self) -> int:
        return self.W_Q.shape[-1]

    @property
    def d_out(self) -> int:
        return self.W_O.shape[1]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]


@dataclass
class AttentionMap(_MapWidths):
    """Multi-head self-attention X [B, n, d] -> [B, n, d_out] with explicit per-head weights.

    q_h = W_Q[h] x + b_Q[h], k_h = W_K[h] x + b_K[h], v_h = W_V[h] x + b_V[h]; then q_norm / k_norm
    on each head's q and k (when set), then rotary (rotary_table, else rope_theta over the full head
    width); P_h = attention_probs(q_h, k_h, kind, mask, scale) with the causal mask (and its window)
    when masked; out = out_norm(sum_h W_O[h] P_h v_h + b_O) (out_norm when set).
    The scores scale by s = `scale`, by default 1/sqrt(k) (k = W_Q.shape[1]) as attention_probs does,
    so A_h = W_K[h]^T W_Q[h] s and x_i^T A_h^T x_j = s q_i . k_j -- a bilinear form only without
    q/k norms (`scores_bilinear`).
    """
    W_Q: torch.Tensor  # [H, k, d]
    W_K: torch.Tensor  # [H, k, d]
    W_V: torch.Tensor  # [H, kv, d]
    W_O: torch.Tensor  # [H, d_out, kv]
    b_Q: torch.Tensor | None = None  # [H, k]
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None  # [H, kv]
    b_O: torch.Tensor | None = None  # [d_out]
    kind: str = "softmax"
    masked: bool = False
    sinkhorn_iters: int = 3
    rope_theta: float | None = None
    label: str = ""
    # The model's own rotary for positions 0..n-1 (model.layer_rotary of the layer: partial rotary,
    # rope_scaling, Gemma 3's local base); takes precedence over rope_theta.
    rotary_table: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None] | None = None
    scale: float | None = None  # score multiplier; None: 1/sqrt(k)
    window: int | None = None  # sliding window of the causal mask (only used when masked)
    q_norm: HeadNorm | None = None  # qk_norm: each head's q and k normed before rotary
    k_norm: HeadNorm | None = None
    out_norm: HeadNorm | None = None  # sandwich_norms: the post-attention norm of the sublayer's output
    # An additive bias of the scores, n -> [H, n, n], fixed (independent of X): T5's relative positions
    score_bias: Callable[[int], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {self.kind!r} (known: {', '.join(ATTENTION_KINDS)})")
        # row-major whatever layout the model's weights have (a generation lays them out column-major for its
        # one-row products): the products' order of summation, hence the map's bits, follows the layout
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            setattr(self, name, getattr(self, name).contiguous())

    def scaled(self, t: torch.Tensor) -> torch.Tensor:
        """t times the score scale: t / sqrt(k) by default (that very expression, so maps without a
        scale of their own give the same bits as before scale existed), else t * scale."""
        return t / math.sqrt(self.W_Q.shape[1]) if self.scale is None else t * self.scale

    @property
    def scores_bilinear(self) -> bool:
        """Whether head h's score is s q_i . k_j with q, k affine in x (no q/k norm); rotary keeps it
        bilinear at each pair of positions (a fixed rotation of q_i and k_j)."""
        return self.q_norm is None and self.k_norm is None

    @property
    def A(self) -> torch.Tensor:
        """[H, d, d]: A_h = W_K^T W_Q s (s = 1/sqrt(k) unless `scale`). With q/k norms this is only the
        linear part, not the score's matrix (scores_bilinear)."""
        return self.scaled(self.W_K.transpose(1, 2) @ self.W_Q)

    @property
    def V(self) -> torch.Tensor:
        """[H, d_out, d]: V_h = W_O W_V (the head's value map into the output space)."""
        return self.W_O @ self.W_V

    def head(self, h: int) -> "AttentionMap":
        """Head h's share W_O[h] f_h (no output bias; no out_norm, which acts on the sum of the heads)."""
        sl = slice(h, h + 1)
        pick = lambda t: None if t is None else t[sl]  # noqa: E731
        return dataclasses.replace(self, W_Q=self.W_Q[sl], W_K=self.W_K[sl], W_V=self.W_V[sl], W_O=self.W_O[sl],
                                   b_Q=pick(self.b_Q), b_K=pick(self.b_K), b_V=pick(self.b_V), b_O=None,
                                   out_norm=None, label=f"{self.label} head {h}".strip())

    def to(self, dtype=None, device=None) -> "AttentionMap":
        conv = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        norm = lambda m: None if m is None else m.to(dtype, device)  # noqa: E731
        return dataclasses.replace(self, W_Q=conv(self.W_Q), W_K=conv(self.W_K), W_V=conv(self.W_V),
                                   W_O=conv(self.W_O), b_Q=conv(self.b_Q), b_K=conv(self.b_K), b_V=conv(self.b_V),
                                   b_O=conv(self.b_O), q_norm=norm(self.q_norm), k_norm=norm(self.k_norm),
                                   out_norm=norm(self.out_norm))

    # -- pieces shared by the forward pass and the closed-form linearisation ----------------
    def mask(self, n: int, device) -> torch.Tensor | None:
        """The causal mask (boolean) when masked; with a score bias, the additive mask: the bias with the
        masked scores at the dtype's minimum (as the model gives T5's)."""
        causal = None
        if self.masked:
            causal = causal_mask(n, n, device) if self.window is None else causal_mask(n, n, device, self.window)
        if self.score_bias is None:
            return causal
        bias = self.score_bias(n).to(device=device, dtype=self.W_Q.dtype)
        return bias if causal is None else bias.masked_fill(~causal, torch.finfo(bias.dtype).min)

    def rotary(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.rotary_table is not None:
            rot = self.rotary_table(torch.arange(n, device=device))
            return None if rot is None else (rot[0].to(self.W_Q.dtype), rot[1].to(self.W_Q.dtype))
        if self.rope_theta is None:
            return None
        cos, sin = rotary_cos_sin(torch.arange(n, device=device), self.W_Q.shape[1], self.rope_theta)
        return cos.to(self.W_Q.dtype), sin.to(self.W_Q.dtype)

    @property
    def has_rotary(self) -> bool:
        return self.rope_theta is not None or self.rotary_table is not None

    def _proj(self, X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.einsum("bnd,hkd->bhnk", X, W)
        return y if b is None else y + b[None, :, None, :]

    def qkv(self, X: torch.Tensor):
        n = X.shape[1]
        q, k, v = self._proj(X, self.W_Q, self.b_Q), self._proj(X, self.W_K, self.b_K), self._proj(X, self.W_V, self.b_V)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        rot = self.rotary(n, X.device)
        if rot is not None:
            q, k = apply_rotary(q, *rot), apply_rotary(k, *rot)
        return q, k, v, rot

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        q, k, v, _ = self.qkv(X)
        p = attention_probs(q, k, self.kind, self.mask(X.shape[1], X.device), self.sinkhorn_iters, self.scale)
        out = torch.einsum("bhnk,hdk->bnd", p @ v, self.W_O)
        out = out if self.b_O is None else out + self.b_O
        return out if self.out_norm is None else self.out_norm(out)

    # -- where Theorem 3.1 applies ------------------------------------------------------------
    def theorem_applies(self) -> bool:
        """Softmax, no rotary, no q/k norm (the score is then not x_i^T A^T x_j), no output norm
        (a nonlinear map after the heads) and no query bias (a key bias shifts each row of scores by
        a constant and a value/output bias shifts the output by a constant: neither changes the
        Jacobian). A score scale is folded into A; a sliding window is a mask (see map_bounds)."""
        no_q_bias = self.b_Q is None or bool((self.b_Q == 0).all())
        return (self.kind == "softmax" and not self.has_rotary and self.scores_bilinear and self.out_norm is None
                and no_q_bias and self.score_bias is None)


def single_head(A: torch.Tensor, V: torch.Tensor, kind: str = "softmax", masked: bool = False,
                sinkhorn_iters: int = 3, W_Q: torch.Tensor | None = None, W_K: torch.Tensor | None = None) -> AttentionMap:
    """f(X)_i = V sum_j P_ij x_j with scores x_i^T A^T x_j (softmax).

    L2 and Sinkhorn attention need the factors: pass W_Q, W_K ([k, d], A = W_K^T W_Q / sqrt(k)); by
    default W_K = I and W_Q = sqrt(d) A, i.e. scores -|sqrt(d) A x_i - x_j|^2 / sqrt(d) for those kinds.
    """
    d = A.shape[0]
    if W_Q is None or W_K is None:
        W_Q, W_K = math.sqrt(d) * A, torch.eye(d, dtype=A.dtype, device=A.device)
    eye_out = torch.eye(V.shape[0], dtype=V.dtype, device=V.device)
    return AttentionMap(W_Q[None], W_K[None], V[None], eye_out[None], kind=kind, masked=masked,
                        sinkhorn_iters=sinkhorn_iters, label=f"single head ({kind})")


def multi_head(W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, kind: str = "softmax",
               masked: bool = False, sinkhorn_iters: int = 3) -> AttentionMap:
    """f^MH = sum_h W_O[h] f^(h), f^(h)(X)_i = W_V[h] sum_j P^h_ij x_j (weights [H, k, d] / [H, d, k])."""
    return AttentionMap(W_Q, W_K, W_V, W_O, kind=kind, masked=masked, sinkhorn_iters=sinkhorn_iters,
                        label=f"{W_Q.shape[0]}-head ({kind})")


def random_single_head(d: int, norm_A: float, norm_V: float, kind: str = "softmax", masked: bool = False,
                       seed: int = 0, sinkhorn_iters: int = 3, dtype=torch.float64) -> AttentionMap:
    """Gaussian W_Q, W_K, V rescaled so that ||A||_2 = norm_A and ||V||_2 = norm_V exactly."""
    g = torch.Generator().manual_seed(seed)
    W_Q = torch.randn(d, d, generator=g, dtype=dtype)
    W_K = torch.randn(d, d, generator=g, dtype=dtype)
    V = torch.randn(d, d, generator=g, dtype=dtype)
    A = W_K.T @ W_Q / math.sqrt(d)
    s = math.sqrt(norm_A / float(torch.linalg.matrix_norm(A, ord=2)))
    V = V * (norm_V / float(torch.linalg.matrix_norm(V, ord=2)))
    return single_head(A * s * s, V, kind, masked, sinkhorn_iters, W_Q=W_Q * s, W_K=W_K * s)


STACKS = {"encoder": ("encoder", "attn"), "decoder": ("decoder", "attn"), "cross": ("decoder", "cross_attn")}


def layer_modules(model, layer: int, stack: str | None = None):
    """(block, its attention module's name) of a one-stack model's layer (stack None), or an
    encoder-decoder's: stack "encoder" (its self-attention), "decoder" (the decoder's causal
    self-attention) or "cross" (the decoder's cross-attention); out of range in one line."""
    cfg = model.cfg
    seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
    if seq2seq != (stack is not None):
        raise ValueError("an encoder-decoder's layer names its stack: encoder, decoder or cross" if seq2seq
                         else f"stack {stack!r}: this model has one stack of layers")
    if stack is None:
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"layer {layer} out of range: the model has {cfg.n_layers} layers (0..{cfg.n_layers - 1})")
        return model.blocks[layer], "attn"
    if stack not in STACKS:
        raise ValueError(f"stack {stack!r}: one of {', '.join(STACKS)}")
    name, kind = STACKS[stack]
    model.attention(name, layer, kind)  # checks the layer against the stack's depth
    return getattr(model, name).blocks[layer], kind


def unmeasured(cfg) -> str | None:
    """Why the lab cannot measure this config's attention faithfully (one line), or None: the parts of a
    score that the measured function below does not compute are refused, never measured without them."""
    if cfg.attn_logit_softcap is not None:
        return (f"attention logit soft-capping (attn_logit_softcap {cfg.attn_logit_softcap:g}, {cfg.family}) is not "
                f"in the Lipschitz lab's measured function: its layers are not measured")
    if cfg.positions == "alibi":
        return (f"ALiBi's bias by distance ({cfg.family}) is not in the Lipschitz lab's measured function: its layers "
                f"are not measured")
    if cfg.residual_multiplier is not None:
        return (f"the residual multiplier (residual_multiplier {cfg.residual_multiplier:g}, {cfg.family}) is not in the "
                f"Lipschitz lab's measured function: its layers are not measured")
    if cfg.qk_norm_across_heads:
        return (f"the Lipschitz lab's attention map norms q and k head by head; this model ({cfg.family}) norms them "
                f"over all heads at once: its layers are not measured")
    if cfg.clip_qkv is not None:
        return (f"q/k/v clipping (clip_qkv {cfg.clip_qkv:g}, {cfg.family}) is not in the Lipschitz lab's measured "
                f"function: its layers are not measured")
    return None


def layer_map(model, layer: int, head: int | None = None, masked: bool | None = None, *, stack: str | None = None,
              source_ids=None):
    """model.blocks[layer].attn as the model's Block applies it, or one head of it.

    The layer: input = what the attention sublayer receives (after the pre-attention norm; the
    block's input itself with post-norm placement), output = what is added to the residual stream:
    the module's output, then the post-attention norm with sandwich_norms (Gemma 3) or output norms
    (OLMo 2), which the Block applies before the residual add (Block.output_norm). Parallel residual
    (GPT-NeoX) changes neither.
    Followed from the config exactly: q/k/v and output biases (attention_out_bias), head_dim,
    grouped-query attention (each query head reads its group's key/value head), qk_norm (the
    model's q_norm/k_norm weights, before rotary), rotary as model.layer_rotary gives it for this
    layer (partial rotary, rope_scaling, Gemma 3's local base on sliding layers), the score scale
    model.attention_scale (attn_scale), and the causal mask with this layer's window
    (model.layer_window) when masked (by default as the config's `causal`; a window only exists
    within the causal mask, as in the model).

    One head (model.head_matrices): its q/k/v biases and W_O[:, head], without the shared output
    bias and without the sandwich post-attention norm, which acts on the sum of the heads (so the
    head is the model's per-head `head_out`, W_O,h y_h); everything else as for the layer.

    An encoder-decoder's (`stack`, layer_modules): "encoder" and "decoder" self-attention as above
    (masked by default in the decoder only; T5's relative position bias is a fixed score bias,
    AttentionMap.score_bias), and "cross": the decoder's cross-attention as a function of its input X
    (the decoder's stream after its norm) with the encoder's output on `source_ids` held fixed
    (CrossAttentionMap).
    """
    block, kind = layer_modules(model, layer, stack)  # (the layer checked first)
    out_norm = next(s.out_norm for s in block.sublayers if s.name == kind)
    # a model read layer by layer: this layer's attention and its output norm in, not its MLP (core/streamed.py)
    with holding(model, layer, only={kind} | ({out_norm} if out_norm else set())):
        return _layer_map(model, layer, head, masked, stack, source_ids)


def _layer_map(model, layer: int, head: int | None, masked: bool | None, stack: str | None, source_ids):
    cfg = model.cfg
    problem = unmeasured(cfg)
    if problem:
        raise ValueError(problem)
    block, kind = layer_modules(model, layer, stack)
    attn = getattr(block, kind)
    if stack == "cross":
        return cross_map(model, layer, head, source_ids)
    masked = (cfg.causal if stack is None else stack == "decoder") if masked is None else masked
    dtype = torch.promote_types(attn.q.weight.dtype, torch.float32)  # float64 models stay float64
    common = dict(kind=cfg.attention_kind, masked=masked, sinkhorn_iters=cfg.sinkhorn_iters)
    # every switch left at its default keeps the map built exactly as before the switches existed
    if layer_rotates(cfg, layer):
        if cfg.rotary_fraction == 1.0 and cfg.rope_scaling is None and cfg.rope_local_theta is None:
            common["rope_theta"] = cfg.rope_theta
        else:
            common["rotary_table"] = functools.partial(layer_rotary, cfg, layer)
    if cfg.attn_scale is not None:
        common["scale"] = attention_scale(cfg)
    if layer_window(cfg, layer) is not None:
        common["window"] = layer_window(cfg, layer)
    if cfg.qk_norm:
        common["q_norm"] = HeadNorm.of(cfg.norm, attn.q_norm, dtype)
        common["k_norm"] = HeadNorm.of(cfg.norm, attn.k_norm, dtype)
    where = "" if stack is None else f"{stack} "
    if stack is not None and getattr(cfg, "relative_buckets", 0):  # T5: the stack's relative position bias
        position_bias = getattr(model, STACKS[stack][0]).position_bias
        common["score_bias"] = lambda n, h=head: position_bias(n, n, 0)[0].detach().to(dtype)[
            slice(None) if h is None else slice(h, h + 1)]
    if head is not None:
        if not 0 <= head < cfg.n_heads:
            raise ValueError(f"head {head} out of range: the model has {cfg.n_heads} heads (0..{cfg.n_heads - 1})")
        hm = model.head_matrices(layer, head) if stack is None else \
            model.head_matrices(layer, head, stack=STACKS[stack][0], kind=kind)
        hdtype = torch.promote_types(model.dtype, torch.float32)
        b = lambda t: None if t is None else t[None].to(hdtype)  # noqa: E731
        return AttentionMap(b(hm.W_Q), b(hm.W_K), b(hm.W_V), b(hm.W_O), b(hm.b_Q), b(hm.b_K), b(hm.b_V),
                            None, label=f"{where}layer {layer} head {head}", **common)
    W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O = _attention_weights(cfg, attn, dtype)
    if block.output_norm(kind) is not None:
        common["out_norm"] = HeadNorm.of(cfg.norm, block.output_norm(kind), dtype)
    return AttentionMap(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, label=f"{where}layer {layer}", **common)


def _attention_weights(cfg, attn, dtype):
    """[H, k, d] W_Q, W_K, W_V (grouped-query heads repeated), their biases, W_O [H, d_out, k] and b_O of an
    Attention module."""
    H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model

    def heads(lin, n_h):  # grouped-query attention: each query head reads its group's key/value head
        w = lin.weight.detach().to(dtype).view(n_h, dh, d)
        bias = None if lin.bias is None else lin.bias.detach().to(dtype).view(n_h, dh)
        if n_h != H:
            w = w.repeat_interleave(H // Hkv, 0)
            bias = None if bias is None else bias.repeat_interleave(H // Hkv, 0)
        return w, bias

    W_O = attn.o.weight.detach().to(dtype).view(d, H, dh).permute(1, 0, 2).contiguous()
    b_O = None if attn.o.bias is None else attn.o.bias.detach().to(dtype)
    return (*heads(attn.q, H), *heads(attn.k, Hkv), *heads(attn.v, Hkv), W_O, b_O)


@dataclass
class CrossAttentionMap(_MapWidths):
    """Multi-head cross-attention X [B, n, d] -> [B, n, d_out] with the keys' and values' side fixed:
    f(X)_i = sum_h W_O[h] sum_j softmax_j(s q_h(x_i) . k_hj) v_hj + b_O, q_h(x) = W_Q[h] x + b_Q[h], and
    k_hj, v_hj [H, m, k] the projections of a fixed memory (the encoder's output on a source text). Each
    row depends on its own x_i only (the memory is not a function of X), so the Jacobian is block
    diagonal. Measured with torch.func (estimator.linearize's generic path); Theorem 3.1 (self-attention)
    does not apply."""
    W_Q: torch.Tensor  # [H, k, d]
    b_Q: torch.Tensor | None
    K: torch.Tensor  # [H, m, k]
    V: torch.Tensor  # [H, m, kv]
    W_O: torch.Tensor  # [H, d_out, kv]
    b_O: torch.Tensor | None = None
    scale: float | None = None  # None: 1/sqrt(k)
    label: str = ""
    kind: str = "softmax"
    masked: bool = False

    def theorem_applies(self) -> bool:
        return False

    def head(self, h: int) -> "CrossAttentionMap":
        sl = slice(h, h + 1)
        return dataclasses.replace(self, W_Q=self.W_Q[sl], b_Q=None if self.b_Q is None else self.b_Q[sl],
                                   K=self.K[sl], V=self.V[sl], W_O=self.W_O[sl], b_O=None,
                                   label=f"{self.label} head {h}".strip())

    def to(self, dtype=None, device=None) -> "CrossAttentionMap":
        conv = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        return dataclasses.replace(self, W_Q=conv(self.W_Q), b_Q=conv(self.b_Q), K=conv(self.K), V=conv(self.V),
                                   W_O=conv(self.W_O), b_O=conv(self.b_O))

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        q = torch.einsum("bnd,hkd->bhnk", X, self.W_Q)
        if self.b_Q is not None:
            q = q + self.b_Q[None, :, None, :]
        p = attention_probs(q, self.K[None].expand(X.shape[0], -1, -1, -1), self.kind, None, scale=self.scale)
        out = torch.einsum("bhnk,hdk->bnd", p @ self.V[None], self.W_O)
        return out if self.b_O is None else out + self.b_O


def cross_map(model, layer: int, head: int | None, source_ids) -> CrossAttentionMap:
    """An encoder-decoder's layer's cross-attention (or one head of it) with the encoder's output on
    `source_ids` (the source text's token ids) held fixed: CrossAttentionMap."""
    cfg = model.cfg
    if not source_ids:
        raise ValueError("cross-attention is measured with the encoder's output on a source text held fixed: "
                         "give a source text")
    if cfg.attention_kind != "softmax":
        raise ValueError(f"cross-attention of {cfg.attention_kind} attention is not measured yet (softmax only)")
    attn = model.attention("decoder", layer, "cross_attn")
    dtype = torch.promote_types(attn.q.weight.dtype, torch.float32)
    with torch.no_grad():
        memory = model.encode(torch.as_tensor(list(source_ids), dtype=torch.long, device=model.device)[None])[0]
    W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O = _attention_weights(cfg, attn, dtype)
    memory = memory.to(dtype)
    K = torch.einsum("md,hkd->hmk", memory, W_K) + (0 if b_K is None else b_K[:, None, :])
    V = torch.einsum("md,hkd->hmk", memory, W_V) + (0 if b_V is None else b_V[:, None, :])
    scale = attention_scale(cfg) if cfg.attn_scale is not None else None
    fmap = CrossAttentionMap(W_Q, b_Q, K, V, W_O, b_O, scale, label=f"cross layer {layer}")
    if head is None:
        return fmap
    if not 0 <= head < cfg.n_heads:
        raise ValueError(f"head {head} out of range: the model has {cfg.n_heads} heads (0..{cfg.n_heads - 1})")
    return fmap.head(head)


def module_function(model, layer: int, masked: bool | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """X [B, n, d] -> the layer's attention sublayer through the model's own modules, called as
    Transformer.forward and Block call them: block.attn(X, mask, rotary) with the causal mask of
    the layer's window (model.layer_window) and the layer's rotary (model.layer_rotary), then
    its output norm, if any (Block.output_norm; PyTorch's math SDPA kernel, which supports
    forward-mode differentiation)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = model.cfg
    block = model.blocks[layer]
    attn = block.attn
    masked = cfg.causal if masked is None else masked
    window = layer_window(cfg, layer)

    def f(X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        mask = causal_mask(n, n, X.device, window)[None, None] if masked else None
        rot = layer_rotary(cfg, layer, torch.arange(n, device=X.device))
        with sdpa_kernel(SDPBackend.MATH):
            out = attn(X, mask, rot)
        out_norm = block.output_norm("attn")
        return out if out_norm is None else out_norm(out)

    return f

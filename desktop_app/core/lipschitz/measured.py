"""The functions measured: one attention head with parameters (A, V), several heads, a model
layer's attention sublayer exactly as the model applies it, or one head of it.

  * one head:  f(X)_i = V sum_j P_ij x_j,  P_ij = softmax_j(x_i^T A^T x_j), or with L2 / Sinkhorn
    attention weights; masked (causal) variant f^m(X)_i = f(x_1..x_i)_i;
  * multi-head f^MH = sum_h W^(h) f^(h);
  * a model layer's attention sublayer (biases, causal mask, rotary), or one head of it
    (model.head_matrices).
All of them are an `AttentionMap` (weights per head, attention kind, mask, rotary), whose scores and
masks come from core/attention.py, the formulas the model itself uses. A model's sublayer can also
be measured through the module itself (`module_function`), which tests use as an independent
reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..attention import ATTENTION_KINDS, attention_probs, causal_mask
from ..model import apply_rotary, rotary_cos_sin


def _rotate_half_t(z: torch.Tensor) -> torch.Tensor:
    """Transpose of the 'rotate half' map R(x) = cat(-x2, x1): R^T(z) = cat(z2, -z1)."""
    z1, z2 = z.chunk(2, dim=-1)
    return torch.cat([z2, -z1], dim=-1)


@dataclass
class AttentionMap:
    """Multi-head self-attention X [B, n, d] -> [B, n, d_out] with explicit per-head weights.

    q_h = W_Q[h] x + b_Q[h], k_h = W_K[h] x + b_K[h] (then rotary when rope_theta is set),
    v_h = W_V[h] x + b_V[h], P_h = attention_probs(q_h, k_h, kind, mask), out = sum_h W_O[h] P_h v_h + b_O.
    The scores scale by 1/sqrt(k) (k = W_Q.shape[1]) as attention_probs does, so
    A_h = W_K[h]^T W_Q[h] / sqrt(k) and x_i^T A_h^T x_j = q_i . k_j / sqrt(k).
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

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {self.kind!r} (known: {', '.join(ATTENTION_KINDS)})")

    @property
    def d(self) -> int:
        return self.W_Q.shape[-1]

    @property
    def d_out(self) -> int:
        return self.W_O.shape[1]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def A(self) -> torch.Tensor:
        """[H, d, d]: A_h = W_K^T W_Q / sqrt(k)."""
        return self.W_K.transpose(1, 2) @ self.W_Q / math.sqrt(self.W_Q.shape[1])

    @property
    def V(self) -> torch.Tensor:
        """[H, d_out, d]: V_h = W_O W_V (the head's value map into the output space)."""
        return self.W_O @ self.W_V

    def head(self, h: int) -> "AttentionMap":
        sl = slice(h, h + 1)
        pick = lambda t: None if t is None else t[sl]  # noqa: E731
        return AttentionMap(self.W_Q[sl], self.W_K[sl], self.W_V[sl], self.W_O[sl], pick(self.b_Q), pick(self.b_K),
                            pick(self.b_V), None, self.kind, self.masked, self.sinkhorn_iters, self.rope_theta,
                            f"{self.label} head {h}".strip())

    def to(self, dtype=None, device=None) -> "AttentionMap":
        conv = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        return AttentionMap(conv(self.W_Q), conv(self.W_K), conv(self.W_V), conv(self.W_O), conv(self.b_Q),
                            conv(self.b_K), conv(self.b_V), conv(self.b_O), self.kind, self.masked,
                            self.sinkhorn_iters, self.rope_theta, self.label)

    # -- pieces shared by the forward pass and the closed-form linearisation ----------------
    def mask(self, n: int, device) -> torch.Tensor | None:
        return causal_mask(n, n, device) if self.masked else None

    def rotary(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.rope_theta is None:
            return None
        cos, sin = rotary_cos_sin(torch.arange(n, device=device), self.W_Q.shape[1], self.rope_theta)
        return cos.to(self.W_Q.dtype), sin.to(self.W_Q.dtype)

    def _proj(self, X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.einsum("bnd,hkd->bhnk", X, W)
        return y if b is None else y + b[None, :, None, :]

    def qkv(self, X: torch.Tensor):
        n = X.shape[1]
        q, k, v = self._proj(X, self.W_Q, self.b_Q), self._proj(X, self.W_K, self.b_K), self._proj(X, self.W_V, self.b_V)
        rot = self.rotary(n, X.device)
        if rot is not None:
            q, k = apply_rotary(q, *rot), apply_rotary(k, *rot)
        return q, k, v, rot

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        q, k, v, _ = self.qkv(X)
        p = attention_probs(q, k, self.kind, self.mask(X.shape[1], X.device), self.sinkhorn_iters)
        out = torch.einsum("bhnk,hdk->bnd", p @ v, self.W_O)
        return out if self.b_O is None else out + self.b_O

    # -- where Theorem 3.1 applies ------------------------------------------------------------
    def theorem_applies(self) -> bool:
        """Softmax, no rotary and no query bias (a key bias shifts each row of scores by a constant
        and a value/output bias shifts the output by a constant: neither changes the Jacobian)."""
        no_q_bias = self.b_Q is None or bool((self.b_Q == 0).all())
        return self.kind == "softmax" and self.rope_theta is None and no_q_bias


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


def layer_map(model, layer: int, head: int | None = None, masked: bool | None = None) -> AttentionMap:
    """model.blocks[layer].attn as the model applies it (all biases, rotary, causal mask by default),
    or one head of it (model.head_matrices: its q/k/v biases, W_O without the shared output bias)."""
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer} out of range: the model has {cfg.n_layers} layers (0..{cfg.n_layers - 1})")
    masked = cfg.causal if masked is None else masked
    theta = cfg.rope_theta if cfg.positions == "rotary" else None
    common = dict(kind=cfg.attention_kind, masked=masked, sinkhorn_iters=cfg.sinkhorn_iters, rope_theta=theta)
    if head is not None:
        if not 0 <= head < cfg.n_heads:
            raise ValueError(f"head {head} out of range: the model has {cfg.n_heads} heads (0..{cfg.n_heads - 1})")
        hm = model.head_matrices(layer, head)
        dtype = torch.promote_types(model.dtype, torch.float32)
        b = lambda t: None if t is None else t[None].to(dtype)  # noqa: E731
        return AttentionMap(b(hm.W_Q), b(hm.W_K), b(hm.W_V), b(hm.W_O), b(hm.b_Q), b(hm.b_K), b(hm.b_V),
                            None, label=f"layer {layer} head {head}", **common)
    attn = model.blocks[layer].attn
    H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    rep = H // Hkv  # grouped-query attention: each query head reads its group's key/value head

    dtype = torch.promote_types(attn.q.weight.dtype, torch.float32)  # float64 models stay float64

    def heads(lin, n_h):
        w = lin.weight.detach().to(dtype).view(n_h, dh, d)
        bias = None if lin.bias is None else lin.bias.detach().to(dtype).view(n_h, dh)
        if n_h != H:
            w = w.repeat_interleave(rep, 0)
            bias = None if bias is None else bias.repeat_interleave(rep, 0)
        return w, bias

    W_Q, b_Q = heads(attn.q, H)
    W_K, b_K = heads(attn.k, Hkv)
    W_V, b_V = heads(attn.v, Hkv)
    W_O = attn.o.weight.detach().to(dtype).view(d, H, dh).permute(1, 0, 2).contiguous()
    b_O = None if attn.o.bias is None else attn.o.bias.detach().to(dtype)
    return AttentionMap(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, label=f"layer {layer}", **common)


def module_function(model, layer: int, masked: bool | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """X [B, n, d] -> model.blocks[layer].attn(X, mask, rotary): the module itself, called as the
    model calls it (PyTorch's math SDPA kernel, which supports forward-mode differentiation)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = model.cfg
    attn = model.blocks[layer].attn
    masked = cfg.causal if masked is None else masked

    def f(X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        mask = causal_mask(n, n, X.device)[None, None] if masked else None
        rot = rotary_cos_sin(torch.arange(n, device=X.device), cfg.d_head, cfg.rope_theta) if cfg.positions == "rotary" else None
        with sdpa_kernel(SDPBackend.MATH):
            return attn(X, mask, rot)

    return f

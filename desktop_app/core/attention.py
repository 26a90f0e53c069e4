"""Attention weights and masks as plain functions: the one home of these formulas.

Everything that turns queries and keys into attention weights reads them from here: the model's
forward pass, generation's one-row-at-a-time attention, and the Lipschitz lab's measured functions
(core/lipschitz/), so a change to a score formula or a mask cannot leave one of them behind.

  softmax:  softmax_j(q_i . k_j / sqrt(dh))
  l2:       softmax_j(-|q_i - k_j|^2 / sqrt(dh))            (Kim et al. 2021)
  sinkhorn: exp(-|q_i - k_j|^2 / sqrt(dh)) made doubly stochastic by alternate row and column
            normalisation, `sinkhorn_iters` rounds, ending on rows (Sander et al. 2022)
"""
from __future__ import annotations

import math

import torch

ATTENTION_KINDS = ("softmax", "l2", "sinkhorn")


def attention_scores(q: torch.Tensor, k: torch.Tensor, kind: str = "softmax", scale: float | None = None) -> torch.Tensor:
    """Scores [..., T_q, T_k] before normalisation: q_i . k_j / sqrt(dh) for softmax attention,
    -|q_i - k_j|^2 / sqrt(dh) for L2 and Sinkhorn attention (expanded as |q|^2 - 2 q.k + |k|^2 so
    it is one matrix product, as the dot-product scores are). scale replaces 1/sqrt(dh) (a config's
    attn_scale)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if kind == "softmax":
        scores = q @ k.transpose(-1, -2)
        # scaled in place when nothing differentiates it (one pass over [..., T_q, T_k] fewer)
        return scores * scale if torch.is_grad_enabled() else scores.mul_(scale)
    if kind in ("l2", "sinkhorn"):
        sq = (q * q).sum(-1, keepdim=True) - 2.0 * (q @ k.transpose(-1, -2)) + (k * k).sum(-1)[..., None, :]
        return -sq * scale
    raise ValueError(f"unknown attention kind {kind!r}")


def sinkhorn_log_normalise(log_p: torch.Tensor, iters: int) -> torch.Tensor:
    """`iters` rounds of row then column normalisation in log space (logsumexp, so large scores
    do not overflow); the caller's final row softmax makes the rows sum to one exactly."""
    for _ in range(iters):
        log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
    return log_p


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` unchanged. Written out because
    torch.broadcast_shapes imports torch.fx's symbolic shapes and sympy on first use (~1.4 s of start-up)."""
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def attention_probs(q: torch.Tensor, k: torch.Tensor, kind: str = "softmax",
                    mask: torch.Tensor | None = None, sinkhorn_iters: int = 3,
                    scale: float | None = None, softcap: float | None = None,
                    n_keys: int | None = None) -> torch.Tensor:
    """Attention weights [..., T_q, T_k] from queries and keys [..., T, dh] (kinds: module docstring).
    n_keys: only the first n_keys keys are attended (T_k = n_keys): k may be a longer buffer, so that a
    product whose key count grows by one each generation step keeps one shape for many steps (oneDNN's
    half-precision products make a new kernel for each new shape, ~0.25 ms; the scores are the same).

    mask: boolean, True where query i may attend key j, or additive (a float bias added to the scores:
    T5's relative positions, with masked keys at the dtype's minimum); scale: as in attention_scores; softcap:
    the scores become softcap * tanh(scores / softcap) before the mask (Gemma 2's attn_logit_softcapping).
    The normalisation runs in float32 at least
    (half-precision softmax loses the small weights), and the result has q's dtype.
    """
    scores = attention_scores(q, k, kind, scale)  # a fresh tensor
    if n_keys is not None and n_keys < scores.shape[-1]:
        scores = scores[..., :n_keys]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    elif mask is not None:
        fill = torch.finfo(scores.dtype).min
        broadcasts = _broadcasts_to(mask.shape, scores.shape)
        in_place = not torch.is_grad_enabled() and broadcasts
        # under autograd too, in place (the scores are this function's own; an add's backward passes the gradient
        # as it is, where masked_fill's is a pass of its own), where every query sees a key: there softmax's
        # backward gives the masked keys 0 either way; a query that sees none would pass its gradient to them
        # (asked after _bias_fills, which is False off the CPU: there the bool() would wait on the device)
        if broadcasts and _bias_fills(q, k, softcap, scale) and (not torch.is_grad_enabled()
                                                                 or bool(mask.any(-1).all())):
            scores = scores.add_(mask_bias(mask, scores.dtype))
        else:
            scores = scores.masked_fill_(~mask, fill) if in_place else scores.masked_fill(~mask, fill)
    work = torch.promote_types(scores.dtype, torch.float32)  # float64 stays float64
    if kind == "sinkhorn":
        return torch.softmax(sinkhorn_log_normalise(scores.to(work), sinkhorn_iters), dim=-1).to(q.dtype)
    if scores.dtype in (torch.bfloat16, torch.float16) and scores.dtype == q.dtype \
            and scores.device.type in ("cpu", "cuda"):
        # these kernels normalise half precision in float32 and round once: softmax(scores.float()).to(dtype)
        # but for a rare last-bit difference in the sum's order (a few entries in 10^6), without the two
        # float32 copies of [..., T_q, T_k] (3.6x faster at 32 x 1024 x 1024 in bfloat16 on this CPU)
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores.to(work), dim=-1).to(q.dtype)


def _bias_fills(q: torch.Tensor, k: torch.Tensor, softcap: float | None, scale: float | None) -> bool:
    """Whether adding mask_bias to the scores of q and k gives what masked_fill writes, on the CPU, where it
    is cheaper: masked_fill is a pass of its own over [..., T_q, T_k] that cost more than an add's (at
    Qwen2.5-0.5B's shape, 1,024 tokens in bfloat16, one thread, ~2.5x; bench firstlook's trace). A score
    plus 0 is the score, and the dtype's minimum plus a score below half its spacing there (2^100 is far
    below: 2^119 in bfloat16, 2^103 in float32) is the minimum. Every score is within d (|q|max + |k|max)^2
    |scale| (dot product and squared distance alike); a NaN or inf in q or k fails the bound, as does
    float16 (its products overflow). (On a GPU the check would wait on the device, and masked_fill is cheap
    there.)"""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float32, torch.float64) or softcap is not None:
        return False
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else abs(scale)
    largest = float(q.detach().abs().amax()) + float(k.detach().abs().amax())  # nan or inf for a non-finite entry
    return q.shape[-1] * largest * largest * scale < 2.0 ** 100


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True where query i may attend key j) as an additive one in `dtype`: 0 where seen,
    the dtype's minimum where not (the value attention_probs' masked_fill writes)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022) as Bloom computes them: 2^(-8h/n) for the n = the largest
    power of two <= n_heads first heads, then every other one of the next power's slopes, in float32."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), device=device, dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, device=device, dtype=torch.int32))
    if closest != n_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), device=device, dtype=torch.float32)
        remaining = min(closest, n_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * remaining, 2, device=device,
                                                                  dtype=torch.int32))])
    return slopes


def alibi_mask(slopes: torch.Tensor, seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ALiBi as an additive mask [..., H, T_q, T_k]: query i at absolute position t_k - t_q + i adds
    slope_h * (j - its position) to its score with key j (a row's constant does not change the softmax:
    Bloom adds slope_h * j), and the dtype's minimum where `seen` (the boolean causal/window/padding mask,
    broadcasting against [H, T_q, T_k]) is False."""
    t_q, t_k = seen.shape[-2:]
    i = torch.arange(t_k - t_q, t_k, device=seen.device)[:, None]
    j = torch.arange(t_k, device=seen.device)[None, :]
    bias = (slopes.to(seen.device)[:, None, None] * (j - i)).to(dtype)
    return torch.where(seen, bias, torch.finfo(dtype).min)


def causal_mask(t_q: int, t_k: int, device=None, window: int | None = None) -> torch.Tensor:
    """[T_q, T_k] boolean, query i (at absolute position t_k - t_q + i) sees keys up to itself;
    with a window (sliding-window attention), only the last `window` of them (itself included)."""
    offset = t_k - t_q
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    seen = j <= i + offset
    return seen if window is None else seen & (j > i + offset - window)


def causal_layer_mask(t_q: int, t_k: int, window: int | None, slopes: torch.Tensor | None, dtype: torch.dtype,
                      device=None) -> torch.Tensor | None:
    """The mask a causal layer applies to its last t_q of t_k positions: None when every query sees every
    key (one query, no window cutting in), else causal_mask's [T_q, T_k] (with the window); with ALiBi's
    slopes, alibi_mask's additive [H, T_q, T_k] over it."""
    seen = causal_mask(t_q, t_k, device, window) if t_q > 1 or (window is not None and t_k > window) else None
    if slopes is None:
        return seen
    if seen is None:
        seen = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    return alibi_mask(slopes, seen, dtype)


def _small_logsumexp(S: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.logsumexp, by hand below 65,536 entries: torch's reduction costs milliseconds per call
    through its thread pool on a busy 2-core machine even for 10 x 10 (measured for the dynamics)."""
    if S.numel() >= 1 << 16:
        return torch.logsumexp(S, dim=dim)
    m = S.amax(dim, keepdim=True)
    return (S - m).exp_().sum(dim, keepdim=True).log_().add_(m).squeeze(dim)


def sinkhorn_to_tolerance(log_k: torch.Tensor, tol: float = 1e-6, max_iter: int = 2000) -> tuple[torch.Tensor, int]:
    """Sinkhorn-Knopp on one [n, m] matrix of log-kernel values, iterated until every column sum is
    within `tol` of 1 (or `max_iter` rounds), ending on rows: (log P, rounds). P's rows sum to 1
    exactly. The tolerance-driven variant of sinkhorn_log_normalise (a fixed number of rounds), for
    the particle dynamics (core/dynamics.py), which needs P doubly stochastic to a known accuracy."""
    g = torch.zeros(log_k.shape[1], dtype=log_k.dtype)
    for it in range(1, max_iter + 1):
        f = -_small_logsumexp(log_k + g[None, :], dim=1)  # rows sum to 1
        col_log = _small_logsumexp(log_k + f[:, None], dim=0) + g
        if float(col_log.abs().max()) < tol:  # |log s| < tol implies |s - 1| < tol (1 + tol) ~ tol
            break
        g = g - col_log
    return log_k + f[:, None] + g[None, :], it

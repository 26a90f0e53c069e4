"""The inputs X [K, n, d] a sweep measures at: tokens drawn in the ball B_R, windows of real text
traced through the model, and a gradient-ascent search for inputs of large ||D_X f||_2."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..jobs import JobControl
from ..trace import Trace
from .estimator import SpectralEstimate, _batched_norm, spectral_norm


def ball_inputs(K: int, n: int, d: int, radius: float, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """[K, n, d] tokens drawn uniformly in the ball of radius R (so X lies in B_R^n)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(K, n, d, generator=g, dtype=dtype)
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * radius * torch.rand(K, n, 1, generator=g, dtype=dtype) ** (1.0 / d)


def window_starts(n_tokens: int, n: int, K: int) -> list[int]:
    if n_tokens < n:
        raise ValueError(f"the text has {n_tokens} tokens, fewer than the window length n = {n}")
    return sorted({int(round(s)) for s in np.linspace(0, n_tokens - n, K)}) if K > 1 else [0]


def real_inputs(model, token_ids: Sequence[int], layer: int, n: int, K: int, starts: Sequence[int] | None = None, *,
                stack: str | None = None, source_ids: Sequence[int] | None = None) -> torch.Tensor:
    """[K', n, d] trace 'blocks.{layer}.attn.input' of K windows of n consecutive tokens, each run
    through the model as its own sequence, all in one batch (K' < K when the text has fewer distinct
    windows). The forward pass stops once that input is recorded.

    An encoder-decoder's (`stack`, measured.layer_modules): "encoder", the windows run through the
    encoder (encoder.blocks.l.attn.input); "decoder" and "cross", the windows are the decoder's input,
    reading the encoder's output on `source_ids` (the same source for every window), and the layer's
    self-attention input (decoder.blocks.l.attn.input) or cross-attention input (.cross_attn.input)."""
    cfg = model.cfg
    if cfg.positions in ("learned", "sinusoidal") and n > cfg.context_length:
        raise ValueError(f"n = {n} exceeds the model's context length {cfg.context_length}")
    starts = window_starts(len(token_ids), n, K) if starts is None else starts
    ids = torch.tensor([list(token_ids[s:s + n]) for s in starts], device=model.device)
    if stack is not None:
        return _stack_inputs(model, ids, layer, stack, source_ids)
    name = f"blocks.{layer}.attn.input"
    # nothing after the point (the layer's attention and MLP, the later blocks) changes it: at layer l
    # the pass runs l blocks and a norm
    _, trace = model.run_with_trace(ids, names=(name,), compute_logits=False, stop_at=name)
    return trace[name].float()


def _stack_inputs(model, ids: torch.Tensor, layer: int, stack: str, source_ids) -> torch.Tensor:
    """real_inputs of an encoder-decoder's stack (see there)."""
    from .measured import layer_modules

    layer_modules(model, layer, stack)  # the layer checked against the stack's depth
    # each pass stops once the point is recorded (stop_at): the layer itself and the later ones never run
    if stack == "encoder":
        name = f"encoder.blocks.{layer}.attn.input"
        trace = Trace((name,))
        with torch.no_grad():
            model.encode(ids, trace=trace, stop_at=name)
        return trace[name].float()
    if not source_ids:
        raise ValueError("the decoder reads the encoder's output: give a source text")
    name = f"decoder.blocks.{layer}.{'cross_attn' if stack == 'cross' else 'attn'}.input"
    trace = Trace((name,))
    with torch.no_grad():
        enc = model.encode(torch.as_tensor(list(source_ids), dtype=torch.long, device=model.device)[None])
        model.decode(ids, enc.expand(ids.shape[0], -1, -1), trace=trace, compute_logits=False, stop_at=name)
    return trace[name].float()


def search_adversarial(fn, X0: torch.Tensor, radius: float, steps: int = 30, step_size: float = 0.05,
                       tol: float = 1e-4, job: JobControl | None = None) -> tuple[torch.Tensor, SpectralEstimate]:
    """Gradient ascent of ||D_X f||_2 over inputs whose tokens lie on the sphere of radius R.

    The gradient of sigma = u^T J(X) v (u, v the top singular pair) is the gradient of
    <u, jvp(f, X, v)> in X; each step moves along its tangent part, by step_size * R per token at
    most, then projects back on the sphere; the estimator restarts from the previous v.
    """
    X = X0.detach()
    X = X * (radius / torch.linalg.vector_norm(X, dim=-1, keepdim=True).clamp_min(1e-30))
    est = spectral_norm(fn, X, tol=tol)
    best_X, best = X.clone(), est
    lr = torch.full((X.shape[0], 1, 1), step_size * radius, dtype=X.dtype, device=X.device)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        u, v = est.left.detach(), est.right.detach()
        grad = torch.func.grad(lambda Y: (u * torch.func.jvp(fn, (Y,), (v,))[1]).sum())(X)
        grad = grad - (grad * X).sum(-1, keepdim=True) * X / radius ** 2  # tangent to each sphere
        gnorm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True).amax(1, keepdim=True).clamp_min(1e-30)
        Y = X + lr * grad / gnorm
        Y = Y * (radius / torch.linalg.vector_norm(Y, dim=-1, keepdim=True).clamp_min(1e-30))
        # warm start from the previous top vector, mixed with fresh noise so no direction is starved
        noise = torch.randn(est.right.shape, generator=gen, dtype=X.dtype).to(X.device)
        start = est.right / _batched_norm(est.right)[:, None, None] + 0.3 * noise / _batched_norm(noise)[:, None, None]
        new = spectral_norm(fn, Y, tol=tol, start=start)
        better = new.sigma > est.sigma
        lr = torch.where(better[:, None, None], lr * 1.2, lr * 0.5)
        X = torch.where(better[:, None, None], Y, X)
        est = _pick(better, new, est)
        improved = est.sigma > best.sigma
        best_X = torch.where(improved[:, None, None], X, best_X)
        best = _pick(improved, est, best)
        if job is not None:
            job.check()
    # the reported value comes from a fresh random start as well (a warm start may miss a direction)
    cold = spectral_norm(fn, best_X, tol=tol, seed=1)
    return best_X, _pick(cold.sigma > best.sigma, cold, best)


def _pick(mask: torch.Tensor, a: SpectralEstimate, b: SpectralEstimate) -> SpectralEstimate:
    m3 = mask[:, None, None]
    return SpectralEstimate(torch.where(mask, a.sigma, b.sigma), torch.where(m3, a.right, b.right),
                            torch.where(m3, a.left, b.left), torch.where(mask.cpu(), a.iterations, b.iterations),
                            torch.where(mask, a.residual, b.residual), torch.where(mask.cpu(), a.converged, b.converged))

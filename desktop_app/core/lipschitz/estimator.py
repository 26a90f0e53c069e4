"""The estimator of a local Lipschitz constant ||D_X f||_2: the largest singular value of the
Jacobian with the Frobenius norm on (R^d)^n, computed matrix-free.

`spectral_norm`: Golub-Kahan-Lanczos bidiagonalisation (equivalent to Lanczos on J^T J, one J v and
one J^T u per step) with explicit restarts (full reorthogonalisation only in the rigorous mode),
batched over all samples of the same n (converged samples leave the batch). For softmax attention
the products are closed-form batched matmuls with the attention matrix computed once; other kinds
use torch.func (a vjp closure built once per batch). Stopping rule (default tol 1e-4, relative): the
Kato-Temple error estimate 10 theta r^2 / (theta^2 - theta_2^2) or the residual
r = ||J^T u - theta v||, whichever is smaller, is below tol * theta (theta never exceeds sigma_max);
rigorous=True uses r alone, which guarantees a singular value within tol * theta. No Krylov method
can see a direction its start vector misses entirely, so starts are fresh Gaussian vectors (see
run_sweep on warm starts).

`published_power_iteration` is the paper's procedure as published (the benchmark's reference;
`power_iteration` the same iteration with a looser relative stopping rule); `exact_jacobian_norm` builds
the Jacobian, the small-case reference of the tests. Nothing else builds it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..attention import attention_probs
from ...threads import SMALL_WORK_ELEMENTS, fair_thread_count, one_thread_when_small, torch_threads
from ..jobs import JobControl
from ..model import apply_rotary
from .measured import AttentionMap, rotary_transpose

KATO_TEMPLE_SAFETY = 10.0
MIN_STEPS = 3
KEEP_LINEARIZATION_BYTES = 256e6  # up to this, the first linearisation is kept for the final product
# From this n, a causal P's products skip its zero upper-right quarter (3/4 of the n x n work); below it
# the extra products' own cost outweighs the saving
SPLIT_CAUSAL_FROM_N = 128


class _SoftmaxLinearization:
    """Closed-form J v and J^T u of softmax attention at X, sharing q, k, v, P computed once.

    dS = s (dq k^T + q dk^T) (s the map's score scale, 1/sqrt(k) by default), one product of
    [dq | q] and [s k | s dk]; dP = P * (dS - r), r = rowsum(P * dS), so dY = P dv + (P * dS) v - r y
    with y = P v the forward output: r comes out of the same product as a column of ones appended
    to v. Backwards: gP = gY v^T, gS = P * (gP - c) with c_i = rowsum(P * gP)_i = gY_i . y_i (no
    pass over the n x n array), and gP - c is again one product, [gY | -c] [v | 1]^T. Each product
    writes its n x n array once and reads it once or twice: the n x n products are the cost, so a
    causal P's zero upper-right quarter is skipped from SPLIT_CAUSAL_FROM_N (two row blocks). Rotary is transposed as cos*y - R(sin*y) on the rotating dims. Valid only where q and k
    are affine in X (no q/k norm) and nothing follows the output projection (no out_norm):
    `linearize` checks. The three input projections are one matmul with the stacked weights, the
    output one more.
    """

    def __init__(self, fmap: AttentionMap, X: torch.Tensor) -> None:
        self.f = fmap
        q, k, v, self.rot = fmap.qkv(X)
        B, H, n, kq = q.shape
        self.H, self.kq, self.kv = H, kq, fmap.W_V.shape[1]
        self.scale = 1.0 / math.sqrt(kq) if fmap.scale is None else fmap.scale
        P = attention_probs(q, k, "softmax", fmap.mask(n, X.device), scale=fmap.scale)
        flat = lambda t: t.reshape(B * H, n, -1)  # noqa: E731  [B*H, n, .] for bmm
        self.P = flat(P).contiguous()
        self.q, self.k = flat(q), flat(k)
        ones = v.new_ones(B * H, n, 1)
        self.v1 = torch.cat([flat(v), ones], -1)  # [v | 1]
        self.y = torch.bmm(self.P, flat(v))  # each head's output P v
        self.q_s, self.k_s = self.q * self.scale, self.k * self.scale  # s q, s k: the scale folded in once
        # Row blocks (first row, last row, columns read: 0..cols) and P's part in each: rows r0:r1 of P are
        # zero beyond column cols. One block, unless the upper-right quarter is zero (causal, checked on
        # P itself), which the products then skip.
        h = n // 2
        split = n >= SPLIT_CAUSAL_FROM_N and not bool(self.P[:, :h, h:].any())
        self.blocks = [(0, h, h), (h, n, n)] if split else [(0, n, n)]
        self.P_blocks = [self.P[:, r0:r1, :cols].contiguous() for r0, r1, cols in self.blocks] if split else [self.P]
        d = fmap.W_Q.shape[2]
        # [d, H*k | H*k | H*kv] and [H*kv, d_out]
        self.W_in = torch.cat([fmap.W_Q.reshape(H * kq, d), fmap.W_K.reshape(H * kq, d),
                               fmap.W_V.reshape(H * self.kv, d)], 0).T.contiguous()
        # the same rows head by head ([H * (k + k + kv), d]: each head's q, k, v rows together), for the vjp,
        # whose gradients are head-major
        self.W_in_heads = torch.cat([fmap.W_Q, fmap.W_K, fmap.W_V], 1).reshape(-1, d)
        self.W_out = fmap.W_O.permute(0, 2, 1).reshape(H * self.kv, fmap.d_out).contiguous()
        self.out_shape = (B, n, fmap.d_out)
        if split:
            self.P = None  # only the blocks are read

    def select(self, keep: torch.Tensor) -> "_SoftmaxLinearization":
        """The linearisation at X[keep] (shares the weights, slices the cached activations)."""
        new = object.__new__(_SoftmaxLinearization)
        new.__dict__.update(self.__dict__)
        rows = keep.repeat_interleave(self.H)  # per (sample, head) row of the flat arrays
        for name in ("q", "k", "v1", "y", "q_s", "k_s"):
            setattr(new, name, getattr(self, name)[rows])
        new.P_blocks = [Pb[rows] for Pb in self.P_blocks]
        new.P = new.P_blocks[0] if len(self.blocks) == 1 else None
        new.out_shape = (int(keep.sum()),) + tuple(self.out_shape[1:])
        return new

    def _split(self, Y: torch.Tensor):
        B, n, _ = Y.shape
        H, k, kv = self.H, self.kq, self.kv
        heads = lambda t, w: t.reshape(B, n, H, w).transpose(1, 2)  # noqa: E731
        return (heads(Y[..., : H * k], k), heads(Y[..., H * k: 2 * H * k], k), heads(Y[..., 2 * H * k:], kv))

    def jvp(self, dX: torch.Tensor) -> torch.Tensor:
        dq, dk, dv = self._split(dX @ self.W_in)
        if self.rot is not None:
            cos, sin = self.rot
            dq, dk = apply_rotary(dq, cos, sin), apply_rotary(dk, cos, sin)
        B, H, n, _ = dq.shape
        flat = lambda t: t.reshape(B * H, n, -1)  # noqa: E731
        # dS = [dq | q] [s k | s dk]^T: one product, one n x n write (per row block)
        left = torch.cat([flat(dq), self.q], -1)
        right = torch.cat([self.k_s, flat(dk) * self.scale], -1)
        dv, kv = flat(dv), self.kv
        parts = []
        for (r0, r1, cols), Pb in zip(self.blocks, self.P_blocks):
            dPdS = (left[:, r0:r1] @ right[:, :cols].transpose(1, 2)).mul_(Pb)  # P * dS
            out = dPdS @ self.v1[:, :cols]  # [(P * dS) v | r]
            parts.append(torch.baddbmm(torch.addcmul(out[..., :kv], out[..., kv:], self.y[:, r0:r1], value=-1.0),
                                       Pb, dv[:, :cols]))
        dY = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        return dY.view(B, H, n, -1).transpose(1, 2).reshape(B, n, -1) @ self.W_out

    def vjp(self, G: torch.Tensor) -> torch.Tensor:
        B, n, _ = G.shape
        H, kv = self.H, self.kv
        gY = (G @ self.W_out.T).reshape(B, n, H, kv).transpose(1, 2).reshape(B * H, n, kv)
        c = (gY * self.y).sum(-1, keepdim=True)  # rowsum(P * gP) = gY_i . y_i
        left = torch.cat([gY, -c], -1)
        gq_parts = []
        gk = gv = None
        # the last block reads every column: it writes gk and gv whole, the others add to their columns
        for (r0, r1, cols), Pb in reversed(list(zip(self.blocks, self.P_blocks))):
            gS = (left[:, r0:r1] @ self.v1[:, :cols].transpose(1, 2)).mul_(Pb)  # P * (gP - c)
            gq_parts.append(gS @ self.k_s[:, :cols])
            if gk is None:
                gk, gv = gS.transpose(1, 2) @ self.q_s[:, r0:r1], Pb.transpose(1, 2) @ gY[:, r0:r1]
            else:  # bmm then add: an in-place baddbmm_ into these strided column slices runs one addmm_ per
                # batch entry (B*H of them; 34% of a width-768 sweep's time at n = 256), bmm one batched call
                gk[:, :cols] += torch.bmm(gS.transpose(1, 2), self.q_s[:, r0:r1])
                gv[:, :cols] += torch.bmm(Pb.transpose(1, 2), gY[:, r0:r1])
        gq = gq_parts[0] if len(gq_parts) == 1 else torch.cat(gq_parts[::-1], 1)
        gq, gk, gv = gq.view(B, H, n, -1), gk.view(B, H, n, -1), gv.view(B, H, n, -1)
        if self.rot is not None:
            cos, sin = self.rot
            gq, gk = rotary_transpose(gq, cos, sin), rotary_transpose(gk, cos, sin)
        # one concatenation, head-major, and one token-major copy against the head-major rows of W_in: 4 torch
        # ops where writing each gradient into its columns of W_in's order took 13 (per-op cost rules here)
        grad_heads = torch.cat([gq, gk, gv], -1)  # [B, H, n, k + k + kv]
        return grad_heads.transpose(1, 2).reshape(B, n, -1) @ self.W_in_heads


class _AutogradLinearization:
    """J^T u by a vjp closure built once at X (one forward pass), and J v as the vjp of that closure
    (it is linear in u), so no product repeats the forward pass. Per product this is ~3.5x faster
    than forward mode (torch.func.jvp re-runs the forward every time) on the demo model's layers;
    no_grad keeps the module's parameters (requires_grad=True) from recording a graph across products."""

    def __init__(self, fn: Callable, X: torch.Tensor) -> None:
        self.fn, self.X = fn, X
        with torch.no_grad():
            out, self._vjp = torch.func.vjp(fn, X)
            _, self._jvp = torch.func.vjp(lambda u: self._vjp(u)[0], torch.zeros_like(out))  # (J^T)^T = J
        self.out_shape = tuple(out.shape)

    def select(self, keep: torch.Tensor) -> "_AutogradLinearization":
        return _AutogradLinearization(self.fn, self.X[keep])

    def jvp(self, dX: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._jvp(dX)[0]

    def vjp(self, G: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._vjp(G)[0]


def linearize(fn, X: torch.Tensor):
    """An object with jvp(dX) and vjp(G) at X: closed form for softmax AttentionMaps whose scores
    are bilinear and whose output is not normed; autograd for everything else (q/k norms, sandwich
    output norms, other attention kinds, any callable)."""
    if isinstance(fn, AttentionMap) and fn.kind == "softmax" and fn.scores_bilinear and fn.out_norm is None:
        return _SoftmaxLinearization(fn, X)
    return _AutogradLinearization(fn, X)


# -- the estimator -----------------------------------------------------------------------------


@dataclass
class SpectralEstimate:
    sigma: torch.Tensor  # [B] estimates of ||D_X f||_2 (never above the true value)
    right: torch.Tensor  # [B, n, d] unit right singular vectors (input directions)
    left: torch.Tensor  # [B, n, d_out]
    iterations: torch.Tensor  # [B] J^T J products (one jvp + one vjp each) until converged
    residual: torch.Tensor  # [B] ||J^T u - sigma v||: a singular value lies within this of sigma
    converged: torch.Tensor  # [B] bool


def _batched_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x.flatten(1), dim=1)


DGKS_ETA = 0.7071067811865476  # a second Gram-Schmidt pass when the first removes more than half of ||w||^2


def _orthogonalize(w: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """w [B, N] minus its projection on the rows of basis [B, j, N] (orthonormal rows): classical
    Gram-Schmidt as two batched matrix products, repeated once only where the first pass removed most
    of w (Daniel-Gragg-Kaufman-Stewart criterion ||w'|| < ||w|| / sqrt(2)), so the basis is usually
    read twice per call instead of four times."""
    if basis.shape[1] == 0:
        return w
    w3 = w[:, :, None]
    bt = basis.transpose(1, 2)
    out = torch.baddbmm(w3, bt, basis @ w3, alpha=-1.0)
    if bool((_batched_norm(out) < DGKS_ETA * _batched_norm(w3)).any()):
        out = torch.baddbmm(out, bt, basis @ out, alpha=-1.0)
    return out[:, :, 0]


def _slots(basis: torch.Tensor, keep: torch.Tensor | None, used: int, cap: int) -> torch.Tensor:
    """A new basis buffer [b', cap, N] holding the first `used` vectors of the kept samples (all
    samples when keep is None): only the used part is copied."""
    rows = basis.shape[0] if keep is None else int(keep.sum())
    out = basis.new_empty((rows, cap, basis.shape[2]))
    out[:, :used] = basis[:, :used] if keep is None else basis[keep, :used]
    return out


def _ritz(alphas: np.ndarray, betas: np.ndarray, k: int):
    """SVD of the k x k upper bidiagonal matrices (float64, numpy: tiny and batched)."""
    Bk = np.zeros((alphas.shape[0], k, k))
    i = np.arange(k)
    Bk[:, i, i] = alphas[:, :k]
    Bk[:, i[:-1], i[1:]] = betas[:, : k - 1]
    return np.linalg.svd(Bk)


def spectral_norm(fn, X: torch.Tensor, tol: float = 1e-4, max_iter: int = 500, basis_size: int | None = None,
                  start: torch.Tensor | None = None, seed: int = 0, rigorous: bool = False,
                  reorthogonalize: bool | None = None, job: JobControl | None = None) -> SpectralEstimate:
    """Largest singular value of D_X f for every sample of X [B, n, d], matrix-free and batched.

    Golub-Kahan-Lanczos, restarted from the best Ritz vector every `basis_size` steps (memory:
    basis_size + 1 vectors of n*d and basis_size of n*d_out per sample; by default as many as fit in
    ~512 MB, at most 64, so restarts are rare: a restart throws the Krylov space away, and on clustered spectra, e.g. a
    random GPT-2 layer, that needs 20-40 steps). With theta the top Ritz value, r = ||J^T u - theta v||
    its residual and theta_2 the next Ritz value, a sample stops when its error estimate
    min(r, 10 theta r^2 / (theta^2 - theta_2^2)) <= tol * theta (the second term is the Kato-Temple
    bound with the Ritz gap standing in for the true gap, times a safety factor 10 because the Ritz
    gap can overstate it; after a restart theta_2 is the largest second Ritz value seen so far, since
    the small restarted space's own theta_2 overstates the gap badly); with rigorous=True only
    r <= tol * theta, which guarantees a singular value within tol * theta. Converged samples leave
    the batch, so the work shrinks as they finish.

    Reorthogonalisation: by default only the recurrence's own (each vector against the previous
    one); full reorthogonalisation (classical Gram-Schmidt, a second pass where needed) with
    rigorous=True, whose guarantee needs an orthonormal basis, or when asked. Without it the basis
    slowly loses orthogonality once the top Ritz pair converges (Paige), which can only add spurious
    copies of converged values, not move them; the returned sigma is then recomputed as
    ||J v|| / ||v|| from the final vector (one more product for the whole batch), a value no
    Jacobian can exceed, and the residual is the recurrence's estimate. Measured: the same
    iteration counts and values within 1e-7 on the demo model and a random GPT-2 layer, for 30-35%
    less time (the reorthogonalisation reads the whole basis twice per product).
    """
    # small products: one thread (threads.one_thread_when_small); the work per product is the batch's input.
    # Larger ones: the cores free now (threads.fair_thread_count), chosen again as the steps go (_refit_threads)
    refit = X.numel() > SMALL_WORK_ELEMENTS and not os.environ.get("OMP_NUM_THREADS")
    with one_thread_when_small(X.numel()), torch_threads(torch.get_num_threads() if refit else None):
        return _spectral_norm(fn, X, tol, max_iter, basis_size, start, seed, rigorous, reorthogonalize, job,
                              torch.get_num_threads() if refit else 0)


# Every this many steps a large batch's thread count is chosen again: a neighbour that started (or ended) since
# the sweep began changes it. Two torch threads beside busy neighbours on 2 cores took 4-8x one thread's time
# (random GPT-2-small layer 6, n = 32, load 7: 11.6 s for a length whose half took 1.5 s on one thread).
REFIT_THREADS_EVERY = 4


def _refit_threads(most: int) -> None:
    """torch on the cores free now, at most `most` (the count the caller gave the sweep)."""
    torch.set_num_threads(min(most, fair_thread_count()))


def _spectral_norm(fn, X: torch.Tensor, tol: float, max_iter: int, basis_size: int | None, start: torch.Tensor | None,
                   seed: int, rigorous: bool, reorthogonalize: bool | None, job: JobControl | None,
                   refit_threads: int = 0) -> SpectralEstimate:
    if reorthogonalize is None:
        reorthogonalize = rigorous
    X = X.detach()
    B, n, d = X.shape
    N = n * d
    lin = linearize(fn, X)
    # The final Rayleigh quotient needs the linearisation at the whole X again: keep this one when its
    # n x n arrays (P per head) are small, else free it and rebuild it at the end (large n).
    heads = fn.W_Q.shape[0] if isinstance(fn, AttentionMap) else None
    keep_whole = heads is not None and B * heads * n * n * X.element_size() <= KEEP_LINEARIZATION_BYTES
    whole_lin = lin if keep_whole and not reorthogonalize else None
    out_shape = tuple(lin.out_shape)
    M = int(np.prod(out_shape[1:]))
    dtype, dev = X.dtype, X.device
    tiny = torch.finfo(dtype).tiny
    if basis_size is None:  # keep the Krylov bases near 512 MB whatever n and d
        basis_size = int(max(8, min(64, 512e6 / (B * (N + M) * X.element_size()))))
    if start is None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        v = torch.randn(B, N, generator=g, dtype=dtype).to(dev)
    else:
        v = start.reshape(B, N).to(dtype)
    v = v / _batched_norm(v)[:, None]

    # results, per sample
    sigma = torch.zeros(B, dtype=dtype, device=dev)
    residual = torch.full((B,), float("inf"), dtype=dtype, device=dev)
    iterations = torch.zeros(B, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    right = torch.zeros(B, N, dtype=dtype, device=dev)
    left = torch.zeros(B, M, dtype=dtype, device=dev)
    active = torch.arange(B)  # samples still iterating; lin and v cover exactly these
    theta2_seen = np.zeros(B)  # largest second Ritz value of earlier cycles (a lower bound of sigma_2)
    total = 0
    Vb = Ub = None
    while total < max_iter and len(active):
        b = len(active)
        S = min(basis_size, max_iter - total)
        # the bases grow as needed (most samples stop long before S steps): untouched memory and
        # dropping converged samples cost nothing for slots never used
        cap = min(S + 1, 16)
        Vb = torch.empty(b, cap, N, dtype=dtype, device=dev)
        Ub = torch.empty(b, cap, M, dtype=dtype, device=dev)
        alphas = np.zeros((b, S))
        betas = np.zeros((b, S))
        Vb[:, 0] = v
        restart_v = None
        for j in range(S):
            if refit_threads and total % REFIT_THREADS_EVERY == 0:
                _refit_threads(refit_threads)
            u = lin.jvp(Vb[:, j].view(b, n, d)).reshape(b, M)
            if j > 0:  # the GKL recurrence (then, if asked, reorthogonalisation against all of U)
                u = torch.addcmul(u, beta_prev[:, None], Ub[:, j - 1], value=-1.0)  # one op: per-op cost rules here
                if reorthogonalize:
                    u = _orthogonalize(u, Ub[:, :j])
            alpha = _batched_norm(u)
            torch.div(u, alpha.clamp_min(tiny)[:, None], out=Ub[:, j])
            w = lin.vjp(Ub[:, j].view((b,) + out_shape[1:])).reshape(b, N)
            w = torch.addcmul(w, alpha[:, None], Vb[:, j], value=-1.0)
            if reorthogonalize:
                w = _orthogonalize(w, Vb[:, : j + 1])
            beta = _batched_norm(w)
            beta_prev = beta
            if j + 1 == cap:
                cap = min(2 * cap, S + 1)
                Vb, Ub = _slots(Vb, None, j + 1, cap), _slots(Ub, None, j + 1, cap)
            torch.div(w, beta.clamp_min(tiny)[:, None], out=Vb[:, j + 1])
            alpha_beta = torch.stack([alpha, beta]).double().cpu().numpy()  # one device-to-host copy
            alphas[:, j], betas[:, j] = alpha_beta[0], alpha_beta[1]
            total += 1
            # Ritz values: singular values of the (j+1)x(j+1) upper bidiagonal matrix
            k = j + 1
            left_ritz, ritz_values, right_ritz_t = _ritz(alphas, betas, k)  # B_k = left diag(values) right_t
            theta = ritz_values[:, 0]
            r = betas[:, j] * np.abs(left_ritz[:, -1, 0])
            err = r
            if not rigorous and k > 1:
                t2 = np.maximum(ritz_values[:, 1], theta2_seen[active.numpy()])
                gap = theta ** 2 - t2 ** 2
                with np.errstate(divide="ignore", invalid="ignore"):
                    kt = np.where(gap > 0, KATO_TEMPLE_SAFETY * theta * r ** 2 / np.maximum(gap, 1e-300), np.inf)
                err = np.minimum(r, kt)
            # a breakdown (beta ~ 0) means the Krylov space is invariant: theta is exact
            breakdown = betas[:, j] <= 1e-12 * np.maximum(theta, 1e-300)
            newly = (err <= tol * theta) | breakdown
            if k < MIN_STEPS and not rigorous:  # too early to trust a Ritz gap
                newly = breakdown
            last = total >= max_iter or j == S - 1
            # the usual step (nobody stops) decides in numpy: no torch op (each costs more than its work here)
            if last or newly.any():
                newly_t = torch.from_numpy(newly)
                finishing_np = np.flatnonzero(newly | last)  # positions in the batch of the samples that stop now
                finishing = torch.from_numpy(finishing_np)
                q1 = torch.from_numpy(right_ritz_t[finishing_np, 0, :]).to(dtype=dtype, device=dev)  # right singular vectors of Bk
                p1 = torch.from_numpy(left_ritz[finishing_np, :, 0]).to(dtype=dtype, device=dev)
                finishing_dev = finishing.to(dev)
                whole = len(finishing) == b  # then views of the bases, not copies
                vr = (q1[:, None, :] @ (Vb[:, :k] if whole else Vb[finishing_dev, :k]))[:, 0]
                ur = (p1[:, None, :] @ (Ub[:, :k] if whole else Ub[finishing_dev, :k]))[:, 0]
                idx = active[finishing]
                sigma[idx.to(dev)] = torch.from_numpy(theta[finishing_np]).to(dtype=dtype, device=dev)
                residual[idx.to(dev)] = torch.from_numpy(r[finishing_np]).to(dtype=dtype, device=dev)
                iterations[idx] = total
                right[idx.to(dev)] = vr
                left[idx.to(dev)] = ur
                done[active[newly_t]] = True
                if last:
                    restart_v = vr[~newly_t[finishing].to(dev)]
                    if k > 1:
                        theta2_seen[active.numpy()] = np.maximum(theta2_seen[active.numpy()], ritz_values[:, 1])
                keep = ~newly_t
                if not bool(keep.any()):
                    active = active[:0]
                    break
                if last:
                    active = active[keep]
                    lin = lin.select(keep.to(dev)) if not bool(keep.all()) else lin
                    break
                # compact: converged samples leave the batch and the Krylov bases shrink with it
                keep_dev = keep.to(dev)
                active, lin = active[keep], lin.select(keep_dev)
                Vb, Ub = _slots(Vb, keep_dev, j + 2, cap), _slots(Ub, keep_dev, j + 1, cap)
                alphas, betas = alphas[keep.numpy()], betas[keep.numpy()]
                beta_prev = beta_prev[keep_dev]
                b = len(active)
        if restart_v is None or not len(active):
            break
        v = restart_v / _batched_norm(restart_v)[:, None]  # explicit restart from the best Ritz vector
        if job is not None:
            job.check()
    if not reorthogonalize:  # the Rayleigh quotient of the final vector: never above sigma_max
        lin = Vb = Ub = None  # free the bases and activations first (large n)
        final_lin = whole_lin if whole_lin is not None else linearize(fn, X)  # the same values either way
        Jv = final_lin.jvp(right.view(B, n, d)).reshape(B, M)
        norm_v, norm_Jv = _batched_norm(right).clamp_min(tiny), _batched_norm(Jv)
        sigma, right, left = norm_Jv / norm_v, right / norm_v[:, None], Jv / norm_Jv.clamp_min(tiny)[:, None]
    return SpectralEstimate(sigma, right.view(B, n, d), left.view((B,) + out_shape[1:]), iterations, residual,
                            done.clone())


def power_iteration(fn, X: torch.Tensor, tol: float = 1e-4, max_iter: int = 100, seed: int = 0) -> tuple[float, int]:
    """The paper's procedure for ONE input X [n, d]: power iteration on J^T J from a Gaussian start,
    one J v and one J^T u per iteration, stopping when the estimate changes by less than tol
    (relative) or after max_iter iterations. Returns (sigma, iterations). Kept as the benchmark
    reference, not used by the app.

    Made as fast as the procedure allows, so that a benchmark against it is fair: the products come
    from _AutogradLinearization (one forward pass per input, none per iteration). Measured on the demo
    model's layer 0 (CPU, one thread, n = 8..256), per iteration: 2.7-3.8x faster than
    torch.autograd.functional.jvp + vjp (double backward, forward run twice per iteration; 2.5-2.8x
    end to end, same iteration counts); torch.func.linearize needs a 0.25-0.4 s trace per input."""
    g = torch.Generator().manual_seed(seed)
    x = X.detach()[None]
    v = torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
    v = v / v.norm()
    lin = _AutogradLinearization(fn, x)
    with torch.no_grad():
        prev, it, sigma = 0.0, 0, 0.0
        for it in range(1, max_iter + 1):
            w = lin.vjp(lin.jvp(v))  # one jvp, one vjp: w = J^T J v
            w_norm = float(w.norm())
            sigma = w_norm ** 0.5
            if w_norm == 0.0:  # J v = 0: a Jacobian that vanishes (or a start in its null space)
                break
            v = w / w_norm
            if abs(sigma - prev) < tol * sigma:
                break
            prev = sigma
    return sigma, it


def published_power_iteration(fn, X: torch.Tensor, tol: float = 1e-4, max_iter: int = 100,
                              seed: int = 0) -> tuple[float, int]:
    """The paper's procedure exactly as its code does it, for ONE input X [n, d]: a Gaussian start u,
    then per iteration v = J^T J u through one torch.func.jvp (which re-runs the forward pass) and one
    vjp closure (built once per input), mu = <u, v>, u = v / ||v||; stop when |mu - mu_previous| <= tol
    in absolute value (mu estimates sigma^2), at most max_iter iterations. Returns (sqrt(mu),
    iterations). The benchmark's reference (issue 20); `power_iteration` is the older, looser rule
    (relative change of sigma), kept as an extra row."""
    g = torch.Generator().manual_seed(seed)
    x = X.detach()[None]
    u = torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
    u = u / u.norm()
    with torch.no_grad():  # the transforms still differentiate in x; no graph through the parameters
        _, vjp_fn = torch.func.vjp(fn, x)
        mu_prev, mu, it = None, 0.0, 0
        for it in range(1, max_iter + 1):
            Ju = torch.func.jvp(fn, (x,), (u,))[1]
            v = vjp_fn(Ju)[0]
            mu = float((u * v).sum())
            v_norm = float(v.norm())
            if v_norm == 0.0:  # J u = 0
                break
            u = v / v_norm
            if mu_prev is not None and abs(mu - mu_prev) <= tol:
                break
            mu_prev = mu
    return max(mu, 0.0) ** 0.5, it


def exact_jacobian_norm(fn, X: torch.Tensor) -> torch.Tensor:
    """[B] exact ||D_X f||_2 from the full Jacobian (reference for small n*d only)."""
    out = []
    for x in X.detach():
        jac = torch.func.jacrev(lambda y: fn(y[None])[0])(x)
        n, d = x.shape
        out.append(torch.linalg.matrix_norm(jac.reshape(-1, n * d), ord=2))
    return torch.stack(out).detach()

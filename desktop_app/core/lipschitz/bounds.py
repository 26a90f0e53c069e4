"""Theorem 3.1 of Castin, Ablin, Peyré (2024): the upper and lower bounds on the Lipschitz
constant of softmax attention on B_R^n, the eigen-analysis of A they need (gamma), the adversarial
construction behind the lower bound, and `map_bounds`, which says where they cover a measured
function and evaluates them."""
from __future__ import annotations

import math

import numpy as np
import torch

from .measured import AttentionMap


def upper_bound(n, radius, norm_A, norm_V):
    """Lip(f on B_R^n) <= sqrt(3) ||V||_2 (||A||_2^2 R^4 (4n+1) + n)^(1/2) (Theorem 3.1)."""
    n, radius = np.asarray(n, dtype=float), np.asarray(radius, dtype=float)
    return math.sqrt(3.0) * norm_V * np.sqrt(norm_A ** 2 * radius ** 4 * (4 * n + 1) + n)


def lower_bound(n, radius, gamma):
    """Lip(f on B_R^n) >= sqrt(n-1) / (1 + (n-1) exp(-2 R^2 gamma)) (Theorem 3.1, V = I)."""
    n, radius = np.asarray(n, dtype=float), np.asarray(radius, dtype=float)
    return np.sqrt(n - 1) / (1.0 + (n - 1) * np.exp(-2.0 * radius ** 2 * gamma))


def real_eigen(A: torch.Tensor, rel_tol: float = 1e-7) -> tuple[torch.Tensor, torch.Tensor]:
    """Real eigenvalues of A [d, d] and their unit eigenvectors (columns)."""
    vals, vecs = _real_pairs(*torch.linalg.eig(A.double()), rel_tol)
    return vals, vecs / torch.linalg.vector_norm(vecs, dim=0, keepdim=True)


def _real_pairs(vals: torch.Tensor, vecs: torch.Tensor, rel_tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The eigenpairs whose eigenvalue is real (imaginary part <= rel_tol * the largest modulus)."""
    scale = max(float(vals.abs().max()), 1e-300)
    real = vals.imag.abs() <= rel_tol * scale
    return vals[real].real, vecs[:, real].real


def head_eigen(fmap: AttentionMap, h: int, rel_tol: float = 1e-7) -> tuple[torch.Tensor, torch.Tensor]:
    """real_eigen of head h's A = W_K^T W_Q s (s the score scale, 1/sqrt(k) by default). With k < d,
    A has rank <= k: its nonzero eigenvalues are those of the k x k matrix W_Q W_K^T s (AB and BA share them), with
    eigenvectors W_K^T y, and 0 is an eigenvalue with any vector outside the row space of W_Q
    (GPT-2 small: a 64 x 64 problem instead of a 768 x 768 one, ~1000x faster)."""
    W_Q, W_K = fmap.W_Q[h].double(), fmap.W_K[h].double()
    k, d = W_Q.shape
    if k >= d:
        return real_eigen(fmap.A[h], rel_tol)
    L = fmap.scaled(W_K.T)
    vals, ys = _real_pairs(*torch.linalg.eig(W_Q @ L), rel_tol)
    vecs = L @ ys
    Q = torch.linalg.qr(W_Q.T).Q  # row space of W_Q
    z = torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(Q.device)
    null = z - Q @ (Q.T @ z)
    vals = torch.cat([vals, vals.new_zeros(1)])
    vecs = torch.cat([vecs, null[:, None]], 1)
    norms = torch.linalg.vector_norm(vecs, dim=0)
    ok = norms > 0  # W_K^T y = 0 only for a zero eigenvalue, which the null vector already covers
    return vals[ok], vecs[:, ok] / norms[ok]


def gamma_of(A: torch.Tensor) -> float:
    """gamma = max(-gamma_min, gamma_max / 8) over the real eigenvalues of A (nan if none)."""
    return _gamma(real_eigen(A)[0])


def _gamma(vals: torch.Tensor) -> float:
    if vals.numel() == 0:
        return float("nan")
    return max(-float(vals.min()), float(vals.max()) / 8.0)


def adversarial_input(A: torch.Tensor, n: int, radius: float) -> torch.Tensor:
    """[n, d] the paper's construction: u unit eigenvector of A for its largest real eigenvalue if
    gamma_max > -8 gamma_min, x_1 = R u, x_2..x_n = R u / 2; otherwise u for the smallest,
    x_1 = -R u, x_2..x_n = R u."""
    return _construction(*real_eigen(A), n, radius).to(A.dtype)


def _construction(vals: torch.Tensor, vecs: torch.Tensor, n: int, radius: float) -> torch.Tensor:
    if vals.numel() == 0:
        raise ValueError("A has no real eigenvalue: the adversarial construction needs one")
    g_max, g_min = float(vals.max()), float(vals.min())
    X = torch.empty(n, vecs.shape[0], dtype=torch.float64, device=vecs.device)
    if g_max > -8.0 * g_min:
        u = vecs[:, int(vals.argmax())]
        X[0], X[1:] = radius * u, radius * u / 2
    else:
        u = vecs[:, int(vals.argmin())]
        X[0], X[1:] = -radius * u, radius * u
    return X


SINGULAR_RTOL = 1e-6  # V counts as singular when sigma_min(V) < SINGULAR_RTOL * ||V||_2


def _bound_parameters(fmap: AttentionMap) -> tuple[list[float], list[float], float, float]:
    """(||A_h||_2, ||V_h||_2 per head, sigma_min(V_0) or nan, gamma(A_0)), computed once per map.

    sigma_min(V_0) is min ||V_0 y|| over unit y; it is nan when V_0 is singular relative to its norm
    (sigma_min < SINGULAR_RTOL * sigma_max, or V_0 [d_out, d] with d_out < d): one head of a model has
    V = W_O W_V of rank <= d_head < d, whose computed sigma_min (~1e-17) is rounding noise."""
    cached = getattr(fmap, "_bound_cache", None)
    if cached is None:
        W_Q, W_K, W_V, W_O = (w.double() for w in (fmap.W_Q, fmap.W_K, fmap.W_V, fmap.W_O))
        norms_A = fmap.scaled(_product_norm(W_K.transpose(1, 2), W_Q)).tolist()
        norms_V = _product_norm(W_O, W_V).tolist()
        smin, gamma = float("nan"), float("nan")
        # only one head's V can be injective, and only then is there a lower bound (map_bounds)
        if fmap.n_heads == 1 and W_V.shape[1] >= W_V.shape[2] and W_O.shape[1] >= W_O.shape[2]:
            sv = torch.linalg.svdvals(fmap.V[0].double())
            if float(sv[0]) > 0 and float(sv[-1]) >= SINGULAR_RTOL * float(sv[0]):
                smin, gamma = float(sv[-1]), gamma_of(fmap.A[0])
        cached = (norms_A, norms_V, smin, gamma)
        fmap._bound_cache = cached
    return cached


def _product_norm(L: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """||L_h R_h||_2 per head for L [H, m, k], R [H, k, p]. A head's A and V have rank <= k (d_head),
    often k << d: with thin QRs L = Q_L T_L and R^T = Q_R T_R, ||L R|| = ||T_L T_R^T||, a k x k
    problem instead of a d x d SVD (GPT-2 small: 0.1 ms against 66 ms per matrix)."""
    k = L.shape[-1]
    if k < min(L.shape[-2], R.shape[-1]):
        L, R = torch.linalg.qr(L).R, torch.linalg.qr(R.transpose(-1, -2)).R.transpose(-1, -2)
    return torch.linalg.matrix_norm(L @ R, ord=2)


def map_bounds(fmap: AttentionMap, n, radius) -> tuple[np.ndarray, np.ndarray]:
    """Theorem 3.1 bounds for fmap on B_R^n (nan where they do not cover fmap).

    Upper bound: Theorem 3.1 per head, summed over heads (triangle inequality). It also holds for
    the masked map. Proof (the argument the bound's constants come from, which uses only that each
    row of P is a softmax of the scores over some set of positions): with m_i = sum_j P_ij x_j,
    g_i = sum_j P_ij x_j and dP_ij = P_ij (ds_ij - sum_k P_ik ds_ik), ds_ij = x_j^T A dx_i + x_i^T A^T dx_j,
      dg_i = sum_j P_ij dx_j + C_i A dx_i + sum_j P_ij (x_j - m_i) (x_i^T A^T dx_j),
    C_i = sum_j P_ij (x_j - m_i)(x_j - m_i)^T. On B_R^n: ||C_i|| <= R^2, ||x_j - m_i|| <= 2R,
    ||A x_i|| <= ||A|| R; by Jensen, sum_i ||sum_j P_ij y_j||^2 <= sum_j (sum_i P_ij) ||y_j||^2
    <= n ||Y||^2 since every P_ij <= 1; so with (a+b+c)^2 <= 3(a^2+b^2+c^2),
      ||D f dX||^2 <= 3 ||V||^2 (n + ||A||^2 R^4 + 4 n ||A||^2 R^4) ||dX||^2.
    The causal mask only restricts row i's softmax to j <= i (f^m(X)_i = f(x_1..x_i)_i, a row of an
    unmasked attention on a prefix): the same identities and estimates hold line by line, so the
    masked map has the same bound (test_masked_estimates_never_exceed_the_upper_bound). A sliding
    window restricts row i further (i - w < j <= i): still a softmax over a set of positions, so the
    bound holds there too. A score scale (attn_scale) is part of A (AttentionMap.A).
    Not applicable (nan, theorem_applies): rotary positions, q/k norms (the score is not
    x_i^T A^T x_j) and an output norm after the heads (sandwich_norms), whose Jacobians the
    theorem's argument does not cover.

    Lower bound: Theorem 3.1 is stated for V = I, unmasked, one head. For f_V(X)_i = V g_i(X),
    D f_V = (I_n (x) V) D g, so ||D f_V|| >= sigma_min(V) ||D g|| and the bound scales by sigma_min(V)
    when V is injective; when V is singular (see _bound_parameters) there is no lower bound (nan).
    Several heads or a mask: no lower bound either.
    """
    n_arr = np.asarray(n, dtype=float)
    nan = np.full(np.broadcast(n_arr, np.asarray(radius, dtype=float)).shape, np.nan)
    if not fmap.theorem_applies():
        return nan, nan.copy()
    norms_A, norms_V, smin, gamma = _bound_parameters(fmap)
    up = sum(upper_bound(n, radius, a, v) for a, v in zip(norms_A, norms_V))
    if fmap.n_heads > 1 or fmap.masked or smin != smin or gamma != gamma:
        return np.asarray(up, dtype=float), nan
    lo = smin * lower_bound(n, radius, gamma)
    return np.asarray(up, dtype=float), np.asarray(lo, dtype=float)


def _adversarial_head(fmap: AttentionMap) -> int:
    """The head whose A has the largest gamma (the one the construction pushes hardest)."""
    gammas = [_gamma(head_eigen(fmap, h)[0]) for h in range(fmap.n_heads)]
    gammas = [g if g == g else -math.inf for g in gammas]
    return int(np.argmax(gammas))

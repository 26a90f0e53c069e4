"""Tokens as particles: a deep attention-only transformer as a flow (Castin 2024 section 3.2;
Geshkovski, Letrouit, Polyanskiy, Rigollet 2023).

Each token x_i moves with dx_i/dt = Gamma_mu(x_i), mu = (1/n) sum_j delta_{x_j}, and
Gamma_mu(x_i) = sum_j P_ij V x_j with a row-stochastic kernel P built by one of three attentions:

    softmax   P_ij = exp(<A x_i, x_j>) / sum_k exp(<A x_i, x_k>),      A = K^T Q / sqrt(d)
    l2        P_ij = exp(-|Q x_i - K x_j|^2) / sum_k exp(-|Q x_i - K x_k|^2)
    sinkhorn  k_0(x_i, x_j) = exp(-|Q x_i - K x_j|^2), rows and columns normalised in turn
              (Sinkhorn-Knopp) until every column sum is within `sinkhorn_tol` of 1; the last
              normalisation is over rows, so P is exactly row-stochastic and doubly stochastic to tol.

With `sphere` (the LayerNorm variant) the velocity is projected on the tangent space of the unit
sphere at x_i, Gamma - <x_i, Gamma> x_i, and each step ends by putting x_i back on the sphere.
Explicit Euler with step 1 is a residual attention network; RK4 is the classical 4-stage scheme.

Time-dependent parameters (when `amplitude` > 0) are a scalar modulation, so that V(s) commute
and the renormalisation stays exact: V(t) = (1 + a sin(w t)) V0 and Q(t), K(t) = (1 + a cos(w t)) Q0, K0.
Then int_0^t V(s) ds = (t + a (1 - cos(w t)) / w) V0, the renormalised positions are
z_i = exp(-int V) x_i, and the support bound (Castin 2024) is R(t) = exp(int_0^t ||V(s)||_2 ds) R0.

Measures at each recorded time (`Record`):
    clusters     connected components of the graph "distance < cluster_tol * max_i |p_i|" on the
                 shown positions p (z with renormalisation, x otherwise); single linkage. With
                 `cluster_sample` = m > 0, among a fixed random subset of m particles (the panel's
                 choice at large n: the count costs O(n^2)); a cluster is then missed only when none of
                 its members was drawn, and the early, scattered counts are not comparable across m
    mean_cosine  mean over pairs i != j of cos(p_i, p_j)
    radius       max_i |x_i| (the bound concerns x, not z), against radius_bound = R(t)
    w2           W2 between this run and a twin started from x_i(0) + perturbation (Gaussian noise),
                 coupling particle i with particle i: an upper bound on W2 (exact when the optimal
                 matching is the identity, as it is for small perturbations of separated particles)

All tensors are torch (float64 by default; the panel plays in float32). No Qt here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .attention import attention_scores, sinkhorn_to_tolerance
from .numbers import MAX_COUNT, MAX_SEED, Range

ATTENTION_KINDS = ("softmax", "l2", "sinkhorn")
INTEGRATORS = ("euler", "rk4")
INITS = ("sphere", "ball", "gaussian", "clusters", "tokens")
QKV_SOURCES = ("identity", "random", "file", "model")
STACKS = ("encoder", "decoder")  # an encoder-decoder's self-attention stacks (check_stack)
CSV_COLUMNS = ("t", "clusters", "radius", "radius_bound", "mean_cosine", "w2")
LAYER_CSV_COLUMNS = ("layer", "name", "clusters", "radius", "mean_cosine")
LOG2_E = 1.0 / math.log(2.0)


# -- attention parameters ----------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """One attention head's parameters in token space R^d: V [d, d]; A [d, d] for softmax;
    Q, K [m, d] for l2 and sinkhorn (m may differ from d, e.g. a model head's width)."""
    V: torch.Tensor
    A: torch.Tensor | None = None
    Q: torch.Tensor | None = None
    K: torch.Tensor | None = None
    name: str = ""

    @property
    def d(self) -> int:
        return int(self.V.shape[0])

    def to(self, dtype) -> "Head":
        conv = lambda M: None if M is None else M.to(dtype)  # noqa: E731
        return Head(conv(self.V), conv(self.A), conv(self.Q), conv(self.K), self.name)

    def check(self, kind: str) -> None:
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {kind!r} (choose {', '.join(ATTENTION_KINDS)})")
        if kind == "softmax" and self.A is None:
            raise ValueError(f"{self.name or 'these parameters'}: softmax attention needs A (or Q and K)")
        if kind != "softmax" and (self.Q is None or self.K is None):
            raise ValueError(f"{self.name or 'these parameters'}: {kind} attention needs Q and K, not only A")


def _a_from_qk(Q: torch.Tensor, K: torch.Tensor, d: int) -> torch.Tensor:
    return K.T @ Q / math.sqrt(d)


def identity_head(d: int, dtype=torch.float64) -> Head:
    eye = torch.eye(d, dtype=dtype)
    return Head(V=eye, A=eye / math.sqrt(d), Q=eye, K=eye, name="Q = K = V = I")


def _with_norm(M: torch.Tensor, norm: float) -> torch.Tensor:
    return M * (norm / torch.linalg.matrix_norm(M, ord=2))


def random_head(d: int, norm_qk: float = 1.0, norm_v: float = 1.0, seed: int = 0, dtype=torch.float64) -> Head:
    """Gaussian Q, K, V rescaled to spectral norms norm_qk, norm_qk, norm_v."""
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    Q, K, V = _with_norm(Q, norm_qk), _with_norm(K, norm_qk), _with_norm(V, norm_v)
    return Head(V=V, A=_a_from_qk(Q, K, d), Q=Q, K=K,
                name=f"random (||Q|| = ||K|| = {norm_qk:g}, ||V|| = {norm_v:g}, seed {seed})").to(dtype)


def check_stack(cfg, stack: str | None) -> None:
    """The stack a model head or a model's tokens come from: None for a one-stack model; for an
    encoder-decoder one of STACKS (its encoder's self-attention or its decoder's causal self-attention).
    Cross-attention is refused: its keys are the encoder's output, fixed, not the moving particles.
    ValueError, one line, otherwise."""
    seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
    if stack is None:
        if seq2seq:
            raise ValueError("an encoder-decoder's head names its stack: encoder or decoder (--stack)")
        return
    if not seq2seq:
        raise ValueError(f"stack {stack!r}: this model has one stack of layers (--stack is for encoder-decoders)")
    if stack == "cross":
        raise ValueError("cross-attention moves no particles of its own: its keys are the encoder's output, fixed; "
                         "choose the encoder's or the decoder's self-attention")
    if stack not in STACKS:
        raise ValueError(f"stack {stack!r}: one of {', '.join(STACKS)}")


def model_head(model, layer: int, head: int, dtype=torch.float64, stack: str | None = None) -> Head:
    """A loaded model's head: A_h and V_h from model.head_matrices (biases and rotary positions left
    out); for l2 and sinkhorn Q = W_Q / d_head^(1/4) and K = W_K / d_head^(1/4), so that the cross term
    of -|Q x - K y|^2 is 2 q.k / sqrt(d_head), twice the softmax score. An encoder-decoder's head is
    one of its `stack`'s self-attention heads (check_stack)."""
    check_stack(model.cfg, stack)
    hm = model.head_matrices(layer, head) if stack is None else model.head_matrices(layer, head, stack=stack)
    s = float(hm.W_Q.shape[0]) ** -0.25
    where = "" if stack is None else f"{stack} "
    return Head(V=hm.V.double(), A=hm.A.double(), Q=hm.W_Q.double() * s, K=hm.W_K.double() * s,
                name=f"{where}layer {layer} head {head}").to(dtype)


def load_head(path, dtype=torch.float64) -> Head:
    """Q, K, V (and optionally A) or A and V from an .npz archive (numpy.savez(path, Q=Q, K=K, V=V)).
    Raises FileNotFoundError or ValueError with one line naming the file and the problem."""
    import zipfile

    path = Path(path)
    hint = "save them with numpy.savez(path, Q=Q, K=K, V=V) or numpy.savez(path, A=A, V=V)"
    from .files import check_array_file, require_file

    require_file(path)  # missing, or a folder: said so before anything is read
    check_array_file(path)  # the headers first: a claimed (100000, 100000) array is refused unread
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise ValueError(f"{path}: not a NumPy .npz archive ({hint})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a single array, not an .npz archive ({hint})")
    with data:
        names = set(data.files)
        if "V" not in names or not ({"Q", "K"} <= names or "A" in names):
            raise ValueError(f"{path}: needs arrays V and either Q and K or A (found: {', '.join(sorted(names)) or 'none'}); "
                             f"{hint}")
        try:
            arrays = {n: data[n] for n in ("Q", "K", "V", "A") if n in names}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            raise ValueError(f"{path}: cannot read the arrays: the archive is damaged or holds pickled objects") from None
    for n, M in arrays.items():
        if M.dtype.kind not in "iuf":
            raise ValueError(f"{path}: {n} has dtype {M.dtype}; expected real numbers")
        if M.ndim != 2:
            raise ValueError(f"{path}: {n} has shape {tuple(M.shape)}; expected a matrix")
        if not np.all(np.isfinite(M)):
            raise ValueError(f"{path}: {n} holds NaN or infinite values")
    V = arrays["V"]
    d = V.shape[0]
    if V.shape != (d, d):
        raise ValueError(f"{path}: V has shape {V.shape}; expected a square [d, d] matrix")
    if "A" in arrays and arrays["A"].shape != (d, d):
        raise ValueError(f"{path}: A has shape {arrays['A'].shape} but V is {d}x{d}")
    Q = K = None
    if "Q" in arrays:
        Q, K = (torch.from_numpy(arrays[n].astype(np.float64)) for n in ("Q", "K"))
        if Q.shape != K.shape or Q.shape[1] != d:
            raise ValueError(f"{path}: Q {tuple(Q.shape)} and K {tuple(K.shape)} must both be [m, {d}] (V is {d}x{d})")
    A = torch.from_numpy(arrays["A"].astype(np.float64)) if "A" in arrays else _a_from_qk(Q, K, d)
    return Head(V=torch.from_numpy(V.astype(np.float64)), A=A, Q=Q, K=K, name=path.name).to(dtype)


# -- kernels and the velocity field ---------------------------------------------------------------
# The score formulas and the Sinkhorn iteration are core/attention.py's (one home); only the fused
# fast path of kernel_means below expands them itself, for the frame rate.


def row_softmax(S: torch.Tensor) -> torch.Tensor:
    """softmax over each row. Small matrices by hand: torch.softmax's thread pool costs milliseconds
    per call on a busy machine even for 10 x 10 (measured), which dominated the small runs."""
    if S.numel() >= 1 << 16:
        return torch.softmax(S, dim=1)
    E = (S - S.amax(1, keepdim=True)).exp_()
    return E.div_(E.sum(1, keepdim=True))


def softmax_kernel(X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """P_ij = softmax_j(<A x_i, x_j>)."""
    return row_softmax(attention_scores(X @ A.T, X, "softmax", scale=1.0))


def l2_scores(X: torch.Tensor, Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """-|Q x_i - K x_j|^2 as an [n, n] matrix."""
    return attention_scores(X @ Q.T, X @ K.T, "l2", scale=1.0)


def l2_kernel(X: torch.Tensor, Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return row_softmax(l2_scores(X, Q, K))


def sinkhorn_kernel(X: torch.Tensor, Q: torch.Tensor, K: torch.Tensor, tol: float = 1e-6,
                    max_iter: int = 2000) -> tuple[torch.Tensor, int]:
    """Sinkhorn-Knopp in the log domain on k_0 = exp(-|Q x_i - K x_j|^2): (P, iterations), P with row
    sums exactly 1 and every column sum within tol of 1 (unless max_iter was reached first)."""
    log_p, iterations = sinkhorn_to_tolerance(l2_scores(X, Q, K), tol, max_iter)
    return log_p.exp_(), iterations


@dataclass(frozen=True)
class Modulation:
    """Scalar time dependence (off when amplitude == 0): V(t) = v(t) V0, Q(t), K(t) = q(t) Q0, K0."""
    amplitude: float = 0.0
    omega: float = 1.0

    def v(self, t: float) -> float:
        return 1.0 + self.amplitude * math.sin(self.omega * t)

    def q(self, t: float) -> float:
        return 1.0 + self.amplitude * math.cos(self.omega * t)

    def v_integral(self, t: float) -> float:
        """int_0^t v(s) ds (v >= 0 when amplitude <= 1, so this is also int of ||V(s)|| / ||V0||)."""
        if self.amplitude == 0:
            return t
        return t + self.amplitude * (1.0 - math.cos(self.omega * t)) / self.omega


def _weighted_means(left: torch.Tensor, right: torch.Tensor, shift: torch.Tensor, X: torch.Tensor) -> torch.Tensor | None:
    """sum_j P_ij x_j for P_ij proportional to exp(<left_i, right_j>), in three passes over an n x n matrix
    (the matmul writes the scores already shifted, exp in place, one matmul gives the weighted sums and,
    through a column of ones, the normalisers) instead of the six of softmax-then-matmul: the frame rate
    of the panel hangs on this. `shift_i` must bound row i's largest score from above (no overflow);
    None when a row underflowed entirely (the caller then takes the exact path)."""
    # exp(s) = 2^(s log2 e): torch's float32 exp2 is 3 to 4 times faster than its exp on this machine's
    # CPU (4M entries, 1 thread: 6 ms against 21 ms, measured), and exp is most of a frame
    E = torch.addmm(shift[:, None], left, right.T, beta=-LOG2_E, alpha=LOG2_E).exp2_()
    S = E @ torch.cat([X, torch.ones(X.shape[0], 1, dtype=X.dtype)], dim=1)
    sums = S[:, -1:]
    tiny = torch.finfo(X.dtype).tiny * 1e6
    if not bool((sums > tiny).all()):
        return None
    return S[:, :-1] / sums


def kernel_means(X: torch.Tensor, head: Head, kind: str, qk_scale: float = 1.0, sinkhorn_tol: float = 1e-6) -> torch.Tensor:
    """sum_j P_ij x_j, [n, d], for the kernel of `kind` (Q, K scaled by qk_scale, so A by its square)."""
    s = qk_scale
    if kind == "softmax":
        XA = X @ (head.A * (s * s)).T
        shift = XA.norm(dim=1) * X.norm(dim=1).max()  # Cauchy-Schwarz: <A x_i, x_j> <= |A x_i| max |x_j|
        means = _weighted_means(XA, X, shift, X)
        return means if means is not None else softmax_kernel(X, head.A * (s * s)) @ X
    if kind == "l2":
        # -|q_i - k_j|^2 = 2 q_i.k_j - |k_j|^2 - |q_i|^2, and the last term cancels in each row
        q, k = X @ (head.Q * s).T, X @ (head.K * s).T
        left = torch.cat([2 * q, torch.ones(X.shape[0], 1, dtype=X.dtype)], dim=1)
        right = torch.cat([k, -(k * k).sum(1, keepdim=True)], dim=1)
        shift = 2 * q.norm(dim=1) * k.norm(dim=1).max()
        means = _weighted_means(left, right, shift, X)
        return means if means is not None else l2_kernel(X, head.Q * s, head.K * s) @ X
    if kind == "sinkhorn":
        P, _ = sinkhorn_kernel(X, head.Q * s, head.K * s, tol=sinkhorn_tol)
        return P @ X
    raise ValueError(f"unknown attention {kind!r}")


def velocity(X: torch.Tensor, t: float, head: Head, kind: str, modulation: Modulation = Modulation(),
             sphere: bool = False, sinkhorn_tol: float = 1e-6) -> torch.Tensor:
    """Gamma_mu(x_i) for every particle, [n, d] (projected on the sphere's tangent spaces with `sphere`)."""
    G = kernel_means(X, head, kind, modulation.q(t), sinkhorn_tol) @ head.V.T * modulation.v(t)
    if sphere:
        G = G - (G * X).sum(1, keepdim=True) * X
    return G


Field = Callable[[float, torch.Tensor], torch.Tensor]


def step(X: torch.Tensor, t: float, dt: float, fn: Field, integrator: str = "euler", sphere: bool = False) -> torch.Tensor:
    """One step of the ODE dX/dt = fn(t, X); on the sphere the result is put back on it (retraction)."""
    if integrator == "euler":
        Y = X + dt * fn(t, X)
    elif integrator == "rk4":
        k1 = fn(t, X)
        k2 = fn(t + dt / 2, X + dt / 2 * k1)
        k3 = fn(t + dt / 2, X + dt / 2 * k2)
        k4 = fn(t + dt, X + dt * k3)
        Y = X + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    else:
        raise ValueError(f"unknown integrator {integrator!r} (choose {', '.join(INTEGRATORS)})")
    if sphere:
        Y = Y / Y.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return Y


# -- initial conditions ----------------------------------------------------------------------------


def initial_positions(init: str, n: int, d: int, seed: int = 0, radius: float = 1.0,
                      covariance: np.ndarray | None = None, n_clusters: int = 3, spread: float = 0.1,
                      tokens: np.ndarray | None = None) -> torch.Tensor:
    """[n, d] float64 starting positions:
    sphere    uniform on the sphere of radius `radius`
    ball      uniform in the ball of radius `radius`
    gaussian  N(0, covariance) (default radius^2 I)
    clusters  n_clusters centres uniform on the sphere of radius `radius`, Gaussian spread around each
    tokens    the given [T, d] array (a model layer's residuals); n and d are taken from it."""
    g = torch.Generator().manual_seed(seed)
    if init == "tokens":
        if tokens is None or np.ndim(tokens) != 2 or len(tokens) == 0:
            raise ValueError("the tokens initial condition needs the positions of at least one token ([T, d])")
        return torch.as_tensor(np.asarray(tokens, dtype=np.float64)).clone()
    if n < 1 or d < 1:
        raise ValueError(f"need n >= 1 particles and d >= 1 (got n = {n}, d = {d})")
    G = torch.randn(n, d, generator=g, dtype=torch.float64)
    if init == "sphere":
        return radius * G / G.norm(dim=1, keepdim=True)
    if init == "ball":
        u = torch.rand(n, 1, generator=g, dtype=torch.float64) ** (1.0 / d)
        return radius * u * G / G.norm(dim=1, keepdim=True)
    if init == "gaussian":
        if covariance is None:
            return radius * G
        C = np.asarray(covariance, dtype=np.float64)
        if C.shape != (d, d) or not np.allclose(C, C.T) or np.linalg.eigvalsh(C).min() < -1e-12:
            raise ValueError(f"the covariance must be a symmetric positive semi-definite {d}x{d} matrix")
        w, U = np.linalg.eigh(C)
        L = torch.from_numpy(U * np.sqrt(np.clip(w, 0, None)))
        return G @ L.T
    if init == "clusters":
        k = max(1, min(n_clusters, n))
        C = torch.randn(k, d, generator=g, dtype=torch.float64)
        C = radius * C / C.norm(dim=1, keepdim=True)
        which = torch.arange(n) % k
        return C[which] + spread * G
    raise ValueError(f"unknown initial condition {init!r} (choose {', '.join(INITS)})")


def parse_covariance(text: str, d: int) -> np.ndarray:
    """The Gaussian start's covariance from text: one number (s I), d numbers (the diagonal), or d rows
    of d numbers separated by ";" (the full matrix, e.g. "2 0.5 0; 0.5 1 0; 0 0 1"); numbers within a
    row by commas or spaces. ValueError, one line, unless it is a symmetric positive semi-definite d x d
    matrix, not all zero."""
    from .numbers import parse_float  # ASCII digits: not '٣' or '1_0', which float() takes

    rows = [r for r in text.split(";") if r.strip()]
    try:
        values = [[parse_float(v) for v in r.replace(",", " ").split()] for r in rows]
    except ValueError:
        raise ValueError(f"covariance {text.strip()!r}: give numbers (rows separated by ';')") from None
    if not all(np.isfinite(v) for r in values for v in r):  # 'inf' said "Eigenvalues did not converge"
        raise ValueError(f"covariance {text.strip()!r}: every number must be finite (no nan or inf)")
    if len(values) == 1 and len(values[0]) in (1, d):
        diag = values[0] * d if len(values[0]) == 1 else values[0]
        if min(diag) < 0:
            raise ValueError(f"covariance {text.strip()!r}: variances cannot be negative")
        C = np.diag(diag)
    else:
        if len(values) != d or any(len(r) != d for r in values):
            shape = f"{len(values)} row(s) of {', '.join(str(len(r)) for r in values) or 'no'} number(s)"
            raise ValueError(f"covariance: give 1 number, {d} numbers or {d} rows of {d} separated by ';' (got {shape})")
        C = np.array(values)
        if not np.allclose(C, C.T):
            raise ValueError("covariance: the matrix must be symmetric")
        if np.linalg.eigvalsh(C).min() < -1e-12 * max(1.0, np.abs(C).max()):
            raise ValueError(f"covariance: the matrix must be positive semi-definite "
                             f"(smallest eigenvalue {np.linalg.eigvalsh(C).min():.3g})")
    if not C.any():  # every particle at the origin: nothing moves, and the radius bound R(t) is 0 (0 / 0)
        raise ValueError(f"covariance {text.strip()!r}: all zero, so every particle starts at the origin; "
                         "give a positive variance")
    return C


# -- measures --------------------------------------------------------------------------------------


def count_clusters(P: np.ndarray | torch.Tensor, tol: float = 0.05) -> int:
    """Connected components of the graph "|p_i - p_j| < tol * max_k |p_k|" (single linkage): isolated
    points count at once, the rest by breadth-first search over rows of the adjacency matrix. In
    numpy: the search makes many small operations, and torch's thread pool costs milliseconds on each
    of them on a busy machine (measured: seconds per count at n = 2000)."""
    P = torch.as_tensor(P, dtype=torch.float64)
    n = P.shape[0]
    if n == 0:
        return 0
    scale = float(P.norm(dim=1).max())
    eps = tol * (scale if scale > 0 else 1.0)
    # the one big operation in torch: a numpy (OpenBLAS) matmul here leaves its threads spinning against
    # torch's on a 2-core machine, which slowed the next simulation steps several-fold (measured)
    adj = (torch.cdist(P, P) < eps).numpy()
    isolated = adj.sum(1) <= 1  # only itself
    count = int(isolated.sum())
    unvisited = ~isolated
    while unvisited.any():
        i = int(np.argmax(unvisited))
        unvisited[i] = False
        frontier = np.array([i])
        while frontier.size:
            reached = adj[frontier].any(0) & unvisited
            unvisited &= ~reached
            frontier = np.flatnonzero(reached)
        count += 1
    return count


def mean_cosine(P: np.ndarray | torch.Tensor) -> float:
    """Mean of cos(p_i, p_j) over pairs i != j: (|sum u_i|^2 - n) / (n (n - 1)), u_i = p_i / |p_i|."""
    P = torch.as_tensor(P, dtype=torch.float64)
    n = P.shape[0]
    if n < 2:
        return 1.0
    U = P / P.norm(dim=1, keepdim=True).clamp_min(1e-300)
    s = U.sum(0)
    return float(((s @ s) - n) / (n * (n - 1)))


def support_radius(X: np.ndarray | torch.Tensor) -> float:
    return float(torch.as_tensor(X).norm(dim=1).max())


# -- the simulation --------------------------------------------------------------------------------


# every numeric setting's range, declared once: DynamicsConfig checks them (a script's run as the panel's), and
# the dynamics command's options take them as their argparse types (Number.of)
LIMITS = {"d": Range(int, 1, 4096), "n": Range(int, 1, MAX_COUNT), "init_radius": Range(float, 0, 1e6, lo_open=True),
          "n_clusters": Range(int, 1, MAX_COUNT), "cluster_spread": Range(float, 0, 1e6),
          "norm_qk": Range(float, 0, 1e6), "norm_v": Range(float, 0, 1e6), "amplitude": Range(float, 0, 1),
          "omega": Range(float, -1e6, 1e6), "dt": Range(float, 0, 100, lo_open=True), "seed": Range(int, 0, MAX_SEED),
          "cluster_tol": Range(float, 0, 1, lo_open=True), "perturbation": Range(float, 0, 1),
          "cluster_sample": Range(int, 0, MAX_COUNT), "sinkhorn_tol": Range(float, 0, 1, lo_open=True, hi_open=True)}


@dataclass
class DynamicsConfig:
    attention: str = "softmax"
    d: int = 3
    n: int = 256
    init: str = "sphere"
    init_radius: float = 1.0
    covariance: np.ndarray | None = None
    n_clusters: int = 3
    cluster_spread: float = 0.1
    qkv: str = "identity"  # identity | random (a Head given directly covers file and model)
    norm_qk: float = 1.0
    norm_v: float = 1.0
    amplitude: float = 0.0  # time dependence off at 0
    omega: float = 1.0
    sphere: bool = False
    renormalise: bool = False
    integrator: str = "euler"
    dt: float = 0.1
    seed: int = 0
    cluster_tol: float = 0.05
    perturbation: float = 1e-3  # the twin run's initial noise for W2; 0: no twin
    cluster_sample: int = 0  # count clusters among this many particles (a fixed random subset); 0: all
    sinkhorn_tol: float = 1e-6
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        """Each number within its LIMITS, else ValueError naming it ("init_radius: must be > 0, got nan"): a
        script's init_radius=nan ran on NaN positions, n=10**12 asked torch for 24 TB (the memory of an n in range is
        estimated by the caller: app.dynamics.check_dynamics_memory)."""
        import numbers

        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                value = int(value)  # numpy's integers too
            if problem := limit.problem(value):
                raise ValueError(f"{name}: {problem}")
            setattr(self, name, value)


@dataclass
class Record:
    t: float
    clusters: int
    radius: float
    radius_bound: float
    mean_cosine: float
    w2: float

    def row(self) -> tuple:
        return (self.t, self.clusters, self.radius, self.radius_bound, self.mean_cosine, self.w2)


@dataclass
class Frame:
    """What one advance hands back to a view: positions to draw (numpy copies) and the records so far."""
    t: float
    steps: int
    shown: np.ndarray  # [n, d]: z with renormalisation, else x
    records: list[Record] = field(default_factory=list)


class Simulation:
    """The particle system of one configuration (and its twin for W2). Not thread-safe: one worker at a time."""

    def __init__(self, config: DynamicsConfig, head: Head | None = None, tokens: np.ndarray | None = None) -> None:
        cfg = config
        if cfg.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {cfg.attention!r} (choose {', '.join(ATTENTION_KINDS)})")
        if cfg.integrator not in INTEGRATORS:
            raise ValueError(f"unknown integrator {cfg.integrator!r} (choose {', '.join(INTEGRATORS)})")
        if not cfg.dt > 0:
            raise ValueError(f"the step size must be positive (got {cfg.dt})")
        if not 0 <= cfg.amplitude <= 1:
            raise ValueError(f"the modulation amplitude must be in [0, 1] (got {cfg.amplitude})")
        X0 = initial_positions(cfg.init, cfg.n, cfg.d, cfg.seed, cfg.init_radius, cfg.covariance,
                               cfg.n_clusters, cfg.cluster_spread, tokens)
        d = X0.shape[1]
        if head is None:
            if cfg.qkv == "identity":
                head = identity_head(d)
            elif cfg.qkv == "random":
                head = random_head(d, cfg.norm_qk, cfg.norm_v, cfg.seed)
            else:
                raise ValueError(f"qkv {cfg.qkv!r} needs a Head (from a file or a model)")
        if head.d != d:
            raise ValueError(f"{head.name}: V is {head.d}x{head.d} but the particles live in dimension {d}")
        head.check(cfg.attention)
        self.config = replace(cfg, n=X0.shape[0], d=d)
        self.head = head.to(cfg.dtype)
        if cfg.sphere:
            X0 = X0 / X0.norm(dim=1, keepdim=True).clamp_min(1e-300)
        self.modulation = Modulation(cfg.amplitude, cfg.omega)
        self.norm_v = float(torch.linalg.matrix_norm(head.V.double(), ord=2))
        self.x = X0.to(cfg.dtype)
        self.twin = None
        if cfg.perturbation > 0:
            g = torch.Generator().manual_seed(cfg.seed + 1)
            Y0 = X0 + cfg.perturbation * torch.randn(X0.shape, generator=g, dtype=torch.float64)
            if cfg.sphere:
                Y0 = Y0 / Y0.norm(dim=1, keepdim=True)
            self.twin = Y0.to(cfg.dtype)
        self.x0 = self.x.clone()
        # the cluster count costs O(n^2) (an n x n distance matrix): the panel counts on a fixed subset
        self.cluster_index = None
        if 0 < cfg.cluster_sample < X0.shape[0]:
            g = torch.Generator().manual_seed(cfg.seed + 2)
            self.cluster_index = torch.randperm(X0.shape[0], generator=g)[:cfg.cluster_sample].sort().values
        self.r0 = support_radius(self.x)
        self.t = 0.0
        self.steps = 0
        self.records: list[Record] = []
        self.record()

    def field(self, t: float, X: torch.Tensor) -> torch.Tensor:
        c = self.config
        return velocity(X, t, self.head, c.attention, self.modulation, c.sphere, c.sinkhorn_tol)

    def advance(self, steps: int = 1, record_every: int = 1, job=None) -> Frame:
        """`steps` integrator steps (recording every `record_every`-th), then the frame to draw."""
        c = self.config
        for _ in range(steps):
            if job is not None:
                job.check()
            self.x = step(self.x, self.t, c.dt, self.field, c.integrator, c.sphere)
            if self.twin is not None:
                self.twin = step(self.twin, self.t, c.dt, self.field, c.integrator, c.sphere)
            self.steps += 1
            self.t = self.steps * c.dt  # not a running sum: no drift of t
            if self.steps % max(1, record_every) == 0:
                self.record()
        return Frame(self.t, self.steps, self.shown().numpy().copy(), list(self.records))

    def renormaliser(self, t: float) -> torch.Tensor:
        """exp(-int_0^t V(s) ds) (exact: the V(s) commute)."""
        return torch.linalg.matrix_exp(-self.modulation.v_integral(t) * self.head.V.double())

    def shown(self) -> torch.Tensor:
        """z = exp(-int V) x with renormalisation (as float64), else x."""
        if self.config.renormalise and not self.config.sphere:
            return self.x.double() @ self.renormaliser(self.t).T
        return self.x.double()

    def radius_bound(self, t: float) -> float:
        return self.r0 * math.exp(self.norm_v * self.modulation.v_integral(t))

    def record(self) -> Record:
        P = self.shown()
        w2 = float("nan")
        if self.twin is not None:
            w2 = float(((self.x.double() - self.twin.double()) ** 2).sum(1).mean().sqrt())
        counted = P if self.cluster_index is None else P[self.cluster_index]
        rec = Record(self.t, count_clusters(counted, self.config.cluster_tol), support_radius(self.x.double()),
                     self.radius_bound(self.t), mean_cosine(P), w2)
        self.records.append(rec)
        return rec


def run(config: DynamicsConfig, steps: int, head: Head | None = None, tokens: np.ndarray | None = None,
        record_every: int = 1, job=None) -> Simulation:
    """A whole run (the CLI's): the simulation after `steps` steps, with its records."""
    sim = Simulation(config, head, tokens)
    sim.advance(steps, record_every, job=job)
    if sim.steps % max(1, record_every):
        sim.record()  # the last time is always recorded
    return sim


def csv_text(records: list[Record]) -> str:
    lines = [",".join(CSV_COLUMNS)]
    for r in records:
        lines.append(",".join([repr(float(r.t)), str(int(r.clusters))] + [repr(float(v)) for v in
                                                                             (r.radius, r.radius_bound, r.mean_cosine, r.w2)]))
    return "\n".join(lines) + "\n"


# -- a real model's tokens, layer by layer ---------------------------------------------------------


@dataclass
class LayerCurves:
    """The same measures on a model's residual stream: the embedding, then after each layer's attention
    sublayer (blocks.l.resid_mid). Layer index 0 is the embedding, l + 1 is after block l's attention."""
    names: list[str]
    clusters: list[int]
    radius: list[float]
    mean_cosine: list[float]

    def rows(self) -> list[tuple]:
        return [(i, n, c, r, m) for i, (n, c, r, m) in enumerate(zip(self.names, self.clusters, self.radius,
                                                                        self.mean_cosine))]


def layer_names(trace) -> list[str]:
    return ["embed"] + [f"blocks.{l}.resid_mid" for l in range(trace.n_layers)]


def trace_tokens(trace, name: str) -> np.ndarray:
    """[T, d] float64 positions of the tokens at one recorded point of the residual stream (batch 0)."""
    if name not in trace:
        raise ValueError(f"the trace has no {name!r} (recorded: {', '.join(sorted(trace.keys()))[:200]})")
    return trace[name][0].detach().double().cpu().numpy()


def layer_curves(trace, cluster_tol: float = 0.05) -> LayerCurves:
    names = [n for n in layer_names(trace) if n in trace]
    points = [trace_tokens(trace, n) for n in names]
    return LayerCurves(names, [count_clusters(P, cluster_tol) for P in points],
                       [support_radius(P) for P in points], [mean_cosine(P) for P in points])


# -- the animation as files ------------------------------------------------------------------------


def check_png_sequence_folder(folder) -> Path:
    """Before any drawing: may the frames go to `folder`? A new or empty folder, or one the app wrote
    (replaced); a folder holding anything else is refused (core.files.OutputFolderError, one line)."""
    from .files import check_output_folder

    return check_output_folder(folder, overwrite=True, what="frames")


def write_png_sequence(folder, pngs: list[bytes], times: list[float]) -> Path:
    """The animation as frame_0000.png, frame_0001.png, ... and frames.csv (frame, t), written as one
    folder atomically (core.files.atomic_write_dir, with the app's manifest); `pngs` are encoded images."""
    from .files import atomic_write_dir

    if len(pngs) != len(times):
        raise ValueError(f"{len(pngs)} images but {len(times)} times")
    folder = check_png_sequence_folder(folder)

    def fill(tmp: Path) -> None:
        for i, data in enumerate(pngs):
            (tmp / f"frame_{i:04d}.png").write_bytes(data)
        (tmp / "frames.csv").write_text("frame,t\n" + "".join(f"{i},{float(t)!r}\n" for i, t in enumerate(times)),
                                        encoding="utf-8")

    atomic_write_dir(folder, fill)
    return folder


# -- drawing helpers (Qt-free) ---------------------------------------------------------------------


def projection_basis(X: np.ndarray, k: int) -> np.ndarray:
    """[d, k]: the identity's first k columns when d <= k (padded with zeros), else the top-k principal
    directions of X (the initial cloud): a fixed basis, so motion on screen is motion of the particles."""
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[1]
    if d <= k:
        return np.eye(d, k)
    Xc = X - X.mean(0)
    _, _, Vt = np.linalg.svd(Xc, full_matrices=False)
    return Vt[:k].T


def rotation(yaw: float, pitch: float) -> np.ndarray:
    """3x3 rotation: yaw about the vertical axis, then pitch about the horizontal one (radians)."""
    cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    Ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    Rx = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
    return Rx @ Ry


def view_3d(P3: np.ndarray, yaw: float, pitch: float) -> tuple[np.ndarray, np.ndarray]:
    """Orthographic screen coordinates [n, 2] of 3-D points and their depth [n] (larger: nearer)."""
    R = rotation(yaw, pitch)
    Y = np.asarray(P3) @ R.T
    return Y[:, :2], Y[:, 2]

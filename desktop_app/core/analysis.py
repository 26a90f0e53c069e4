"""What the attention and layers inspectors show, computed from a Trace (no Qt).

Every function reads one sequence of a Trace (batch index `batch`, no padding) and returns numpy
arrays. Attention patterns are [heads, T_q, T_k]; when a trace comes from a cached generation step
T_q may be smaller than T_k, and query i then sits at absolute position T_k - T_q + i.

Definitions (natural logarithms, distances in tokens):
    mean over heads      Abar = (1/H) sum_h P_h
    rollout              R_l = Ahat_l ... Ahat_0 with Ahat = row-normalised (Abar + I)  (Abnar & Zuidema 2020)
    entropy              H_i = -sum_j P_ij log P_ij, averaged over queries i
    mean distance        D_i = sum_j P_ij |pos(i) - j|, averaged over queries i (ViT head analysis)
    first-token          P_i0, averaged over queries i
    residual norm        ||x_t||_2 of the residual stream at each depth (embed, after block 0, ...)
    logit lens           softmax(unembed(resid_post_l))_t: top token and its probability
    PCA                  principal axes of all depths' token vectors pooled together, so depths share axes
    cosine similarity    C_ij = <x_i, x_j> / (|x_i| |x_j|) at one depth; its mean over i != j measures
                         how tokens cluster with depth (Geshkovski et al. 2023)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .interventions import Attribution, Patching
from .jobs import JobControl, report
from .trace import Trace


def _seq(t: torch.Tensor, batch: int) -> np.ndarray:
    return t[batch].detach().float().cpu().numpy()


def _need(trace: Trace, name: str, why: str) -> torch.Tensor:
    if name not in trace:
        raise ValueError(f"the trace has no {name!r}, needed for {why}; record it with names=('*',)")
    return trace[name]


def n_layers(trace: Trace) -> int:
    return trace.n_layers


# -- attention -------------------------------------------------------------------------------


def attention_pattern(trace: Trace, layer: int, batch: int = 0) -> np.ndarray:
    """[H, T_q, T_k] float32 attention probabilities of one layer."""
    return _seq(_need(trace, f"blocks.{layer}.attn.pattern", "attention views"), batch)


def attention_pattern_tensor(trace: Trace, layer: int, batch: int = 0) -> torch.Tensor:
    """[H, T_q, T_k] attention probabilities of one layer as the trace holds them (its dtype and device:
    no float32 copy of the layer, for what reads it in torch)."""
    return _need(trace, f"blocks.{layer}.attn.pattern", "attention views")[batch].detach()


def attention_patterns(trace: Trace, batch: int = 0) -> list[np.ndarray]:
    return [attention_pattern(trace, l, batch) for l in range(trace.n_layers)]


def query_positions(t_q: int, t_k: int) -> np.ndarray:
    """Absolute position of each query (the last t_q of t_k positions)."""
    return np.arange(t_k - t_q, t_k)


def allowed_mask(t_q: int, t_k: int, causal: bool) -> np.ndarray:
    """[T_q, T_k] boolean, True where a query may attend a key (False = masked by causality)."""
    if not causal:
        return np.ones((t_q, t_k), dtype=bool)
    return np.arange(t_k)[None, :] <= query_positions(t_q, t_k)[:, None]


def mean_over_heads(trace: Trace, layer: int, batch: int = 0) -> np.ndarray:
    """[T_q, T_k] attention averaged over heads (summed in float64 without a float64 copy of the layer)."""
    return attention_pattern(trace, layer, batch).mean(axis=0, dtype=np.float64)


# Query rows of a layer read at a time: a piece [H, rows, T_k] of about this many elements is widened to float32
# in a buffer that stays in cache (4 MiB; at 14 heads x 1,024 tokens, 73 rows). A whole 1,024-token layer
# widened at once is 58 MB of fresh memory each layer, and its float64 copies were most of the time:
# rollout and head statistics took 3.4 + 5.5 s at the Qwen2.5-0.5B shape (README's Performance notes).
PIECE_ELEMENTS = 1 << 20


def _row_pieces(pattern: torch.Tensor):
    """(first row, [H, rows, T_k] piece) of a [H, T_q, T_k] pattern, in float32 (float64 stays float64),
    each piece written over the one before it (use it before the next)."""
    h, t_q, t_k = pattern.shape
    rows = max(1, min(t_q, PIECE_ELEMENTS // max(1, h * t_k)))
    buffer = torch.empty((h, rows, t_k), dtype=torch.promote_types(pattern.dtype, torch.float32),
                         device=pattern.device)
    for first in range(0, t_q, rows):
        n = min(rows, t_q - first)
        yield first, buffer[:, :n].copy_(pattern[:, first:first + n])


def _lower_triangular_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, blocks: int = 4) -> None:
    """out = a @ b for lower-triangular [T, T] a and b (out is too): each of `blocks` bands of rows reads only
    the columns up to its last row, 30/64 of the multiply-adds at 4 bands (a causal rollout's products:
    8.5 ms against 18 ms at 1,024 tokens, one thread)."""
    t = a.shape[0]
    step = -(-t // blocks)
    for first in range(0, t, step):
        stop = min(t, first + step)
        torch.matmul(a[first:stop, :stop], b[:stop, :stop], out=out[first:stop, :stop])
        out[first:stop, stop:] = 0


def attention_rollout(trace: Trace, batch: int = 0, job: JobControl | None = None) -> np.ndarray:
    """[L, T, T] float32 (float64 for a float64 trace): entry l is the rollout through layers 0..l.

    Each layer's attention is averaged over heads, the residual identity is added and rows are
    renormalised (Ahat = (Abar + I) / row sums), and layers are multiplied back: R_l = Ahat_l R_{l-1}.
    Row t of R_l says how much each input token flows into token t after block l. Needs square
    patterns (a full forward pass, not a cached step).

    In float32 with torch: the products are of non-negative matrices, so each entry's relative rounding
    error is at most ~T * 2^-24 per layer (no cancellation; in practice ~1e-6 over 24 layers at 1,024
    tokens, benchmarks/attention_stats.py), below the 2^-9 of the bfloat16 patterns it reads."""
    n_layers = trace.n_layers
    out = ahat = None  # out [L, T, T], each product written in place
    lower = True  # the rollout so far is lower triangular (a causal model's)
    for l in range(n_layers):
        report(job, l, n_layers, "rollout")  # (and a newer trace may have made this one moot: check)
        p = attention_pattern_tensor(trace, l, batch)
        h, t_q, t_k = p.shape
        if t_q != t_k:
            raise ValueError("attention rollout needs the full sequence's attention (T_q == T_k), "
                             f"got {t_q} queries for {t_k} keys")
        if out is None:
            dtype = torch.promote_types(p.dtype, torch.float32)  # as _row_pieces'
            out = torch.empty((n_layers, t_q, t_k), dtype=dtype, device=p.device)
            ahat = torch.empty((t_q, t_k), dtype=dtype, device=p.device)
        a = out[0] if l == 0 else ahat
        for first, piece in _row_pieces(p):
            torch.sum(piece, dim=0, out=a[first:first + piece.shape[1]])
        a.diagonal().add_(h)  # H (Abar + I): the row normalisation makes the 1/H moot
        a.div_(a.sum(-1, keepdim=True))
        lower = lower and not a.triu(1).any()
        if l > 0 and lower:
            _lower_triangular_product(a, out[l - 1], out[l])
        elif l > 0:
            torch.matmul(a, out[l - 1], out=out[l])
    return out.cpu().numpy() if out is not None else np.zeros((0, 0, 0), dtype=np.float32)


@dataclass
class HeadStats:
    """Per-head statistics, each [layers, heads], averaged over queries."""
    entropy: np.ndarray  # nats
    mean_distance: np.ndarray  # tokens
    first_token: np.ndarray  # attention weight on the first token

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"entropy": self.entropy, "mean_distance": self.mean_distance, "first_token": self.first_token}


STAT_NAMES = {"entropy": "attention entropy (nats)", "mean_distance": "mean attention distance (tokens)",
              "first_token": "attention to the first token"}


def head_stats(trace: Trace, batch: int = 0, job: JobControl | None = None) -> HeadStats:
    """Each head's entropy, mean distance and weight on the first token (the module's definitions), averaged
    over queries: in torch over all heads of a layer at once, piece by piece of query rows (_row_pieces),
    each row's sums in float32 (T same-signed terms: relative error ~T * 2^-24 at most, ~1e-6 in
    practice), the sums over queries in float64."""
    n_layers = trace.n_layers
    ent, dist, first = [], [], []
    distances = None  # [T_q, T_k] |pos(i) - j| in the pieces' dtype, made once per shape
    for l in range(n_layers):
        report(job, l, n_layers, "head statistics")
        p = attention_pattern_tensor(trace, l, batch)
        h, t_q, t_k = p.shape
        if distances is None or distances.shape != (t_q, t_k):
            distances = torch.from_numpy(np.abs(query_positions(t_q, t_k)[:, None] - np.arange(t_k)[None, :]))
            distances = distances.to(torch.promote_types(p.dtype, torch.float32)).to(p.device)  # the pieces' dtype
        tiny = torch.finfo(distances.dtype).tiny
        e, d, f = (torch.zeros(h, dtype=torch.float64, device=p.device) for _ in range(3))
        for row, piece in _row_pieces(p):
            n = piece.shape[1]
            f += piece[:, :, 0].sum(-1, dtype=torch.float64)
            reach = t_k - t_q + row + n  # keys up to the piece's last query: the rest is 0 in a causal pattern
            if 0 < reach < t_k and not piece[:, :, reach:].sum():  # (non-negative weights: a sum of 0 is all zeros)
                piece = piece[:, :, :reach]  # zeros add nothing to either sum below: half a causal layer skipped
            # sum_j P_ij |pos(i) - j| of each row as one batched product over the piece's rows: [n, H, T] @ [n, T, 1]
            dist_rows = distances[row:row + n, :piece.shape[2], None]
            d += torch.bmm(piece.transpose(0, 1), dist_rows).sum((0, 2), dtype=torch.float64)
            # P log P with P clamped to the least normal float under the log: a masked P of 0 gives 0 as in
            # xlogy, which took 2.7x as long (its zeros' path, half a causal layer), and the clamp moves a term by
            # < 1e-36; the product overwrites the piece, which is done with
            e -= piece.mul_(piece.clamp_min(tiny).log_()).sum(-1).sum(-1, dtype=torch.float64)
        ent.append(e / t_q)
        dist.append(d / t_q)
        first.append(f / t_q)
    if not ent:
        return HeadStats(*(np.zeros((0, 0)) for _ in range(3)))
    return HeadStats(*(torch.stack(s).cpu().numpy() for s in (ent, dist, first)))


# -- residual stream and components ----------------------------------------------------------


def depth_labels(n_layers: int) -> list[str]:
    """Names of the residual-stream depths: the embedding, then each block's output."""
    return ["embed"] + [f"L{l}" for l in range(n_layers)]


def residual_depths(trace: Trace, stages: bool = False) -> list[tuple[str, str]]:
    """(trace name, label) of each depth of the residual stream: the embedding, then each block's output.
    With `stages` and a trace of an encoder-decoder's decoder (its blocks have resid_cross, seen through
    app.tracing.attention_view), each block is three depths: after its self-attention ("L0 self",
    resid_mid), after its cross-attention ("L0 cross", resid_cross) and after its MLP ("L0")."""
    out = [("embed", "embed")]
    for l in range(trace.n_layers):
        if stages and f"blocks.{l}.resid_cross" in trace:
            out += [(f"blocks.{l}.resid_mid", f"L{l} self"), (f"blocks.{l}.resid_cross", f"L{l} cross")]
        out.append((f"blocks.{l}.resid_post", f"L{l}"))
    return out


def residual_stream(trace: Trace, batch: int = 0, stages: bool = False) -> np.ndarray:
    """[D, T, d]: the embedding output then every block's output (raw, before any final norm), D = L + 1;
    with `stages`, residual_depths' (a decoder's cross-attention as its own stage)."""
    hs = [_need(trace, name, "the residual stream") for name, _ in residual_depths(trace, stages)]
    return np.stack([_seq(h, batch) for h in hs])


def residual_norms(trace: Trace, batch: int = 0) -> np.ndarray:
    """[L + 1, T]: ||x_t|| at each depth."""
    return np.linalg.norm(residual_stream(trace, batch).astype(np.float64), axis=-1)


def head_output_norms(trace: Trace, batch: int = 0) -> np.ndarray:
    """[L, H, T]: norm of what each head writes into the residual stream (after W_O, no bias)."""
    return np.stack([np.linalg.norm(_seq(_need(trace, f"blocks.{l}.attn.head_out", "head-output norms"), batch)
                                    .astype(np.float64), axis=-1) for l in range(trace.n_layers)])


def mlp_output_norms(trace: Trace, batch: int = 0) -> np.ndarray:
    """[L, T]: norm of each MLP's output, before the residual add."""
    return np.stack([np.linalg.norm(_seq(_need(trace, f"blocks.{l}.mlp.out", "MLP-output norms"), batch)
                                    .astype(np.float64), axis=-1) for l in range(trace.n_layers)])


# -- logit lens ------------------------------------------------------------------------------


@dataclass
class LogitLens:
    top_ids: np.ndarray  # [L, T] int64: the most probable next token read at each layer
    top_probs: np.ndarray  # [L, T] its probability


def logit_lens(trace: Trace, model=None, batch: int = 0, job=None) -> LogitLens:
    """Top prediction and probability of every layer's residual stream read through the LM head.

    Uses blocks.l.logit_lens when the trace has it; otherwise applies model.unembed (final norm +
    unembedding) to blocks.l.resid_post one layer at a time, so the full [L, T, vocab] is never held.
    `job` (core.jobs) is checked at each layer: a cancel lands within one layer (~1.8 s a layer at 512 tokens
    of a GPT-2-small shape, not the ~21 s of the whole).
    """
    ids, probs = [], []
    # A ViT's classifier reads [CLS] alone (its recorded lens is [B, classes]): read each position
    # through the final norm + classifier as if it were [CLS], one class per token.
    classifier = model is not None and model.cfg.lm_head_kind == "classifier"
    for l in range(trace.n_layers):
        if job is not None:
            job.check()
        name = f"blocks.{l}.logit_lens"
        recorded = name in trace and not classifier
        if recorded and trace[name].dim() == 2:
            raise ValueError("this trace's logit lens reads [CLS] alone: pass the model for one per token")
        if recorded:
            top_p, top_i = _top(trace[name][batch])
        else:
            if model is None:
                raise ValueError(f"the trace has no {name!r}: pass the model to compute the logit lens")
            if not model.cfg.lm_head:
                raise ValueError("this model has no language-model head, so it has no logit lens")
            h = _need(trace, f"blocks.{l}.resid_post", "the logit lens")[batch]
            parts = []
            with torch.no_grad():  # chunks of tokens: [chunk, vocab] at a time, even for 50k vocabularies
                for start in range(0, h.shape[0], LENS_CHUNK):
                    chunk = h[start:start + LENS_CHUNK].to(device=model.device, dtype=model.dtype)
                    parts.append(_top(model.unembed(chunk[:, None] if classifier else chunk)))
            top_p = torch.cat([p for p, _ in parts]) if parts else torch.zeros(0)
            top_i = torch.cat([i for _, i in parts]) if parts else torch.zeros(0, dtype=torch.long)
        ids.append(top_i.cpu().numpy().astype(np.int64))
        probs.append(top_p.cpu().numpy().astype(np.float64))
    return LogitLens(np.stack(ids), np.stack(probs))


LENS_CHUNK = 256


def _top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probability and id of the most probable token per row (softmax in float32)."""
    return torch.softmax(logits.float(), dim=-1).max(dim=-1)


# -- geometry of token representations -------------------------------------------------------


@dataclass
class PCAResult:
    coords: np.ndarray  # [L + 1, T, 2]
    components: np.ndarray  # [2, d] unit principal axes
    explained_variance_ratio: np.ndarray  # [2]
    mean: np.ndarray  # [d]


def pca_over_depth(trace: Trace, batch: int = 0, n_components: int = 2, stages: bool = False) -> PCAResult:
    """PCA fitted on the token vectors of all depths pooled, so every depth is drawn in the same axes
    (residual_depths' depths).

    Each axis's sign is fixed so that its largest-magnitude loading is positive (deterministic output).
    """
    x = residual_stream(trace, batch, stages).astype(np.float64)  # [D, T, d]
    depth, t, d = x.shape
    flat = x.reshape(depth * t, d)
    mean = flat.mean(axis=0)
    centred = flat - mean
    if depth * t >= d:  # the covariance's eigenvectors: [d, d], not an SVD of all D*T points (GPT-2 small's 13 x 512
        w, v = np.linalg.eigh(centred.T @ centred)  # x 768: 1.3-3.1 s against the SVD's 13.7-18.3 s, load ~5)
        s, vt = np.sqrt(np.clip(w[::-1], 0.0, None)), v[:, ::-1].T
    else:
        _, s, vt = np.linalg.svd(centred, full_matrices=False)
    comps = vt[:n_components]
    if comps.shape[0] < n_components:  # fewer points than components: pad with zero axes
        comps = np.vstack([comps, np.zeros((n_components - comps.shape[0], d))])
    signs = np.sign(comps[np.arange(n_components), np.abs(comps).argmax(axis=1)])
    comps = comps * np.where(signs == 0, 1.0, signs)[:, None]
    total = (s ** 2).sum()
    var = np.zeros(n_components)
    var[: min(n_components, len(s))] = (s[:n_components] ** 2) / total if total > 0 else 0.0
    coords = (centred @ comps.T).reshape(depth, t, n_components)
    return PCAResult(coords, comps, var, mean)


def cosine_similarity(trace: Trace, depth: int, batch: int = 0) -> np.ndarray:
    """[T, T] cosine similarity between tokens at one depth (0 = embedding, l + 1 = after block l)."""
    x = residual_stream(trace, batch)[depth].astype(np.float64)
    return cosine_matrix(x)


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    xn = x / np.where(norms > 0, norms, 1.0)
    return xn @ xn.T


def mean_off_diagonal(c: np.ndarray) -> float:
    t = c.shape[0]
    if t < 2:
        return float("nan")
    return float((c.sum() - np.trace(c)) / (t * (t - 1)))


def mean_cosine_by_depth(trace: Trace, batch: int = 0) -> np.ndarray:
    """[L + 1]: mean off-diagonal cosine similarity at each depth (rises as tokens cluster)."""
    x = residual_stream(trace, batch).astype(np.float64)
    return np.array([mean_off_diagonal(cosine_matrix(h)) for h in x])


# -- per-head scores (a model's heads through training: core.training.timeline, app.timeline) ----------


def induction_score(pattern: np.ndarray, period, start=None) -> np.ndarray:
    """[..., T, T] attention on a sequence whose tokens repeat with `period` (its second part copies the
    first): for each query i in the repeat (start <= i < T; start defaults to the period), the weight on the
    token right after the earlier occurrence of its own token, i - period + 1; averaged over those queries
    (Olsson et al. 2022, TransformerLens' induction head detector). 1.0 for a perfect induction head.

    `period` and `start` may also be one value per sequence ([n] arrays, the pattern [n, ..., T, T]): the
    repeats of several lengths of repeated_probe, on which a head looking a fixed distance back cannot score."""
    p = np.asarray(pattern, dtype=np.float64)
    t = p.shape[-1]
    periods = np.atleast_1d(np.asarray(period, dtype=np.int64))
    starts = periods if start is None else np.atleast_1d(np.asarray(start, dtype=np.int64))
    if p.shape[-2] != t or (periods < 1).any() or (starts < periods).any() or (starts >= t).any():
        raise ValueError(f"an induction score needs a square pattern longer than its period, got {p.shape[-2:]} "
                         f"with period {period}")
    if np.ndim(period) == 0 and (start is None or np.ndim(start) == 0):
        rows = np.arange(int(starts[0]), t)
        return p[..., rows, rows - int(periods[0]) + 1].mean(-1)
    if p.ndim < 3 or len(periods) != p.shape[0] or len(starts) != p.shape[0]:
        raise ValueError(f"one period and start per sequence: {len(periods)} periods for a pattern {p.shape}")
    weights = np.zeros((p.shape[0], t, t))  # 1 / queries at (i, i - period + 1) of each sequence's repeat
    for b, (per, st) in enumerate(zip(periods, starts)):
        rows = np.arange(st, t)
        weights[b, rows, rows - per + 1] = 1.0 / len(rows)
    weights = weights.reshape((p.shape[0],) + (1,) * (p.ndim - 3) + (t, t))
    return (p * weights).sum((-2, -1))


def previous_token_score(pattern: np.ndarray) -> np.ndarray:
    """[..., T, T] attention: the weight each query i >= 1 puts on i - 1, averaged over queries."""
    p = np.asarray(pattern, dtype=np.float64)
    t = p.shape[-1]
    if p.shape[-2] != t or t < 2:
        raise ValueError(f"a previous-token score needs a square pattern of 2 tokens or more, got {p.shape[-2:]}")
    rows = np.arange(1, t)
    return p[..., rows, rows - 1].mean(-1)


def attention_entropy(pattern: np.ndarray) -> np.ndarray:
    """[..., T, T] attention: -sum_j P_ij log P_ij (nats), averaged over queries (HeadStats.entropy)."""
    p = np.asarray(pattern, dtype=np.float64)
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1).mean(-1)


def attention_distance(pattern: np.ndarray) -> np.ndarray:
    """[..., T, T] attention: sum_j P_ij |i - j| (tokens), averaged over queries (HeadStats.mean_distance)."""
    p = np.asarray(pattern, dtype=np.float64)
    t_q, t_k = p.shape[-2:]
    d = np.abs(query_positions(t_q, t_k)[:, None] - np.arange(t_k)[None, :])
    return (p * d).sum(-1).mean(-1)


# name -> (what it is, how it reads a [..., T, T] pattern and the sequences' period and repeat start)
HEAD_SCORES = {
    "induction": ("induction score", lambda p, period, start: induction_score(p, period, start)),
    "prev-token": ("previous-token score", lambda p, period, start: previous_token_score(p)),
    "entropy": ("attention entropy (nats)", lambda p, period, start: attention_entropy(p)),
    "distance": ("mean attention distance (tokens)", lambda p, period, start: attention_distance(p)),
}


def repeated_sequences(n: int, period: int, symbols: int, seed: int = 0, length: int | None = None) -> torch.Tensor:
    """[n, length] token ids: `period` random ids in [0, symbols) then the same again (the induction task's
    data), cut to `length` (default 2 x period)."""
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(0, symbols, (n, period), generator=gen)
    return torch.cat([half, half], dim=1)[:, : (length or 2 * period)]


def repeated_probe(n: int, periods: tuple[int, int], symbols: int, length: int, seed: int = 0):
    """(ids [n, length], period [n], start [n]): sequences repeating a random half of several lengths (from
    periods[0] to periods[1], spread evenly over the n sequences): random ids, then the half, then the half
    again, ending at `length`; start is where each repeat begins. The induction score on these (TransformerLens'
    detector draws its own repeats too) cannot be reached by a head looking a fixed distance back."""
    lo, hi = int(periods[0]), int(periods[1])
    if not 1 <= lo <= hi or 2 * hi > length:
        raise ValueError(f"repeats of {lo} to {hi} tokens do not fit twice in {length} tokens")
    gen = torch.Generator().manual_seed(seed)
    period = torch.tensor([lo + (i * (hi - lo + 1)) // n for i in range(n)]) if n > 0 else torch.zeros(0, dtype=torch.long)
    ids = torch.randint(0, symbols, (n, length), generator=gen)
    pos = torch.arange(length).expand(n, length)
    src = torch.where(pos >= length - period[:, None], pos - period[:, None], pos)
    return ids.gather(1, src), period.numpy(), (length - period).numpy()


@torch.no_grad()
def head_scores(model, ids: torch.Tensor, metric: str, period, start=None) -> np.ndarray:
    """[layers, heads]: HEAD_SCORES[metric] of every head of `model` (a Transformer) on the sequences `ids`
    [n, T] (whose tokens repeat with `period` from `start`: ints, or one per sequence as repeated_probe
    gives), averaged over the sequences. An encoder-decoder's rows: its stack_layers (the sequences are
    both the source and the decoder's input; the self-attention heads of each stack)."""
    if metric not in HEAD_SCORES:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(HEAD_SCORES)})")
    score = HEAD_SCORES[metric][1]
    if getattr(model.cfg, "is_encoder_decoder", False):  # the encoder's then the decoder's self-attention
        rows = [f"{stack}.blocks.{l}.attn.pattern" for stack, l in stack_layers(model.cfg)]
        ids = ids.to(model.device)
        _, trace = model.run_with_trace(ids, ids, names=tuple(rows))  # the probe as source and decoder input
    else:
        _, trace = model.run_with_trace(ids.to(model.device), names=("blocks.*.attn.pattern",))
        rows = [f"blocks.{l}.attn.pattern" for l in range(trace.n_layers)]
    return np.stack([score(trace[name].float().cpu().numpy(), period, start).mean(0) for name in rows])


def stack_layers(cfg) -> list[tuple[str | None, int]]:
    """(stack, layer) of each layer of a model: (None, l) for a one-stack model; an encoder-decoder's
    ("encoder", l) for its encoder's layers, then ("decoder", l) for its decoder's."""
    if getattr(cfg, "is_encoder_decoder", False):
        return [("encoder", l) for l in range(cfg.n_layers)] + [("decoder", l) for l in range(cfg.n_decoder_layers)]
    return [(None, l) for l in range(cfg.n_layers)]


# -- encoder-decoders: direct logit attribution and activation patching (core/seq2seq.py) ----------
# The decoder's residual stream is the sum of its embedding, every self-attention head, every
# cross-attention head (which reads the encoder's output) and every MLP (pre-norm models such as T5;
# post-norm BART and Marian are refused by check_additive): the decoder's logits are attributed over
# those. Patching runs two source texts (the same target): the encoder's residual stream at each layer
# and source position, and each head of the three kinds (encoder self, decoder self, cross).

@dataclass
class Seq2SeqAttribution(Attribution):
    """An encoder-decoder's Attribution: head_table holds the decoder's self-attention heads, cross_table
    [L, H] its cross-attention heads."""
    cross_table: np.ndarray = None


@dataclass
class Seq2SeqPatching(Patching):
    """An encoder-decoder's Patching: resid over the encoder's stream and source positions, heads [rows, H]
    with head_rows naming each row ("enc L0", "dec L1", "cross L1") and head_points its edit point's prefix
    ("encoder.blocks.0.attn", "decoder.blocks.1.cross_attn"; + ".head.h" names a head)."""
    head_rows: list = None
    head_points: list = None


STACK_HEADS = (("encoder", "attn", "enc"), ("decoder", "attn", "dec"), ("decoder", "cross_attn", "cross"))


def _ids(ids) -> torch.Tensor:
    return torch.as_tensor(list(ids), dtype=torch.long)[None]


def seq2seq_logit_attribution(loaded, src_ids, dec_ids, position: int, token_id: int, interventions=None):
    """interventions.Attribution of `token_id`'s logit at decoder position `position` (logits row i reads
    dec_ids[:i + 1], the decoder's input [start] + target): rows embed (the decoder's), head (decoder
    self-attention heads), cross_head (cross-attention heads), attn_bias / cross_bias (their W_O biases),
    mlp, final_norm_bias, logits_bias; they sum to the logit. head_table [L, H] holds the self-attention
    heads, cross_table [L, H] the cross-attention heads, mlp [L] (L = the decoder's layers)."""
    from .interventions import (check_additive, check_position_and_token, direct_logit_function, edit_bar,
                                edit_bar_points, traced_forward)

    model = getattr(loaded, "model", loaded)
    cfg = model.cfg
    check_additive(cfg, "direct logit attribution")
    position = check_position_and_token(cfg, len(dec_ids), position, token_id)
    L, H = cfg.n_decoder_layers, cfg.n_heads
    bars = edit_bar_points(interventions, "decoder.")  # edits of the decoder's residual stream: a bar each
    names = ["decoder.embed", "logits", "decoder.blocks.*.attn.head_out", "decoder.blocks.*.cross_attn.head_out",
             "decoder.blocks.*.mlp.out", f"decoder.blocks.{L - 1}.resid_post", *(p for p, _ in bars)]
    _, trace = traced_forward(model, (_ids(src_ids).to(model.device), _ids(dec_ids).to(model.device)), names,
                              interventions, unedited=[p for p, _ in bars])
    direct, bias_part = direct_logit_function(model, trace[f"decoder.blocks.{L - 1}.resid_post"][0, position], token_id)
    comps, layers, heads, vals = [], [], [], []

    def add(component: str, layer: int, head: int, c: torch.Tensor) -> float:
        v = float(direct(c))
        comps.append(component), layers.append(layer), heads.append(head), vals.append(v)
        return v

    add("embed", -1, -1, trace["decoder.embed"][0, position])
    tables = {"attn": np.zeros((L, H)), "cross_attn": np.zeros((L, H))}
    mlp = np.zeros(L)
    for l in range(L):
        block = model.decoder.blocks[l]
        for kind, component in (("attn", "head"), ("cross_attn", "cross_head")):
            per_head = trace[f"decoder.blocks.{l}.{kind}.head_out"][0, :, position]  # [H, d]
            for h in range(H):
                tables[kind][l, h] = add(component, l, h, per_head[h])
            o_bias = getattr(block, kind).o.bias
            if o_bias is not None:
                add("attn_bias" if kind == "attn" else "cross_bias", l, -1, o_bias)
        mlp[l] = add("mlp", l, -1, trace[f"decoder.blocks.{l}.mlp.out"][0, position])
        for point, _ in (b for b in bars if b[1] == l):
            add(edit_bar(point), l, -1, trace[point][0, position] - trace.unedited[point][0, position])
    if bias_part is not None:
        comps.append("final_norm_bias"), layers.append(-1), heads.append(-1), vals.append(bias_part)
    if cfg.final_logits_bias:
        comps.append("logits_bias"), layers.append(-1), heads.append(-1), vals.append(float(model.lm_bias[token_id]))
    return Seq2SeqAttribution(position, token_id, float(trace["logits"][0, position, token_id]), comps,
                              np.array(layers), np.array(heads), np.array(vals), tables["attn"], mlp,
                              cross_table=tables["cross_attn"])


def seq2seq_head_rows(cfg) -> list[tuple[str, int]]:
    """The heads patching measures, one row per (stack's layer, kind): (edit prefix, layer), e.g.
    ("encoder.blocks.0.attn", 0), ("decoder.blocks.1.cross_attn", 1)."""
    n = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers}
    return [(f"{stack}.blocks.{l}.{kind}", l) for stack, kind, _ in STACK_HEADS for l in range(n[stack])]


def head_row_label(prefix: str) -> str:
    """"decoder.blocks.1.cross_attn" -> "cross L1" (the short names --ablate takes: enc, dec, cross)."""
    stack, _, layer, kind = prefix.split(".")
    short = {("encoder", "attn"): "enc", ("decoder", "attn"): "dec", ("decoder", "cross_attn"): "cross"}[(stack, kind)]
    return f"{short} L{layer}"


def seq2seq_activation_patching(loaded, clean_src, corrupted_src, dec_ids, answer_id: int, wrong_id: int | None = None,
                                job=None, interventions=None):
    """interventions.Patching between two source texts of the same length (the same decoder input
    dec_ids): metric logit[answer] (- logit[wrong]) at the decoder's last position. resid [L_enc + 1, S]:
    the encoder's residual stream (embed, each block's output) at one source position copied from the
    clean run; heads [rows, H], rows seq2seq_head_rows (encoder self, decoder self, cross-attention):
    one head's output (before W_O) at every position copied. `head_rows` names the heads' rows. Edits
    (`interventions`) apply in every run, a mean ablation's mean taken once on the clean source (and dec_ids)."""
    from .interventions import patch_each, resolve

    model = getattr(loaded, "model", loaded)
    cfg = model.cfg
    if len(clean_src) != len(corrupted_src):
        raise ValueError(f"the clean and corrupted source texts must have the same length in tokens "
                         f"({len(clean_src)} and {len(corrupted_src)})")
    if not clean_src or not dec_ids:
        raise ValueError("the texts are empty")
    for name, t in (("answer", answer_id), ("wrong", wrong_id)):
        if t is not None and not 0 <= t < cfg.vocab_size:
            raise ValueError(f"{name} token id {t} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    edits = resolve(model, clean_src, [iv.check(cfg) for iv in interventions or []], decoder_ids=dec_ids)
    rows = ["encoder.embed"] + [f"encoder.blocks.{l}.resid_post" for l in range(cfg.n_layers)]
    head_rows = seq2seq_head_rows(cfg)
    clean_m, corrupted_m, resid, heads = patch_each(
        model, clean_src, corrupted_src, rows, [p for p, _ in head_rows], answer_id, wrong_id, edits, job,
        extra=(_ids(dec_ids).to(model.device),), what="sources")
    return Seq2SeqPatching(answer_id, wrong_id, clean_m, corrupted_m, rows, resid, heads,
                           head_rows=[head_row_label(p) for p, _ in head_rows], head_points=[p for p, _ in head_rows])

"""The Attention panel's views as data (no Qt): its view state, the VIEWS table and their numbers.

`prepare(trace, causal, tokens)` reads a trace once (patterns, mask, labels); `aggregates` and
`thumbnails` are the slow parts (a worker runs them); each view's compute(data, state) then returns
what its widget draws. Definitions of the quantities: core.analysis.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import analysis
from ..jobs import JobControl
from . import HeatmapResult, View

CONTROLS = ("layer", "head", "statistic")  # the panel's controls, in the order they are laid out


@dataclass
class AttentionViewState:
    view: str = "model-view"
    layer: int = 0
    head: int = 0
    statistic: str = "entropy"  # a key of analysis.STAT_NAMES
    selected_token: int | None = None  # absolute position in the sequence (of the queries' sequence)
    kind: str = "encoder"  # an encoder-decoder's: encoder, decoder or cross (app.tracing.ATTENTION_KINDS)


class LayerPatterns(Sequence):
    """Every layer's pattern [H, T_q, T_k] as float32 numpy, read from the trace when a view asks for
    that layer: a float32 trace's patterns are shared, not copied; narrower ones (float16, bfloat16)
    are converted for the last few layers asked only, so the trace's dtype is what memory holds."""

    CACHE = 2

    def __init__(self, trace) -> None:
        self.trace = trace
        self._n = trace.n_layers
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._n

    @property
    def layer_shape(self) -> tuple[int, int, int]:
        """[H, T_q, T_k] of every layer, from the trace's tensor (no float32 copy of a layer made for it)."""
        return tuple(analysis.attention_pattern_tensor(self.trace, 0).shape)

    def __getitem__(self, layer):
        if isinstance(layer, slice):
            return [self[l] for l in range(*layer.indices(self._n))]
        if layer < 0:
            layer += self._n
        if not 0 <= layer < self._n:
            raise IndexError(f"layer {layer} of {self._n}")
        hit = self._cache.pop(layer, None)
        if hit is None:
            hit = analysis.attention_pattern(self.trace, layer)
        self._cache[layer] = hit  # the most recent last
        while len(self._cache) > self.CACHE:
            self._cache.pop(next(iter(self._cache)))
        return hit


def layer_shape(patterns: Sequence[np.ndarray]) -> tuple[int, int, int]:
    """[H, T_q, T_k] of each layer's pattern (a LayerPatterns' without converting a layer to float32)."""
    return patterns.layer_shape if isinstance(patterns, LayerPatterns) else patterns[0].shape


@dataclass
class AttentionData:
    """One trace's attention, read once; `rollout`, `stats` and `thumbs` arrive later from a worker."""
    patterns: Sequence[np.ndarray]  # [layer] -> [H, T_q, T_k] (LayerPatterns: read when asked)
    mask: np.ndarray | None  # [T_q, T_k] True where a query may attend; None when nothing is masked
    causal: bool
    row_labels: list[str]  # the queries' token strings (the last T_q)
    col_labels: list[str]  # every token's string (T_k)
    rollout: np.ndarray | None = None
    stats: analysis.HeadStats | None = None
    rollout_problem: str = ""
    thumbs: list[list[np.ndarray]] | None = None
    aggregated: bool = False  # rollout and stats have arrived (thumbs before them)
    rollout_arrived: bool = False  # the rollout (or why there is none) has, maybe before the stats
    # Queries and keys are two sequences (cross-attention: target tokens reading source tokens): the rows
    # are row_labels' tokens from the first, the columns col_labels', and a selection is a query's position.
    cross: bool = False

    @property
    def n_layers(self) -> int:
        return len(self.patterns)

    @property
    def n_heads(self) -> int:
        return layer_shape(self.patterns)[0]

    @property
    def query_offset(self) -> int:
        """Position of the first query: queries are the last T_q of T_k tokens (a cached step has one);
        0 for cross-attention (queries are another sequence)."""
        _, t_q, t_k = layer_shape(self.patterns)
        return 0 if self.cross else t_k - t_q

    @property
    def positions(self) -> list[str]:
        """The tokens a selection indexes: every key's (the sequence), or the queries' for cross-attention."""
        return self.row_labels if self.cross else self.col_labels


def prepare(trace, causal: bool | None, tokens: list[str] | None,
            query_tokens: list[str] | None = None) -> AttentionData:
    """Read a trace's patterns. causal=None: guessed from the patterns (no key above the diagonal).
    tokens: one string per key position, else positions are used as labels. query_tokens: the queries
    are another sequence (cross-attention), one string per query."""
    patterns = LayerPatterns(trace)
    if not len(patterns):
        analysis.attention_pattern(trace, 0)  # says what is missing
    _, t_q, t_k = patterns.layer_shape
    if causal is None:
        causal = bool(np.all(np.triu(patterns[0][:, :, t_k - t_q:], 1) == 0))
    allowed = analysis.allowed_mask(t_q, t_k, causal)
    strings = list(tokens) if tokens is not None and len(tokens) == t_k else [str(i) for i in range(t_k)]
    if query_tokens is not None:
        rows = list(query_tokens) if len(query_tokens) == t_q else [str(i) for i in range(t_q)]
        return AttentionData(patterns, None, False, rows, strings, cross=True)
    return AttentionData(patterns, None if allowed.all() else allowed, causal, strings[t_k - t_q:], strings)


# -- numbers ---------------------------------------------------------------------------------


def display_levels(m: np.ndarray, mask: np.ndarray | None = None, q: float = 0.995) -> tuple[float, float]:
    """Colour range 0..(99.5th percentile of the visible weights): a causal model's first rows hold
    weights near 1 by construction and would leave every other cell dark; the few cells above the
    range saturate, the colour bar shows the range and hovering gives the exact value."""
    step = max(1, m.shape[0] // 128)  # every step-th row: a percentile needs no more, and stays fast
    shown = m[::step] if mask is None else m[::step][mask[::step]]
    top = float(np.quantile(shown, q)) if shown.size else 1.0
    return 0.0, max(top, 1e-6)


def block_max(t: torch.Tensor, fr: int, fc: int) -> torch.Tensor:
    """Maxima of fr x fc blocks over the last two dimensions, the last blocks cut short where the sizes do not
    divide (ceil(R / fr) x ceil(C / fc) blocks). Rows first, then columns: each a reduction over a contiguous run (3x faster
    than max_pool2d on a 1,024-token layer)."""
    def along(x: torch.Tensor, dim: int, f: int) -> torch.Tensor:
        n = x.shape[dim]
        whole = n // f * f
        parts = [x.narrow(dim, 0, whole).unflatten(dim, (n // f, f)).amax(dim + 1)] if whole else []
        if whole < n:
            parts.append(x.narrow(dim, whole, n - whole).amax(dim, keepdim=True))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim)

    return along(along(t, t.dim() - 2, fr), t.dim() - 1, fc)


def pooled_heads(pattern, mask: np.ndarray | None, size: int) -> np.ndarray:
    """One layer's heads [H, R, C] (numpy, or a trace's tensor in its own dtype) as float32 [H, <=size, <=size]:
    each head's block maxima, masked cells -1 (below every weight). The same values as numpy's block
    maxima of each head in float32 (a maximum is exact, and so is widening bfloat16 or float16 to float32), but pooled by torch
    in the pattern's dtype, with no copy of the layer: the blocks the mask leaves whole are pooled as they
    are, those it covers whole are -1, and only those it cuts through (a causal mask's diagonal) are pooled
    again with their masked cells -1. A bfloat16 1,024-token layer of 14 heads: ~0.03 s against 0.25 s
    for numpy on its float32 copy, one core (the first look at the Qwen2.5-0.5B shape makes 24)."""
    t = torch.as_tensor(pattern).detach()
    r, c = t.shape[-2:]
    fr, fc = -(-r // size), -(-c // size)
    allowed = None if mask is None else torch.from_numpy(mask).to(t.device)
    if (fr, fc) == (1, 1):
        return (t if allowed is None else t.masked_fill(~allowed, -1.0)).to(torch.float32).cpu().numpy()
    small = block_max(t, fr, fc).to(torch.float32)
    if allowed is None:
        return small.cpu().numpy()
    allowed_in = block_max(allowed, fr, fc)  # the block holds a cell the mask allows
    masked_in = block_max(~allowed, fr, fc)  # ... and one it masks
    small[:, ~allowed_in] = -1.0
    i, j = (allowed_in & masked_in).nonzero().unbind(1)  # the blocks it cuts through, gathered at once: [H, K, fr, fc]
    # (a last block cut short repeats its last row or column, which leaves its maximum as it is)
    rows = (i[:, None] * fr + torch.arange(fr, device=t.device)).clamp(max=r - 1)[:, :, None]
    cols = (j[:, None] * fc + torch.arange(fc, device=t.device)).clamp(max=c - 1)[:, None, :]
    blocks = t[:, rows, cols].masked_fill(~allowed[rows, cols], -1.0)
    small[:, i, j] = blocks.amax(dim=(2, 3)).to(torch.float32)
    return small.cpu().numpy()


def thumbnails(patterns, mask: np.ndarray | None, lut: np.ndarray, size: int) -> list[list[np.ndarray]]:
    """RGBA thumbnails [layer][head] of at most size x size pixels, from each layer's [H, T_q, T_k] (numpy or
    a trace's tensor: pooled_heads; runs in a worker)."""
    out = []
    for p in patterns:
        row = []
        for small in pooled_heads(p, mask, size):
            top = display_levels(small, small >= 0)[1]
            rgba = np.empty(small.shape + (4,), np.uint8)
            rgba[..., :3] = lut[np.clip(small / max(top, 1e-12) * 255, 0, 255).astype(np.uint8)]
            rgba[..., 3] = 255
            rgba[small < 0] = (190, 190, 190, 255)  # pooled entirely from masked cells
            row.append(rgba)
        out.append(row)
    return out


def aggregates(trace, job: JobControl | None = None, no_rollout: str = "", on_rollout=None):
    """Rollout, head statistics and why there is no rollout (worker thread: O(L T^3) and O(L H T^2)).
    `no_rollout`: why this trace has no meaningful rollout (cross-attention), instead of computing one.
    `on_rollout(rollout, problem)`, if given, has the rollout before the statistics are computed."""
    try:
        if no_rollout:
            raise ValueError(no_rollout)
        rollout, problem = analysis.attention_rollout(trace, job=job), ""
    except ValueError as exc:  # a cached generation step has no square patterns
        rollout, problem = None, str(exc)
    if on_rollout is not None:
        on_rollout(rollout, problem)
    return rollout, analysis.head_stats(trace, job=job), problem


# -- the views' results ----------------------------------------------------------------------


@dataclass
class ModelViewResult:
    patterns: list[np.ndarray]
    mask: np.ndarray | None
    thumbs: list[list[np.ndarray]] | None


@dataclass
class HeadViewResult:
    pattern: np.ndarray  # [H, T_q, T_k] of one layer
    row_labels: list[str]
    col_labels: list[str]
    query_offset: int | None = None  # position of the first query among the keys (None: the last T_q)


def compute_model_view(data: AttentionData, state: AttentionViewState) -> ModelViewResult:
    return ModelViewResult(data.patterns, data.mask, data.thumbs)


def compute_head(data: AttentionData, state: AttentionViewState) -> HeatmapResult:
    m = data.patterns[state.layer][state.head]
    return HeatmapResult(m, data.row_labels, data.col_labels, data.mask, display_levels(m, data.mask),
                         f"Layer {state.layer}, head {state.head}")


def compute_head_view(data: AttentionData, state: AttentionViewState) -> HeadViewResult:
    return HeadViewResult(data.patterns[state.layer], data.row_labels, data.col_labels, data.query_offset)


def compute_mean(data: AttentionData, state: AttentionViewState) -> HeatmapResult:
    mean = data.patterns[state.layer].astype(np.float64).mean(axis=0)  # = analysis.mean_over_heads
    return HeatmapResult(mean, data.row_labels, data.col_labels, data.mask, display_levels(mean, data.mask),
                         f"Layer {state.layer}, mean over heads")


def compute_rollout(data: AttentionData, state: AttentionViewState) -> HeatmapResult | None:
    if data.rollout is None:
        if data.rollout_arrived or data.aggregated:  # computed, and impossible for this trace: say why
            return HeatmapResult(np.zeros((1, 1)), [""], [""], title=data.rollout_problem)
        return None
    r = data.rollout[state.layer]
    return HeatmapResult(r, data.col_labels, data.col_labels, data.mask, display_levels(r, data.mask),
                         f"Attention rollout through layers 0..{state.layer}")


def compute_head_stats(data: AttentionData, state: AttentionViewState) -> HeatmapResult | None:
    if data.stats is None:
        return None
    values = data.stats.as_dict()[state.statistic]
    n_layers, n_heads = values.shape
    return HeatmapResult(values, [f"L{l}" for l in range(n_layers)], [f"H{h}" for h in range(n_heads)],
                         title=analysis.STAT_NAMES[state.statistic],
                         value_name=analysis.STAT_NAMES[state.statistic])


VIEWS: tuple[View, ...] = (
    View("model-view", "Model view", (), compute_model_view, widget="model-view"),
    View("attention", "Heatmap", ("layer", "head"), compute_head, "attention-L{layer}-H{head}",
         rows="queries", keep_zoom=True),
    View("head-view", "Head view", ("layer",), compute_head_view, "{view}-L{layer}", widget="head-view"),
    View("mean", "Mean over heads", ("layer",), compute_mean, "{view}-L{layer}",
         axes=("query", "key", "mean weight"), rows="queries"),
    View("rollout", "Rollout", ("layer",), compute_rollout, "{view}-L{layer}",
         axes=("token", "source token", "rollout"), rows="tokens"),
    View("head-stats", "Head statistics", ("statistic",), compute_head_stats, "head-stats-{statistic}",
         axes=("layer", "head", "entropy"),
         heatmap_options=dict(colormap="magma", annotate_max_cells=400, row_tokens=False, col_tokens=False)),
)

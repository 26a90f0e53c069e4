"""The Layers panel's views as data (no Qt): its view state, the VIEWS table and their numbers.

`compute_layers` computes every number the panel shows (a worker runs it: the logit lens runs the
unembedding); each view's compute(data, state) then picks what its widget draws at the chosen depth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import analysis
from ..jobs import report
from . import HeatmapResult, View

CONTROLS = ("depth",)


@dataclass
class LayersViewState:
    view: str = "residual-norms"
    depth: int = 0  # residual depth: 0 = embedding, l + 1 = after block l (a decoder's: analysis.residual_depths)
    selected_token: int | None = None
    stack: str = "decoder"  # an encoder-decoder's stack shown: "encoder" or "decoder"


@dataclass
class LayersResult:
    depth_labels: list[str]
    resid_norms: np.ndarray  # [D, T]
    head_norms: np.ndarray | None  # [L, H, T]
    mlp_norms: np.ndarray | None  # [L, T]
    lens_ids: np.ndarray | None  # [L, T]
    lens_probs: np.ndarray | None
    lens_strings: list[list[str]] | None
    lens_problem: str
    pca: analysis.PCAResult
    cosine: np.ndarray  # [D, T, T]
    mean_cosine: np.ndarray  # [D]
    cross_norms: np.ndarray | None = None  # [L, H, T]: an encoder-decoder decoder's cross-attention heads
    router_probs: np.ndarray | None = None  # [L, T, E]: a mixture of experts' router probabilities
    expert_load: np.ndarray | None = None  # [L, E]: the share of each layer's routing choices per expert
    expert_norms: np.ndarray | None = None  # [L, T, E]: |w_e expert_e(x)| per token, 0 where e was not chosen


ENCODER_LENS = ("the encoder's stream is not read by the language-model head (the decoder's is): "
                "choose the Decoder stack for the logit lens")


def compute_layers(trace, model=None, tokenizer=None, job=None, stack: str | None = None) -> LayersResult:
    """Every number the layers panel shows (worker thread; `job` lets a newer trace cancel it). An
    encoder-decoder's: `trace` is one stack's view (app.tracing.attention_view) and `stack` names it,
    "encoder" (no logit lens) or "decoder" (its cross-attention a stage of its own, its cross-attention
    heads' norms among the components)."""
    def now_computing(name: str) -> None:  # progress by stage: a GPT-2-small shape at 512 tokens took ~27 s on 2 busy cores
        report(job, LAYERS_STAGES.index(name), len(LAYERS_STAGES), name)

    n_layers = trace.n_layers
    stages = stack == "decoder"
    now_computing("residual stream")
    depths = analysis.residual_depths(trace, stages)
    x = analysis.residual_stream(trace, stages=stages).astype(np.float64)
    now_computing("cosine similarity")
    cos = np.stack([analysis.cosine_matrix(h) for h in x]).astype(np.float32)
    now_computing("component norms")
    head = _head_norms(trace, n_layers)
    mlp = analysis.mlp_output_norms(trace) if "blocks.0.mlp.out" in trace else None
    cross = None
    if stages and "blocks.0.cross_attn.head_out" in trace:
        cross = np.stack([trace[f"blocks.{l}.cross_attn.head_out"][0].double().norm(dim=-1).numpy()
                          for l in range(n_layers)])
    ids = probs = strings = None
    problem = ""
    now_computing("logit lens")
    try:
        if stack == "encoder":
            raise ValueError(ENCODER_LENS)
        lens = analysis.logit_lens(trace, model, job=job)
        ids, probs = lens.top_ids, lens.top_probs
        if tokenizer is not None:
            if stack == "decoder" and getattr(tokenizer, "target", None) is not None:
                tokenizer = tokenizer.target  # Marian: the decoder writes target-side tokens
            strings = [tokenizer.token_strings(row.tolist()) for row in ids]
        else:
            strings = [[str(i) for i in row] for row in ids]
    except ValueError as exc:
        problem = str(exc)
    now_computing("PCA")
    pca = analysis.pca_over_depth(trace, stages=stages)
    return LayersResult([label for _, label in depths], np.linalg.norm(x, axis=-1), head, mlp, ids, probs, strings,
                        problem, pca, cos,
                        np.array([analysis.mean_off_diagonal(c) for c in cos.astype(np.float64)]), cross,
                        *_routing(trace, n_layers))


LAYERS_STAGES = ("residual stream", "cosine similarity", "component norms", "logit lens", "PCA")  # compute_layers'


def _routing(trace, n_layers: int) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """A mixture of experts' router probabilities [L, T, E] (softmax of blocks.l.mlp.router), expert load
    [L, E] (the share of blocks.l.mlp.experts' choices per expert over the text) and each expert's
    contribution norm per token [L, T, E] (blocks.l.mlp.expert_norms laid out by expert, 0 where not chosen;
    None when not recorded); (None, None, None) without them."""
    if "blocks.0.mlp.router" not in trace or "blocks.0.mlp.experts" not in trace:
        return None, None, None
    probs = np.stack([trace[f"blocks.{l}.mlp.router"][0].float().softmax(-1).numpy() for l in range(n_layers)])
    E = probs.shape[-1]
    ids = [trace[f"blocks.{l}.mlp.experts"][0].numpy() for l in range(n_layers)]
    counts = np.stack([np.bincount(i.flatten(), minlength=E) for i in ids]).astype(np.float64)
    norms = None
    if "blocks.0.mlp.expert_norms" in trace:
        norms = np.zeros_like(probs)
        for l in range(n_layers):
            np.put_along_axis(norms[l], ids[l], trace[f"blocks.{l}.mlp.expert_norms"][0].float().numpy(), axis=-1)
    return probs, counts / counts.sum(-1, keepdims=True), norms


def _head_norms(trace, n_layers: int) -> np.ndarray | None:
    """[L, H, T] norms of what each head writes (analysis.head_output_norms' numbers), from the
    recorded head outputs or, in a lazy trace, from attn.z without forming them (Trace.head_out_norms)."""
    if not hasattr(trace, "head_out_norms"):
        return analysis.head_output_norms(trace) if "blocks.0.attn.head_out" in trace else None
    norms = [trace.head_out_norms(l) for l in range(n_layers)]
    return None if not norms or any(n is None for n in norms) else np.stack([n[0].numpy() for n in norms])


@dataclass
class LayersData:
    result: LayersResult
    tokens: list[str]  # one string per position
    causal: bool  # the logit lens then shows the token that actually comes next

    @property
    def n_depths(self) -> int:
        return len(self.result.depth_labels)


# -- the views' results ----------------------------------------------------------------------


@dataclass
class LensResult:
    tokens: list[str]
    next_tokens: list[str] | None  # causal models: what actually comes next (a first column)
    strings: list[list[str]]  # [L][T] top prediction
    ids: np.ndarray  # [L, T]
    probs: np.ndarray  # [L, T]
    problem: str = ""  # why there is no lens (then every field above is empty)


@dataclass
class PCAViewResult:
    pca: analysis.PCAResult
    tokens: list[str]
    depth_labels: list[str]
    depth: int


@dataclass
class CosineViewResult:
    cosine: np.ndarray  # [D, T, T]
    mean_cosine: np.ndarray  # [D]
    tokens: list[str]
    depth_labels: list[str]
    depth: int


def compute_residual_norms(data: LayersData, state: LayersViewState) -> HeatmapResult:
    res = data.result
    return HeatmapResult(res.resid_norms.T, data.tokens, res.depth_labels,
                         title="Residual stream norm \u2016x\u2016 per token and depth")


def compute_component_norms(data: LayersData, state: LayersViewState) -> HeatmapResult:
    res = data.result
    layer_names = [label for label in res.depth_labels[1:] if " " not in label]  # L0, L1 ... (not a decoder's stages)
    if res.head_norms is not None and res.mlp_norms is not None:
        n_heads = res.head_norms.shape[1]
        parts, names = [res.head_norms.mean(-1)], [f"head {h}" for h in range(n_heads)]
        if res.cross_norms is not None:  # an encoder-decoder's decoder: its cross-attention heads too
            parts.append(res.cross_norms.mean(-1))
            names += [f"cross {h}" for h in range(n_heads)]
        comp = np.concatenate(parts + [res.mlp_norms.mean(-1)[:, None]], axis=1)
        return HeatmapResult(comp, layer_names, names + ["MLP"],
                             title="Output norm of each component (mean over tokens)")
    if res.mlp_norms is not None:  # e.g. a generation step: heads' outputs are not recorded there
        return HeatmapResult(res.mlp_norms.mean(-1)[:, None], layer_names, ["MLP"],
                             title="MLP output norm (mean over tokens); head outputs were not recorded")
    return HeatmapResult(np.zeros((1, 1)), [""], [""], title="component outputs were not recorded")


NOT_A_MIXTURE = "this model is not a mixture of experts: it has no router"
MIXTURE_VIEWS = ("routing", "expert-norms", "expert-load")  # a mixture of experts' views (drawn for one only)


def compute_routing(data: LayersData, state: LayersViewState) -> HeatmapResult:
    """Each token's router probabilities over the experts, in the block whose output is the chosen depth
    (depth 0, the embedding: block 0)."""
    probs = data.result.router_probs
    if probs is None:
        return HeatmapResult(np.zeros((1, 1)), [""], [""], title=NOT_A_MIXTURE)
    layer = min(max(state.depth - 1, 0), len(probs) - 1)
    return HeatmapResult(probs[layer], data.tokens, [f"E{e}" for e in range(probs.shape[-1])], levels=(0.0, 1.0),
                         title=f"Router probabilities per token, block L{layer}")


def compute_expert_load(data: LayersData, state: LayersViewState) -> HeatmapResult:
    load = data.result.expert_load
    if load is None:
        return HeatmapResult(np.zeros((1, 1)), [""], [""], title=NOT_A_MIXTURE)
    return HeatmapResult(load, [f"L{l}" for l in range(len(load))], [f"E{e}" for e in range(load.shape[-1])],
                         title="Expert load: share of each layer's routing choices over the text")


def compute_expert_norms(data: LayersData, state: LayersViewState) -> HeatmapResult:
    """Each expert's contribution norm per token, in the block whose output is the chosen depth (as Routing)."""
    norms = data.result.expert_norms
    if norms is None:
        return HeatmapResult(np.zeros((1, 1)), [""], [""], title=NOT_A_MIXTURE if data.result.router_probs is None
                             else "expert norms were not recorded")
    layer = min(max(state.depth - 1, 0), len(norms) - 1)
    return HeatmapResult(norms[layer], data.tokens, [f"E{e}" for e in range(norms.shape[-1])],
                         title=f"Expert contribution norm \u2016w\u2091 expert\u2091(x)\u2016 per token, block L{layer}")


def compute_logit_lens(data: LayersData, state: LayersViewState) -> LensResult:
    res = data.result
    if res.lens_ids is None:
        return LensResult([], None, [], np.zeros((0, 0), np.int64), np.zeros((0, 0)), res.lens_problem)
    next_tokens = (data.tokens[1:] + [""]) if data.causal else None
    return LensResult(data.tokens, next_tokens, res.lens_strings, res.lens_ids, res.lens_probs)


def compute_pca(data: LayersData, state: LayersViewState) -> PCAViewResult:
    return PCAViewResult(data.result.pca, data.tokens, data.result.depth_labels, state.depth)


def compute_cosine(data: LayersData, state: LayersViewState) -> CosineViewResult:
    res = data.result
    return CosineViewResult(res.cosine, res.mean_cosine, data.tokens, res.depth_labels, state.depth)


VIEWS: tuple[View, ...] = (
    View("residual-norms", "Residual norms", (), compute_residual_norms,
         axes=("token", "depth", "\u2016x\u2016"), rows="tokens",
         heatmap_options=dict(colormap="inferno", col_tokens=False)),
    View("component-norms", "Component norms", (), compute_component_norms,
         axes=("layer", "component", "mean output norm"),
         heatmap_options=dict(colormap="inferno", annotate_max_cells=400, row_tokens=False, col_tokens=False)),
    View("logit-lens", "Logit lens", (), compute_logit_lens, widget="logit-lens"),
    View("pca", "PCA", ("depth",), compute_pca, "{view}-{depth_name}", widget="pca"),
    View("cosine", "Cosine similarity", ("depth",), compute_cosine, "{view}-{depth_name}", widget="cosine"),
    # a mixture of experts' routing (core/moe.py)
    View("routing", "Routing", ("depth",), compute_routing, "{view}-{depth_name}",
         axes=("token", "expert", "router probability"), rows="tokens",
         heatmap_options=dict(colormap="viridis", col_tokens=False)),
    View("expert-norms", "Expert norms", ("depth",), compute_expert_norms, "{view}-{depth_name}",
         axes=("token", "expert", "contribution norm"), rows="tokens",
         heatmap_options=dict(colormap="inferno", col_tokens=False)),
    View("expert-load", "Expert load", (), compute_expert_load, axes=("layer", "expert", "share of routing"),
         heatmap_options=dict(colormap="inferno", annotate_max_cells=400, row_tokens=False, col_tokens=False)),
)

"""Attribution graphs for the front ends (the Graph panel; the CLI's `graph` command calls core.graphs
directly): one graph of the model and text on screen, kept unpruned so that pruning thresholds can move
without computing again, tested by intervention, its feature edits handed to the app's edit list.

    result = compute_graph(loaded, ids, folder, job=None)    GraphResult: the raw graph and its context
    model = pruned_json(result, node_threshold, edge_threshold)   the frontend's JSON of the pruned graph
    before, after = intervene(result, edits, live=False)     logits [V] at the last position
    ivs = whatif_edits(result, edits, n_text)                What-if edits (core.interventions) for the text
    graph_feature_tokens(loaded, transcoders, layer, feature)      decoder tokens   (the Features panel's
    graph_feature_dashboard(loaded, transcoders, layer, feature, path, job=)   top contexts   dashboard code)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class GraphResult:
    """One graph and what it was computed for (the panel shows it only while those are on screen)."""
    model_name: str
    ids: list[int]  # the graph's input: the text's ids, a special token first (circuit-tracer's rule)
    n_text: int  # len of the text's ids on screen (the graph's ids may hold one more, the special token)
    transcoders_folder: str
    graph: object  # core.graphs.Graph (unpruned: the raw adjacency)
    ctx: object  # core.graphs.Context: the frozen replacement model the edits re-run
    replacement_score: float
    completeness_score: float
    tokenizer: object = None

    @property
    def slug(self) -> str:
        return f"{self.model_name} graph"

    def feature_row(self, layer: int, position: int, feature: int) -> int | None:
        """The index of an active feature in ctx.active (what an edit names), or None."""
        a = self.ctx.active
        hit = ((a[:, 0] == layer) & (a[:, 1] == position) & (a[:, 2] == feature)).nonzero()
        return int(hit[0, 0]) if len(hit) else None


def compute_graph(loaded, ids: Sequence[int], folder, job=None, max_feature_nodes: int = 7500,
                  batch_size: int = 64) -> GraphResult:
    """The unpruned graph of `loaded` on the text `ids` over the transcoders in `folder` (circuit-tracer's
    top-logit targets and defaults); `job` gets progress ("feature rows k/n") and may cancel between batches."""
    import re

    from ..core.graphs import attribute, build_context, graph_scores, load_transcoders, salient_targets
    from ..core.graphs import with_leading_special
    from ..core.jobs import report

    if not ids:
        raise ValueError("no text: type a text in the Model panel")
    transcoders = load_transcoders(folder)
    tok = loaded.tokenizer
    graph_ids = with_leading_special(list(ids), tok)
    if len(graph_ids) < 2:
        raise ValueError("the text is one token: the graph ignores position 0 (type a longer text)")
    report(job, 0, 1, "the replacement model")
    with torch.no_grad():
        ctx = build_context(loaded.model, graph_ids, transcoders)
    decode = (lambda t: tok.decode([t])) if tok is not None else str
    targets = salient_targets(loaded.model, ctx.frozen.logits[-1], 10, 0.95, decode)
    total = min(max_feature_nodes, len(ctx.active)) or 1

    def progress(message: str) -> None:
        m = re.match(r"feature rows (\d+)/(\d+)", message)
        report(job, int(m[1]) if m else 0, int(m[2]) if m else total, message)

    graph = attribute(ctx, targets, batch_size=batch_size, max_feature_nodes=max_feature_nodes, progress=progress,
                      input_string=tok.decode(graph_ids) if tok is not None else "",
                      token_strings=tok.token_strings(graph_ids) if tok is not None else [str(t) for t in graph_ids])
    replacement, completeness = graph_scores(graph)
    return GraphResult(loaded.name, graph_ids, len(ids), str(folder), graph, ctx, replacement, completeness, tok)


def pruned_json(result: GraphResult, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> dict:
    """The graph pruned at these thresholds, in the frontend's / Neuronpedia's JSON (core.graphs.files)."""
    from ..core.graphs import prune_graph
    from ..core.graphs.files import graph_json

    pruned = prune_graph(result.graph, node_threshold, edge_threshold)
    model = graph_json(result.graph, pruned, result.slug, node_threshold)
    model["metadata"]["transcoder_list"] = [result.transcoders_folder]
    return model


def _edits(result: GraphResult, edits):
    from ..core.graphs.edits import FeatureSet

    return [e if isinstance(e, FeatureSet) else FeatureSet(*e) for e in edits]


def intervene(result: GraphResult, edits, live: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits before, logits after) [V] at the last position, the edits (FeatureSet, or (active index, how,
    value)) applied in the frozen replacement model (attention, norms, other features and errors held), or
    `live`: in the real model, as the same edits' What-if form (attention, norms and MLPs recomputed)."""
    from ..core.graphs.edits import feature_interventions, frozen_logits

    edits = _edits(result, edits)
    before = result.ctx.frozen.logits[-1].float().cpu()
    if not live:
        return before, frozen_logits(result.ctx, edits)[-1].float().cpu()
    model = result.ctx.model
    ivs = feature_interventions(result.ctx, edits)
    with torch.no_grad():
        out = model(torch.tensor([result.ids], device=model.device), interventions=ivs or None)
    return before, out.logits[0, -1].float().cpu()


def whatif_edits(result: GraphResult, edits, n_text: int | None = None) -> list:
    """The edits as What-if edits for the text on screen (n_text tokens): each "add" value [T, d] loses the
    rows of the special token the graph put first (it carries no feature, so nothing is lost)."""
    from dataclasses import replace

    from ..core.graphs.edits import feature_interventions

    n_text = result.n_text if n_text is None else n_text
    extra = len(result.ids) - n_text
    if extra < 0:
        raise ValueError(f"the graph was computed for {len(result.ids)} tokens, the text has {n_text}")
    ivs = feature_interventions(result.ctx, _edits(result, edits))
    return [replace(iv, value=iv.value[extra:].cpu()) for iv in ivs]


def logit_rows(result: GraphResult, before: torch.Tensor, after: torch.Tensor, n: int = 5) -> list[tuple]:
    """(label, token id, logit before, logit after, p before, p after) for the graph's logit targets and the
    top `n` tokens after the edit, largest probability after first."""
    tok_ids = [t for t in result.graph.logit_tokens if t < len(before)]
    for t in torch.topk(after, min(n, len(after))).indices.tolist():
        if t not in tok_ids:
            tok_ids.append(t)
    labels = dict(zip(result.graph.logit_tokens, result.graph.logit_labels))
    tok = result.tokenizer
    p0, p1 = torch.softmax(before, -1), torch.softmax(after, -1)
    name = (lambda t: labels.get(t) or (tok.decode([t]) if tok is not None else str(t)))
    rows = [(name(t), t, float(before[t]), float(after[t]), float(p0[t]), float(p1[t])) for t in tok_ids]
    return sorted(rows, key=lambda r: -r[5])


def transcoder_dictionary(transcoders, layer: int, loaded, feature: int):
    """Layer `layer` of circuit-tracer transcoders as a core.features SparseDictionary attached to the model
    (read at its input hook, written at the MLP output), so the Features panel's dashboard code (top contexts
    over a text file, decoder tokens) reads feature `feature`. Only that feature's decoder is read (a
    cross-layer transcoder's decoder of one layer is tens of GB): its row holds the sum of what it writes to
    every later MLP output, its total direct write to the residual stream; the other rows are zero."""
    from ..core.features import SparseDictionary, attach

    t = transcoders
    if not 0 <= feature < t.n_features:
        raise ValueError(f"{t.folder}: feature {feature} is not in 0..{t.n_features - 1}")
    W_enc = t._enc[layer].full(t._name("W_enc", layer)).float()
    W_dec = torch.zeros(t.n_features, t.d_model)
    W_dec[feature] = t.decoder_rows(layer, torch.tensor([feature]))[0].sum(0)
    threshold = t._vector(t._threshold_name(layer), layer) if t.activation == "jump_relu" else None
    architecture = {"relu": "standard", "jump_relu": "jumprelu", "topk": "topk"}[t.activation]
    hook = f"blocks.{layer}.mlp.input" if t.input_hook == "mlp.hook_in" else f"blocks.{layer}.hook_resid_mid"
    d = SparseDictionary(W_enc.T.contiguous(), t._vector(t._name("b_enc", layer), layer), W_dec, t.b_dec(layer),
                         architecture=architecture, hook=hook, hook_out=f"blocks.{layer}.hook_mlp_out",
                         threshold=threshold, k=t.k, path=str(t.folder))
    d.to(loaded.model.device)
    return attach(d, loaded.config)


def graph_feature_tokens(loaded, transcoders, layer: int, feature: int, n: int = 10):
    """The tokens a graph feature's decoder promotes and suppresses (app.features.decoder_tokens)."""
    from .features import decoder_tokens

    return decoder_tokens(loaded, transcoder_dictionary(transcoders, layer, loaded, feature), feature, n)


def graph_feature_dashboard(loaded, transcoders, layer: int, feature: int, path, job=None):
    """A graph feature's top contexts over a text file, cached (app.features.cached_dashboard)."""
    from .features import cached_dashboard

    return cached_dashboard(loaded, transcoder_dictionary(transcoders, layer, loaded, feature), path, feature, job=job)

"""Attribution graphs: direct effects between features, errors, tokens and logits (circuit-tracer 0.5's
definitions: attribution/attribute.py, graph.py; Ameisen et al. 2025).

Nodes, in circuit-tracer's order: [selected features, error nodes (layer by layer, position by position),
token embeddings, logit targets]. adjacency[t, s] (rows targets, columns sources) is the direct effect of
source s on target t's pre-activation in the local replacement model (replacement.py), along linear paths:
    feature target (layer l, position p, feature f): W_enc[f] . (feature input at l, p)
    logit target: (W_U[token] - mean over the vocabulary of W_U) . (final norm output at the last position)
    feature source: its activation times its decoder vector(s) (one per layer a cross-layer feature writes to)
    error source: real MLP output - reconstruction at (layer, position); token source: W_E[token].
Each target's row is one backward pass of the linear replacement model from its input direction; a
batch of targets is one vmapped backward (autograd.grad with is_grads_batched).

Which features get rows when max_feature_nodes is below the number active: circuit-tracer's order (the
features of highest partial influence on the logits first, re-ranked every update_interval batches).
Pruning (prune_graph) and the replacement and completeness scores (graph_scores) follow graph.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..streamed import weights_saved_by_name
from .replacement import Frozen, freeze, graph_problem, keeping_parts, linear_forward, n_graph_layers
from .transcoders import Transcoders


# -- the prompt's replacement model and its node vectors -----------------------------------------------


@dataclass
class Context:
    """One prompt, one model, one set of transcoders: everything the rows are computed from.

    The decoder is held once per active feature id, not once per (position, feature): a feature active
    at many positions has one row, and the a_s W_dec[s] products are formed a chunk at a time where they
    are used (a 1,024-token prompt's active features would otherwise hold ~36 GB of a 1B model's CLT)."""
    model: object
    transcoders: Transcoders
    frozen: Frozen
    active: torch.Tensor  # [n, 3] (layer, position, feature), sorted
    activations: torch.Tensor  # [n]
    layer_starts: list[int]  # L + 1: layer l's active features are active[layer_starts[l]:layer_starts[l + 1]]
    decoder_rows: list[torch.Tensor]  # per layer l: [U_l, outputs, d] W_dec of its distinct active features
    decoder_slots: list[torch.Tensor]  # per layer l: [n_l] each active feature's row in decoder_rows[l]
    mlp_constants: list[torch.Tensor]  # [T, d] per layer: MLP output less skip less the features' part
    error_vectors: torch.Tensor  # [L, T, d], zero at position 0
    dtype: torch.dtype = torch.float32

    CHUNK_BYTES = 256 << 20  # the most a_s W_dec[s] products formed at once

    def encoder_vectors(self, index: torch.Tensor) -> torch.Tensor:
        """[k, d]: the W_enc rows of active features `index` (read from the transcoder files)."""
        index = index.cpu().long()
        out = torch.empty(len(index), self.transcoders.d_model, dtype=self.dtype)
        layers = self.active[index, 0].cpu()
        for l in layers.unique().tolist():
            at = (layers == l).nonzero().flatten()
            out[at] = self.transcoders.encoder_rows(l, self.active[index[at], 2].cpu(), self.dtype)
        return out.to(self.frozen.mlp_out.device)

    def source_layers(self, layer: int) -> list[int]:
        """The layers whose features write to `layer`'s MLP output."""
        return [l for l in range(layer + 1) if layer in self.transcoders.output_layers(l)]

    def feature_writes(self, layer: int, activations: torch.Tensor | None = None) -> torch.Tensor:
        """[T, d]: what the active features write to layer `layer`'s MLP output (at `activations`)."""
        acts = self.activations if activations is None else activations
        out = torch.zeros(self.n_pos, self.frozen.mlp_out.shape[-1], dtype=self.dtype, device=acts.device)
        step = max(1, self.CHUNK_BYTES // (out.shape[-1] * out.element_size()))
        for l in self.source_layers(layer):
            k = layer - self.transcoders.output_layers(l).start
            for a in range(self.layer_starts[l], self.layer_starts[l + 1], step):
                b = min(a + step, self.layer_starts[l + 1])
                vec = self.decoder_rows[l][self.decoder_slots[l][a - self.layer_starts[l]:b - self.layer_starts[l]], k]
                out.index_add_(0, self.active[a:b, 1], acts[a:b, None].to(self.dtype) * vec)
        return out

    def feature_edges(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """[B, n]: each active feature's direct effect, a_s sum_j grads[j][:, pos_s] . W_dec[s, j], from
        the gradients [B, T, d] at each layer's MLP output. Per source layer, one batched product per
        position: the features of a position padded to the most any position has, a chunk of positions
        at a time."""
        B, T, d = grads[0].shape
        out = torch.zeros(B, len(self.active), dtype=self.dtype, device=grads[0].device)
        # one buffer for every chunk, never zeroed: a padding slot's product is computed and never read
        # (a fresh zeroed chunk each time: on a 1,024-token prompt, most of a batch went to page faults and fills)
        buffer = torch.empty(0, dtype=self.dtype, device=grads[0].device)
        for l in range(self.n_layers):
            start, end = self.layer_starts[l], self.layer_starts[l + 1]
            if start == end:
                continue
            outputs = self.transcoders.output_layers(l)
            g = torch.stack([grads[j] for j in outputs], dim=2).view(B, T, -1)  # [B, T, outputs * d]
            pos = self.active[start:end, 1]
            counts = torch.bincount(pos, minlength=T)
            m = int(counts.max())
            first = torch.cumsum(counts, 0) - counts  # each position's first active feature (sorted by position)
            rank = torch.arange(end - start, device=pos.device) - first[pos]
            per_position = max(1, self.CHUNK_BYTES // (m * g.shape[-1] * g.element_size()))
            for p0 in range(0, T, per_position):
                p1 = min(T, p0 + per_position)
                a, b = int(first[p0]), int(first[p1 - 1] + counts[p1 - 1])
                if a == b:
                    continue
                slots = (pos[a:b] - p0) * m + rank[a:b]
                if buffer.numel() < (p1 - p0) * m * g.shape[-1]:
                    buffer = torch.empty((p1 - p0) * m * g.shape[-1], dtype=self.dtype, device=g.device)
                padded = buffer[:(p1 - p0) * m * g.shape[-1]].view((p1 - p0) * m, g.shape[-1])
                padded[slots] = self.decoder_rows[l][self.decoder_slots[l][a:b]].view(b - a, -1)
                dots = torch.bmm(g[:, p0:p1].transpose(0, 1), padded.view(p1 - p0, m, -1).transpose(1, 2))  # [P, B, m]
                out[:, start + a:start + b] = dots.transpose(0, 1).reshape(B, -1)[:, slots]
        return out * self.activations.to(self.dtype)

    @property
    def n_layers(self) -> int:
        return len(self.mlp_constants)

    @property
    def n_pos(self) -> int:
        return len(self.frozen.ids)

    @property
    def logit_offset(self) -> int:
        return len(self.active) + (self.n_layers + 1) * self.n_pos

    def mlp_values(self, activations: torch.Tensor | None = None, errors: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each layer's MLP-output constant with the features at `activations` and the error nodes at
        `errors` [L, T, d] (defaults: this prompt's); the prompt's own values give the real MLP output."""
        out = []
        for l in range(self.n_layers):
            rest = self.mlp_constants[l] - self.feature_writes(l) - self.error_vectors[l]  # b_dec (+ position 0)
            err = self.error_vectors[l] if errors is None else errors[l]
            out.append(rest + err + self.feature_writes(l, activations))
        return out

    def forward(self, tokens: torch.Tensor | None = None, activations: torch.Tensor | None = None,
                errors: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The frozen replacement model evaluated (no gradient): (feature inputs per layer, final norm output)."""
        with torch.no_grad():
            t = self.frozen.token_vectors.to(self.dtype) if tokens is None else tokens
            return linear_forward(self.model, self.frozen, self.transcoders, t, self.mlp_values(activations, errors))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The model's logits from the final norm's output (its scale, bias and soft-cap included)."""
        with torch.no_grad():
            return self.model.unembed(h, normed=True)


def _special_ids(tokenizer) -> list[int]:
    from ..tokenizer import SPECIAL_NAMES

    ids = [tokenizer.special_id(name) for name in ("bos", "pad", "eos", *SPECIAL_NAMES)]
    return [i for i in ids if i is not None]


def with_leading_special(ids: Sequence[int], tokenizer) -> list[int]:
    """circuit-tracer's ensure_tokenized: unless the input starts with a special token, one goes first
    (BOS, else PAD, EOS, any special; as there, one whose id is 0 is passed over: it picks the first
    truthy id). The graph ignores position 0 (no feature, no error node there). Without a tokenizer, or
    without such a token, nothing is added (position 0 is then a prompt token, still ignored)."""
    ids = [int(i) for i in ids]
    specials = _special_ids(tokenizer) if tokenizer is not None else []
    if not ids or ids[0] in specials:
        return ids
    first = next((i for i in specials if i), None)
    return ids if first is None else [first, *ids]


def build_context(model, ids: Sequence[int], transcoders: Transcoders, *, source: Sequence[int] | None = None) -> Context:
    """The real forward, the active features (zeroed at position 0), their vectors and the error nodes.
    An encoder-decoder: ids are the decoder's (its start token first), `source` the encoder's input; the
    transcoders replace the decoder's MLPs."""
    cfg = model.cfg
    problem = graph_problem(cfg)
    if problem:
        raise ValueError(problem)
    n_layers = n_graph_layers(model)
    if transcoders.n_layers != n_layers or transcoders.d_model != cfg.d_model:
        raise ValueError(f"{transcoders.folder}: transcoders for {transcoders.n_layers} layers of width "
                         f"{transcoders.d_model}; the model has {n_layers} layers of width {cfg.d_model}")
    dtype = model.dtype
    with keeping_parts(model):  # a streamed model: the replay reads again what its real forward has just read
        frozen = freeze(model, list(ids), transcoders.input_hook, None if source is None else list(source))
    L, T, d = frozen.mlp_out.shape
    device = frozen.mlp_out.device
    active, values, decoder_rows, decoder_slots = [], [], [], []
    for l in range(L):
        acts = transcoders.encode(l, frozen.feature_in[l].to(torch.float32 if dtype != torch.float64 else dtype))
        acts[0] = 0  # position 0 is ignored (circuit-tracer's zero_positions)
        pos, feat = acts.nonzero(as_tuple=True)  # sorted by position
        active.append(torch.stack([torch.full_like(pos, l), pos, feat], dim=1))
        values.append(acts[pos, feat])
        features, slots = torch.unique(feat, return_inverse=True)
        decoder_rows.append(transcoders.decoder_rows(l, features, dtype).to(device))  # [U, outputs, d]
        decoder_slots.append(slots.to(device))
        del acts
    layer_starts = torch.cumsum(torch.tensor([0] + [len(a) for a in active]), 0).tolist()
    ctx = Context(model, transcoders, frozen, torch.cat(active).long(), torch.cat(values).to(dtype), layer_starts,
                  decoder_rows, decoder_slots, [], torch.zeros(L, T, d, dtype=dtype, device=device), dtype)
    for l in range(L):
        skip = transcoders.skip(l, frozen.feature_in[l])
        constant = frozen.mlp_out[l] - (skip if skip is not None else 0)
        recon = ctx.feature_writes(l) + transcoders.b_dec(l).to(device, dtype)
        ctx.error_vectors[l] = constant - recon
        ctx.error_vectors[l, 0] = 0
        ctx.mlp_constants.append(constant)
    return ctx


# -- rows: batched backward passes ---------------------------------------------------------------------


def compute_rows(ctx: Context, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """[B, logit_offset]: the direct effects on B targets, target b read as vectors[b] . (the input at
    layer layers[b], position positions[b]) (layer n_layers: the final norm's output, for logits), on
    every feature, error and token node."""
    model, fr = ctx.model, ctx.frozen
    L, T = ctx.n_layers, ctx.n_pos
    B = len(layers)
    device = fr.mlp_out.device
    layers, positions = layers.to(device), positions.to(device)
    tokens = fr.token_vectors.to(ctx.dtype).clone().requires_grad_(True)
    constants = [c.detach().clone().requires_grad_(True) for c in ctx.mlp_constants]
    # a streamed model's blocks are read again by the backward, one at a time, rather than all kept
    with torch.enable_grad(), weights_saved_by_name(model):
        feature_inputs, h = linear_forward(model, fr, ctx.transcoders, tokens, constants)
        outputs, grads_in = [], []
        for layer in layers.unique().tolist():
            mask = layers == layer
            g = torch.zeros(B, T, h.shape[-1], dtype=ctx.dtype, device=device)
            g[mask.nonzero(as_tuple=True)[0], positions[mask]] = vectors[mask].to(ctx.dtype)
            outputs.append(h if layer == L else feature_inputs[layer])
            grads_in.append(g)
        grads = torch.autograd.grad(outputs, [tokens, *constants], grads_in, is_grads_batched=True,
                                    allow_unused=True, materialize_grads=True)
    # an input no target reaches comes back unbatched (materialized zeros): give it the batch axis
    grads = [g if g.dim() == 3 else g.expand(B, *g.shape) for g in grads]
    g_tokens, g_mlp = grads[0], grads[1:]
    n = len(ctx.active)
    rows = torch.zeros(B, ctx.logit_offset, dtype=ctx.dtype, device=h.device)
    rows[:, :n] = ctx.feature_edges(g_mlp)
    for j in range(L):
        rows[:, n + j * T: n + (j + 1) * T] = torch.einsum("btd,td->bt", g_mlp[j], ctx.error_vectors[j])
    rows[:, n + L * T:] = torch.einsum("btd,td->bt", g_tokens, fr.token_vectors.to(ctx.dtype))
    return rows.detach()


# -- targets --------------------------------------------------------------------------------------------


@dataclass
class Targets:
    labels: list[str]
    vocab_ids: list[int]  # a token id, or vocab_size + i for a custom target (a logit difference)
    probabilities: torch.Tensor  # [k]
    vectors: torch.Tensor  # [k, d]


def unembedding(model) -> torch.Tensor:
    """[V, d]: logit = W[t] . (the final norm's output) before a bias or soft-cap (Granite's, Cohere's
    and T5's scale on the head's input folded in)."""
    W = model.lm_head.weight.detach()
    scale = model.cfg.lm_head_scale
    return W if scale is None else W * scale


def salient_targets(model, logits: torch.Tensor, max_n_logits: int, desired_logit_prob: float, decode) -> Targets:
    """The top logits until their probabilities sum to desired_logit_prob, at most max_n_logits, each as
    its logit minus the mean logit (the demeaned unembedding row)."""
    probs = torch.softmax(logits, dim=-1)
    top_p, top_idx = torch.topk(probs, min(max_n_logits, probs.shape[-1]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
    return token_targets(model, logits, top_idx[:cutoff].tolist(), decode)


def token_targets(model, logits: torch.Tensor, token_ids: Sequence[int], decode) -> Targets:
    W = unembedding(model)
    V = logits.shape[-1]
    bad = [t for t in token_ids if not 0 <= t < V]
    if bad:
        raise ValueError(f"target token ids {bad} are outside the vocabulary (0..{V - 1})")
    idx = torch.tensor(list(token_ids), dtype=torch.long, device=W.device)
    probs = torch.softmax(logits, dim=-1)[idx]
    return Targets([decode(t) for t in token_ids], list(map(int, token_ids)), probs, W[idx] - W.mean(0, keepdim=True))


def difference_target(model, logits: torch.Tensor, a: int, b: int, decode) -> Targets:
    """logit(a) - logit(b), a custom target of weight 1 (circuit-tracer's CustomTarget with a virtual index)."""
    W = unembedding(model)
    V = logits.shape[-1]
    for t in (a, b):
        if not 0 <= t < V:
            raise ValueError(f"target token id {t} is outside the vocabulary (0..{V - 1})")
    label = f"logit({decode(a)})-logit({decode(b)})"
    return Targets([label], [V], torch.ones(1, dtype=logits.dtype, device=logits.device), (W[a] - W[b])[None])


# -- the graph ------------------------------------------------------------------------------------------


@dataclass
class Graph:
    """circuit-tracer's Graph, as arrays (the raw file holds them; graph_files.py writes both files)."""
    input_ids: list[int]
    input_string: str
    active_features: torch.Tensor  # [n, 3] int64
    activation_values: torch.Tensor  # [n]
    selected_features: torch.Tensor  # [k] indices into active_features
    adjacency: torch.Tensor  # [N, N]
    logit_labels: list[str]
    logit_tokens: list[int]
    logit_probabilities: torch.Tensor  # [m]
    n_layers: int
    scan: str = ""
    token_strings: list[str] = field(default_factory=list)

    @property
    def n_pos(self) -> int:
        return len(self.input_ids)

    @property
    def n_features(self) -> int:
        return len(self.selected_features)

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    def error_index(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_index(self, i: int) -> int:
        return self.adjacency.shape[0] - self.n_logits + i


def partial_influences(edges: torch.Tensor, logit_p: torch.Tensor, row_nodes: torch.Tensor, max_iter: int = 128) -> torch.Tensor:
    """Influence on the logits of every node (columns) through the rows computed so far (graph.py's
    compute_partial_influences)."""
    norm = edges.abs()
    norm = norm / norm.sum(dim=1, keepdim=True).clamp(min=1e-8)
    influences = torch.zeros(edges.shape[1], dtype=edges.dtype)
    prod = torch.zeros(edges.shape[1], dtype=edges.dtype)
    prod[-len(logit_p):] = logit_p.to(edges.dtype)
    for _ in range(max_iter):
        prod = prod[row_nodes] @ norm
        if not prod.any():
            return influences
        influences += prod
    raise RuntimeError("partial influences did not converge")


def attribute(ctx: Context, targets: Targets, *, batch_size: int = 512, max_feature_nodes: int | None = None,
              update_interval: int = 4, progress: Callable[[str], None] | None = None,
              input_string: str = "", token_strings: Sequence[str] = ()) -> Graph:
    """The unpruned graph (attribute.py's phases 3-5)."""
    say = progress or (lambda _msg: None)
    L, T = ctx.n_layers, ctx.n_pos
    total = len(ctx.active)
    n_logits = len(targets.vocab_ids)
    offset = ctx.logit_offset
    n_nodes = offset + n_logits
    max_feature_nodes = min(max_feature_nodes or total, total)
    work = torch.float64 if ctx.dtype == torch.float64 else torch.float32
    edges = torch.zeros(max_feature_nodes + n_logits, n_nodes, dtype=work)
    row_nodes = torch.zeros(max_feature_nodes + n_logits, dtype=torch.long)
    say(f"{total} active features, {n_logits} logit targets, {L * T} error nodes, {T} tokens; "
        f"rows for {max_feature_nodes} features")
    # a streamed model: each batch is a forward and a backward through every layer; the first layers' parts are kept
    with keeping_parts(ctx.model):
        for i in range(0, n_logits, batch_size):
            vec = targets.vectors[i:i + batch_size]
            rows = compute_rows(ctx, torch.full((len(vec),), L), torch.full((len(vec),), T - 1), vec)
            edges[i:i + len(vec), :offset] = rows.to(work).cpu()
            row_nodes[i:i + len(vec)] = torch.arange(i, i + len(vec)) + offset
        layers, positions = ctx.active[:, 0].cpu(), ctx.active[:, 1].cpu()
        visited = torch.zeros(total, dtype=torch.bool)
        n_visited, st = 0, n_logits
        while n_visited < max_feature_nodes:
            if max_feature_nodes == total:
                pending = torch.arange(total)
            else:
                influence = partial_influences(edges[:st], targets.probabilities.cpu(), row_nodes[:st])
                rank = torch.argsort(influence[:total], descending=True)
                pending = rank[~visited[rank]][:min(update_interval * batch_size, max_feature_nodes - n_visited)]
            for b in range(0, len(pending), batch_size):
                batch = pending[b:b + batch_size]
                n_visited += len(batch)
                rows = compute_rows(ctx, layers[batch], positions[batch], ctx.encoder_vectors(batch))
                edges[st:st + len(batch), :offset] = rows.to(work).cpu()
                row_nodes[st:st + len(batch)] = batch
                visited[batch] = True
                st += len(batch)
                say(f"feature rows {n_visited}/{max_feature_nodes}")
    selected = torch.where(visited)[0]
    if max_feature_nodes < total:
        edges = edges[:, torch.cat([selected, torch.arange(total, n_nodes)])]
    edges = edges[row_nodes.argsort()]
    N = edges.shape[1]
    adjacency = torch.zeros(N, N, dtype=work)
    adjacency[:max_feature_nodes] = edges[:max_feature_nodes]
    adjacency[N - n_logits:] = edges[max_feature_nodes:]
    return Graph(list(ctx.frozen.ids), input_string, ctx.active.cpu(), ctx.activations.detach().cpu(),
                 selected, adjacency, list(targets.labels), list(targets.vocab_ids),
                 targets.probabilities.detach().cpu(), L, ctx.transcoders.scan, list(token_strings))


# -- pruning and scores (graph.py) ----------------------------------------------------------------------


def normalize_matrix(m: torch.Tensor) -> torch.Tensor:
    a = m.abs()
    return a / a.sum(dim=1, keepdim=True).clamp(min=1e-10)


def influence(A: torch.Tensor, logit_weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """logit_weights (A + A^2 + ...): the graph is acyclic, so the powers reach zero."""
    current = logit_weights @ A
    total = current
    for _ in range(max_iter):
        if not current.any():
            return total
        current = current @ A
        total = total + current
    raise RuntimeError(f"influence did not converge after {max_iter} iterations")


def _logit_weights(graph: Graph) -> torch.Tensor:
    w = torch.zeros(graph.adjacency.shape[0], dtype=graph.adjacency.dtype)
    w[-graph.n_logits:] = graph.logit_probabilities.to(w.dtype)
    return w


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """The score above which the kept scores hold `threshold` of the total. Only the positive scores are
    sorted (an adjacency's scores are mostly zero: a 1,024-token graph's are 3e8, its positive ones 1e6);
    where the positive ones hold less than `threshold`, the next score below them, as in a sort of all."""
    positive = scores[scores > 0]
    ordered = torch.sort(positive, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    i = int(torch.searchsorted(cumulative, threshold).item())
    if i < len(ordered):
        return ordered[i]
    rest = scores[scores <= 0]
    return rest.max() if len(rest) else ordered[-1]


@dataclass
class Pruned:
    node_mask: torch.Tensor  # [N] bool
    edge_mask: torch.Tensor  # [N, N] bool
    cumulative_scores: torch.Tensor  # [N] each node's cumulative share of influence, in influence order


def prune_graph(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """Keep the nodes holding node_threshold of the influence on the logits, then the edges holding
    edge_threshold of it; drop feature and error nodes left without outgoing edges and features without
    incoming ones, until nothing changes (graph.py's prune_graph)."""
    if not 0.0 <= node_threshold <= 1.0 or not 0.0 <= edge_threshold <= 1.0:
        raise ValueError("node and edge thresholds must be in [0, 1]")
    A = graph.adjacency
    n_tokens, n_logits, n_features = graph.n_pos, graph.n_logits, graph.n_features
    weights = _logit_weights(graph)
    node_influence = influence(normalize_matrix(A), weights)
    node_mask = node_influence >= find_threshold(node_influence, node_threshold)
    node_mask[-n_logits - n_tokens:] = True
    pruned = A.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normalized = normalize_matrix(pruned)
    edge_scores = normalized * (influence(normalized, weights) + weights)[:, None]
    edge_mask = edge_scores >= find_threshold(edge_scores.flatten(), edge_threshold)
    inner = slice(0, A.shape[0] - n_logits - n_tokens)  # feature and error nodes
    old = node_mask.clone()
    node_mask[inner] &= edge_mask[:, inner].any(0)
    node_mask[:n_features] &= edge_mask[:n_features].any(1)
    while not torch.equal(node_mask, old):
        old[:] = node_mask
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[inner] &= edge_mask[:, inner].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
    order_scores, order = torch.sort(node_influence, descending=True)
    cumulative = torch.zeros_like(node_influence)
    cumulative[order] = torch.cumsum(order_scores, dim=0) / torch.sum(order_scores)
    return Pruned(node_mask, edge_mask, cumulative)


def graph_scores(graph: Graph) -> tuple[float, float]:
    """(replacement score, completeness score) as graph.py's compute_graph_scores: the share of the
    tokens' influence on the logits that does not pass through error nodes, and the influence-weighted
    share of each node's input that does not come from error nodes."""
    f = graph.n_features
    error_end = f + graph.n_pos * graph.n_layers
    token_end = error_end + graph.n_pos
    weights = _logit_weights(graph)
    normalized = normalize_matrix(graph.adjacency)
    node_influence = influence(normalized, weights)
    token_influence = node_influence[error_end:token_end].sum()
    error_influence = node_influence[f:error_end].sum()
    replacement = token_influence / (token_influence + error_influence)
    non_error = 1 - normalized[:, f:error_end].sum(dim=-1)
    output_influence = node_influence + weights
    completeness = (non_error * output_influence).sum() / output_influence.sum()
    return float(replacement), float(completeness)

"""Where a graph JSON's nodes and edges are drawn (the Graph panel; no Qt here).

Rows: token embeddings at 0, layer l's features and error nodes at l + 1, logits on top (n_layers + 1).
Columns: the token position; the nodes sharing a cell are spread across it, most influential in the middle.
A node's size grows with its influence (1 - its cumulative share: the first nodes in influence order hold
the smallest share) or, for a logit, with its probability.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import check_graph_json

KINDS = ("cross layer transcoder", "mlp reconstruction error", "embedding", "logit")
MAX_JSON_BYTES = 2 << 30  # a graph file beyond this is refused before it is read


@dataclass
class GraphLayout:
    nodes: list[dict]
    x: np.ndarray  # [n]
    y: np.ndarray  # [n]
    size: np.ndarray  # [n] in 0..1
    kind: np.ndarray  # [n] index into KINDS
    edges: np.ndarray  # [m, 2] node indices (source, target)
    weights: np.ndarray  # [m]
    n_rows: int
    prompt_tokens: list[str]


def load_graph_json(path: str | Path) -> dict:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ValueError(f"{path}: {path.stat().st_size / 2**30:.1f} GB is larger than a graph file can be here")
        model = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable graph JSON ({exc})") from exc
    except RecursionError:
        raise ValueError(f"{path}: not a graph JSON (nested too deeply)") from None
    if not isinstance(model, dict):
        raise ValueError(f"{path}: not a graph JSON (no metadata, nodes, links)")
    check_graph_json(model, path)
    return model


def _row(node: dict, n_layers: int) -> int:
    if node["feature_type"] == "embedding":
        return 0
    if node["feature_type"] == "logit":
        return n_layers + 1
    return int(node["layer"]) + 1


def layout(model: dict) -> GraphLayout:
    nodes = model["nodes"]
    logit_layers = [int(n["layer"]) for n in nodes if n["feature_type"] == "logit"]
    layer_rows = [int(n["layer"]) for n in nodes if n["feature_type"] in KINDS[:2]]
    n_layers = (logit_layers[0] - 1) if logit_layers else (max(layer_rows, default=-1) + 1)
    n = len(nodes)
    size = np.zeros(n)
    for i, node in enumerate(nodes):
        if node["feature_type"] == "logit":
            size[i] = float(node.get("token_prob") or 0.0)
        elif node.get("influence") is not None:
            size[i] = 1.0 - float(node["influence"])
    rows = np.array([_row(node, n_layers) for node in nodes], dtype=float)
    cols = np.array([float(node["ctx_idx"]) for node in nodes])
    x = cols.copy()
    cells: dict[tuple, list[int]] = {}
    for i in range(n):
        cells.setdefault((rows[i], cols[i]), []).append(i)
    for members in cells.values():
        if len(members) > 1:  # spread over the cell, the largest in the middle
            members.sort(key=lambda i: -size[i])
            offsets = np.linspace(-0.38, 0.38, len(members))
            order = np.argsort(np.abs(offsets), kind="stable")
            for rank, i in enumerate(members):
                x[i] = cols[i] + offsets[order[rank]]
    index = {node["node_id"]: i for i, node in enumerate(nodes)}
    edges = np.array([[index[link["source"]], index[link["target"]]] for link in model["links"]], dtype=int)
    weights = np.array([float(link["weight"]) for link in model["links"]])
    kind = np.array([KINDS.index(node["feature_type"]) if node["feature_type"] in KINDS else 0 for node in nodes])
    return GraphLayout(nodes, x, rows, size, kind, edges.reshape(-1, 2), weights, n_layers + 2,
                       list(model["metadata"].get("prompt_tokens", [])))


def strongest_neighbourhood(data: GraphLayout, node: int, top: int = 3, depth: int = 4) -> tuple[set[int], np.ndarray]:
    """The node's strongest ancestors and descendants: from it, the `top` incoming edges of largest |weight|
    of each node reached (ancestors) and likewise outgoing ones (descendants), `depth` steps each way.
    (nodes reached including `node`, indices into data.edges of the edges followed)."""
    strength = np.abs(data.weights)
    chosen: list[np.ndarray] = []
    reached = {node}
    for end, other in ((1, 0), (0, 1)):  # edges into the frontier (ancestors), then out of it (descendants)
        frontier = {node}
        for _ in range(depth):
            if not frontier or not len(data.edges):
                break
            hits = np.nonzero(np.isin(data.edges[:, end], list(frontier)))[0]
            keep = []
            for n in frontier:
                mine = hits[data.edges[hits, end] == n]
                keep.append(mine[np.argsort(-strength[mine], kind="stable")[:top]])
            step = np.concatenate(keep) if keep else np.zeros(0, int)
            chosen.append(step)
            frontier = set(data.edges[step, other].tolist()) - reached
            reached |= frontier
    edges = np.unique(np.concatenate(chosen)) if chosen else np.zeros(0, int)
    return reached, edges


def search_nodes(data: GraphLayout, query: str, labels: dict[str, str] | None = None) -> list[int]:
    """Feature nodes whose feature id is `query` (a number); else nodes whose node id or label (clerp, or
    the user's label in `labels` by node id) contains it, case-insensitively."""
    q = query.strip().lower()
    if not q:
        return []
    labels = labels or {}
    out = []
    for i, n in enumerate(data.nodes):
        feature = str(n["node_id"]).split("_")[1] if n["feature_type"] == KINDS[0] else None
        text = f"{n['node_id']} {n.get('clerp') or ''} {labels.get(n['node_id'], '')}".lower()
        if (q == feature) if q.isdigit() else (q in text):
            out.append(i)
    return out


def annotated_json(model: dict, pinned: list[str], supernodes: list[list[str]], labels: dict[str, str]) -> dict:
    """The graph JSON with the user's work in the frontend's qParams: pinnedIds (node ids), supernodes
    ([label, node id, ...] each) and clerps ([node id, label] each, the frontend's user labels)."""
    ids = {n["node_id"] for n in model["nodes"]}
    out = dict(model)
    q = dict(model.get("qParams") or {})
    q["pinnedIds"] = [i for i in pinned if i in ids]
    q["supernodes"] = [[s[0], *[i for i in s[1:] if i in ids]] for s in supernodes]
    q["clerps"] = [[i, text] for i, text in labels.items() if i in ids and text]
    out["qParams"] = q
    return out


def user_annotations(model: dict) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """(pinned ids, supernodes, labels) kept in a graph JSON's qParams (annotated_json's inverse); a
    Neuronpedia URL-style pinnedIds string "a,b,c" is read too."""
    q = model.get("qParams") or {}
    pinned = q.get("pinnedIds") or []
    if isinstance(pinned, str):
        pinned = [p for p in pinned.split(",") if p]
    supernodes = q.get("supernodes") or []
    if isinstance(supernodes, str):
        supernodes = json.loads(supernodes)
    clerps = q.get("clerps") or []
    if isinstance(clerps, str):
        clerps = json.loads(clerps)
    labels = {str(c[0]): str(c[1]) for c in clerps if isinstance(c, (list, tuple)) and len(c) == 2}
    return [str(p) for p in pinned], [[str(x) for x in s] for s in supernodes if isinstance(s, list) and s], labels


def sub_layout(data: GraphLayout, keep: list[int]) -> GraphLayout:
    """The nodes `keep` (indices) and the edges between them, where they were drawn (a pinned subgraph)."""
    keep = sorted(set(int(i) for i in keep))
    where = -np.ones(len(data.nodes), dtype=int)
    where[keep] = np.arange(len(keep))
    inside = (where[data.edges[:, 0]] >= 0) & (where[data.edges[:, 1]] >= 0) if len(data.edges) else np.zeros(0, bool)
    edges = where[data.edges[inside]].reshape(-1, 2)
    return GraphLayout([data.nodes[i] for i in keep], data.x[keep], data.y[keep], data.size[keep], data.kind[keep],
                       edges, data.weights[inside], data.n_rows, data.prompt_tokens)

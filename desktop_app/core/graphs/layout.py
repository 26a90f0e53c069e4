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

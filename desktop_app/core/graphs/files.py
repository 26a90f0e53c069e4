"""A graph's two files.

GRAPH.json: the pruned graph in the schema the attribution-graphs frontend and Neuronpedia read
(circuit-tracer 0.5's utils/create_graph_files.py and frontend/graph_models.py): {metadata, qParams,
nodes, links}. Node ids as circuit-tracer writes them: feature "L_F_P", token "E_ID_P", logit
"(n_layers+1)_ID_P", and error "L_-1_P": circuit-tracer's fix after 0.5 (its pull request #102), as 0.5's
"0_L_P" collides with the layer-0 feature L at P. Each node's influence is its cumulative share of
influence (prune_graph).

RAW.safetensors: circuit-tracer's Graph as arrays (adjacency [N, N] float32, rows targets and columns
sources; active_features [n, 3] int64; selected_features; activation_values; logit_tokens;
logit_probabilities; input_tokens), with the prompt, scan, layer count and logit labels in the header's
metadata. Both written atomically.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..files import atomic_write_bytes
from .attribution import Graph, Pruned

SCHEMA_KEYS = ("metadata", "qParams", "nodes", "links")
METADATA_KEYS = ("slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold", "schema_version")
NODE_KEYS = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit", "run_idx",
             "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation")


def cantor_pairing(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(node_id, feature, layer, ctx_idx, feature_type, js_id, influence=None, activation=None,
          token_prob=0.0, is_target_logit=False, clerp="") -> dict:
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx_idx, "feature_type": feature_type,
            "token_prob": token_prob, "is_target_logit": is_target_logit, "run_idx": 0, "reverse_ctx_idx": 0,
            "jsNodeId": js_id, "clerp": clerp, "influence": influence, "activation": activation}


def graph_nodes(graph: Graph, pruned: Pruned) -> dict[int, dict]:
    """The kept nodes by their index in the adjacency."""
    f, T, L = graph.n_features, graph.n_pos, graph.n_layers
    error_end = f + T * L
    token_end = error_end + T
    scores = pruned.cumulative_scores
    nodes = {}
    for i in pruned.node_mask.nonzero().flatten().tolist():
        influence = float(scores[i])
        if i < f:
            layer, pos, feat = graph.active_features[graph.selected_features[i]].tolist()
            act = float(graph.activation_values[graph.selected_features[i]])
            nodes[i] = _node(f"{layer}_{feat}_{pos}", cantor_pairing(layer, feat), str(layer), pos,
                             "cross layer transcoder", f"{layer}_{feat}-0", influence, act)
        elif i < error_end:
            layer, pos = divmod(i - f, T)
            nodes[i] = _node(f"{layer}_-1_{pos}", -1, str(layer), pos, "mlp reconstruction error",
                             f"{layer}_{pos}-0", influence)
        elif i < token_end:
            pos = i - error_end
            tok = graph.input_ids[pos]
            nodes[i] = _node(f"E_{tok}_{pos}", pos, "E", pos, "embedding", f"E_{tok}-{pos}", influence)
        else:
            k = i - token_end
            vocab_idx, label = graph.logit_tokens[k], graph.logit_labels[k]
            p = float(graph.logit_probabilities[k])
            layer = str(L + 1)
            nodes[i] = _node(f"{layer}_{vocab_idx}_{T - 1}", vocab_idx, layer, T - 1, "logit", f"L_{vocab_idx}-{T - 1}",
                             token_prob=p, is_target_logit=k == 0, clerp=f'Output "{label}" (p={p:.3f})')
    return nodes


def graph_json(graph: Graph, pruned: Pruned, slug: str, node_threshold: float) -> dict:
    """create_graph_files' model: nodes with an edge (or tokens and logits) and the kept edges."""
    nodes = graph_nodes(graph, pruned)
    adjacency = graph.adjacency.float().numpy()
    targets, sources = pruned.edge_mask.numpy().nonzero()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": float(adjacency[t, s])}
             for t, s in zip(targets.tolist(), sources.tolist()) if s in nodes and t in nodes]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    tokens = graph.token_strings or [str(t) for t in graph.input_ids]
    metadata = {"slug": slug, "scan": graph.scan, "transcoder_list": [], "prompt_tokens": list(tokens),
                "prompt": graph.input_string, "node_threshold": node_threshold, "schema_version": 1}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def write_graph_json(path: str | Path, model: dict) -> None:
    atomic_write_bytes(Path(path), json.dumps(model, indent=2, allow_nan=False).encode("utf-8"))


def check_graph_json(model: dict, where="graph") -> None:
    """The schema's required keys and consistent ids (ValueError, one line): what a reader relies on."""
    for key in SCHEMA_KEYS:
        if key not in model:
            raise ValueError(f"{where}: no {key!r}")
    missing = [k for k in METADATA_KEYS[:5] if k not in model["metadata"]]
    if missing:
        raise ValueError(f"{where}: metadata lacks {', '.join(missing)}")
    for key in ("nodes", "links"):
        if not isinstance(model[key], list) or not all(isinstance(x, dict) for x in model[key]):
            raise ValueError(f"{where}: {key!r} is not a list of objects")
    ids = set()
    for n in model["nodes"]:
        lacking = [k for k in ("node_id", "feature", "layer", "ctx_idx", "feature_type", "jsNodeId") if k not in n]
        if lacking:
            raise ValueError(f"{where}: node {n.get('node_id')!r} lacks {', '.join(lacking)}")
        if n["node_id"] in ids:
            raise ValueError(f"{where}: node id {n['node_id']!r} appears twice")
        ids.add(n["node_id"])
        # what a reader computes with: a layer number (embeddings: "E"), a position, numbers or null
        layer = n["layer"]
        if not (n["feature_type"] == "embedding" or isinstance(layer, int) and not isinstance(layer, bool)
                or isinstance(layer, str) and layer.isdigit()):
            raise ValueError(f"{where}: node {n['node_id']!r} has layer {layer!r}, not a layer number")
        if not (isinstance(n["ctx_idx"], int) and not isinstance(n["ctx_idx"], bool) and n["ctx_idx"] >= 0):
            raise ValueError(f"{where}: node {n['node_id']!r} has ctx_idx {n['ctx_idx']!r}, not a position")
        for key in ("influence", "activation", "token_prob"):
            if n.get(key) is not None and not _is_finite_number(n[key]):
                raise ValueError(f"{where}: node {n['node_id']!r} has {key} {n[key]!r}, not a finite number")
    for link in model["links"]:
        if link.get("source") not in ids or link.get("target") not in ids:
            raise ValueError(f"{where}: link {link.get('source')!r} -> {link.get('target')!r} names a missing node")
        if not _is_finite_number(link.get("weight")):
            raise ValueError(f"{where}: link {link['source']!r} -> {link['target']!r} has weight "
                             f"{link.get('weight')!r}, not a finite number")


def _is_finite_number(x) -> bool:
    """JSON's numbers, not NaN or infinity (Python's json reads NaN and Infinity, which no graph holds)."""
    return isinstance(x, int) and not isinstance(x, bool) or isinstance(x, float) and math.isfinite(x)


def save_raw(path: str | Path, graph: Graph) -> None:
    from safetensors.torch import save

    tensors = {
        "adjacency": graph.adjacency.float().contiguous(),
        "active_features": graph.active_features.long().contiguous(),
        "selected_features": graph.selected_features.long().contiguous(),
        "activation_values": graph.activation_values.float().contiguous(),
        "logit_tokens": torch.tensor(graph.logit_tokens, dtype=torch.long),
        "logit_probabilities": graph.logit_probabilities.float().contiguous(),
        "input_tokens": torch.tensor(graph.input_ids, dtype=torch.long),
    }
    meta = {"input_string": graph.input_string, "scan": graph.scan, "n_layers": str(graph.n_layers),
            "logit_labels": json.dumps(graph.logit_labels), "token_strings": json.dumps(graph.token_strings)}
    atomic_write_bytes(Path(path), save(tensors, metadata=meta))


def load_raw(path: str | Path) -> Graph:
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:
        raise ValueError(f"{path}: not a readable graph file ({exc})") from exc
    need = ("adjacency", "active_features", "selected_features", "activation_values", "logit_tokens",
            "logit_probabilities", "input_tokens")
    missing = [k for k in need if k not in t]
    if missing or "n_layers" not in meta:
        raise ValueError(f"{path}: not a graph file (lacks {', '.join(missing) or 'n_layers'})")
    for k in ("adjacency", "activation_values", "logit_probabilities"):
        bad = (~torch.isfinite(t[k])).nonzero()
        if len(bad):
            raise ValueError(f"{path}: {k} holds NaN or infinite values (the first at {bad[0].tolist()})")
    return Graph(t["input_tokens"].tolist(), meta.get("input_string", ""), t["active_features"], t["activation_values"],
                 t["selected_features"], t["adjacency"], json.loads(meta.get("logit_labels", "[]")),
                 t["logit_tokens"].tolist(), t["logit_probabilities"], int(meta["n_layers"]), meta.get("scan", ""),
                 json.loads(meta.get("token_strings", "[]")))

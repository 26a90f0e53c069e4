"""The app's attribution graphs against circuit-tracer 0.5 itself (issue 37's "Done means").

circuit-tracer pins transformers <= 4.57.3 and nnsight 0.6, so it lives in an environment of its own
(packaging/circuit_tracer_env.sh, default /work/ctenv, or $CIRCUIT_TRACER_ENV). There,
packaging/circuit_tracer_reference.py builds a small random float32 Llama and random transcoders in
circuit-tracer's on-disk formats (per-layer ReLU, per-layer JumpReLU with a skip connection, cross-layer ReLU and
JumpReLU, two with fewer feature nodes than active features, one reading hook_resid_mid) and runs circuit-tracer's
attribute(), prune_graph() and compute_graph_scores() on its nnsight backend. This test runs the app's
`python -m desktop_app graph` on the same model folder, transcoder folder and token ids, and checks: the same
active features (and activations), the same logit targets and probabilities, the adjacency within 1e-4 of the
largest reference edge, the same pruned nodes and links at circuit-tracer's default thresholds (0.8 / 0.98), and
the same replacement and completeness scores (the JSON line `graph` prints last).

    pytest -m reference tests/reference                                        (makes the reference too: minutes)
    CIRCUIT_TRACER_REFERENCE=/tmp/ct-ref pytest -m reference tests/reference   (reads one made beforehand)

The app tested is the one this test imports (PYTHONPATH, or the current folder first under `python -m pytest`).
Skipped, saying why, when neither the environment nor a reference folder is there.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SCRIPT = REPO / "packaging" / "circuit_tracer_reference.py"
CASES = ["plt_relu", "plt_jumprelu_skip", "clt_relu", "clt_jumprelu", "clt_relu_top200", "clt_relu_top300_reranked",
         "clt_relu_resid_mid"]
NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98  # circuit-tracer's defaults
ADJACENCY_RTOL = 1e-4  # of the largest reference edge
PROBABILITY_ATOL = 1e-5
SCORE_ATOL = 1e-5  # replacement and completeness scores (compute_graph_scores)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The folder circuit_tracer_reference.py wrote: given by $CIRCUIT_TRACER_REFERENCE, or made now in
    circuit-tracer's environment."""
    given = os.environ.get("CIRCUIT_TRACER_REFERENCE")
    if given:
        if not (Path(given) / "reference.json").is_file():
            pytest.skip(f"CIRCUIT_TRACER_REFERENCE={given} holds no reference.json "
                        f"(write one with packaging/circuit_tracer_reference.py --out {given})")
        return Path(given)
    env = Path(os.environ.get("CIRCUIT_TRACER_ENV", "/work/ctenv"))
    python = env / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no circuit-tracer environment at {env}: build it with packaging/circuit_tracer_env.sh "
                    "(or set CIRCUIT_TRACER_ENV, or CIRCUIT_TRACER_REFERENCE to a reference folder)")
    out = tmp_path_factory.mktemp("circuit-tracer") / "reference"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run([str(python), str(REFERENCE_SCRIPT), "--out", str(out)], capture_output=True, text=True,
                         timeout=900, env=clean_env)
    # an environment that is there but cannot make the reference is a failure, not a skip
    assert run.returncode == 0, f"{REFERENCE_SCRIPT.name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return out


def run_app_graph(reference: Path, case: str, out: Path) -> tuple[Path, Path, dict]:
    """`python -m desktop_app graph` as a person runs it, on the tree this test imported (PYTHONPATH). Returns its
    two files and the JSON line it prints last (counts and the replacement and completeness scores)."""
    import desktop_app

    ids = json.loads((reference / "reference.json").read_text())["ids"]
    summary = json.loads((reference / case / "summary.json").read_text())
    graph_json, raw = out / "graph.json", out / "graph.safetensors"
    args = [
        sys.executable, "-m", "desktop_app", "graph", str(reference / "model"),
        "--transcoders", str(reference / case / "transcoders"),
        "--ids", ",".join(str(i) for i in ids),
        "--out", str(graph_json), "--raw", str(raw),
        "--node-threshold", str(NODE_THRESHOLD), "--edge-threshold", str(EDGE_THRESHOLD),
        "--max-feature-nodes", str(summary["max_feature_nodes"]),
        "--batch-size", str(summary["batch_size"]),  # with a feature cap, it sets when attribute() re-ranks
        "--max-logits", "10", "--desired-logit-prob", "0.95",
        "--dtype", "float32", "--device", "cpu",
    ]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(Path(desktop_app.__file__).parents[1])}
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, f"graph failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return graph_json, raw, json.loads(run.stdout.strip().splitlines()[-1])


def node_labels(raw: dict, n_layers: int) -> list[tuple]:
    """A name per adjacency row/column, in circuit-tracer's node order: (kind, layer, position, feature or token
    id), with -1 where a kind has no such field."""
    tokens, logits = raw["input_tokens"].tolist(), raw["logit_tokens"].tolist()
    labels = [("feature", *map(int, raw["active_features"][i])) for i in raw["selected_features"].tolist()]
    labels = [(kind, layer, pos, feature) for kind, layer, pos, feature in labels]
    labels += [("error", layer, pos, -1) for layer in range(n_layers) for pos in range(len(tokens))]
    labels += [("token", -1, pos, token) for pos, token in enumerate(tokens)]
    labels += [("logit", -1, len(tokens) - 1, token) for token in logits]
    return labels


def kept_by_masks(raw: dict, labels: list[tuple]) -> tuple[set[tuple], set[tuple]]:
    """The nodes and links circuit-tracer's create_graph_files writes from prune_graph's masks: edges kept with
    both ends kept, and the kept nodes that such an edge touches, plus every token and logit. (Read from the masks,
    not its JSON: 0.5's error id "0_L_P" is also layer 0's feature L at P, so its JSON can be ambiguous.)"""
    node_mask, edge_mask = raw["node_mask"], raw["edge_mask"]
    targets, sources = (edge_mask & node_mask[:, None] & node_mask[None, :]).nonzero(as_tuple=True)
    links = {(labels[s], labels[t]) for s, t in zip(sources.tolist(), targets.tolist())}
    kept = {end for link in links for end in link}
    kept |= {label for label, keep in zip(labels, node_mask.tolist()) if keep and label[0] in ("token", "logit")}
    return kept, links


def json_nodes_and_links(graph_json: Path, problems: list[str]) -> tuple[set[tuple], set[tuple]]:
    """The nodes and links of a frontend-schema graph JSON, named as node_labels names them, from the node fields
    (error nodes by layer and ctx_idx, since the id style changed after circuit-tracer 0.5: "0_L_P", now
    "L_-1_P"). A node id used twice is a problem: a link to it is ambiguous."""
    kinds = {"embedding": "token", "logit": "logit", "mlp reconstruction error": "error"}
    graph = json.loads(graph_json.read_text())
    key = {}
    for n in graph["nodes"]:
        kind = kinds.get(n["feature_type"], "feature")
        if kind == "feature":  # "L_F_P"
            layer, feature, pos = (int(part) for part in n["node_id"].split("_"))
            label = (kind, layer, pos, feature)
        elif kind == "error":
            label = (kind, int(n["layer"]), n["ctx_idx"], -1)
        elif kind == "token":  # "E_ID_P"
            label = (kind, -1, n["ctx_idx"], int(n["node_id"].split("_")[1]))
        else:
            label = (kind, -1, n["ctx_idx"], n["feature"])
        if n["node_id"] in key:
            problems.append(f"{graph_json.name}: node id {n['node_id']!r} names both {key[n['node_id']]} and {label}")
        key[n["node_id"]] = label
    links = {(key[link["source"]], key[link["target"]]) for link in graph["links"]}
    return set(key.values()), links


def compare(reference: Path, case: str, app_json: Path, app_raw: Path, app_report: dict) -> tuple[dict, list[str]]:
    """Every difference between circuit-tracer's graph and the app's, as numbers and a list of problems."""
    import torch
    from safetensors.torch import load_file

    ref, app = load_file(str(reference / case / "graph.safetensors")), load_file(str(app_raw))
    n_layers = json.loads((reference / case / "summary.json").read_text())["n_error_nodes"] // len(ref["input_tokens"])
    problems, numbers = [], {}
    missing = [k for k in ("adjacency", "active_features", "selected_features", "activation_values",
                           "logit_tokens", "logit_probabilities", "input_tokens") if k not in app]
    if missing:
        return numbers, [f"raw file lacks {missing} (holds {sorted(app)})"]

    if app["input_tokens"].tolist() != ref["input_tokens"].tolist():
        problems.append(f"input_tokens {app['input_tokens'].tolist()} != {ref['input_tokens'].tolist()}")

    ref_feats = [tuple(r) for r in ref["active_features"].tolist()]
    app_feats = [tuple(r) for r in app["active_features"].tolist()]
    only_ref, only_app = set(ref_feats) - set(app_feats), set(app_feats) - set(ref_feats)
    numbers.update(active_features=len(ref_feats), app_active_features=len(app_feats),
                   features_only_in_reference=len(only_ref), features_only_in_app=len(only_app))
    if only_ref or only_app:
        problems.append(f"active features differ: {len(only_ref)} only in circuit-tracer (e.g. {sorted(only_ref)[:5]}), "
                        f"{len(only_app)} only in the app (e.g. {sorted(only_app)[:5]}) (layer, position, feature)")
    elif app_feats != ref_feats:
        problems.append("active features: same set, another order (circuit-tracer's is sorted by layer, position, "
                        "feature: the coalesced sparse activation matrix)")
    if not only_ref and not only_app:
        order = {f: i for i, f in enumerate(app_feats)}
        app_values = app["activation_values"][[order[f] for f in ref_feats]]
        err = ((app_values - ref["activation_values"]).abs().max() / ref["activation_values"].abs().max()).item()
        numbers["activation_values_max_rel_error"] = err
        if err > ADJACENCY_RTOL:
            problems.append(f"activation values differ: max error {err:.3g} of the largest")

    ref_logits, app_logits = ref["logit_tokens"].tolist(), app["logit_tokens"].tolist()
    numbers["logit_targets"] = ref_logits
    if app_logits != ref_logits:
        problems.append(f"logit targets {app_logits} != circuit-tracer's {ref_logits}")
    elif not torch.allclose(app["logit_probabilities"], ref["logit_probabilities"], rtol=0, atol=PROBABILITY_ATOL):
        problems.append(f"logit probabilities {app['logit_probabilities'].tolist()} != "
                        f"{ref['logit_probabilities'].tolist()}")

    n_pos = len(ref["input_tokens"])
    ref_labels, app_labels = node_labels(ref, n_layers), node_labels(app, n_layers)
    ref_selected = {label for label in ref_labels if label[0] == "feature"}
    app_selected = {label for label in app_labels if label[0] == "feature"}
    numbers.update(selected_features=len(ref_selected), app_selected_features=len(app_selected))
    if ref_selected != app_selected and not (only_ref or only_app):
        problems.append(f"selected features differ (max_feature_nodes): {len(ref_selected - app_selected)} only "
                        f"circuit-tracer's (e.g. {sorted(ref_selected - app_selected)[:3]}), "
                        f"{len(app_selected - ref_selected)} only the app's (e.g. {sorted(app_selected - ref_selected)[:3]})")
    numbers.update(nodes=len(ref_labels), app_nodes=app["adjacency"].shape[0])
    if app["adjacency"].shape != (len(app_labels),) * 2:
        problems.append(f"app adjacency {tuple(app['adjacency'].shape)} does not match its own node count "
                        f"{len(app_labels)}")
    elif set(app_labels) == set(ref_labels):
        where = {label: i for i, label in enumerate(app_labels)}
        perm = torch.tensor([where[label] for label in ref_labels])
        A_app, A_ref = app["adjacency"][perm][:, perm].double(), ref["adjacency"].double()
        scale = A_ref.abs().max()
        diff = (A_app - A_ref).abs()
        worst = divmod(int(diff.argmax()), diff.shape[1])
        numbers["adjacency_max_rel_error"] = (diff.max() / scale).item()
        numbers["adjacency_worst_edge"] = f"{ref_labels[worst[1]]} -> {ref_labels[worst[0]]}: app " \
                                          f"{A_app[worst].item():.6g}, circuit-tracer {A_ref[worst].item():.6g}"
        # the largest error per (source kind -> target kind) block says which part of the definition differs
        kinds = [label[0] for label in ref_labels]
        blocks = {}
        for t_kind in ("feature", "logit"):
            for s_kind in ("feature", "error", "token"):
                rows = torch.tensor([k == t_kind for k in kinds])
                cols = torch.tensor([k == s_kind for k in kinds])
                if rows.any() and cols.any():
                    blocks[f"{s_kind}->{t_kind}"] = (diff[rows][:, cols].max() / scale).item()
        numbers["adjacency_block_rel_errors"] = blocks
        if numbers["adjacency_max_rel_error"] > ADJACENCY_RTOL:
            problems.append(f"adjacency differs: max error {numbers['adjacency_max_rel_error']:.3g} of the largest "
                            f"edge (worst {numbers['adjacency_worst_edge']}; per block {blocks})")
    else:
        problems.append("adjacency not compared: the node sets differ")

    (ref_kept, ref_links), (app_kept, app_links) = kept_by_masks(ref, ref_labels), json_nodes_and_links(app_json,
                                                                                                          problems)
    numbers.update(pruned_nodes=len(ref_kept), app_pruned_nodes=len(app_kept),
                   pruned_only_in_reference=sorted(ref_kept - app_kept)[:10],
                   pruned_only_in_app=sorted(app_kept - ref_kept)[:10],
                   pruned_links=len(ref_links), app_pruned_links=len(app_links),
                   links_only_in_reference=len(ref_links - app_links), links_only_in_app=len(app_links - ref_links))
    if ref_kept != app_kept:
        problems.append(f"pruned node sets differ at {NODE_THRESHOLD}/{EDGE_THRESHOLD}: {len(ref_kept)} kept by "
                        f"circuit-tracer, {len(app_kept)} by the app; only circuit-tracer's: "
                        f"{numbers['pruned_only_in_reference']}; only the app's: {numbers['pruned_only_in_app']}")
    if ref_links != app_links:
        problems.append(f"pruned links differ: {len(ref_links - app_links)} only in circuit-tracer's JSON (e.g. "
                        f"{sorted(ref_links - app_links)[:3]}), {len(app_links - ref_links)} only in the app's")

    summary = json.loads((reference / case / "summary.json").read_text())
    for score in ("replacement_score", "completeness_score"):
        numbers[f"{score}_error"] = abs(app_report[score] - summary[score])
        if numbers[f"{score}_error"] > SCORE_ATOL:
            problems.append(f"{score} {app_report[score]:.6f} != circuit-tracer's {summary[score]:.6f}")
    return numbers, problems


@pytest.mark.reference
@pytest.mark.parametrize("case", CASES)
def test_graph_matches_circuit_tracer(reference, case, tmp_path):
    if case not in json.loads((reference / "reference.json").read_text())["cases"]:
        pytest.skip(f"{reference} was made without the case {case}")
    app_json, app_raw, app_report = run_app_graph(reference, case, tmp_path)
    numbers, problems = compare(reference, case, app_json, app_raw, app_report)
    print(f"\n{case}: {json.dumps(numbers)}")
    assert not problems, f"{case}: " + "\n".join(problems)


# -- the comparison itself, on a hand-made graph (runs in the default suite: no circuit-tracer needed) ----------


def write_tiny_graph(folder: Path, error_id: str, mutate: str = "") -> tuple[Path, Path, dict]:
    """One layer, two positions, two features at position 1, one logit: a graph's raw file (with prune_graph's
    masks, as circuit_tracer_reference.py writes it), frontend JSON and scores, one thing changed if `mutate` says."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    # nodes: 0 feature (0, 1, 3), 1 feature (0, 1, 5), 2 error (0, 0), 3 error (0, 1), 4 token 1, 5 token 4, 6 logit 7
    adjacency = torch.zeros(7, 7)
    adjacency[1, 0], adjacency[1, 5], adjacency[0, 5] = 0.5, 1.0, 2.0
    adjacency[6, :6] = torch.tensor([3.0, -1.0, 0.0, 0.5, 0.0, 1.0])
    node_mask = torch.tensor([True, True, False, True, True, True, True])
    edge_mask = (adjacency != 0) & node_mask[:, None] & node_mask[None, :]
    if mutate == "adjacency":
        adjacency[6, 0] *= 1 + 1e-3
    raw = {
        "adjacency": adjacency,
        "active_features": torch.tensor([[0, 1, 3], [0, 1, 6 if mutate == "feature" else 5]]),
        "selected_features": torch.tensor([0, 1]),
        "activation_values": torch.tensor([1.0, 2.0]),
        "logit_tokens": torch.tensor([8 if mutate == "logit" else 7]),
        "logit_probabilities": torch.tensor([1.0]),
        "input_tokens": torch.tensor([1, 4]),
        "node_mask": node_mask,
        "edge_mask": edge_mask,
    }
    if mutate == "selected":  # feature (0, 1, 5) active but not among the graph's nodes (max_feature_nodes)
        keep = [0, 2, 3, 4, 5, 6]
        raw.update(selected_features=torch.tensor([0]), adjacency=adjacency[keep][:, keep],
                   node_mask=node_mask[keep], edge_mask=edge_mask[keep][:, keep])
    save_file(raw, folder / "graph.safetensors")
    ids = ["0_3_1", "0_5_1", None, error_id, "E_1_0", "E_4_1", "2_7_1"]
    fields = [("cross layer transcoder", "0", 1, 3), ("cross layer transcoder", "0", 1, 5), None,
              ("mlp reconstruction error", "0", 1, -1), ("embedding", "E", 0, 0), ("embedding", "E", 1, 1),
              ("logit", "2", 1, 7)]
    dropped = {0} if mutate == "pruned" else set()
    nodes = [{"node_id": ids[i], "feature_type": f[0], "layer": f[1], "ctx_idx": f[2], "feature": f[3]}
             for i, f in enumerate(fields) if f is not None and i not in dropped]
    links = [{"source": ids[s], "target": ids[t], "weight": adjacency[t, s].item()}
             for t, s in edge_mask.nonzero().tolist() if s not in dropped and t not in dropped]
    (folder / "graph.json").write_text(json.dumps({"metadata": {}, "qParams": {}, "nodes": nodes, "links": links}))
    scores = {"replacement_score": 0.5 + (1e-3 if mutate == "score" else 0), "completeness_score": 0.75,
              "n_error_nodes": 2}
    (folder / "summary.json").write_text(json.dumps(scores))
    return folder / "graph.json", folder / "graph.safetensors", scores


@pytest.mark.parametrize("mutate,expected", [
    ("", None),
    ("adjacency", "adjacency differs: max error 0.001"),
    ("feature", "active features differ: 1 only in circuit-tracer (e.g. [(0, 1, 5)]), 1 only in the app"),
    ("logit", "logit targets [8] != circuit-tracer's [7]"),
    ("pruned", "pruned node sets differ"),
    ("score", "replacement_score 0.501000 != circuit-tracer's 0.500000"),
    ("selected", "selected features differ (max_feature_nodes): 1 only circuit-tracer's (e.g. [('feature', 0, 1, 5)])"),
    ("duplicate id", "node id '0_3_1' names both ('feature', 0, 1, 3) and ('error', 0, 1, -1)"),
])
def test_the_comparison_finds_each_difference(tmp_path, mutate, expected):
    """compare() passes a graph equal to the reference up to the error nodes' id style, and names each kind of
    difference: so a passing parity run means agreement, not a check that cannot fail."""
    write_tiny_graph(tmp_path / "ref" / "case", error_id="0_0_1")
    app_error_id = "0_3_1" if mutate == "duplicate id" else "0_-1_1"
    app_json, app_raw, app_report = write_tiny_graph(tmp_path / "app", error_id=app_error_id, mutate=mutate)
    numbers, problems = compare(tmp_path / "ref", "case", app_json, app_raw, app_report)
    if expected is None:
        assert problems == [] and numbers["adjacency_max_rel_error"] == 0
        assert numbers["pruned_nodes"] == 6 and numbers["pruned_links"] == 7
    else:
        assert problems and expected in problems[0], problems  # named first (what follows from it may follow)

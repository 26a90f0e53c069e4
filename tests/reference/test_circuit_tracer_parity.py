"""The app's attribution graphs against circuit-tracer 0.5 itself (issue 37's "Done means").

circuit-tracer pins transformers <= 4.57.3 and nnsight 0.6, so it lives in an environment of its own
(packaging/circuit_tracer_env.sh, default /work/ctenv, or $CIRCUIT_TRACER_ENV). There,
packaging/circuit_tracer_reference.py builds a small random float32 Llama, random per-layer and cross-layer
transcoders in circuit-tracer's on-disk formats (ReLU and JumpReLU, one set with a skip connection), and runs
circuit-tracer's attribute() and prune_graph() on its nnsight backend. This test runs the app's
`python -m desktop_app graph` on the same model folder, transcoder folders and token ids, and checks: the same
active features (and activations), the same logit targets and probabilities, the adjacency within 1e-4 of the
largest reference edge, and the same pruned node set at circuit-tracer's default thresholds (0.8 / 0.98).

    pytest -m reference tests/reference                                   (makes the reference, ~1 minute)
    CIRCUIT_TRACER_REFERENCE=/tmp/ct-ref pytest -m reference tests/reference   (reads one made beforehand)

Skipped, saying why, when neither the environment nor a reference folder is there.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.reference

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SCRIPT = REPO / "packaging" / "circuit_tracer_reference.py"
CASES = ["plt_relu", "plt_jumprelu_skip", "clt_relu", "clt_jumprelu"]
NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98  # circuit-tracer's defaults
ADJACENCY_RTOL = 1e-4  # of the largest reference edge
PROBABILITY_ATOL = 1e-5


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


def run_app_graph(reference: Path, case: str, out: Path) -> tuple[Path, Path]:
    """`python -m desktop_app graph` as a person runs it, on the tree this test imported (PYTHONPATH)."""
    import desktop_app

    ids = json.loads((reference / "reference.json").read_text())["ids"]
    graph_json, raw = out / "graph.json", out / "graph.safetensors"
    args = [
        sys.executable, "-m", "desktop_app", "graph", str(reference / "model"),
        "--transcoders", str(reference / case / "transcoders"),
        "--ids", ",".join(str(i) for i in ids),
        "--out", str(graph_json), "--raw", str(raw),
        "--node-threshold", str(NODE_THRESHOLD), "--edge-threshold", str(EDGE_THRESHOLD),
        "--max-feature-nodes", "7500", "--max-logits", "10", "--desired-logit-prob", "0.95",
        "--dtype", "float32", "--device", "cpu",
    ]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(Path(desktop_app.__file__).parents[1])}
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, f"graph failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return graph_json, raw


def node_labels(active_features, selected_features, n_layers: int, n_pos: int, logit_tokens) -> list[tuple]:
    """A name per adjacency row/column, in circuit-tracer's node order: (kind, layer, position, id)."""
    labels = [("feature", *map(int, active_features[i])) for i in selected_features.tolist()]
    labels += [("error", layer, pos, -1) for layer in range(n_layers) for pos in range(n_pos)]
    labels += [("token", -1, pos, -1) for pos in range(n_pos)]
    labels += [("logit", -1, n_pos - 1, int(t)) for t in logit_tokens]
    return labels


def json_node_set(graph_json: Path) -> set[tuple]:
    """The kept nodes of a frontend-schema graph JSON as (kind, layer, position, feature or token id), read from
    the fields, not from the id strings alone: circuit-tracer 0.5 names an error node "0_L_P", which collides with
    layer 0's feature L at P; later versions (and the app) write "L_-1_P"."""
    kinds = {"embedding": "token", "logit": "logit", "mlp reconstruction error": "error"}
    kept = set()
    for n in json.loads(graph_json.read_text())["nodes"]:
        kind = kinds.get(n["feature_type"], "feature")
        if kind == "feature":  # "L_F_P"
            layer, feature, pos = (int(part) for part in n["node_id"].split("_"))
            kept.add((kind, layer, pos, feature))
        elif kind == "error":
            kept.add((kind, int(n["layer"]), n["ctx_idx"], -1))
        elif kind == "token":  # "E_ID_P"
            kept.add((kind, -1, n["ctx_idx"], int(n["node_id"].split("_")[1])))
        else:
            kept.add((kind, -1, n["ctx_idx"], n["feature"]))
    return kept


def compare(reference: Path, case: str, app_json: Path, app_raw: Path) -> tuple[dict, list[str]]:
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
    ref_labels = node_labels(ref["active_features"], ref["selected_features"], n_layers, n_pos, ref_logits)
    app_labels = node_labels(app["active_features"], app["selected_features"], n_layers, n_pos, app_logits)
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

    ref_kept, app_kept = json_node_set(reference / case / "graph.json"), json_node_set(app_json)
    numbers.update(pruned_nodes=len(ref_kept), app_pruned_nodes=len(app_kept),
                   pruned_only_in_reference=sorted(ref_kept - app_kept)[:10],
                   pruned_only_in_app=sorted(app_kept - ref_kept)[:10])
    if ref_kept != app_kept:
        problems.append(f"pruned node sets differ at {NODE_THRESHOLD}/{EDGE_THRESHOLD}: {len(ref_kept)} kept by "
                        f"circuit-tracer, {len(app_kept)} by the app; only circuit-tracer's: "
                        f"{numbers['pruned_only_in_reference']}; only the app's: {numbers['pruned_only_in_app']}")
    return numbers, problems


@pytest.mark.parametrize("case", CASES)
def test_graph_matches_circuit_tracer(reference, case, tmp_path):
    if case not in json.loads((reference / "reference.json").read_text())["cases"]:
        pytest.skip(f"{reference} was made without the case {case}")
    app_json, app_raw = run_app_graph(reference, case, tmp_path)
    numbers, problems = compare(reference, case, app_json, app_raw)
    print(f"\n{case}: {json.dumps(numbers)}")
    assert not problems, f"{case}: " + "\n".join(problems)

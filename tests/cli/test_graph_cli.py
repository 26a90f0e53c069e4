"""Issue 37 §5: `python -m desktop_app graph` writes the frontend's JSON and circuit-tracer's raw arrays."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.graphs import prune_graph
from desktop_app.core.graphs.files import check_graph_json, load_raw
from desktop_app.core.graphs.transcoders import random_transcoders
from tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# what the attribution-graphs frontend reads of each node (circuit-tracer's frontend/graph_models.Node)
NODE_KEYS = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit", "run_idx",
             "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph")
    specials = ["<pad>", "<s>"]  # BOS id 1 (circuit-tracer passes over an id 0)
    save_tiny_model(root / "llama", "abcdefgh ", "llama", specials=specials, d_model=16, n_kv_heads=2, d_ff=32,
                    context_length=32)
    random_transcoders(root / "plt", 2, 16, 20, seed=1)
    random_transcoders(root / "clt", 2, 16, 20, cross_layer=True, activation="jump_relu", seed=2)
    save_tiny_model(root / "bert", "abcdefgh ", "bert", specials=specials, d_model=16, n_heads=2, d_ff=32,
                    context_length=32)
    return root


def run(capsys, *argv):
    code = main(["graph", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_graph_json_and_raw_file(files, tmp_path, capsys, kind):
    out, raw = tmp_path / "g.json", tmp_path / "g.safetensors"
    code, stdout, err = run(capsys, files / "llama", "--transcoders", files / kind, "--prompt", "abc dea",
                            "--out", out, "--raw", raw)
    assert code == 0, err
    assert "graph: feature rows" in err  # progress on stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    model = json.loads(out.read_text())
    check_graph_json(model, out)  # required keys, unique ids, every link's ends present
    assert set(model) == {"metadata", "qParams", "nodes", "links"}
    meta = model["metadata"]
    assert meta["prompt_tokens"] == ["<s>", "a", "b", "c", " ", "d", "e", "a"]  # a BOS first, as circuit-tracer
    assert meta["slug"] == "g" and meta["node_threshold"] == 0.8 and meta["schema_version"] == 1
    assert set(model["qParams"]) == {"pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"}
    assert all(set(n) == NODE_KEYS for n in model["nodes"])
    kinds = {n["feature_type"] for n in model["nodes"]}
    assert {"cross layer transcoder", "embedding", "logit"} <= kinds
    assert len(model["nodes"]) == summary["nodes"] and len(model["links"]) == summary["links"]

    graph = load_raw(raw)  # the unpruned graph: the JSON is its pruned view
    N = graph.adjacency.shape[0]
    assert graph.adjacency.dtype == torch.float32 and graph.active_features.dtype == torch.int64
    assert N == graph.n_features + (graph.n_layers + 1) * graph.n_pos + graph.n_logits
    assert graph.input_ids[0] == 1 and len(graph.input_ids) == 8
    pruned = prune_graph(graph, 0.8, 0.98)
    by_id = {n["node_id"]: n for n in model["nodes"]}
    for i in range(graph.n_features):
        layer, pos, feat = graph.active_features[graph.selected_features[i]].tolist()
        if f"{layer}_{feat}_{pos}" in by_id:
            assert pruned.node_mask[i]
            assert by_id[f"{layer}_{feat}_{pos}"]["activation"] == pytest.approx(
                float(graph.activation_values[graph.selected_features[i]]))
    index = {}  # node id -> adjacency index, for the kept nodes
    for i in pruned.node_mask.nonzero().flatten().tolist():
        if i < graph.n_features:
            layer, pos, feat = graph.active_features[graph.selected_features[i]].tolist()
            index[f"{layer}_{feat}_{pos}"] = i
        elif i < graph.n_features + graph.n_layers * graph.n_pos:
            layer, pos = divmod(i - graph.n_features, graph.n_pos)
            index[f"{layer}_-1_{pos}"] = i
    for link in model["links"]:
        s, t = index.get(link["source"]), index.get(link["target"])
        if s is not None and t is not None:
            assert link["weight"] == pytest.approx(float(graph.adjacency[t, s]))
            assert pruned.edge_mask[t, s]
    logits = [n for n in model["nodes"] if n["feature_type"] == "logit"]
    assert len(logits) == graph.n_logits and logits[0]["is_target_logit"]
    assert sum(n["token_prob"] for n in logits) == pytest.approx(float(graph.logit_probabilities.sum()))


def test_graph_targets_a_token_or_a_logit_difference(files, tmp_path, capsys):
    out = tmp_path / "t.json"
    code, stdout, err = run(capsys, files / "llama", "--transcoders", files / "plt", "--ids", "1,2,3",
                            "--target", "a", "--target", "b", "--out", out)
    assert code == 0, err
    logits = [n for n in json.loads(out.read_text())["nodes"] if n["feature_type"] == "logit"]
    assert [n["feature"] for n in logits] == [3, 4]  # <pad>, <s>, space, a, b, ...
    code, stdout, err = run(capsys, files / "llama", "--transcoders", files / "plt", "--ids", "1,2,3",
                            "--target", "a-b", "--out", out, "--overwrite")
    assert code == 0, err
    logits = [n for n in json.loads(out.read_text())["nodes"] if n["feature_type"] == "logit"]
    assert len(logits) == 1 and logits[0]["clerp"].startswith('Output "logit(a)-logit(b)"')


@pytest.mark.parametrize("argv,message", [
    (["--transcoders", "MISSING"], "is not a folder"),
    (["--transcoders", "TC", "--model", "bert"], "language-model head"),
    (["--transcoders", "TC", "--target", "abc"], "--target 'abc' is not one token"),
])
def test_graph_refusals_are_one_line(files, tmp_path, capsys, argv, message):
    argv = list(argv)
    model = files / "llama"
    if "--model" in argv:
        model = files / argv[argv.index("--model") + 1]
        del argv[argv.index("--model"):argv.index("--model") + 2]
    argv = [str(files / "plt") if a == "TC" else str(tmp_path / "none") if a == "MISSING" else a for a in argv]
    code, _, err = run(capsys, model, *argv, "--ids", "1,2", "--out", tmp_path / "g.json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "g.json").exists()


def test_graph_keeps_an_existing_output_without_overwrite(files, tmp_path, capsys):
    out = tmp_path / "g.json"
    out.write_text("mine")
    code, _, err = run(capsys, files / "llama", "--transcoders", files / "plt", "--ids", "1,2", "--out", out)
    assert code == 2 and "--overwrite" in err and out.read_text() == "mine"


def test_graph_of_an_encoder_decoders_decoder(tmp_path, capsys):
    """T5 (the parity suite's tiny model): --source-ids for the encoder, --ids after the decoder's start token;
    the graph's rows are the decoder's layers. Without a source: one line."""
    import sys
    from pathlib import Path
    parity = str(Path(__file__).resolve().parents[1] / "parity")
    if parity not in sys.path:
        sys.path.insert(0, parity)
    pytest.importorskip("transformers")
    from family_cases.t5 import CASES
    torch.manual_seed(0)
    next(iter(CASES.values()))().save_pretrained(tmp_path / "t5")
    random_transcoders(tmp_path / "tc", 2, 32, 16, seed=1)  # the decoder's 2 layers (the encoder has 3)
    out, raw = tmp_path / "g.json", tmp_path / "g.safetensors"
    code, stdout, err = run(capsys, tmp_path / "t5", "--transcoders", tmp_path / "tc", "--source-ids", "5,9,12,1",
                            "--ids", "7,3,8", "--out", out, "--raw", raw)
    assert code == 0, err
    graph = load_raw(raw)
    assert graph.input_ids == [0, 7, 3, 8] and graph.n_layers == 2  # T5's start token (pad, id 0) first
    check_graph_json(json.loads(out.read_text()), out)
    code, _, err = run(capsys, tmp_path / "t5", "--transcoders", tmp_path / "tc", "--ids", "7,3,8", "--out",
                       tmp_path / "h.json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--source" in err, err


@pytest.mark.parametrize("tensor,value", [("adjacency", float("nan")), ("adjacency", -float("inf")),
                                          ("activation_values", float("inf"))])
def test_a_raw_graph_file_with_nan_or_infinite_values_is_refused_in_one_line(files, tmp_path, capsys, tensor, value):
    """The raw file `graph --raw` writes, read back (load_raw): damaged values are named with the file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out, raw = tmp_path / "g.json", tmp_path / "g.safetensors"
    code, _, err = run(capsys, files / "llama", "--transcoders", files / "clt", "--prompt", "abc dea", "--out", out,
                       "--raw", raw)
    assert code == 0, err
    assert load_raw(raw).adjacency.shape[0] > 0  # the undamaged file reads
    with safe_open(str(raw), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors[tensor].view(-1)[-1] = value
    save_file(tensors, str(raw), metadata=meta)
    with pytest.raises(ValueError) as info:
        load_raw(raw)
    msg = str(info.value)
    assert msg.startswith(f"{raw}: {tensor} holds NaN or infinite values") and "\n" not in msg, msg

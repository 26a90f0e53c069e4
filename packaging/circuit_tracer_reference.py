"""circuit-tracer's attribution graphs on a small random Llama: the reference tests/reference/ compares against.

Runs in circuit-tracer's own environment (packaging/circuit_tracer_env.sh), never the app's:

    /work/ctenv/bin/python packaging/circuit_tracer_reference.py --out /tmp/ct-reference

It writes, all seeded and deterministic:
    OUT/model/                      a random float32 Llama saved by transformers, with a tiny tokenizer.json
    OUT/reference.json              the prompt ids and the cases below
    OUT/<case>/transcoders/         random transcoders in circuit-tracer's on-disk format (config.yaml + safetensors)
    OUT/<case>/graph.safetensors    circuit-tracer's Graph fields (adjacency, active_features, selected_features,
                                    activation_values, logit_tokens, logit_probabilities, input_tokens) and
                                    prune_graph's node_mask / edge_mask / cumulative_scores at the default thresholds
    OUT/<case>/graph.json           circuit-tracer's own frontend JSON (create_graph_files) at those thresholds
    OUT/<case>/summary.json         counts, replacement and completeness scores (compute_graph_scores), the
                                    node threshold's distance from a tie

The transcoders are loaded with circuit-tracer's loaders (load_transcoders for the per-layer set, as its
from_pretrained does with a config.yaml; load_clt for the cross-layer folder) and run on its nnsight backend
on the CPU. Cases (CASES): per-layer ReLU; per-layer JumpReLU with a skip connection; cross-layer ReLU;
cross-layer JumpReLU; cross-layer ReLU with max_feature_nodes below the active count; cross-layer ReLU reading
hook_resid_mid. reference.json also records the versions of circuit-tracer, nnsight, transformers and torch.
"""

import argparse
import json
import os
import platform
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the hub (read at import)

import torch
import yaml
from safetensors.torch import save_file

NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98  # circuit-tracer's defaults (prune_graph, create_graph_files)
MAX_N_LOGITS, DESIRED_LOGIT_PROB = 10, 0.95  # attribute()'s defaults

# the model: small, but with grouped-query attention and weights large enough that attention and logits are
# far from uniform (transformers' default initializer_range 0.02 gives an almost flat next-token distribution)
VOCAB, D_MODEL, N_LAYERS, N_HEADS, N_KV_HEADS = 100, 64, 3, 4, 2
PAD, BOS, EOS = 0, 1, 2  # BOS is not 0: ensure_tokenized's filter(None, ...) skips a special id 0
N_FEATURES = 96  # per layer, both kinds; also the MLPs' width (see true_dictionary)
SILU_SHARPNESS = 20.0  # silu(k z) / k: relu(z) within 0.28 / k
LM_HEAD_SCALE = 3.0
TRANSCODER_NOISE = 0.15
MAX_FEATURE_NODES = 7500  # circuit-tracer's CLI default (__main__.py); above every case's active count here
BATCH_SIZE = 64  # attribute()'s rows per backward pass
# where circuit-tracer's published Llama per-layer transcoders read and write: the MLP's input after the
# pre-MLP norm's gain, and the MLP's output (tl_nnsight_mapping's LlamaForCausalLM entry)
MLP_HOOKS = ("mlp.hook_in", "mlp.hook_out")
PLT, CLT = "transcoder_set", "cross_layer_transcoder"


def spec(kind, activation, skip=False, max_feature_nodes=MAX_FEATURE_NODES, batch_size=BATCH_SIZE,
         hooks=MLP_HOOKS) -> dict:
    """One case's transcoders and attribute() settings."""
    return dict(kind=kind, activation=activation, skip=skip, max_feature_nodes=max_feature_nodes,
                batch_size=batch_size, hooks=hooks)


CASES = {
    "plt_relu": spec(kind=PLT, activation="relu"),
    "plt_jumprelu_skip": spec(kind=PLT, activation="jump_relu", skip=True),
    "clt_relu": spec(kind=CLT, activation="relu"),
    "clt_jumprelu": spec(kind=CLT, activation="jump_relu"),
    # fewer feature nodes than active features: attribute() keeps those ranked first by influence on the logits
    # (compute_partial_influences over the rows computed so far): one ranking here (200 <= 4 x batch size) ...
    "clt_relu_top200": spec(kind=CLT, activation="relu", max_feature_nodes=200),
    # ... and three here (queues of 4 x 32 = 128, re-ranked with the feature rows computed so far)
    "clt_relu_top300_reranked": spec(kind=CLT, activation="relu", max_feature_nodes=300, batch_size=32),
    # reading the residual stream before the pre-MLP norm (hook_resid_mid) and writing the MLP's output
    # (hook_mlp_out): circuit-tracer's CrossLayerTranscoder defaults; the gradient then crosses the norm
    "clt_relu_resid_mid": spec(kind=CLT, activation="relu", hooks=("hook_resid_mid", "hook_mlp_out")),
}


def write_tokenizer(folder: Path):
    """A word-level tokenizer over VOCAB made-up words, enough for AutoTokenizer (which nnsight opens) to load."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<bos>": BOS, "<eos>": EOS}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<pad>"
    )
    fast.save_pretrained(folder)


def true_dictionary(g) -> dict:
    """A random ReLU dictionary per layer: the MLPs compute it (write_model) and the transcoders are noisy copies
    of it, so that, as with trained transcoders, features explain most of each MLP's output and a pruned graph
    keeps feature nodes (with transcoders unrelated to the MLPs every kept node is an error node, and the
    pruned-set check would say nothing about features). About a fifth of the features fire on a unit-scale input."""
    return {
        "W_enc": torch.randn(N_LAYERS, N_FEATURES, D_MODEL, generator=g) / D_MODEL**0.5,
        "b_enc": -0.6 - 0.4 * torch.rand(N_LAYERS, N_FEATURES, generator=g),
        "W_dec": 0.6 * torch.randn(N_LAYERS, N_FEATURES, D_MODEL, generator=g) / N_FEATURES**0.5,
        "b_dec": 0.05 * torch.randn(N_LAYERS, D_MODEL, generator=g),
    }


def write_model(folder: Path, seed: int, dictionary: dict):
    """A random Llama whose MLP at layer l computes dictionary l: down(silu(k (W_enc x + b_enc)) * 1/k) + b_dec,
    i.e. relu(W_enc x + b_enc) W_dec + b_dec up to silu's rounding near 0 (the up projection is the constant
    1/k: zero weights, bias 1/k). Everything else is random; the norm gains are away from 1 so that a reader
    that skips a gain is caught, and the unembedding is large enough that a few logits carry most probability."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=N_FEATURES,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        initializer_range=0.15,
        mlp_bias=True,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    k = SILU_SHARPNESS
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
        for layer, block in enumerate(model.model.layers):
            block.mlp.gate_proj.weight.copy_(k * dictionary["W_enc"][layer])
            block.mlp.gate_proj.bias.copy_(k * dictionary["b_enc"][layer])
            block.mlp.up_proj.weight.zero_()
            block.mlp.up_proj.bias.fill_(1 / k)
            block.mlp.down_proj.weight.copy_(dictionary["W_dec"][layer].T)
            block.mlp.down_proj.bias.copy_(dictionary["b_dec"][layer])
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)


def noisy(t: torch.Tensor, g, scale: float = TRANSCODER_NOISE) -> torch.Tensor:
    """t plus Gaussian noise of `scale` times t's own spread."""
    return t + scale * t.std() * torch.randn(t.shape, generator=g)


def jump_thresholds(g) -> torch.Tensor:
    return 0.05 + 0.25 * torch.rand(N_FEATURES, generator=g)


def write_transcoder_set(folder: Path, g, dictionary: dict, activation: str, skip: bool, hooks: tuple[str, str]):
    """circuit-tracer's per-layer format: layer_L.safetensors with W_enc, W_dec, b_enc, b_dec, optional W_skip
    and activation_function.threshold (SingleLayerTranscoder.to_safetensors), listed by config.yaml."""
    folder.mkdir(parents=True)
    names = []
    for layer in range(N_LAYERS):
        tensors = {name: noisy(dictionary[name][layer], g) for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
        if activation == "jump_relu":
            tensors["activation_function.threshold"] = jump_thresholds(g)
        if skip:
            tensors["W_skip"] = 0.1 * torch.randn(D_MODEL, D_MODEL, generator=g) / D_MODEL**0.5
        name = f"layer_{layer}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / name)
        names.append(name)
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": hooks[0],
        "feature_output_hook": hooks[1],
        "transcoders": names,
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def write_clt(folder: Path, g, dictionary: dict, activation: str, hooks: tuple[str, str]):
    """circuit-tracer's cross-layer format (CrossLayerTranscoder.to_safetensors): W_enc_L.safetensors with
    W_enc_L [features, d_model], b_enc_L, b_dec_L, optional threshold_L; W_dec_L.safetensors with W_dec_L
    [features, n_layers - L, d_model]. Layer L's features write their dictionary decoder to layer L and smaller
    random ones to the layers after it."""
    folder.mkdir(parents=True)
    for layer in range(N_LAYERS):
        enc = {f"{name}_{layer}": noisy(dictionary[name][layer], g) for name in ("W_enc", "b_enc", "b_dec")}
        if activation == "jump_relu":
            enc[f"threshold_{layer}"] = jump_thresholds(g)
        save_file(enc, folder / f"W_enc_{layer}.safetensors")
        W_dec = 0.2 * torch.randn(N_FEATURES, N_LAYERS - layer, D_MODEL, generator=g) / N_FEATURES**0.5
        W_dec[:, 0] = noisy(dictionary["W_dec"][layer], g)
        save_file({f"W_dec_{layer}": W_dec}, folder / f"W_dec_{layer}.safetensors")
    config = {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": hooks[0],
        "feature_output_hook": hooks[1],
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def load_with_circuit_tracer(folder: Path, kind: str):
    """circuit-tracer's own loaders: load_transcoders reads a per-layer set from its config (the path its
    from_pretrained takes after downloading); the cross-layer folder goes to load_clt, which load_transcoders
    reaches only through a hub download."""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from circuit_tracer.utils.hf_utils import load_transcoders

    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["scan"] = f"reference/{folder.parent.name}"
    cpu = torch.device("cpu")
    if kind == "transcoder_set":
        config["transcoders"] = [str(folder / name) for name in config["transcoders"]]
        return load_transcoders(config, device=cpu, dtype=torch.float32)
    return load_clt(
        str(folder),
        feature_input_hook=config["feature_input_hook"],
        feature_output_hook=config["feature_output_hook"],
        scan=config["scan"],
        device=cpu,
        dtype=torch.float32,
    )


def run_case(out: Path, model_dir: Path, dictionary: dict, case: str, ids: list[int], seed: int) -> dict:
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.graph import compute_graph_scores, compute_node_influence, prune_graph
    from circuit_tracer.utils.create_graph_files import create_graph_files

    settings = CASES[case]
    kind, activation, skip, hooks = settings["kind"], settings["activation"], settings["skip"], settings["hooks"]
    case_dir = out / case
    g = torch.Generator().manual_seed(seed + 1 + list(CASES).index(case))
    if kind == "transcoder_set":
        write_transcoder_set(case_dir / "transcoders", g, dictionary, activation, skip, hooks)
    else:
        write_clt(case_dir / "transcoders", g, dictionary, activation, hooks)

    transcoders = load_with_circuit_tracer(case_dir / "transcoders", kind)
    model = ReplacementModel.from_pretrained_and_transcoders(
        str(model_dir), transcoders, backend="nnsight", device=torch.device("cpu"), dtype=torch.float32
    )
    graph = attribute(
        torch.tensor(ids), model, max_n_logits=MAX_N_LOGITS, desired_logit_prob=DESIRED_LOGIT_PROB, batch_size=settings["batch_size"], max_feature_nodes=settings["max_feature_nodes"],
    )
    node_mask, edge_mask, cumulative_scores = prune_graph(graph, NODE_THRESHOLD, EDGE_THRESHOLD)
    replacement_score, completeness_score = compute_graph_scores(graph)
    # how far the node threshold is from a tie: the relative gap between the last kept node's influence and the
    # next one's (prune_graph's own numbers), so a pruned-set difference can be told from a rounding-level tie
    logit_weights = torch.zeros(graph.adjacency_matrix.shape[0])
    logit_weights[-len(graph.logit_targets):] = graph.logit_probabilities
    influence = torch.sort(compute_node_influence(graph.adjacency_matrix, logit_weights), descending=True).values
    last_kept = int((cumulative_scores < NODE_THRESHOLD).sum())  # find_threshold's index
    node_threshold_gap = ((influence[last_kept] - influence[last_kept + 1]) / influence[last_kept]).item()

    save_file(
        {
            "adjacency": graph.adjacency_matrix.float().contiguous(),
            "active_features": graph.active_features.long().contiguous(),
            "selected_features": graph.selected_features.long().contiguous(),
            "activation_values": graph.activation_values.float().contiguous(),
            "logit_tokens": graph.logit_token_ids.long(),
            "logit_probabilities": graph.logit_probabilities.float().contiguous(),
            "input_tokens": graph.input_tokens.long().contiguous(),
            "node_mask": node_mask.contiguous(),
            "edge_mask": edge_mask.contiguous(),
            "cumulative_scores": cumulative_scores.float().contiguous(),
        },
        case_dir / "graph.safetensors",
    )
    create_graph_files(graph, slug="graph", output_path=str(case_dir), scan=graph.scan,
                       node_threshold=NODE_THRESHOLD, edge_threshold=EDGE_THRESHOLD)
    n_layers, n_pos = N_LAYERS, len(ids)
    summary = {
        "case": case,
        "kind": kind,
        "activation": activation,
        "skip_connection": skip,
        "max_feature_nodes": settings["max_feature_nodes"],
        "batch_size": settings["batch_size"],
        "feature_input_hook": hooks[0],
        "feature_output_hook": hooks[1],
        "transcoders": "transcoders",
        "n_active_features": int(graph.active_features.shape[0]),
        "n_selected_features": int(graph.selected_features.shape[0]),
        "n_nodes": int(graph.adjacency_matrix.shape[0]),
        "n_error_nodes": n_layers * n_pos,
        "n_logits": len(graph.logit_targets),
        "n_pruned_nodes": int(node_mask.sum()),
        "n_pruned_edges": int(edge_mask.sum()),
        "replacement_score": replacement_score,
        "completeness_score": completeness_score,
        "node_threshold_gap": node_threshold_gap,
        "node_threshold": NODE_THRESHOLD,
        "edge_threshold": EDGE_THRESHOLD,
    }
    (case_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    del model
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="a new (or empty) folder outside the repository")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-tokens", type=int, default=10, help="prompt length, BOS included")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()

    import circuit_tracer
    import nnsight
    import transformers

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # deterministic reductions, and a fair share of a busy machine
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"{args.out}: not empty; give a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.out / "model"
    g = torch.Generator().manual_seed(args.seed)
    dictionary = true_dictionary(g)
    write_model(model_dir, args.seed, dictionary)
    ids = [BOS] + torch.randint(3, VOCAB, (args.n_tokens - 1,), generator=g).tolist()
    summaries = [run_case(args.out, model_dir, dictionary, case, ids, args.seed) for case in args.cases]
    reference = {
        "model": "model",
        "ids": ids,
        "cases": [s["case"] for s in summaries],
        "circuit_tracer": circuit_tracer.__version__,
        "nnsight": nnsight.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seed": args.seed,
    }
    (args.out / "reference.json").write_text(json.dumps(reference, indent=2))
    for s in summaries:
        print(
            f"{s['case']}: {s['n_active_features']} active features, {s['n_logits']} logits, {s['n_nodes']} nodes, "
            f"{s['n_pruned_nodes']} kept at {NODE_THRESHOLD}/{EDGE_THRESHOLD}; replacement "
            f"{s['replacement_score']:.3f}, completeness {s['completeness_score']:.3f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""circuit-tracer's half of `bench graph` (issue 37): its attribute() timed on a Llama-3.2-1B-shaped random model
with a random cross-layer transcoder, on this machine's CPU, with the process's peak memory (VmHWM).

Runs in circuit-tracer's own environment (packaging/circuit_tracer_env.sh):

    /work/ctenv/bin/python packaging/circuit_tracer_bench.py --inputs /work/ct-bench            (full shape)
    /work/ctenv/bin/python packaging/circuit_tracer_bench.py --inputs /tmp/b --shape tiny       (a quick check)

--inputs is a folder outside the repository: the random model (`model/`, transformers' layout with a tokenizer),
the CLT (`clt/`, circuit-tracer's W_enc_L / W_dec_L files and a config.yaml) and the prompt ids (`prompt.json`)
are written there once (seeded; the full shape is ~2.5 GB of model and ~10 GB of CLT in bfloat16) and reused,
so the app's `bench graph` can run on the same input. The run prints one JSON line: seconds to load, seconds
in attribute(), peak resident memory after loading and at the end (VmHWM), the active features and nodes.

Measured on the 2-core, 23 GB development machine (1 Dec 2026, load average 8-10 from other work), full shape,
--batch-size 8 --max-feature-nodes 16 --offload disk: 64,535 active features; precompute 99 s, forward pass
21 s, the 10 logit rows 288 s, the 16 feature rows 74 s (~37 s per backward pass of 8 rows), VmHWM 10.7 GB.
At the defaults (7,500 feature rows) that is ~940 backward passes, about ten hours here: circuit-tracer is built
for a GPU. With --batch-size 32 its resident set passed 9 GB before the first backward pass.
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local (read at import)

import torch
import yaml
from safetensors.torch import save_file

SHAPES = {
    # Llama-3.2-1B's config.json; a 16k-feature-per-layer CLT
    "llama-3.2-1b": dict(vocab=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_mlp=8192,
                         features=16384, bos=128000, eos=128001),
    "tiny": dict(vocab=1000, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_mlp=512, features=1024,
                 bos=1, eos=2),
}
ACTIVE_PER_TOKEN_LAYER = 64  # a CLT's typical L0 scale: b_enc puts ~64 of each layer's features above 0


def vm_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB (VmHWM: peak resident set)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def write_model(folder: Path, shape: dict, dtype: torch.dtype, seed: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["d_model"], intermediate_size=shape["d_mlp"],
        num_hidden_layers=shape["n_layers"], num_attention_heads=shape["n_heads"],
        num_key_value_heads=shape["n_kv_heads"], head_dim=shape["d_model"] // shape["n_heads"],
        max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=shape["bos"], eos_token_id=shape["eos"],
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise straight in the target dtype: no float32 copy of 1.2 B weights
    try:
        model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(folder, safe_serialization=True)
    del model

    vocab = {f"w{i}": i for i in range(shape["vocab"])}
    vocab["<bos>"], vocab["<eos>"] = shape["bos"], shape["eos"]
    del vocab[f"w{shape['bos']}"], vocab[f"w{shape['eos']}"]
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                            unk_token="w0").save_pretrained(folder)


def write_clt(folder: Path, shape: dict, dtype: torch.dtype, seed: int):
    """A random ReLU CLT reading mlp.hook_in (unit-scale elements after the norm) and writing mlp.hook_out;
    b_enc sets ~ACTIVE_PER_TOKEN_LAYER features per token and layer above zero. One layer at a time in memory."""
    from statistics import NormalDist

    folder.mkdir(parents=True)
    n_layers, d, f = shape["n_layers"], shape["d_model"], shape["features"]
    z = NormalDist().inv_cdf(1 - ACTIVE_PER_TOKEN_LAYER / f)
    g = torch.Generator().manual_seed(seed)
    for layer in range(n_layers):
        enc = {
            f"W_enc_{layer}": (torch.randn(f, d, generator=g) / d**0.5).to(dtype),
            f"b_enc_{layer}": torch.full((f,), -z).to(dtype),
            f"b_dec_{layer}": torch.zeros(d, dtype=dtype),
        }
        save_file(enc, folder / f"W_enc_{layer}.safetensors")
        W_dec = torch.empty(f, n_layers - layer, d, dtype=dtype)
        for i in range(n_layers - layer):  # a float32 slice at a time
            W_dec[:, i] = (torch.randn(f, d, generator=g) * (0.1 / f**0.5)).to(dtype)
        save_file({f"W_dec_{layer}": W_dec}, folder / f"W_dec_{layer}.safetensors")
        del enc, W_dec
    config = {"model_kind": "cross_layer_transcoder", "feature_input_hook": "mlp.hook_in",
              "feature_output_hook": "mlp.hook_out"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def make_inputs(folder: Path, shape_name: str, dtype: torch.dtype, n_tokens: int, seed: int):
    """Writes what is missing of model/, clt/ and prompt.json (a folder half written by an interrupted run is
    written again: each part is written under a temporary name and renamed when whole)."""
    shape = SHAPES[shape_name]
    folder.mkdir(parents=True, exist_ok=True)
    for name, write in (("model", write_model), ("clt", write_clt)):
        if not (folder / name).is_dir():
            tmp = folder / f".{name}.partial"
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp)
            start = time.perf_counter()
            write(tmp, shape, dtype, seed)
            tmp.rename(folder / name)
            print(f"wrote {folder / name} in {time.perf_counter() - start:.0f} s", flush=True)
    if not (folder / "prompt.json").is_file():
        g = torch.Generator().manual_seed(seed)
        ids = [shape["bos"]] + torch.randint(3, min(shape["vocab"], 128000), (n_tokens - 1,), generator=g).tolist()
        (folder / "prompt.json").write_text(json.dumps({"shape": shape_name, "dtype": str(dtype), "ids": ids}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, type=Path, help="folder for (or with) model/, clt/, prompt.json")
    parser.add_argument("--shape", choices=list(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--tokens", type=int, default=64, help="prompt length, BOS included")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="attribute()'s rows per backward pass (its default 512 runs the forward pass on 512 "
                             "copies of the prompt and keeps them for the backward passes: tens of GB at this shape)")
    parser.add_argument("--max-feature-nodes", type=int, default=7500)
    parser.add_argument("--offload", choices=["cpu", "disk"], default=None,
                        help="attribute()'s offload: drop the transcoder, MLP and embedding weights to disk (or CPU) "
                             "once each phase is done with them")
    parser.add_argument("--make-only", action="store_true", help="write the inputs and stop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    make_inputs(args.inputs, args.shape, dtype, args.tokens, args.seed)
    if args.make_only:
        return
    ids = json.loads((args.inputs / "prompt.json").read_text())["ids"]

    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

    start = time.perf_counter()
    cpu = torch.device("cpu")
    clt = load_clt(str(args.inputs / "clt"), feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
                   scan="bench", device=cpu, dtype=dtype)  # lazy decoder: rows read from disk as features fire
    model = ReplacementModel.from_pretrained_and_transcoders(str(args.inputs / "model"), clt, backend="nnsight",
                                                             device=cpu, dtype=dtype)
    load_s = time.perf_counter() - start
    hwm_loaded = vm_kib("VmHWM")
    start = time.perf_counter()
    graph = attribute(torch.tensor(ids), model, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes,
                      offload=args.offload, verbose=True)
    attribute_s = time.perf_counter() - start
    print(json.dumps({
        "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
        "reference": "circuit-tracer", "shape": args.shape, "dtype": args.dtype, "tokens": len(ids),
        "features_per_layer": SHAPES[args.shape]["features"], "batch_size": args.batch_size,
        "max_feature_nodes": args.max_feature_nodes, "offload": args.offload, "torch_threads": torch.get_num_threads(),
        "load_s": round(load_s, 2), "attribute_s": round(attribute_s, 2),
        "vmhwm_after_load_gib": round(hwm_loaded / 2**20, 3), "vmhwm_gib": round(vm_kib("VmHWM") / 2**20, 3),
        "active_features": int(graph.active_features.shape[0]), "nodes": int(graph.adjacency_matrix.shape[0]),
    }))


if __name__ == "__main__":
    main()

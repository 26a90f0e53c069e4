"""Attribution graphs at scale (issue 37): `graph` against circuit-tracer's attribute() on the same input.

    python -m desktop_app bench graph [--inputs DIR] [--shape llama-3.2-1b|tiny] [--tokens 64]
                                      [--max-feature-nodes N] [--batch-size B] [--no-reference] [--ct-python PY]

The input is circuit_tracer_bench's (packaging/circuit_tracer_bench.py --make-only, run in circuit-tracer's
environment so that its transformers reads the tokenizer written; its make_inputs here without one), so the two
sides read the very same files: a random Llama of the shape in bfloat16 (transformers' layout), a random
ReLU cross-layer transcoder (16,384 features per layer at the Llama-3.2-1B shape, ~64 active per token and
layer) in circuit-tracer's files, and the prompt ids (BOS first). --inputs keeps them (written once, ~12 GB at
the full shape); without it they go in a temporary folder, removed at the end.

Two fresh processes, one after the other (neither's memory pollutes the other's peak): ours runs
`python -m desktop_app graph MODEL --transcoders CLT --ids ... --dtype bfloat16`; the reference runs
circuit_tracer_bench.py in circuit-tracer's own environment (--ct-python, default /work/ctenv/bin/python;
skipped with --no-reference or when it is missing). Each is timed from launch to exit (imports, loading and
the graph; the figures each prints are kept too) and its peak resident memory is the kernel's (wait4's
ru_maxrss: VmHWM at exit). Ratios: reference / ours for time (above 1: ours faster), ours / reference for
memory (below 1: ours smaller). Both at the same --max-feature-nodes and --batch-size: circuit-tracer's
default 7,500 feature rows take ~10 hours on a 2-core CPU, so the default here is 64.
The last line printed is the JSON result.

    python -m desktop_app bench graph --streamed [--inputs DIR] [--shape ...] [--runs 2] ...

--streamed: the graph of a model read layer by layer (core/streamed.py), in this process, no reference: the
replacement model's passes reading only the parts of each block they use (norms, attention values and
output), the first layers' parts kept across the passes within one block's bytes (streamed.keeping), against
the same parts read again by every pass ("unkept"), against the whole block (`holding` without `only`),
against the code before that (the whole block, each read checked with isfinite(t).all()) and against the
model held whole (what streaming still costs), rotating which goes first, --runs of each: the seconds of
build_context (freeze) and attribute(), and the MB read from the files by the freeze and per backward batch.
Its shape is --shape's widths, cut at llama-3.2-1b to 4 layers, a 32,000-token vocabulary and 2,048 features
per layer (~620 MB of bfloat16 weights), written to the inputs folder as "<shape>-streamed".

Measured on the 2-core, 23 GB development machine (1 Dec 2026, load average 16), full shape, --max-feature-nodes
16 --batch-size 8 --reference-offload disk, one run: ours 203 s launch to exit, peak 4.78 GiB (65,996 active
features); circuit-tracer 815 s (780 s in attribute()), peak 10.6 GiB (64,535): speedup 4.03, memory ratio 0.45.
Before the decoder was held once per feature id and read without a memory map: 202 s, 11.5 GiB against
441 s, 10.7 GiB at load 11 (speedup 2.19, memory ratio 1.07). At 1,024 tokens (`graph` alone, same files,
random ids, --max-feature-nodes 16 --batch-size 8): 1,054,427 active features, peak 12.7 GiB (9.1 GB of it the
decoder rows: nearly every feature is active somewhere), 2,257 s at load 7-12 (before feature_edges stopped
zeroing a fresh chunk per product).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..commands.args import OneLineParser, int_in

REFERENCE_SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "circuit_tracer_bench.py"
CT_PYTHON = "/work/ctenv/bin/python"


def _reference_module():
    """packaging/circuit_tracer_bench.py as a module (its make_inputs writes the shared input)."""
    if not REFERENCE_SCRIPT.is_file():
        raise ValueError(f"{REFERENCE_SCRIPT}: missing (bench graph writes its inputs with it)")
    spec = importlib.util.spec_from_file_location("circuit_tracer_bench", REFERENCE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_measured(cmd: list[str]) -> dict:
    """Run cmd to its end: seconds from launch to exit, its peak resident set in GiB (os.wait4: this child's
    own rusage, not all children's) and the last JSON line it printed."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}): {' | '.join(tail)}")
    last = next((line for line in reversed(stdout.strip().splitlines()) if line.startswith("{")), "{}")
    return {"seconds": round(seconds, 2), "peak_gib": round(usage.ru_maxrss / 2**20, 3), "printed": json.loads(last)}


def ours(inputs: Path, max_feature_nodes: int, batch_size: int, dtype: str = "bfloat16") -> dict:
    """`graph` on the bench input in a fresh process: seconds, peak GiB and its summary line."""
    ids = json.loads((inputs / "prompt.json").read_text())["ids"]
    with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
        return _run_measured([sys.executable, "-m", "desktop_app", "graph", str(inputs / "model"), "--transcoders",
                              str(inputs / "clt"), "--ids", ",".join(map(str, ids)), "--out",
                              str(Path(tmp) / "graph.json"), "--dtype", dtype, "--max-feature-nodes",
                              str(max_feature_nodes), "--batch-size", str(batch_size)])


def reference(inputs: Path, shape: str, max_feature_nodes: int, batch_size: int, ct_python: str,
              dtype: str = "bfloat16", offload: str | None = None) -> dict:
    """circuit_tracer_bench.py on the same input in circuit-tracer's environment (`offload`: its attribute()'s)."""
    return _run_measured([ct_python, str(REFERENCE_SCRIPT), "--inputs", str(inputs), "--shape", shape, "--dtype",
                          dtype, "--max-feature-nodes", str(max_feature_nodes), "--batch-size", str(batch_size),
                          *(["--offload", offload] if offload else [])])


def measure(inputs: Path, shape: str, tokens: int, max_feature_nodes: int, batch_size: int,
            ct_python: str | None, offload: str | None = None) -> dict:
    import torch

    maker = _reference_module()
    if ct_python and Path(ct_python).is_file():  # its transformers must read the tokenizer saved: write with it
        subprocess.run([ct_python, str(REFERENCE_SCRIPT), "--inputs", str(inputs), "--shape", shape, "--tokens",
                        str(tokens), "--make-only"], check=True, stdout=subprocess.DEVNULL)
    else:
        maker.make_inputs(inputs, shape, torch.bfloat16, tokens, 0)
    made = json.loads((inputs / "prompt.json").read_text())
    if made.get("shape") != shape:
        raise ValueError(f"{inputs / 'prompt.json'}: the inputs there are of shape {made.get('shape')!r}, not {shape!r}")
    result = {"name": "graph", "shape": shape, "tokens": len(made["ids"]), "dtype": "bfloat16",
              "features_per_layer": maker.SHAPES[shape]["features"],
              "max_feature_nodes": max_feature_nodes, "batch_size": batch_size,
              "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    mine = ours(inputs, max_feature_nodes, batch_size)
    result.update(ours_s=mine["seconds"], ours_peak_gib=mine["peak_gib"],
                  active_features=mine["printed"].get("active_features"),
                  replacement_score=mine["printed"].get("replacement_score"))
    if ct_python and Path(ct_python).is_file():
        ref = reference(inputs, shape, max_feature_nodes, batch_size, ct_python, offload=offload)
        result.update(reference_offload=offload, reference_s=ref["seconds"], reference_peak_gib=ref["peak_gib"],
                      reference_attribute_s=ref["printed"].get("attribute_s"),
                      reference_active_features=ref["printed"].get("active_features"),
                      speedup=round(ref["seconds"] / mine["seconds"], 3),
                      memory_ratio=round(mine["peak_gib"] / ref["peak_gib"], 3))
    else:
        result["reference"] = f"not run ({ct_python or 'no --ct-python'} missing or --no-reference)"
    return result


# --streamed's cuts of a shape: a model of a few hundred MB at Llama-3.2-1B's widths
STREAMED_CUTS = {"llama-3.2-1b": dict(n_layers=4, vocab=32000, bos=1, eos=2, features=2048)}


def streamed_graph(inputs: Path, shape: str, tokens: int, max_feature_nodes: int, batch_size: int,
                   runs: int) -> dict:
    """--streamed (see the module's docstring): parts against whole blocks, alternating in one process."""
    from contextlib import ExitStack
    from unittest import mock

    import torch

    from ..core import checkpoints
    from ..core.checkpoints import load_model_folder
    from ..core.graphs import attribute, attribution, build_context, load_transcoders, replacement
    from ..core.graphs.attribution import salient_targets
    from ..core.streamed import streamed_of

    maker = _reference_module()
    name = f"{shape}-streamed"
    maker.SHAPES[name] = dict(maker.SHAPES[shape], **STREAMED_CUTS.get(shape, {}))
    maker.make_inputs(inputs, name, torch.bfloat16, tokens, 0)
    made = json.loads((inputs / "prompt.json").read_text())
    if made.get("shape") != name:
        raise ValueError(f"{inputs / 'prompt.json'}: the inputs there are of shape {made.get('shape')!r}, not {name!r}")
    loaded = load_model_folder(inputs / "model", dtype="bfloat16", streamed=True)
    held = load_model_folder(inputs / "model", dtype="bfloat16", streamed=False)  # what streaming costs
    streamed, transcoders = streamed_of(loaded.model), load_transcoders(inputs / "clt")
    compute_rows, batches = attribution.compute_rows, [0]

    def counted(*args):
        batches[0] += 1
        return compute_rows(*args)

    def checked_every_read(load_block):
        """The code before: each block read checked value by value (isfinite's mask of the tensor, then all())."""
        def read(layer, device, only):
            out = load_block(layer, device, only)
            if not all(bool(torch.isfinite(t).all()) for t in out.values()):
                raise ValueError(f"block {layer}: a value is not finite")
            return out
        return read

    def one(mode: str) -> tuple[dict, torch.Tensor]:
        model = held.model if mode == "held" else loaded.model
        with ExitStack() as patches:
            patches.enter_context(mock.patch.object(attribution, "compute_rows", counted))
            if mode != "parts":  # nothing kept across the passes (streamed.keeping): the code before 2 Dec's
                patches.enter_context(mock.patch.object(streamed, "keep_budget", 0))
            if mode in ("whole", "before"):  # holding the whole block
                patches.enter_context(mock.patch.object(replacement, "_parts_read", lambda block: None))
            if mode == "before":  # its check on every read, not the new one at each tensor's first read
                patches.enter_context(mock.patch.object(checkpoints, "_check_finite", lambda files, into: None))
                patches.enter_context(mock.patch.object(streamed, "load_block",
                                                        checked_every_read(streamed.load_block)))
            streamed.bytes_read, batches[0] = 0, 0
            start = time.perf_counter()
            ctx = build_context(model, made["ids"], transcoders)
            freeze_s, freeze_bytes = time.perf_counter() - start, streamed.bytes_read
            targets = salient_targets(model, ctx.frozen.logits[-1], 10, 0.95, str)
            streamed.bytes_read = 0
            start = time.perf_counter()
            graph = attribute(ctx, targets, batch_size=batch_size, max_feature_nodes=max_feature_nodes)
            seconds = time.perf_counter() - start
        return {"freeze_s": round(freeze_s, 3), "freeze_mb": round(freeze_bytes / 2**20, 1),
                "graph_s": round(seconds, 3), "batches": batches[0],
                "mb_per_batch": round(streamed.bytes_read / batches[0] / 2**20, 2)}, graph.adjacency

    result = {"name": "graph", "mode": "streamed", "shape": name, "tokens": len(made["ids"]), "dtype": "bfloat16",
              "model_mb": round(sum(f.stat().st_size for f in (inputs / "model").glob("*.safetensors")) / 2**20),
              "max_feature_nodes": max_feature_nodes, "batch_size": batch_size, "cpus": os.cpu_count(),
              "load_average": round(os.getloadavg()[0], 2), "parts": [], "unkept": [], "whole": [], "before": [],
              "held": []}
    adjacency, modes = [], ("parts", "unkept", "whole", "before", "held")
    one("parts")  # untimed: the first graph of a process pays for its first allocations and the CLT's pages
    for run in range(runs):  # rotating which goes first
        for mode in modes[run % len(modes):] + modes[:run % len(modes)]:
            figures, adj = one(mode)
            result[mode].append(figures)
            adjacency.append(adj)
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    result["same_graph"] = all(torch.equal(adjacency[0], a) for a in adjacency[1:])

    def ratios(key: str, over: str, under: str) -> list[float]:  # per run: over's seconds / under's
        return [round(a[key] / b[key], 3) for a, b in zip(result[over], result[under])]

    def read_ratio(over: str) -> float | None:  # MB read per batch, over's / parts' (None: parts read nothing)
        parts = result["parts"][0]["mb_per_batch"]
        return round(result[over][0]["mb_per_batch"] / parts, 2) if parts else None

    result.update(graph_speedup_vs_unkept=ratios("graph_s", "unkept", "parts"),
                  freeze_speedup_vs_unkept=ratios("freeze_s", "unkept", "parts"),
                  graph_speedup_vs_before=ratios("graph_s", "before", "parts"),
                  freeze_speedup_vs_before=ratios("freeze_s", "before", "parts"),
                  graph_speedup_vs_whole=ratios("graph_s", "whole", "parts"),
                  freeze_speedup_vs_whole=ratios("freeze_s", "whole", "parts"),
                  graph_vs_held=ratios("graph_s", "parts", "held"), freeze_vs_held=ratios("freeze_s", "parts", "held"),
                  read_ratio=read_ratio("whole"), read_ratio_vs_unkept=read_ratio("unkept"))
    return result


# the small size for `bench quick` (RUNS["graph"] there): the 128-wide 4-layer Llama with a 1,024-feature CLT
QUICK_ARGS = ["--shape", "tiny", "--tokens", "32", "--max-feature-nodes", "64"]


def quick() -> dict:
    """bench graph at the small size (QUICK_ARGS): against circuit-tracer where its environment is present;
    at this size its figure is mostly the two processes' start-up, a regression guard and no result."""
    return main(QUICK_ARGS)


def main(argv: list[str]) -> dict:
    p = OneLineParser(prog="bench graph", description=__doc__.splitlines()[0])
    p.add_argument("--inputs", type=Path, help="folder for (or with) model/, clt/, prompt.json (kept)")
    p.add_argument("--shape", choices=("llama-3.2-1b", "tiny"), default="llama-3.2-1b")
    p.add_argument("--tokens", type=int_in(2, 4096), default=64, help="prompt length, BOS included (default 64)")
    p.add_argument("--max-feature-nodes", type=int_in(1, 10**6), default=64,
                   help="feature rows on both sides (default 64; circuit-tracer's 7500 takes ~10 h on 2 cores)")
    p.add_argument("--batch-size", type=int_in(1, 4096), default=8, help="rows per backward pass, both sides")
    p.add_argument("--no-reference", action="store_true", help="ours only")
    p.add_argument("--reference-offload", choices=("cpu", "disk"),
                   help="circuit-tracer's attribute(offload=...): its weights dropped once each phase is done")
    p.add_argument("--ct-python", default=CT_PYTHON, help=f"circuit-tracer's Python (default {CT_PYTHON})")
    p.add_argument("--streamed", action="store_true",
                   help="the graph of a model read layer by layer: only the parts of a block used against the whole "
                        "block, in this process (no reference)")
    p.add_argument("--runs", type=int_in(1, 20), default=2, help="--streamed: runs of each (default 2)")
    args = p.parse_args(argv)
    if args.streamed:
        if args.inputs is not None:
            return streamed_graph(args.inputs, args.shape, args.tokens, args.max_feature_nodes, args.batch_size,
                                  args.runs)
        with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
            return streamed_graph(Path(tmp) / "inputs", args.shape, args.tokens, args.max_feature_nodes,
                                  args.batch_size, args.runs)
    ct = None if args.no_reference else args.ct_python
    if args.inputs is not None:
        return measure(args.inputs, args.shape, args.tokens, args.max_feature_nodes, args.batch_size, ct,
                       args.reference_offload)
    with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
        return measure(Path(tmp) / "inputs", args.shape, args.tokens, args.max_feature_nodes, args.batch_size, ct,
                       args.reference_offload)

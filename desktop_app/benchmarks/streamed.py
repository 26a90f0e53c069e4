"""`bench streamed`: a model larger than the memory the app is given, traced layer by layer (core/streamed.py),
against the same model held whole, in two processes on the same checkpoint.

The capped process sees at most --memory-cap-gb GiB available (core.devices.available_memory, what every
load and trace checks against), so it opens the checkpoint streamed; its peak resident set (VmHWM) is
reported beside the cap, and the trace's logits must equal the uncapped ones. Prints the figures as one
JSON line: the time of open + trace (and of a few greedy tokens) capped against uncapped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..commands.args import OneLineParser, float_in, int_in
from .scale import SHAPES, _ids, _peak_mb, _rss_mb, make_checkpoint


def child(folder: str, tokens: int, new: int, dtype: str, cap_gib: float | None, out_file: str) -> dict:
    import torch

    from ..core import devices

    if cap_gib:
        devices.available_memory = lambda device="cpu": int(cap_gib * 2**30)  # this process's small machine
    from ..app.tracing import trace_input
    from ..core.checkpoints import load_model_folder
    from ..core.generation import GenerationSession, GenerationSettings

    baseline = _rss_mb()
    t0 = time.perf_counter()
    loaded = load_model_folder(folder, dtype=dtype)
    t_load = time.perf_counter() - t0
    ids = _ids(tokens, loaded.config.vocab_size, 1)
    first: list[float] = []
    t1 = time.perf_counter()
    _, trace = trace_input(loaded, "", ids, on_layer=lambda ready: first or first.append(time.perf_counter()))
    t_trace = time.perf_counter() - t1
    torch.save(trace["logits"][0, -8:].float().clone(), out_file)  # the last positions' logits, compared
    held_mb = trace.nbytes() / 2**20
    del trace
    s = GenerationSession(loaded, _ids(8, loaded.config.vocab_size, 2), GenerationSettings("greedy"), stop_tokens=[])
    t2 = time.perf_counter()
    for _ in s.run(new):
        pass
    t_gen = (time.perf_counter() - t2) / new
    return {"streamed": getattr(loaded.model, "streamed", None) is not None, "load_s": t_load, "trace_s": t_trace,
            "first_layer_s": first[0] - t1, "generate_s_per_token": t_gen, "generated_ids": s.ids(),
            "peak_mb": _peak_mb(), "baseline_mb": baseline, "trace_held_mb": held_mb, "dtype": str(loaded.model.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads()}


def _run(*args) -> dict:
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-m", "desktop_app.benchmarks.streamed", json.dumps(args)],
                         capture_output=True, text=True, env=env, timeout=7200)
    if out.returncode:
        lines = out.stderr.strip().splitlines() or ["(no message)"]
        raise SystemExit(f"bench streamed: a measured process failed: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench streamed")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--tokens", type=int_in(1, 32_768), default=1024, help="tokens traced (default 1024)")
    ap.add_argument("--new", type=int_in(1, 4096), default=2, help="tokens generated, greedy (default 2)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="bfloat16",
                    help="compute dtype, both processes (default bfloat16, as the checkpoint is stored)")
    ap.add_argument("--memory-cap-gb", type=float_in(0, 1e5, lo_open=True), default=None, metavar="G",
                    help="the memory the capped process is told it has, GiB (default: 95%% of the weights')")
    args = ap.parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory(prefix="bench-streamed-") as tmp:
        folder = Path(tmp) / args.shape
        params, _ = make_checkpoint(args.shape, folder)
        weights_gib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30
        cap = args.memory_cap_gb or 0.95 * weights_gib
        common = (str(folder), args.tokens, args.new, args.dtype)
        capped = _run(*common, cap, str(Path(tmp) / "capped.pt"))
        whole = _run(*common, None, str(Path(tmp) / "whole.pt"))
        diff = float((torch.load(Path(tmp) / "capped.pt") - torch.load(Path(tmp) / "whole.pt")).abs().max())
    result = {
        "name": "streamed", "shape": args.shape, "params": params, "weights_gib": round(weights_gib, 2),
        "tokens": args.tokens, "dtype": capped["dtype"], "threads": capped["threads"],
        "memory_cap_gib": float(f"{cap:.4g}"), "capped_streamed": capped["streamed"], "whole_streamed": whole["streamed"],
        "capped_peak_gib": round(capped["peak_mb"] / 1024, 2), "whole_peak_gib": round(whole["peak_mb"] / 1024, 2),
        "trace_held_gib": round(capped["trace_held_mb"] / 1024, 2),
        "capped_open_s": round(capped["load_s"], 2), "whole_open_s": round(whole["load_s"], 2),
        "capped_trace_s": round(capped["trace_s"], 2), "whole_trace_s": round(whole["trace_s"], 2),
        "capped_first_layer_s": round(capped["first_layer_s"], 2), "whole_first_layer_s": round(whole["first_layer_s"], 2),
        "time_ratio": round((capped["load_s"] + capped["trace_s"]) / (whole["load_s"] + whole["trace_s"]), 3),
        "capped_s_per_token": round(capped["generate_s_per_token"], 2),
        "whole_s_per_token": round(whole["generate_s_per_token"], 2),
        "same_generated_ids": capped["generated_ids"] == whole["generated_ids"],
        "max_abs_logit_diff": diff,
    }
    for key, value in result.items():
        print(f"{key:28s} {value}", file=sys.stderr)
    return result


if __name__ == "__main__":  # a measured process: python -m desktop_app.benchmarks.streamed ARGS_JSON
    print(json.dumps(child(*json.loads(sys.argv[1]))))

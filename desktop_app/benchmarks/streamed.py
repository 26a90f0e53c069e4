"""`bench streamed`: a model larger than the memory the app is given, traced layer by layer (core/streamed.py),
against the same model held whole, in two processes on the same checkpoint.

The capped process sees at most --memory-cap-gb GiB available (core.devices.available_memory, what every
load and trace checks against), so it opens the checkpoint streamed; where this machine lets a memory
cgroup be made (v2 with the memory controller, or v1's memory hierarchy, under this process's own), the
capped process runs inside one limited to the same figure, so the kernel enforces the cap (the cgroup's
peak charge is reported; "cap" says which cap held). Its peak resident set (VmHWM) is reported beside the
cap, and the trace's logits must equal the uncapped ones. Prints the figures as one JSON line: the time
of open + trace (and of a few greedy tokens, --new; 0 for none) capped against uncapped.

--folder DIR measures an existing checkpoint (kept); otherwise one is made in a temporary folder, tensor by
tensor for the shapes past a few GB (scale.write_checkpoint_by_tensor: an 8B shape is never whole in memory).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..commands.args import OneLineParser, float_in, int_in
from .scale import SHAPES, _ids, _peak_mb, _rss_mb, make_checkpoint, write_checkpoint_by_tensor


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
    generated, t_gen = None, None
    if new:
        s = GenerationSession(loaded, _ids(8, loaded.config.vocab_size, 2), GenerationSettings("greedy"), stop_tokens=[])
        t2 = time.perf_counter()
        for _ in s.run(new, lazy_last=True):  # generate's forwards: none for the last token
            pass
        generated, t_gen = s.ids(), (time.perf_counter() - t2) / new
    return {"streamed": getattr(loaded.model, "streamed", None) is not None, "load_s": t_load, "trace_s": t_trace,
            "first_layer_s": first[0] - t1, "generate_s_per_token": t_gen, "generated_ids": generated,
            "peak_mb": _peak_mb(), "baseline_mb": baseline, "trace_held_mb": held_mb, "dtype": str(loaded.model.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads()}


def _own_cgroup() -> tuple[Path, str] | None:
    """This process's own memory cgroup (the deepest of core.devices.cgroup_memory_files that has one) and
    its limit file's name: under it a cgroup of the bench's is made; None when there is none."""
    from ..core.devices import cgroup_memory_files

    for limit, _ in cgroup_memory_files():
        if Path(limit).is_file():
            return Path(limit).parent, Path(limit).name
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def memory_cgroup(cap_bytes: int):
    """A memory cgroup limited to `cap_bytes` under this process's own, removed on leaving: yields
    (the file a process writes its pid to, the file holding its peak charge), or None when none can be made."""
    found = _own_cgroup()
    group = found and found[0] / f"bench-streamed-{os.getpid()}"
    try:
        group.mkdir()
        (group / found[1]).write_text(str(cap_bytes))
    except (OSError, TypeError, AttributeError):
        if group and group.exists():
            group.rmdir()
        yield None
        return
    peak = "memory.peak" if found[1] == "memory.max" else "memory.max_usage_in_bytes"
    try:
        yield group / "cgroup.procs", group / peak
    finally:
        group.rmdir()  # its processes have ended (a cgroup with none is removed by rmdir)


def _run(*args, cgroup: Path | None = None) -> dict:
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    join = (lambda: cgroup.write_text(str(os.getpid()))) if cgroup else None  # in the child, before exec
    out = subprocess.run([sys.executable, "-m", "desktop_app.benchmarks.streamed", json.dumps(args)],
                         capture_output=True, text=True, env=env, timeout=7200, preexec_fn=join)
    if out.returncode:
        lines = out.stderr.strip().splitlines() or [f"(no message; exit status {out.returncode}: "
                                                     f"{'killed, out of memory?' if out.returncode < 0 else ''})"]
        raise SystemExit(f"bench streamed: a measured process failed: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench streamed")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--folder", default=None, metavar="DIR",
                    help="an existing checkpoint to measure (kept), instead of making --shape's in a temporary folder")
    ap.add_argument("--tokens", type=int_in(1, 32_768), default=1024, help="tokens traced (default 1024)")
    ap.add_argument("--new", type=int_in(0, 4096), default=2, help="tokens generated, greedy (default 2; 0: none)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="bfloat16",
                    help="compute dtype, both processes (default bfloat16, as the checkpoint is stored)")
    ap.add_argument("--memory-cap-gb", type=float_in(0, 1e5, lo_open=True), default=None, metavar="G",
                    help="the memory the capped process is told it has, GiB (default: 95%% of the weights')")
    args = ap.parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory(prefix="bench-streamed-") as tmp:
        if args.folder:
            folder, params = Path(args.folder), None
        else:
            folder = Path(tmp) / args.shape
            big = SHAPES[args.shape][1]["hidden_size"] >= 4096  # 16 GB and up: never whole in memory
            params = write_checkpoint_by_tensor(args.shape, folder) if big else make_checkpoint(args.shape, folder)[0]
        weights_gib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30
        cap = args.memory_cap_gb or 0.95 * weights_gib
        common = (str(folder), args.tokens, args.new, args.dtype)
        with memory_cgroup(int(cap * 2**30)) as cgroup:
            capped = _run(*common, cap, str(Path(tmp) / "capped.pt"), cgroup=cgroup and cgroup[0])
            cgroup_peak = int(_read(cgroup[1]) or 0) if cgroup else None
        print(f"capped: {json.dumps(capped)}; cgroup peak {cgroup_peak}", file=sys.stderr, flush=True)  # (a long run)
        whole = _run(*common, None, str(Path(tmp) / "whole.pt"))
        diff = float((torch.load(Path(tmp) / "capped.pt") - torch.load(Path(tmp) / "whole.pt")).abs().max())
    per_token = {}
    if args.new:
        per_token = {"capped_s_per_token": round(capped["generate_s_per_token"], 2),
                     "whole_s_per_token": round(whole["generate_s_per_token"], 2),
                     "same_generated_ids": capped["generated_ids"] == whole["generated_ids"]}
    result = {
        "name": "streamed", "shape": args.shape, "folder": args.folder, "params": params,
        "weights_gib": round(weights_gib, 2), "tokens": args.tokens, "dtype": capped["dtype"], "threads": capped["threads"],
        "memory_cap_gib": float(f"{cap:.4g}"),
        "cap": "cgroup (kernel-enforced) + the app's own" if cgroup else "the app's own (no memory cgroup could be made)",
        "cgroup_peak_gib": round(cgroup_peak / 2**30, 2) if cgroup_peak else None,
        "capped_streamed": capped["streamed"], "whole_streamed": whole["streamed"],
        "capped_peak_gib": round(capped["peak_mb"] / 1024, 2), "whole_peak_gib": round(whole["peak_mb"] / 1024, 2),
        "trace_held_gib": round(capped["trace_held_mb"] / 1024, 2),
        "capped_open_s": round(capped["load_s"], 2), "whole_open_s": round(whole["load_s"], 2),
        "capped_trace_s": round(capped["trace_s"], 2), "whole_trace_s": round(whole["trace_s"], 2),
        "capped_first_layer_s": round(capped["first_layer_s"], 2), "whole_first_layer_s": round(whole["first_layer_s"], 2),
        "time_ratio": round((capped["load_s"] + capped["trace_s"]) / (whole["load_s"] + whole["trace_s"]), 3),
        **per_token, "max_abs_logit_diff": diff,
    }
    for key, value in result.items():
        print(f"{key:28s} {value}", file=sys.stderr)
    return result


if __name__ == "__main__":  # a measured process: python -m desktop_app.benchmarks.streamed ARGS_JSON
    print(json.dumps(child(*json.loads(sys.argv[1]))))

"""`bench streamed`: a model larger than the memory the app is given, traced layer by layer (core/streamed.py),
against the same model held whole, in two processes on the same checkpoint.

The capped process sees at most --memory-cap-gb GiB available (core.devices.available_memory, what every
load and trace checks against), so it opens the checkpoint streamed; where this machine lets a memory
cgroup be made (v2 with the memory controller, or v1's memory hierarchy, under this process's own), the
capped process runs inside one limited to the same figure, so the kernel enforces the cap (the cgroup's
peak charge is reported; "cap" says which cap held). Its peak resident set (VmHWM) is reported beside the
cap, and the trace's logits must equal the uncapped ones. The cap (--memory-cap-gb, else 95% of the weights,
raised to halfway between what the run needs and the weights when the trace of --tokens needs more:
memory_cap) is checked against the checkpoint's config before any weights are made: one line names the cap
or the tokens to pass when the capped process would refuse. Prints the figures as one JSON line: the time
of open + trace (and of a few greedy tokens, --new; 0 for none) capped against uncapped.

--folder DIR measures an existing checkpoint (kept); otherwise one is made in a temporary folder, tensor by
tensor for the shapes past a few GB (scale.write_checkpoint_by_tensor: an 8B shape is never whole in memory).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..commands.args import OneLineParser, float_in, int_in
from .scale import SHAPES, _ids, _peak_mb, _rss_mb, make_checkpoint, shape_config, write_checkpoint_by_tensor


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


def needs(folder: Path, dtype: str) -> tuple[int, float, Callable[[int], int]]:
    """What the capped process's own checks will ask of its memory cap, from the checkpoint's config alone
    (nothing read): (the weights' bytes, which must exceed the cap for it to open streamed; the bytes it
    then keeps, embeddings, head and two layers, which must fit; the trace's estimate at a token count,
    which must fit too: app.tracing's check). The compute dtype: --dtype, or under "auto" the stored one
    (a float32 copy of half-precision weights never fits under a cap below them)."""
    import torch

    from ..app.tracing import trace_memory
    from ..core.checkpoints import LoadedModel, _MetaSkeleton, model_class, read_config, resident_bytes
    from ..core.devices import dtype_name, resolve_dtype

    cfg = read_config(folder)
    stored = resolve_dtype(cfg.dtype)
    compute = stored if dtype == "auto" else resolve_dtype(dtype)
    cfg = cfg.replace(dtype=dtype_name(compute))
    with torch.device("meta"), _MetaSkeleton():  # shapes only: what the estimates read
        model = model_class(cfg)(cfg, init_weights=False).to(compute)
    loaded = LoadedModel(model=model, config=cfg, tokenizer=None, path=folder, name=folder.name, stored_dtype=stored)
    return (cfg.parameter_estimate() * compute.itemsize, resident_bytes(cfg, compute.itemsize),
            lambda tokens: trace_memory(loaded, tokens, host_records=False).device)


def memory_cap(weights: int, resident: float, trace: Callable[[int], int], tokens: int,
               asked_gib: float | None) -> float:
    """The capped process's memory cap in GiB: `asked_gib`, or by default 95% of the weights, raised to
    halfway between what the run needs (the trace of `tokens`, or the resident set, whichever is more) and
    the weights when it needs more (1,024 tokens at the Llama-3.2-1B shape: 2.25 GiB against 2.19).
    SystemExit, one line, when no cap can both stream the model (below its weights) and let it run, or
    when the cap asked is below what the run needs (the capped process would refuse to trace): which cap
    or how many tokens to pass."""
    gib = 2**30
    need = max(trace(tokens), resident)
    if asked_gib is not None:
        if asked_gib * gib < need < weights:
            places = next((p for p in range(2, 10) if math.ceil(need / gib * 10**p) < weights / gib * 10**p), 10)
            lo, hi = math.ceil(need / gib * 10**places), math.ceil(weights / gib * 10**places) - 1
            raise SystemExit(f"bench streamed: --memory-cap-gb {asked_gib:g} is less than the {need / gib:.3g} GiB "
                             f"the run needs (the trace of {tokens} tokens, or what the model keeps read layer by "
                             f"layer, whichever is more): pass "
                             f"--memory-cap-gb from {lo / 10**places:.{places}f} to {hi / 10**places:.{places}f} "
                             f"(below the weights' {weights / gib:.3g} GiB)")
        return asked_gib  # (at or above the weights: the model opens whole, as the result's capped_streamed says)
    if resident >= weights:
        raise SystemExit(f"bench streamed: the model's embeddings, head and two layers ({resident / gib:.3g} GiB) are "
                         f"as much as its weights ({weights / gib:.3g} GiB): no cap below the weights lets it be read "
                         f"layer by layer")
    if need >= weights:
        most, hi = 0, tokens - 1  # the most tokens whose trace stays below the weights (it grows with them)
        while most < hi:
            mid = (most + hi + 1) // 2
            most, hi = (mid, hi) if trace(mid) < weights else (most, mid - 1)
        raise SystemExit(f"bench streamed: a trace of {tokens} tokens needs about {need / gib:.3g} GiB, as much as "
                         f"the weights' {weights / gib:.3g} GiB: no cap below the weights lets it run; "
                         f"pass --tokens {most} or fewer")
    return max(0.95 * weights, (need + weights) / 2) / gib


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
    from ..paths import package_on_path

    env = package_on_path(dict(os.environ))
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
                    help="the memory the capped process is told it has, GiB (default: 95%% of the weights', or more "
                         "when the trace of --tokens needs more: memory_cap)")
    args = ap.parse_args(argv)
    import torch

    from ..core.checkpoints import ModelLoadError

    with tempfile.TemporaryDirectory(prefix="bench-streamed-") as tmp:
        if args.folder:
            folder, params = Path(args.folder), None
        else:
            folder = Path(tmp) / args.shape
            config = shape_config(args.shape)  # first, as it will be written: the cap is checked before the weights are made
            config.dtype = torch.bfloat16
            config.save_pretrained(folder)
        try:
            cap = memory_cap(*needs(folder, args.dtype), args.tokens, args.memory_cap_gb)
        except ModelLoadError as exc:
            raise SystemExit(f"bench streamed: {exc}") from None
        if not args.folder:
            big = SHAPES[args.shape][1]["hidden_size"] >= 4096  # 16 GB and up: never whole in memory
            params = write_checkpoint_by_tensor(args.shape, folder) if big else make_checkpoint(args.shape, folder)[0]
        weights_gib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30
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

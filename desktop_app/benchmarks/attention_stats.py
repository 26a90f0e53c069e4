"""The Attention panel's rollout and head statistics (core.analysis) against float64 numpy, same process.

    python -m desktop_app bench attention_stats [--layers 24] [--heads 14] [--tokens 1024] [--repeat 2]

A trace's attention patterns of the shape (default Qwen2.5-0.5B's: 24 layers x 14 heads, 1,024 tokens),
in bfloat16 as such a model records them: causal softmaxes of random logits, their sharpness varying by head
(near uniform to a few tokens). The reference is the computation as it was before it moved to torch: each
layer widened to float32 then float64 in numpy, the statistics one head at a time, the rollout's products in
float64 (reference_rollout, reference_head_stats; the tests read them too). Both run on the threads the
panel's worker gets (threads.every_free_core), alternating --repeat times; each time is the least over
the runs. Reported: seconds, speedups (reference / ours) and the largest relative difference of ours from
the reference (rollout over its non-zero entries). The last line printed is the JSON result.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from ..commands.args import OneLineParser, int_in
from ..core import analysis
from ..core.trace import Trace


def reference_rollout(trace: Trace) -> np.ndarray:
    """[L, T, T] float64: analysis.attention_rollout as numpy computed it (the mean over heads summed in float64)."""
    out = None
    for l in range(trace.n_layers):
        a = analysis.attention_pattern(trace, l).mean(axis=0, dtype=np.float64)
        a = a + np.eye(a.shape[0])
        a = a / a.sum(axis=-1, keepdims=True)
        if out is None:
            out = np.empty((trace.n_layers, *a.shape))
            out[0] = a
        else:
            np.matmul(a, out[l - 1], out=out[l])
    return out


def reference_head_stats(trace: Trace) -> analysis.HeadStats:
    """analysis.head_stats as numpy computed it: each head in float64 (attention_entropy, attention_distance)."""
    ent, dist, first = [], [], []
    for l in range(trace.n_layers):
        heads = [m.astype(np.float64) for m in analysis.attention_pattern(trace, l)]
        ent.append([analysis.attention_entropy(p) for p in heads])
        dist.append([analysis.attention_distance(p) for p in heads])
        first.append([p[:, 0].mean() for p in heads])
    return analysis.HeadStats(np.array(ent), np.array(dist), np.array(first))


def causal_trace(layers: int, heads: int, tokens: int, seed: int = 0, dtype=torch.bfloat16) -> Trace:
    """A trace holding only attention patterns [1, heads, tokens, tokens]: causal softmaxes of random logits,
    head h's logits scaled by up to 8 (from near uniform to a few tokens), in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((heads, tokens, tokens), generator=g)
    masked = torch.ones((tokens, tokens), dtype=torch.bool).triu(1)
    trace = Trace()
    for l in range(layers):
        sharpness = torch.linspace(0.5, 8.0, heads).roll(l)[:, None, None]
        p = (logits.roll(l, dims=-1) * sharpness).masked_fill(masked, float("-inf")).softmax(-1)
        trace.record(f"blocks.{l}.attn.pattern", p.to(dtype)[None])
    return trace


def largest_relative_difference(ours: np.ndarray, reference: np.ndarray) -> float:
    """max |ours - reference| / |reference| over the reference's non-zero entries (0.0 when it has none);
    inf if ours is non-zero where the reference is zero."""
    nonzero = reference != 0
    if np.any(ours[~nonzero] != 0):
        return float("inf")
    if not nonzero.any():
        return 0.0
    return float(np.max(np.abs(ours[nonzero] - reference[nonzero]) / np.abs(reference[nonzero])))


def main(argv: list[str]) -> dict:
    from ..threads import every_free_core

    ap = OneLineParser(prog="bench attention_stats")
    ap.add_argument("--layers", type=int_in(1, 256), default=24)
    ap.add_argument("--heads", type=int_in(1, 256), default=14)
    ap.add_argument("--tokens", type=int_in(2, 8192), default=1024)
    ap.add_argument("--repeat", type=int_in(1, 100), default=2, help="alternating runs of each side (default 2)")
    args = ap.parse_args(argv)
    trace = causal_trace(args.layers, args.heads, args.tokens)
    times = {key: [] for key in ("rollout_ours", "rollout_reference", "stats_ours", "stats_reference")}

    def timed(key, fn):
        t0 = time.perf_counter()
        result = fn()
        times[key].append(time.perf_counter() - t0)
        return result

    with every_free_core():
        threads = torch.get_num_threads()
        for _ in range(args.repeat):  # alternating: both sides see the same machine load
            ref_rollout = timed("rollout_reference", lambda: reference_rollout(trace))
            rollout = timed("rollout_ours", lambda: analysis.attention_rollout(trace))
            ref_stats = timed("stats_reference", lambda: reference_head_stats(trace))
            stats = timed("stats_ours", lambda: analysis.head_stats(trace))
    best = {key: min(v) for key, v in times.items()}
    out = {"name": "attention_stats", "layers": args.layers, "heads": args.heads, "tokens": args.tokens,
           "repeats": args.repeat, "threads": threads}
    for what in ("rollout", "stats"):
        out[f"{what}_ours_s"] = round(best[f"{what}_ours"], 3)
        out[f"{what}_reference_s"] = round(best[f"{what}_reference"], 3)
        out[f"{what}_speedup"] = round(best[f"{what}_reference"] / best[f"{what}_ours"], 2)
    ours_s, ref_s = best["rollout_ours"] + best["stats_ours"], best["rollout_reference"] + best["stats_reference"]
    out.update(ours_s=round(ours_s, 3), reference_s=round(ref_s, 3), speedup=round(ref_s / ours_s, 2))
    out["rollout_max_rel_diff"] = largest_relative_difference(rollout, ref_rollout)
    for name, values in stats.as_dict().items():
        out[f"{name}_max_rel_diff"] = largest_relative_difference(values, ref_stats.as_dict()[name])
    out["load_average"] = round(os.getloadavg()[0], 2)
    return out

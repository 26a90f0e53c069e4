"""Benchmarks: each prints ratios against a reference run in the same process (see commands/bench.py)."""
from __future__ import annotations

import time
from typing import Callable


def best_time(fn: Callable[[], object], repeat: int = 3) -> float:
    """Fastest of `repeat` wall-clock runs: the least disturbed by a noisy machine."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

"""Benchmarks: each prints ratios against a reference run in the same process (see commands/bench.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
# the references benchmarks measure against that the app itself never imports: pyproject.toml's [bench] extra
BENCH_EXTRA = ("transformers",)


def needs_extra(exc: ModuleNotFoundError) -> str | None:
    """One line for a benchmark whose reference is not installed (an install without the [bench] extra); None
    for another missing module (a bug: its traceback is kept)."""
    missing = (exc.name or "").split(".")[0]
    if missing not in BENCH_EXTRA:
        return None
    return f"needs {missing}, the reference it measures against: pip install 'transformer-explorer[bench]'"


def best_time(fn: Callable[[], object], repeat: int = 3) -> float:
    """Fastest of `repeat` wall-clock runs: the least disturbed by a noisy machine."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a benchmark launches and times: this one's, with this checkout first on the
    path (the child runs the same code) and `extra` set. An installed app has its bytecode compiled (pip does it,
    as it did torch's and transformers'), so a setting that stops Python caching it is dropped: with it every
    launch compiled the app's ~100 modules from source (0.2-0.4 s of ours, nothing of the reference's). Installed
    (REPO a site folder), PYTHONPATH is left as it is (paths.package_on_path)."""
    from ..paths import package_on_path

    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return package_on_path(env, REPO)  # not when installed: site-packages first would shadow the standard library

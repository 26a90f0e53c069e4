"""`python -m desktop_app bench NAME [args]`: benchmarks that print ratios against a reference.

Each benchmark is desktop_app/benchmarks/<name>.py with `main(argv) -> dict`; the dict is
printed as one JSON line (keys name, ours_s, reference_s, speedup or ratio, ...); `bench quick` runs them
all at a small size and prints one table.
"""
from __future__ import annotations

import argparse
import sys

BENCHMARKS = ("load", "generation", "lipschitz", "training", "render", "startup", "dynamics", "memory", "scale", "busy",
              "graph", "graph_view", "streamed", "firstlook", "generate_launch", "attention_stats", "ui", "quick")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark: " + ", ".join(BENCHMARKS))
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of that benchmark")
    p.set_defaults(func=run)


def run(args) -> int:
    import importlib
    import json

    try:
        result = importlib.import_module(f"desktop_app.benchmarks.{args.name}").main(args.rest)
    except ModuleNotFoundError as exc:
        from ..benchmarks import needs_extra

        if (line := needs_extra(exc)) is None:
            raise
        print(f"error: bench {args.name} {line}", file=sys.stderr)
        return 2
    if result is not None:  # bench quick prints its own table
        print(json.dumps(result))
    return 0

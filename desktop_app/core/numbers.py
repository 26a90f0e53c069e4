"""A number's allowed range, stated once with its one-line message (no argparse, no Qt).

`Range(int, 1).problem(0)` is "must be an integer >= 1, got 0". core checks values read from files
with it (core.training.options: TrainConfig's settings); the CLI's argparse types
(app/arguments.py's Number) are Ranges too, so a flag and a file meet the same limits and messages.
Infinities and NaN are refused everywhere.
"""
from __future__ import annotations

import math

# the largest count any option takes (steps, samples, tokens...): beyond it a run would never end
MAX_COUNT = 10**9
MAX_SEED = 2**63 - 1


class Range:
    """An int or a finite float within [lo, hi] (an end may be open or absent)."""

    def __init__(self, kind: type, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False, note: str = "") -> None:
        self.kind, self.lo, self.hi, self.lo_open, self.hi_open, self.note = kind, lo, hi, lo_open, hi_open, note

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            return (f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
                    if self.kind is float or self.lo_open or self.hi_open else
                    f"an integer from {self.lo:,} to {self.hi:,}")
        if self.lo is not None:
            word = {(int, False): "an integer >=", (int, True): "an integer >",
                    (float, False): ">=", (float, True): ">"}[(self.kind, self.lo_open)]
            return f"{word} {self.lo:g}" if self.kind is float else f"{word} {self.lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return "an integer" if self.kind is int else "a finite number"

    def problem(self, value) -> str:
        """'' when `value` (a number, e.g. from a JSON file) is allowed, else 'must be ..., got VALUE'."""
        bad = f"must be {self.describe()}{self.note}, got {value!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return bad
        if self.kind is int and not isinstance(value, int):
            return bad
        if not math.isfinite(value):
            return bad
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return bad
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            return bad
        return ""

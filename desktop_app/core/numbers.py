"""A number's allowed range, stated once with its one-line message (no argparse, no Qt).

`Range(int, 1).problem(0)` is "must be an integer >= 1, got 0". core checks values read from files
with it (core.training.options: TrainConfig's settings); the CLI's argparse types
(app/arguments.py's Number) are Ranges too, so a flag and a file meet the same limits and messages.
Infinities and NaN are refused everywhere.

Numbers typed by a person (options, token ids, layer ranges, lengths, sizes) are read by parse_int and
parse_float: ASCII digits only, as a person reads them. Python's int() and float() also take '1_000' and
other scripts' digits ('٣' Arabic-Indic, '３' full-width), which a paste or a typo makes and nobody expects
to be a number: those are refused.
"""
from __future__ import annotations

import math
import re

# the largest count any option takes (steps, samples, tokens...): beyond it a run would never end
MAX_COUNT = 10**9
MAX_SEED = 2**63 - 1

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


def parse_int(text: str) -> int:
    """An integer as typed: ASCII digits with an optional sign ("12", "-3"; spaces around it dropped).
    ValueError for anything else, '1_000' and '٣' included (int() takes them)."""
    text = str(text).strip()
    if not _INT.fullmatch(text):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def parse_float(text: str) -> float:
    """A number as typed: ASCII digits, a point, an exponent ("0.5", "-1e-3", ".5"), or inf / nan (which a
    Range then refuses by name). ValueError for anything else, '1_000.5' and '３' included (float() takes them)."""
    text = str(text).strip()
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


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


# every number a generation takes (core/generation), declared once: GenerationSettings and generate() check them
# (a script's generate(max_new=2.5) was a TypeError deep in the run, max_new=-1 nothing at all), and the generate
# command's options are argparse types of them. length_penalty (beam search, transformers'): a finished hypothesis
# scores its log-probability / generated length ** it, > 0 favouring longer ones; bounded so that length ** it
# stays a float at any context length. Here, not in core/generation: the command line reads them without torch.
GENERATION = {"max_new": Range(int, 0, MAX_COUNT), "temperature": Range(float, 0, 1e6),
              "top_k": Range(int, 0, MAX_COUNT, note=" (0: off)"), "top_p": Range(float, 0, 1, lo_open=True),
              "beams": Range(int, 1, MAX_COUNT), "length_penalty": Range(float, -10.0, 10.0),
              "seed": Range(int, 0, MAX_SEED)}

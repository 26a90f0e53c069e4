"""Every numeric option's range, declared where the option is: argparse `type=` factories, shared by
both front ends (the CLI's subcommands and the GUI's own command line, ui/app.py).

`p.add_argument("--top-p", type=probability)` makes argparse itself refuse `--top-p 2` in one line
("argument --top-p: must be in (0, 1], got 2", exit 2) before any work. Infinities and NaN are
refused everywhere, and so are digits other than ASCII's and underscores ('٣', '1_000': core.numbers.parse_int).
A Number is a core.numbers.Range: values read from a file meet the same limits
and messages (`Number.of(range)` makes the type of a range declared elsewhere, e.g. a training option's).
"""
from __future__ import annotations

import argparse
import re

from ..core.numbers import MAX_COUNT, MAX_SEED, Range, parse_float, parse_int


class Number(Range):
    """An argparse type: an int or a finite float within [lo, hi] (an end may be open or absent); its
    range and messages are core.numbers.Range's."""

    def __init__(self, kind: type, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False, note: str = "") -> None:
        super().__init__(kind, lo, hi, lo_open=lo_open, hi_open=hi_open, note=note)
        self.__name__ = kind.__name__  # argparse names the type in some messages

    @classmethod
    def of(cls, limit: Range) -> "Number":
        """The argparse type of a range declared elsewhere (e.g. a training option's)."""
        return cls(limit.kind, limit.lo, limit.hi, lo_open=limit.lo_open, hi_open=limit.hi_open, note=limit.note)

    def __call__(self, text: str):
        try:
            value = parse_int(text) if self.kind is int else parse_float(text)  # ASCII digits: not '1_000', '٣'
        except ValueError:
            typed = "; write it in the digits 0-9, without '_'" if "_" in text or not text.isascii() else ""
            raise argparse.ArgumentTypeError(
                f"must be {self.describe()}{self.note}, got {text!r}{typed}") from None
        problem = self.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem.replace(f"got {value!r}", f"got {text}"))
        return value


def int_in(lo: int | None = None, hi: int | None = MAX_COUNT, note: str = "") -> Number:
    return Number(int, lo, hi, note=note)


def float_in(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
             note: str = "") -> Number:
    return Number(float, lo, hi, lo_open=lo_open, hi_open=hi_open, note=note)


positive_int = int_in(1)  # counts: steps, samples, layers, tokens...
count = int_in(0)  # a count that may be 0
seed = int_in(0, MAX_SEED)
index = int_in(-MAX_COUNT, MAX_COUNT)  # a position or token index (negative counts from the end)
layer_or_head = int_in(0, 10**6)
positive = float_in(0, 1e6, lo_open=True)  # a step size, tolerance, radius, learning rate...
non_negative = float_in(0, 1e6)
probability = float_in(0, 1, lo_open=True)  # a share or a nucleus: (0, 1]
unit = float_in(0, 1)  # [0, 1]
signed = float_in(-1e6, 1e6)  # a scale that may be negative


_DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps)")


def device(text: str) -> str:
    """--device: cpu, cuda, cuda:N or mps (auto too where the option says so), present on this machine."""
    from ..core.devices import available_devices

    present = available_devices()
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or mps, got {text!r} "
                                         f"(this machine has: {', '.join(present)})")
    if text == "cuda" and any(d.startswith("cuda") for d in present):
        return text
    if text.startswith("cuda:") and "cuda" in present and text == "cuda:0":
        return text
    if text not in present:
        raise argparse.ArgumentTypeError(f"{text} is not available on this machine (it has: {', '.join(present)})")
    return text


def devices(text: str) -> str:
    """--devices: two or more devices, comma-separated (cuda:0,cuda:1), each present: the model's layers
    placed across them (core/streamed.place_blocks)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if len(names) < 2:
        raise argparse.ArgumentTypeError(f"give two or more devices, comma-separated (cuda:0,cuda:1), got {text!r}; "
                                         f"one device is --device")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a device is listed twice in {text!r}")
    return ",".join(device(name) for name in names)


DEVICES_HELP = "layers placed across several devices, e.g. cuda:0,cuda:1 (instead of --device)"


def device_or_auto(text: str) -> str:
    return text if text == "auto" else device(text)

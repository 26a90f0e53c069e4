"""Every numeric option's range, declared where the option is: argparse `type=` factories, and the parser that
refuses in one line (OneLineParser), shared by both front ends (the CLI's subcommands and the GUI's own command
line, ui/app.py).

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


def device(text: str) -> str:
    """--device: cpu, cuda, cuda:N or mps (auto too where the option says so), present on this machine
    (core.devices.device_problem: the rule a script's load_model_file(device=...) meets too)."""
    from ..core.devices import device_problem

    if problem := device_problem(text):
        raise argparse.ArgumentTypeError(problem)
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


# A value that starts with '-': a negative number or range ("-1:1", "-1e-3", "-.5", "-inf"). No option is
# named so (every option is --word, or -h), so it is always an option's value or a positional.
_SIGNED_VALUE = re.compile(r"-([0-9]|\.[0-9]|:)|-(inf|infinity|nan)$", re.IGNORECASE)
_NO_VALUE = re.compile(r"argument (\S+): expected one argument")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr ("PROG: error: argument --top-p: must be
    in (0, 1], got 2 (see --help)"), exit 2, without the usage block (which --help still shows).
    A value that starts with '-' and a digit, '.' or ':' is a value (`--layers -1:1`, `--steer-scale -1e-3`);
    argparse takes only "-1" and "-0.5" so, and said "expected one argument" of the rest. Another value that
    starts with '-' (`--text -x`) is written `--text=-x`, which the refusal says."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{self._dash_hint(message)} (see {self.prog} --help)\n")

    def _dash_hint(self, message: str) -> str:
        """For "argument --text: expected one argument" when what followed --text starts with one '-': how to
        give it."""
        m = _NO_VALUE.fullmatch(message)
        given = getattr(self, "_given", [])
        for option, value in zip(given, given[1:]):
            if m and option in m[1].split("/") and value.startswith("-") and not value.startswith("--"):  # (an
                # option there: the value was forgotten)
                return f" (a value that starts with '-' is written {option}={value})"
        return ""

    def _parse_optional(self, arg_string):
        if _SIGNED_VALUE.match(arg_string) and arg_string not in self._option_string_actions:
            return None  # a value, not an unknown option
        return super()._parse_optional(arg_string)

    def parse_known_args(self, args=None, namespace=None):
        import sys

        self._given = list(sys.argv[1:] if args is None else args)  # (for _dash_hint)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unknown argument is refused by the subcommand that got it ("python -m
        desktop_app generate: error: unrecognized arguments: --max-new-tokens 2 (did you mean --max-new?)
        (see python -m desktop_app generate --help)"), not by the top parser with the top-level help."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(ns)._refuse_unknown(extras)
        return ns

    def _chosen(self, ns) -> "OneLineParser":
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(ns, action.dest, None))
                if isinstance(sub, OneLineParser):
                    return sub._chosen(ns)
        return self

    def _refuse_unknown(self, extras: list[str]) -> None:
        import difflib

        options = [s for a in self._actions for s in a.option_strings]
        close = [m[0] for e in extras if e.startswith("--")
                 for m in [difflib.get_close_matches(e.split("=", 1)[0], options, n=1, cutoff=0.6)] if m]
        hint = f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")

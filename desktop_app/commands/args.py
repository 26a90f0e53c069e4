"""The CLI's argument helpers: the numeric argparse types (declared in app/arguments.py, which the GUI's
command line shares: imported from here by every subcommand), the one --overwrite, and the parser that
refuses in one line.
"""
from __future__ import annotations

import argparse
import re

from ..app.arguments import (DEVICES_HELP, Number, count, device, device_or_auto, devices, float_in, index,  # noqa: F401
                             int_in,  # the
                             layer_or_head, non_negative, positive, positive_int, probability, seed,  # CLI's
                             signed, unit)  # import point for the argparse types


OVERWRITE_HELP = ("replace an existing output file (without it an existing file is refused and kept); a symbolic "
                  "link, folder, device or pipe is never written, even with --overwrite")


def add_overwrite_argument(p) -> None:
    """The one --overwrite of every command that writes named output files (core.files.check_output_file)."""
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


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

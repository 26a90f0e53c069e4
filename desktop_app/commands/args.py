"""The CLI's argument helpers: the numeric argparse types (declared in app/arguments.py, which the GUI's
command line shares: imported from here by every subcommand), the one --overwrite, and the parser that
refuses in one line.
"""
from __future__ import annotations

import argparse

from ..app.arguments import (Number, count, device, device_or_auto, float_in, index, int_in,  # noqa: F401 - the
                             layer_or_head, non_negative, positive, positive_int, probability, seed,  # CLI's
                             signed, unit)  # import point for the argparse types


OVERWRITE_HELP = ("replace an existing output file (without it an existing file is refused and kept); a symbolic "
                  "link, folder, device or pipe is never written, even with --overwrite")


def add_overwrite_argument(p) -> None:
    """The one --overwrite of every command that writes named output files (core.files.check_output_file)."""
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr ("PROG: error: argument --top-p: must be
    in (0, 1], got 2 (see --help)"), exit 2, without the usage block (which --help still shows)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

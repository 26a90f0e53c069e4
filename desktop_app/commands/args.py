"""The CLI's argument helpers: the numeric argparse types and the parser that refuses in one line (declared in
app/arguments.py, which the GUI's command line shares: imported from here by every subcommand), and the one
--overwrite.
"""
from __future__ import annotations

from ..app.arguments import (DEVICES_HELP, Number, OneLineParser, count, device, device_or_auto, devices, float_in,
                             index, int_in, layer_or_head, non_negative, positive, positive_int, probability, seed,
                             signed, unit)

# the CLI's import point for the argparse types and the parser (the GUI's command line takes them from app/arguments.py)
__all__ = ["DEVICES_HELP", "Number", "OneLineParser", "count", "device", "device_or_auto", "devices", "float_in",
           "index", "int_in", "layer_or_head", "non_negative", "positive", "positive_int", "probability", "seed",
           "signed", "unit", "OVERWRITE_HELP", "add_overwrite_argument"]


OVERWRITE_HELP = ("replace an existing output file (without it an existing file is refused and kept); a symbolic "
                  "link, folder, device or pipe is never written, even with --overwrite")


def add_overwrite_argument(p) -> None:
    """The one --overwrite of every command that writes named output files (core.files.check_output_file)."""
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

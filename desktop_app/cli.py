"""Headless subcommands over the same core functions the panels call.

Each subcommand lives in desktop_app/commands/<name>.py with `add_parser(subparsers)`, which
registers its arguments and sets `func(args) -> int`. Imports are lazy so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("info", "trace", "generate", "render", "lipschitz", "train", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m desktop_app", description="Transformer Explorer, headless.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"desktop_app.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"desktop_app.commands.{name}":
                raise
            continue  # a subcommand not built yet
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear one-line message, not a traceback, for expected failures
        from .core.checkpoints import ModelLoadError
        if isinstance(exc, (ModelLoadError, ValueError, FileNotFoundError)):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

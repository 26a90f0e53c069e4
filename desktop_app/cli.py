"""Headless subcommands over the same core functions the panels call.

Each subcommand lives in desktop_app/commands/<name>.py with `add_parser(subparsers)`, which
registers its arguments and sets `func(args) -> int`. Imports are lazy so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .app.command_line import COMMANDS, COMMANDS_HELP, EXIT_DIVERGED, EXIT_INPUT, EXIT_WRITE  # noqa: F401 (re-exported)

EPILOG = ("exit status: 0 success, 2 bad input (one line says which file and why), 3 training diverged, "
          "4 an output could not be written (one line names the path and the reason), 130 interrupted.")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with `only` (a command's name) that command's alone: each command module imports
    what its options need (the dynamics, training, generation modules...), ~0.2-0.6 s for all of them, which
    a run of one command should not pay."""
    from .commands.args import OneLineParser  # every subcommand's parser refuses in one line

    parser = OneLineParser(prog="python -m desktop_app", description="Transformer Explorer, headless.",
                           epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ((only,) if only in COMMANDS else COMMANDS):
        try:
            module = importlib.import_module(f"desktop_app.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"desktop_app.commands.{name}":
                raise
            continue  # a subcommand not built yet
        module.add_parser(sub)
    from .commands import add_step_arguments
    add_step_arguments(sub)  # RUN_DIR --step N on every command that takes a model
    for sp in sub.choices.values():  # `python -m desktop_app --help` is the GUI's: say it on every command
        sp.epilog = f"{sp.epilog}\n\n{EPILOG}" if sp.epilog else EPILOG
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command's arguments. Building its parser imports the command's modules (torch with most): with
    garbage collection off, what they made then frozen (imports.kept_for_good)."""
    from .imports import kept_for_good

    with kept_for_good():
        parser = build_parser(only=argv[0] if argv else None)
    return parser.parse_args(argv)


EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell shows for a command whose reader went away


def output_reader_gone() -> int:
    """stdout's reader has closed the pipe (`te-cli families | head -3`): nothing more can be shown, and that is
    no error to report (it read "error: Broken pipe"). stdout goes to the null device so that no later flush
    fails again (Python's own advice for SIGPIPE); the exit status is a shell's for SIGPIPE."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # (no stdout file descriptor to replace)
        pass
    return EXIT_PIPE_CLOSED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command not in ("bench", "families"):  # a benchmark sets its own threads; families runs no model
        from .threads import fit_torch_threads

        fit_torch_threads()  # the cores free now, not every core (a busy machine: threads.py)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`... | head -3`)
        return output_reader_gone()
    except Exception as exc:  # a clear one-line message, not a traceback, for expected failures
        from .core.checkpoints import ModelLoadError
        from .core.files import WriteError
        if isinstance(exc, WriteError):
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_WRITE
        if isinstance(exc, (ModelLoadError, ValueError, FileNotFoundError)):
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INPUT
        if isinstance(exc, RecursionError):  # e.g. a deeply nested JSON file somewhere not caught closer
            print("error: an input is nested too deeply to be read", file=sys.stderr)
            return EXIT_INPUT
        if isinstance(exc, OSError):  # reading failed (permissions, a folder where a file was expected...)
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
            return EXIT_INPUT
        raise


if __name__ == "__main__":
    sys.exit(main())

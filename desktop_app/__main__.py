"""`python -m desktop_app`: no arguments opens the GUI; a subcommand runs the headless CLI."""
import sys


def unknown_command(word: str) -> str | None:
    """The one-line refusal of a first argument that reads as a mistyped subcommand ('generat'): a plain
    word that is not a command, not an existing path and not a model in the local Hugging Face cache
    (then the GUI opens it). None when the GUI should get it."""
    import difflib
    import os
    import re

    from .cli import COMMANDS

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", word) or os.path.lexists(word):
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if not close:
        from .core.hf_cache import NotInCacheError, find_in_cache
        try:
            if find_in_cache(word) is not None:
                return None
        except NotInCacheError:  # cached, with a bad ref: the loader says which
            return None
    hint = f"did you mean {close[0]}?" if close else f"commands: {', '.join(COMMANDS)}; a model folder must exist"
    return f"python -m desktop_app: error: unknown command {word!r} ({hint})"


def main() -> int:
    from .cli import COMMANDS

    argv = sys.argv[1:]
    if argv and argv[0] in COMMANDS:
        from .cli import main as cli_main
        return cli_main(argv)
    if argv and (problem := unknown_command(argv[0])):
        print(problem, file=sys.stderr)
        return 2
    from .ui.app import main as gui_main
    return gui_main(argv)


if __name__ == "__main__":
    sys.exit(main())

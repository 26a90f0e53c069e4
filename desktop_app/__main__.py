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


def exit_when_done(rc: int) -> int:
    """After a headless command (`python -m desktop_app COMMAND`, never the GUI) returned: run the atexit
    callbacks, flush stdout and stderr, then os._exit(rc). The interpreter's normal exit once torch is imported
    (module teardown, every object freed) costs 0.16-0.8 s, up to a fifth of a Lipschitz run (issue 38); the
    atexit callbacks alone take 6-9 ms. Every output was written, atomically, and closed before the command
    returned; the callbacks are what else an exit promises: logging.shutdown (a log file's last lines),
    weakref.finalize's (a tempfile.TemporaryDirectory still held is removed), multiprocessing's finalizers.
    The normal exit is kept (rc returned) where something may still need it: another non-daemon thread alive
    (threading's own exit joins it, and a thread pool's), multiprocessing children to join, Qt loaded (render)."""
    import atexit
    import os
    import threading

    from .cli import COMMANDS

    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS or "PySide6" in sys.modules:
        return rc
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return rc
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.active_children():
        return rc
    atexit._run_exitfuncs()  # no public name; it runs and clears them as the normal exit would, errors printed
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # stdout's reader went away before the last of it was written
        from .cli import output_reader_gone
        os._exit(output_reader_gone())
    except (OSError, ValueError):  # a closed pipe or stream: the normal exit reports it
        return rc
    os._exit(rc)


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
    sys.exit(exit_when_done(main()))

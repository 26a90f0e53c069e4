"""How a run (a model's, `train`; a dictionary's, `train --task sae`) is driven from outside while it trains."""
from __future__ import annotations

import signal
import sys
import threading


def take_control(args, control) -> dict:
    """How a run (a model's or a dictionary's) is driven from outside: with --control-stdin the lines
    "pause", "resume" and "stop" on stdin (stdin closed: stop); SIGTERM and the first Ctrl-C stop cleanly,
    with a checkpoint, a second Ctrl-C interrupts. Returns the signal handlers it replaced (put them back
    with `signal.signal` when the run ends)."""
    if args.control_stdin:
        def read_commands() -> None:
            for line in sys.stdin:
                cmd = line.strip().lower()
                if cmd == "pause":
                    control.pause()
                elif cmd == "resume":
                    control.resume()
                elif cmd == "stop":
                    control.resume()
                    control.cancel()
            control.resume()  # stdin closed: the controlling window is gone, stop with a checkpoint
            control.cancel()
        threading.Thread(target=read_commands, daemon=True).start()
    previous = {}
    try:
        def stop(signum, frame):
            control.cancel()
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread (tests calling run() from a worker)
        pass
    return previous

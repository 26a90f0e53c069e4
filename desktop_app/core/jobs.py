"""How long core functions report progress and learn they should stop, without knowing about Qt.

A long core function takes `job: JobControl | None = None`, calls `job.progress(done, total, msg)`
as it goes and `job.check()` at safe points; check() raises Cancelled once cancel() was called,
and also once the program's main thread has ended: a job left running (or paused) in a background
thread by code that failed or forgot to stop it ends at its next check instead of keeping the
interpreter alive forever (Python waits for non-daemon threads at exit).
The UI's workers wire progress to a signal and Cancel to cancel(); the CLI prints or ignores it.
TimeLeft says how long is left, for both (the CLI's progress lines, a panel's progress bar).
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class Cancelled(Exception):
    """The user asked the job to stop."""


class JobControl:
    def __init__(self, on_progress: Callable[[int, int, str], None] | None = None) -> None:
        self._cancel = threading.Event()
        self._on_progress = on_progress
        self._waits: list[threading.Event] = []  # the events wait() blocks on: cancel() sets them too

    def cancel(self) -> None:
        self._cancel.set()
        for event in list(self._waits):
            event.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        if self._cancel.is_set() or not threading.main_thread().is_alive():
            raise Cancelled()

    def wait(self, event: threading.Event) -> None:
        """Block until `event` is set (by another thread), without polling; a cancel ends the wait by setting
        `event` too, and then raises Cancelled."""
        self._waits.append(event)
        try:
            if not self._cancel.is_set():  # (a cancel from here on sets `event`)
                event.wait()
        finally:
            self._waits.remove(event)
        self.check()

    def progress(self, done: int, total: int, message: str = "") -> None:
        if self._on_progress is not None:
            self._on_progress(done, total, message)
        self.check()


def report(job: JobControl | None, done: int, total: int, message: str = "") -> None:
    """progress() that accepts job=None, so core code needs no if around every call."""
    if job is not None:
        job.progress(done, total, message)


class TimeLeft:
    """How long a job has left, from its rate since it started (made when it starts)."""

    clock = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self.start = self.clock()

    def rate(self, done: int) -> float:
        """Units done per second so far."""
        return done / max(self.clock() - self.start, 1e-9)

    def phrase(self, done: int, total: int) -> str:
        """'about 21 s left' (min, h when longer); '' before the first unit is done and once all are."""
        if not 0 < done < total:
            return ""
        left = (total - done) / self.rate(done)
        when = f"{left:.0f} s" if left < 90 else f"{left / 60:.1f} min" if left < 5400 else f"{left / 3600:.1f} h"
        return f"about {when} left"

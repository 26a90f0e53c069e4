"""Run one core function off the UI thread, with progress, cancel and errors back as signals.

    job = run_job(core_fn, arg1, kw=..., on_result=..., on_error=..., on_progress=...)
    cancel_button.clicked.connect(job.cancel)

If `core_fn` accepts a `job` keyword it receives a core.jobs.JobControl: its progress() reaches
`on_progress(done, total, message)` on the UI thread and cancel() makes its check() raise
Cancelled, which ends the job quietly (on_cancelled, not on_error).
"""
from __future__ import annotations

import inspect
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from ..core.jobs import Cancelled, JobControl


class _Signals(QObject):
    result = Signal(object)
    error = Signal(object)  # (exception, traceback text)
    progress = Signal(int, int, str)
    cancelled = Signal()
    finished = Signal()


class Job(QRunnable):
    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.setAutoDelete(False)  # the caller may keep a handle to cancel it
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.signals = _Signals()
        self.control = JobControl(on_progress=lambda d, t, m: self.signals.progress.emit(int(d), int(t), str(m)))
        self.done = False
        try:
            self._takes_job = "job" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            self._takes_job = False

    def cancel(self) -> None:
        self.control.cancel()

    def run(self) -> None:  # worker thread
        try:
            kwargs = dict(self.kwargs)
            if self._takes_job:
                kwargs["job"] = self.control
            result = self.fn(*self.args, **kwargs)
        except Cancelled:
            self.signals.cancelled.emit()
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the UI, not kill the thread
            self.signals.error.emit((exc, traceback.format_exc()))
        else:
            self.signals.result.emit(result)
        finally:
            self.done = True
            self.signals.finished.emit()


_active: set[Job] = set()  # keep Python wrappers alive until their signals have fired


def run_job(fn: Callable[..., Any], *args: Any, on_result: Callable[[Any], None] | None = None,
            on_error: Callable[[BaseException, str], None] | None = None,
            on_progress: Callable[[int, int, str], None] | None = None,
            on_cancelled: Callable[[], None] | None = None,
            on_finished: Callable[[], None] | None = None,
            pool: QThreadPool | None = None, **kwargs: Any) -> Job:
    job = Job(fn, args, kwargs)
    if on_result:
        job.signals.result.connect(on_result)
    if on_error:
        job.signals.error.connect(lambda e: on_error(e[0], e[1]))
    if on_progress:
        job.signals.progress.connect(on_progress)
    if on_cancelled:
        job.signals.cancelled.connect(on_cancelled)
    if on_finished:
        job.signals.finished.connect(on_finished)
    _active.add(job)
    job.signals.finished.connect(lambda: _active.discard(job))
    (pool or QThreadPool.globalInstance()).start(job)
    return job

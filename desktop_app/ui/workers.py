"""Run one core function off the UI thread, with progress, cancel and errors back as signals.

    job = run_job(core_fn, arg1, kw=..., on_result=..., on_error=..., on_progress=...)
    cancel_button.clicked.connect(job.cancel)

If `core_fn` accepts a `job` keyword it receives a core.jobs.JobControl: its progress() reaches
`on_progress(done, total, message)` on the UI thread and cancel() makes its check() raise
Cancelled, which ends the job quietly (on_cancelled, not on_error). If it accepts a `partial`
keyword it receives a function that hands a piece of the result (e.g. a trace's first layers) to
`on_partial(piece)` on the UI thread, in order, before the result.

With `accept=` (a function of no arguments) the result, error and progress are delivered only while
it returns True: AppState.run passes "the inputs this was computed for are still current", so a
result for a model or text no longer shown never arrives (cancelled and finished always do).

A job never calls back into a widget that is gone: its owner (`owner=`, else the QObject whose
bound method is a callback) being destroyed cancels the job and drops whatever it still delivers,
and `shutdown()` (the main window's close, the application's quit) does the same for every job and
waits briefly for the worker threads, so nothing runs into a deleted object after the window closed.
"""
from __future__ import annotations

import inspect
import traceback
from typing import Any, Callable

from PySide6.QtCore import QCoreApplication, QObject, QRunnable, QThreadPool, Signal

from ..core.jobs import Cancelled, JobControl


class _Signals(QObject):
    result = Signal(object)
    error = Signal(object)  # (exception, traceback text)
    progress = Signal(int, int, str)
    partial = Signal(object)  # a piece of the result, before it (the `partial` keyword)
    cancelled = Signal()
    finished = Signal()


class Job(QRunnable):
    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.setAutoDelete(False)  # the caller may keep a handle to cancel it
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.signals = _Signals()
        self.control = JobControl(on_progress=lambda d, t, m: self._emit(self.signals.progress, int(d), int(t), str(m)))
        self.done = False
        self.detached = False  # deliver nothing more
        self.pool: QThreadPool | None = None
        self.key = None  # AppState.run: the InputKey the job computes for
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            parameters = {}
        self._takes_job = "job" in parameters
        self._takes_partial = "partial" in parameters

    def cancel(self) -> None:
        self.control.cancel()

    def detach(self) -> None:
        """Cancel and drop every later delivery (the receiver is going away)."""
        self.detached = True
        self.control.cancel()

    def _emit(self, signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:  # "Signal source has been deleted": the application is tearing down
            self.detached = True
            self.control.cancel()

    def run(self) -> None:  # worker thread
        try:
            kwargs = dict(self.kwargs)
            if self._takes_job:
                kwargs["job"] = self.control
            if self._takes_partial:
                kwargs["partial"] = lambda piece: self._emit(self.signals.partial, piece)
            result = self.fn(*self.args, **kwargs)
        except Cancelled:
            self._emit(self.signals.cancelled)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the UI, not kill the thread
            if self.detached:  # e.g. a callback into a receiver deleted meanwhile: nobody to tell
                self._emit(self.signals.cancelled)
            else:
                self._emit(self.signals.error, (exc, traceback.format_exc()))
        else:
            self._emit(self.signals.result, result)
        finally:
            self.done = True
            self._emit(self.signals.finished)


_active: set[Job] = set()  # keep Python wrappers alive until their signals have fired

# Jobs wait on each other and on people: a trace holds its thread while the rows of its first layers are
# made in another job, and a paused training (or dictionary training) holds one for as long as it stays
# paused. Qt's pool has one thread per core the process may use, so on one core (a small VM, taskset) they
# ran one after the other: the first rows waited for the whole trace, and a paused training stopped every
# other panel. Threads that wait cost nothing; those that compute share the cores.
WORKER_THREADS_AT_LEAST = 4
_quit_hooked = False


def _owner_of(callbacks) -> QObject | None:
    for cb in callbacks:
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, QObject):
            return owner
    return None


def _guarded(job: Job, callback: Callable, accept: Callable[[], bool] | None = None) -> Callable:
    def deliver(*args):
        if not job.detached and (accept is None or accept()):
            callback(*args)
    return deliver


def _let_go(job: Job) -> None:
    """The job's signals have fired: drop it and what it held. Its signal carrier holds, in C++, the
    slots that reference the job (and the callbacks' objects): a cycle the garbage collector cannot see,
    so every job, its arguments (a model, a text's tensors) and its callbacks' panels lived on until the
    process ended. Deleting the carrier drops those slots."""
    _active.discard(job)
    job.fn, job.args, job.kwargs = None, (), {}
    job.signals.deleteLater()


def run_job(fn: Callable[..., Any], *args: Any, on_result: Callable[[Any], None] | None = None,
            on_error: Callable[[BaseException, str], None] | None = None,
            on_progress: Callable[[int, int, str], None] | None = None,
            on_partial: Callable[[Any], None] | None = None,
            on_cancelled: Callable[[], None] | None = None,
            on_finished: Callable[[], None] | None = None,
            pool: QThreadPool | None = None, owner: QObject | None = None,
            accept: Callable[[], bool] | None = None, **kwargs: Any) -> Job:
    global _quit_hooked
    job = Job(fn, args, kwargs)
    if on_result:
        job.signals.result.connect(_guarded(job, on_result, accept))
    if on_error:
        job.signals.error.connect(_guarded(job, lambda e: on_error(e[0], e[1]), accept))
    if on_progress:
        job.signals.progress.connect(_guarded(job, on_progress, accept))
    if on_partial:
        job.signals.partial.connect(_guarded(job, on_partial, accept))
    if on_cancelled:
        job.signals.cancelled.connect(_guarded(job, on_cancelled))
    if on_finished:
        job.signals.finished.connect(_guarded(job, on_finished))
    owner = owner if owner is not None else _owner_of((on_result, on_error, on_progress, on_partial, on_cancelled,
                                                       on_finished))
    if owner is not None:
        tie = owner.destroyed.connect(lambda *_: job.detach())  # must not reference the owner itself
        job.signals.finished.connect(lambda: QObject.disconnect(tie))  # a long-lived owner keeps no old jobs
    _active.add(job)
    job.signals.finished.connect(lambda: _let_go(job))  # connected last: every other slot has run
    job.pool = pool or global_pool()
    app = QCoreApplication.instance()
    if app is not None and not _quit_hooked:
        app.aboutToQuit.connect(shutdown)
        _quit_hooked = True
    job.pool.start(job)
    return job


def global_pool() -> QThreadPool:
    """Qt's global pool, with at least WORKER_THREADS_AT_LEAST threads whatever the cores."""
    pool = QThreadPool.globalInstance()
    if pool.maxThreadCount() < WORKER_THREADS_AT_LEAST:
        pool.setMaxThreadCount(WORKER_THREADS_AT_LEAST)
    return pool


def active_jobs() -> list[Job]:
    return [job for job in _active if not job.done]


def shutdown(timeout_ms: int = 10_000) -> bool:
    """Cancel every running job, drop what they would still deliver, and wait up to `timeout_ms`
    for them to end (cancellable core functions stop at their next check). True when all ended.
    Jobs that have ended but whose result is still queued for the UI thread are dropped too: it would
    otherwise arrive in a window deleted meanwhile."""
    for job in list(_active):
        job.detach()
    jobs = active_jobs()
    for pool in {job.pool for job in jobs}:
        pool.waitForDone(timeout_ms)
    for job in list(_active):
        if job.done:  # its queued signals would deliver nothing now; they go with its carrier
            _let_go(job)
    return all(job.done for job in jobs)


class UIThreadGarbageCollector(QObject):
    """Python's cyclic garbage collection only on the UI thread.

    Automatic collection runs in whichever thread allocates past the threshold, a worker's included;
    a cycle holding a Qt object (a closed panel, a job's signal carrier) would then be destroyed from
    that worker, which Qt does not allow and which can crash the process (seen in the suite as a
    segfault during a collection while a worker loaded a model). So automatic collection is turned
    off and a timer on the UI thread collects, by generation, as the thresholds say.
    """

    def __init__(self, parent: QObject, interval_ms: int = 500) -> None:
        import gc

        from PySide6.QtCore import QTimer

        super().__init__(parent)
        self._gc = gc
        self.threshold = gc.get_threshold()
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.check)
        self.start()

    def start(self) -> None:
        self._gc.disable()
        self.timer.start()

    def check(self) -> None:
        counts = self._gc.get_count()
        for generation in (2, 1, 0):  # the oldest generation due, which collects the younger ones too
            if counts[generation] > self.threshold[generation]:
                self._gc.collect(generation)
                return

    def stop(self) -> None:
        """Automatic collection again (code that runs no event loop, e.g. a test without Qt after this)."""
        self.timer.stop()
        self._gc.collect()
        self._gc.enable()


def collect_garbage_on_the_ui_thread(app: QObject) -> UIThreadGarbageCollector:
    """Install (once per application) and start the collector above; returns it."""
    existing = app.findChild(UIThreadGarbageCollector)
    if existing is None:
        return UIThreadGarbageCollector(app)
    existing.start()
    return existing

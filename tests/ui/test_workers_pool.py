"""ui.workers' pool on a machine with one core: jobs that wait on one another still all run."""
from __future__ import annotations

import threading

from PySide6.QtCore import QThreadPool

from desktop_app.ui import workers


def test_a_job_waiting_for_another_job_ends_on_a_one_core_machine(qtbot):
    """Qt sizes its pool by the cores (taskset -c 0: one thread). A held trace waiting for its rows' job, as
    test_progressive_trace does under taskset, waited out its whole timeout there; with the pool's floor the
    second job runs beside the first."""
    pool = QThreadPool.globalInstance()
    cores_threads = pool.maxThreadCount()
    pool.setMaxThreadCount(1)  # what Qt gives a process allowed one core
    second_ran = threading.Event()
    results = []
    try:
        first = workers.run_job(lambda: second_ran.wait(timeout=20), on_result=results.append)
        workers.run_job(second_ran.set)
        qtbot.waitUntil(lambda: first.done and bool(results), timeout=30_000)
        assert results == [True]  # the second job ran while the first waited for it
        assert pool.maxThreadCount() >= workers.WORKER_THREADS_AT_LEAST
    finally:
        second_ran.set()
        workers.shutdown()
        pool.setMaxThreadCount(cores_threads)

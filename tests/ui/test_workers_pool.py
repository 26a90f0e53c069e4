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


def test_a_finished_job_keeps_neither_its_arguments_nor_its_receiver_alive(qtbot):
    """A job's signal carrier held, in C++, the slots that reference the job and its callbacks: a cycle the
    garbage collector cannot see. Every job, its arguments (a model) and its callbacks' panels lived until the
    process ended (the UI tests left ~2,000 plot menus of panels long closed)."""
    import gc
    import weakref

    from PySide6.QtCore import QCoreApplication, QEvent, QObject

    class Model:  # stands for what a job computes on
        pass

    class Panel(QObject):
        def __init__(self):
            super().__init__()
            self.results = []

        def show_result(self, result):
            self.results.append(result)

    model, panel = Model(), Panel()
    job = workers.run_job(lambda m: "done", model, on_result=panel.show_result)
    qtbot.waitUntil(lambda j=job: j not in workers._active, timeout=10_000)  # its signals delivered
    assert panel.results == ["done"]
    model_ref, panel_ref = weakref.ref(model), weakref.ref(panel)
    del model, panel, job
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    assert model_ref() is None, "the finished job still holds its argument"
    assert panel_ref() is None, "the finished job still holds its receiver"

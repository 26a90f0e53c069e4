"""Cyclic garbage is collected on the UI thread, never in a worker (ui.workers.UIThreadGarbageCollector):
a worker that collected a cycle holding a Qt object would destroy it from the wrong thread."""
from __future__ import annotations

import gc
import threading
import weakref


class _Cycle:
    def __init__(self):
        self.me = self


def test_a_cycle_dropped_on_the_ui_thread_is_collected_there_even_while_a_worker_allocates(qtbot, qapp):
    from desktop_app.ui.workers import collect_garbage_on_the_ui_thread, run_job

    collect_garbage_on_the_ui_thread(qapp)  # what ui.app.main installs (the UI conftest does it too)
    assert not gc.isenabled()
    collected_in: list[str] = []
    cycle = _Cycle()
    weakref.finalize(cycle, lambda: collected_in.append(threading.current_thread().name))
    del cycle  # garbage now, only a collection frees it

    kept = []

    def allocate():  # far past generation 0's threshold, and kept: automatic collection would run here
        for i in range(200_000):
            kept.append([i])

    job = run_job(allocate)
    qtbot.waitUntil(lambda: job.done, timeout=60_000)
    qtbot.waitUntil(lambda: bool(collected_in), timeout=10_000)  # the UI thread's timer collects it
    assert collected_in == [threading.main_thread().name]

"""JobControl.wait: a worker blocks on an event another thread sets, without polling, and a cancel ends the
wait (ui/state.py's logits wait for the blocks' paint this way)."""
from __future__ import annotations

import threading

import pytest

from desktop_app.core.jobs import Cancelled, JobControl


def _waiter(job: JobControl, event: threading.Event):
    """A thread waiting on `event` through `job`; its outcome ('set' or 'cancelled') in the list returned."""
    outcome: list[str] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        try:
            job.wait(event)
            outcome.append("set")
        except Cancelled:
            outcome.append("cancelled")

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(5)
    return thread, outcome


def test_the_wait_ends_when_the_event_is_set():
    job, event = JobControl(), threading.Event()
    thread, outcome = _waiter(job, event)
    thread.join(0.05)
    assert thread.is_alive() and outcome == []  # still waiting: nothing set it
    event.set()
    thread.join(5)
    assert not thread.is_alive() and outcome == ["set"]
    assert job._waits == []  # nothing left for a later cancel to set


def test_a_cancel_ends_the_wait_with_cancelled():
    job, event = JobControl(), threading.Event()
    thread, outcome = _waiter(job, event)
    thread.join(0.05)
    assert thread.is_alive()
    job.cancel()
    thread.join(5)
    assert not thread.is_alive() and outcome == ["cancelled"]


def test_a_job_cancelled_before_it_waits_does_not_wait():
    job, event = JobControl(), threading.Event()
    job.cancel()
    with pytest.raises(Cancelled):
        job.wait(event)  # (the event is never set: a wait would block for ever)

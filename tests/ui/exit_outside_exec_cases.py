"""Run by test_event_loops.py in a pytest session of its own, never collected by the suite (its name
does not start with test_): its first test breaks the application's event loops on purpose, as
test_workspace's watchdog did when it fired in a later test."""
from desktop_app.ui.workers import run_job


def test_a_watchdog_calls_exit_outside_app_exec(qapp):
    qapp.exit(99)  # what a watchdog timer left running by an earlier test does when it fires


def test_a_later_test_gets_its_jobs_result(qtbot):
    got = []
    run_job(sum, [1, 2, 3], on_result=got.append)  # delivered by a queued signal, as a sweep's results are
    qtbot.waitUntil(lambda: got == [6], timeout=10_000)

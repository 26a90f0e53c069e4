"""The UI tests' guard (conftest.event_loops_run): QCoreApplication.exit() called outside app.exec() fails
the test it happens in, with the reason, and the tests after it run with working event loops."""
from __future__ import annotations

CASES = "exit_outside_exec_cases.py"  # run by conftest.guard_cases_run


def test_an_exit_outside_app_exec_fails_its_own_test_and_no_later_one(guard_cases_run):
    """Without the guard the second case, a worker's result waited for with waitUntil, timed out (the
    result reached the UI thread's queue but no event loop ran): test_lipschitz_panel's hang."""
    outcomes, out = guard_cases_run
    # the first case passes, then errors in its teardown; the second passes
    assert {k: v for k, v in outcomes.items() if k.startswith(CASES)} == {
        f"{CASES}::test_a_watchdog_calls_exit_outside_app_exec": {"PASSED", "ERROR"},
        f"{CASES}::test_a_later_test_gets_its_jobs_result": {"PASSED"}}, out
    assert "ERROR at teardown of test_a_watchdog_calls_exit_outside_app_exec" in out, out
    assert "QCoreApplication.exit() was called outside app.exec() during this test" in out, out

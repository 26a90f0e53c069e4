"""The UI tests' guard (conftest.event_loops_run): QCoreApplication.exit() called outside app.exec() fails
the test it happens in, with the reason, and the tests after it run with working event loops."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("exit_outside_exec_cases.py")


def test_an_exit_outside_app_exec_fails_its_own_test_and_no_later_one(tmp_path):
    """Without the guard the second case, a worker's result waited for with waitUntil, timed out (the
    result reached the UI thread's queue but no event loop ran): test_lipschitz_panel's hang."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "QT_QPA_PLATFORM": "offscreen", "OMP_NUM_THREADS": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "--basetemp", str(tmp_path / "inner-tmp"), str(CASES)], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:  # run() kills the child on timeout
        pytest.fail(f"the two cases did not end within 240 s: {exc.stdout!r}")
    out = r.stdout + r.stderr
    assert "2 passed, 1 error" in r.stdout, out  # the first case passes, then errors in its teardown
    assert "ERROR at teardown of test_a_watchdog_calls_exit_outside_app_exec" in r.stdout, out
    assert "QCoreApplication.exit() was called outside app.exec() during this test" in r.stdout, out

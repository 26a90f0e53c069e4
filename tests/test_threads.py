"""desktop_app.threads: torch's threads fit the cores free now, and OpenMP threads sleep while they wait."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from desktop_app import threads

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cores, running_elsewhere, reserve, expected", [
    (2, 0, 0, 2), (2, 1, 0, 1), (2, 2, 0, 1), (16, 3, 0, 13), (16, 3, 1, 12), (1, 0, 1, 1)])
def test_the_thread_count_is_the_cores_not_busy_elsewhere(monkeypatch, cores, running_elsewhere, reserve, expected):
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: running_elsewhere)
    assert threads.fair_thread_count(reserve) == expected


def test_fit_torch_threads_sets_torch_and_an_explicit_omp_num_threads_wins(monkeypatch):
    n = torch.get_num_threads()
    monkeypatch.setattr(threads, "fair_thread_count", lambda reserve=0: 1)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        assert threads.fit_torch_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert threads.fit_torch_threads() is None and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(n)


def test_busy_elsewhere_reads_the_kernels_count_of_running_tasks():
    assert 0 <= threads.busy_elsewhere() < 10_000
    assert threads.available_cores() >= 1


def test_importing_the_package_sets_a_passive_wait_before_torch_unless_the_user_chose():
    code = "import os, desktop_app, sys; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PASSIVE", "False"]  # set, and torch (libgomp reads it when loaded) not yet imported
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "ACTIVE"


def test_every_free_core_sets_the_fair_count_inside_and_new_threads_start_with_the_count_before(monkeypatch):
    import threading

    n = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "fair_thread_count", lambda reserve=0: 2 if reserve == 0 else 1)
    seen = {}

    def fresh_thread_count(key):  # torch gives a thread its count when it first computes
        t = threading.Thread(target=lambda: seen.__setitem__(key, torch.get_num_threads()))
        t.start()
        t.join()

    try:
        torch.set_num_threads(1)  # as the app leaves a core for the UI
        with threads.every_free_core():
            seen["inside"] = torch.get_num_threads()
        fresh_thread_count("after")
        assert seen == {"inside": 2, "after": 1} and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice wins
        with threads.every_free_core():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


def test_every_free_core_chooses_the_count_again_when_refit_between_steps_and_omp_num_threads_wins(monkeypatch):
    n = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    free = [1]  # a neighbour busy when the job starts, gone by its next step
    monkeypatch.setattr(threads, "fair_thread_count", lambda reserve=0: free[0])
    try:
        torch.set_num_threads(1)
        with threads.every_free_core() as refit:
            assert torch.get_num_threads() == 1
            free[0] = 2
            refit()
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1  # the count before, after
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice wins
        with threads.every_free_core() as refit:
            refit()
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


def test_one_thread_when_small_inside_only_for_small_work_and_an_explicit_omp_num_threads_wins(monkeypatch):
    from desktop_app.core.lipschitz import spectral_norm

    n = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []

    def layer(X):  # records the thread count the estimator's products run on
        seen.append(torch.get_num_threads())
        return torch.tanh(X)

    try:
        torch.set_num_threads(2)
        with threads.one_thread_when_small(threads.SMALL_WORK_ELEMENTS):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with threads.one_thread_when_small(threads.SMALL_WORK_ELEMENTS + 1):
            assert torch.get_num_threads() == 2
        spectral_norm(layer, torch.randn(2, 4, 3, dtype=torch.float64))
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's choice wins
        with threads.one_thread_when_small(8):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(n)


def test_this_processs_own_running_threads_are_not_busy_elsewhere():
    """A thread of this process spinning is counted as its own, not as another process's work."""
    import hashlib
    import threading

    stop = threading.Event()
    started = threading.Event()
    data = bytes(1 << 22)

    def spin():  # hashing a large buffer runs without the GIL: the thread stays runnable beside the asking one
        started.set()
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    try:
        started.wait(5)
        seen = [threads.own_running_threads() for _ in range(200)]
    finally:
        stop.set()
        worker.join(5)
    assert min(seen) >= 1
    assert max(seen) >= 2  # the spinning thread was seen running at least once beside the asking one
    assert threads.own_running_threads() >= 1

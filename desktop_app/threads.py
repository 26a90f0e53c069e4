"""How many cores torch may use, and how its threads wait: chosen for the cores really available.

A workstation always has something else running. torch's CPU ops are OpenMP parallel regions whose
threads meet at the end of each op; by default a thread that arrives first spins, so when another
process holds the core its partner needs, every op waits out a scheduler slice: the lectures' motif run
took 5x its quiet time beside two busy neighbours on 2 cores, and a Lipschitz sweep 30 s instead of 9.
Two remedies, both here:
  * OpenMP's wait policy PASSIVE: a waiting thread sleeps instead of spinning, so it never takes a
    core from the thread it waits for. libgomp reads it once, when torch is imported: `passive_waits`
    runs at the package's import, before anything imports torch (desktop_app/__init__.py).
  * torch's thread count = the cores this process may run on (its CPU affinity) less those other
    processes are busy on now (the kernel's count of runnable tasks), at least 1.
An explicit OMP_NUM_THREADS / OMP_WAIT_POLICY (or torch.set_num_threads by the caller) wins.
"""
from __future__ import annotations

import os
from contextlib import contextmanager


def passive_waits() -> None:
    """OpenMP threads sleep while they wait (effective only before torch is first imported)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def busy_elsewhere() -> int:
    """Tasks running or runnable right now in other processes (/proc/stat's procs_running less this
    process's own running threads; 0 where it cannot be read). Instantaneous, unlike the load average,
    which trails a change by a minute. This process's threads are not "elsewhere": the app's UI thread
    painting while a trace starts made a quiet 2-core machine look half busy, and the first look at
    0.5B traced on one thread (8.6 s against 6.9 s on two)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running "):
                    return max(0, int(line.split()[1]) - own_running_threads())
    except (OSError, ValueError):
        pass
    return 0


def own_running_threads() -> int:
    """This process's threads running or runnable now (state R in /proc/self/task/*/stat), >= 1: the
    thread asking is one."""
    running = 0
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat", encoding="ascii", errors="replace") as f:
                    stat = f.read()
            except OSError:  # the thread ended meanwhile
                continue
            if stat[stat.rindex(")") + 2:].startswith("R"):  # the state follows the name, which may hold spaces
                running += 1
    except (OSError, ValueError):
        pass
    return max(1, running)


def fair_thread_count(reserve: int = 0) -> int:
    """Cores free for torch: available less busy elsewhere less `reserve` (a core kept for a UI), >= 1."""
    return max(1, available_cores() - busy_elsewhere() - reserve)


def fit_torch_threads(reserve: int = 0) -> int | None:
    """torch.set_num_threads(fair_thread_count(reserve)), unless OMP_NUM_THREADS says otherwise;
    returns the count set (None when left alone)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    import torch

    n = min(torch.get_num_threads(), fair_thread_count(reserve))
    torch.set_num_threads(n)
    return n


@contextmanager
def torch_threads(n: int | None):
    """torch on `n` threads inside, the count before restored after (torch starts each new thread with the
    last count set, so other workers keep theirs); None, or an explicit OMP_NUM_THREADS, leaves it alone."""
    if n is None or os.environ.get("OMP_NUM_THREADS"):
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def every_free_core():
    """torch on every core free now (none kept for the UI) while this thread computes a job the UI only
    waits on, its count before restored after. The first look at 0.5B, 1,024 tokens, on 2 cores: with
    the trace on both, the UI thread's 5 ms timer was late by <= 1.5 ms at the 95th percentile (as on
    one), so the core kept for the UI bought nothing while it waited; a core another process is busy on
    is not free (the trace forced onto two beside a busy neighbour took 6.3 and 14.7 s against 5.2 and
    6.3 s on one). OpenMP's count is per thread, but torch starts each new thread with the last count
    set: restoring it keeps the other workers on theirs. An explicit OMP_NUM_THREADS wins.
    Its value, refit(), chooses the count again for the cores free then: a job of many steps (the first look's
    trace, layer by layer) calls it between them, so a neighbour busy for a moment when the job started
    does not keep it on one core to its end, nor a neighbour started since share its cores."""
    with torch_threads(fair_thread_count()):
        yield _refit


def _refit() -> None:
    """every_free_core's count chosen again (its value)."""
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(fair_thread_count())


# Up to this many input elements per product (samples x tokens x width), torch's ops are microseconds of
# work each, and meeting a second thread at the end of every op costs more than it saves, even with the
# other core free: the demo model's sweep at lengths 8-32 (2 samples, d 128: <= 8k elements), 10 runs each,
# took a median 72-73 ms (min 68-71) on one thread against 148-182 ms (min 85-88) on two (2 cores, load 1.0-1.6).
SMALL_WORK_ELEMENTS = 1 << 16


@contextmanager
def one_thread_when_small(elements: int):
    """torch on one thread inside when a loop's products read at most SMALL_WORK_ELEMENTS input elements
    (the count before restored after); otherwise left alone. An explicit OMP_NUM_THREADS wins."""
    with torch_threads(1 if elements <= SMALL_WORK_ELEMENTS else None):
        yield

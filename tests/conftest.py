import gc
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session", autouse=True)
def torch_on_one_thread_throughout():
    """Every test runs torch on one intra-op thread, as the UI tests' rule gives on CI's 2 cores. With
    torch's default (a thread per core) on a machine busy with other work, its spinning threads
    starved each other: a 2-second Jacobian test took over 15 minutes at load 14 and tripped the
    suite's timeout. The tests use tiny models, for which one thread is as fast anyway."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread; several threads on a shared 2-core machine crawl. Files
    ask for it with pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def start_thread():
    """start_thread(target, stop) -> a started daemon thread. Teardown, also when the test failed,
    calls every stop() (e.g. a JobControl's cancel) and joins the threads, so a test that fails while
    its thread waits (a paused training loop) can never keep pytest from exiting."""
    import threading

    started = []

    def start(target, stop):
        thread = threading.Thread(target=target, daemon=True, name=f"test-{getattr(target, '__name__', 'thread')}")
        started.append((thread, stop))
        thread.start()
        return thread

    yield start
    for _, stop in started:
        stop()
    for thread, _ in started:
        thread.join(60)
    alive = [thread.name for thread, _ in started if thread.is_alive()]
    assert not alive, f"still running 60 s after stop(): {alive}"


@pytest.fixture
def spawn():
    """spawn(args, **popen_kwargs) -> subprocess.Popen. Teardown, also when the test failed, kills
    whatever is still running and closes its pipes: no test leaves a process behind."""
    import subprocess

    procs = []

    def start(*args, **kwargs):
        proc = subprocess.Popen(*args, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def pytest_runtest_setup(item):
    """What earlier tests left alive (imported modules, session and module fixtures, caches) is moved out of
    the cyclic collector's reach before each test. A full collection otherwise walks every object the
    session holds (torch, transformers, Qt, pyqtgraph: over a million), and each UI test ends with one
    (tests/ui/conftest.py): about a third of the suite's time went there. Here the previous test's own
    objects are already gone (pytest drops its arguments after teardown), so this freezes only what
    outlives tests; it is what desktop_app.imports does for the app's own imports."""
    gc.collect()
    gc.freeze()

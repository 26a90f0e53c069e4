"""Fixtures shared by the UI tests: the four walkthrough models (see walkthrough.py)."""
from __future__ import annotations

import gc
import os

import pytest
import shiboken6
from PySide6.QtCore import QSettings

from .walkthrough import ErrorWatch, make_model_dirs


EXIT_OUTSIDE_EXEC = ("QCoreApplication.exit() was called outside app.exec() {when} (e.g. by a watchdog timer an "
                     "earlier test left running): Qt then ends every event loop as it starts, so qtbot.wait, "
                     "waitUntil and waitSignal process no events and every later wait times out. Event loops "
                     "restored by a brief app.exec().")


def event_loops_return_at_once() -> bool:
    """True when QCoreApplication.exit() was called while app.exec() was not running: Qt keeps that
    quit asked (QThreadData::quitNow) until the next app.exec(), and every QEventLoop.exec() meanwhile
    returns -1 at once without processing an event. (quit() checks that exec runs; exit() does not.)"""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    timer = QTimer(loop, singleShot=True, interval=0)  # dies with the loop, also when exec never ran
    timer.timeout.connect(loop.quit)
    timer.start()
    return loop.exec() == -1


def end_the_asked_quit(app) -> None:
    """app.exec() clears the quit that exit() left asked, at its start and again at its end."""
    from PySide6.QtCore import QTimer

    QTimer.singleShot(0, app.quit)
    app.exec()


@pytest.fixture(autouse=True)
def event_loops_run(qapp):
    """Setup and teardown: the application's event loops still run. test_workspace's 60 s watchdog
    (QApplication.exit(99)) outlived its test and fired in test_lipschitz_panel, whose every later
    waitUntil then spun 30 s without delivering the sweep's queued results (they arrived only in
    pytest-qt's teardown processEvents). Now the test in which that happens fails, saying why, and
    the rest of the session runs with working event loops."""
    if event_loops_return_at_once():
        end_the_asked_quit(qapp)
        pytest.fail(EXIT_OUTSIDE_EXEC.format(when="after the previous test's teardown"))
    yield
    if event_loops_return_at_once():
        end_the_asked_quit(qapp)
        pytest.fail(EXIT_OUTSIDE_EXEC.format(when="during this test"))


@pytest.fixture(scope="session", autouse=True)
def app_thread_setting():
    """The UI runs as the app runs it: torch's threads on all cores but one (ui.app.main does this at
    start; these tests build windows without main). Two full-suite runs in seven hung or crashed in a
    worker's torch call while the UI thread waited, with torch's default of one thread per core."""
    import torch

    from desktop_app.ui.app import leave_a_core_for_the_ui

    before = torch.get_num_threads()
    leave_a_core_for_the_ui()
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def garbage_collected_on_the_ui_thread(qapp):
    """As ui.app.main does: cyclic garbage collection only on the UI thread while a UI test runs (a
    worker collecting a cycle that holds a Qt object can crash the process). Set up before and torn
    down after no_job_outlives_its_test: its collection of the test's leftovers runs here, on the UI
    thread, and then automatic collection is back for tests without an event loop."""
    from desktop_app.ui.workers import collect_garbage_on_the_ui_thread

    collector = collect_garbage_on_the_ui_thread(qapp)
    yield collector
    collector.stop()


_states_made: list | None = None


def states_made_in_the_test() -> list:
    """The list that every AppState made from now on joins (emptied for each test). A test's AppState (no
    parent) holds, in C++, the slots its panels connected, which reference the panels, which reference the
    state: a cycle the garbage collector cannot see, so each test's panels, plots and their pyqtgraph menus
    (~7 top-level widgets a plot) lived to the end of the session. Deleting the state drops those slots.
    In the app one state lives as long as the application. No module or session fixture makes one."""
    global _states_made
    if _states_made is None:
        from desktop_app.ui.state import AppState

        made_by_init = AppState.__init__

        def init_and_note(self, *args, **kwargs):
            made_by_init(self, *args, **kwargs)
            _states_made.append(self)

        AppState.__init__ = init_and_note
        _states_made = []
    _states_made.clear()
    return _states_made


@pytest.fixture
def no_timer_outlives_its_test():
    """Teardown, after the test's windows and states are deleted (no_window_outlives_its_test asks for
    this one): a timer the test started that still runs and still calls something fails the test, and is
    stopped. Such timers fired into later tests (a watchdog's exit broke their event loops; a callback
    reached a deleted panel). Timers running before the test are left alone; one made before it (a module
    fixture's) that the test started is the test's."""
    before = {_address(t) for t in running_timers()}
    yield
    left = [t for t in running_timers(calling=True) if _address(t) not in before]
    described = [describe_timer(t) for t in left]
    for timer in left:
        timer.stop()
    left.clear()
    before.clear()
    assert not described, f"this test left timers running that still call something: {described}"


@pytest.fixture
def no_window_outlives_its_test(garbage_collected_on_the_ui_thread, no_timer_outlives_its_test):
    """Teardown, also when the test failed: every parentless window the test made (its panels, main
    windows, dialogs, the window ui.app.main builds in-process) is deleted, not only closed, and a test
    that leaves a window of its own on screen fails. Closed
    windows otherwise lived on: 15,000 top-level widgets by the end of the UI suite, with their timers
    and connections, in the runs where test_lipschitz_panel's sweeps never saw their end.
    Windows made before the test (module and session fixtures) are left alone; pytest-qt has already
    closed the qtbot ones, and no_job_outlives_its_test stopped the jobs first (it asks for this one)."""
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    before = set(QApplication.topLevelWidgets())
    states = states_made_in_the_test()
    yield
    for state in states:
        if shiboken6.isValid(state):
            state.deleteLater()
    states.clear()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # pytest-qt's deleteLater, the states
    gc.collect()  # windows only a reference cycle kept: Python deletes them, on this (the UI) thread
    # only windows of this project's or pyqtgraph's classes: a plain Qt one (a QMenu, a bare QWidget) may be
    # Qt's own, which Qt still points at (deleting one of those crashed the process)
    made = [w for w in QApplication.topLevelWidgets() if w not in before and w.parentWidget() is None
            and not type(w).__module__.startswith("PySide6.")]
    for window in made:
        window.hide()
        window.deleteLater()
    made.clear()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    # a window still on screen (a dialog, a menu or a popup the test opened and never closed) can take a later
    # test's clicks and keys, and its timers run on
    shown = [f"{type(w).__name__} {w.windowTitle()!r}" for w in QApplication.topLevelWidgets()
             if w not in before and w.isVisible()]
    before.clear()
    assert not shown, f"this test left windows on screen: {shown}"


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(no_window_outlives_its_test):
    """Teardown, also when the test failed: cancel every worker job still running and wait for it
    (ui.workers.shutdown, what the window's close does), so no worker thread outlives its test."""
    yield
    from desktop_app.ui.workers import shutdown

    assert shutdown(timeout_ms=60_000), "a worker job did not stop within 60 s of its cancel"


GUARD_CASES = ("exit_outside_exec_cases.py", "timer_guard_cases.py")


@pytest.fixture(scope="session")
def guard_cases_run(tmp_path_factory):
    """The guards' case files (never collected by the suite: their names do not start with test_) run in one
    pytest session of their own -> (outcomes, output): outcomes maps "file.py::test" to the set of its -rA
    lines' words (PASSED, ERROR, FAILED: a test that errors in its teardown has PASSED and ERROR). One session
    for both files: each costs a Python start with torch and Qt."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(here.parents[1]), "QT_QPA_PLATFORM": "offscreen", "OMP_NUM_THREADS": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "--basetemp", str(tmp_path_factory.mktemp("guard-cases")),
                            *(str(here / name) for name in GUARD_CASES)], cwd=here.parents[1], env=env,
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:  # run() kills the child on timeout
        pytest.fail(f"the guards' cases did not end within 240 s: {exc.stdout!r}")
    outcomes: dict[str, set] = {}
    for line in r.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "ERROR", "FAILED") and "::" in rest:
            outcomes.setdefault(rest.split(" ")[0].split("/")[-1], set()).add(word)
    return outcomes, r.stdout + r.stderr


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """name -> model folder for 'demo', 'bert', 'llama', 'notok' (made once per session)."""
    return make_model_dirs(tmp_path_factory.mktemp("walkthrough-models"))


@pytest.fixture
def isolated_user_files(tmp_path, monkeypatch):
    """Settings, recent files, last session and the log go to this test's temporary folder."""
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def error_watch(monkeypatch):
    """Fails nothing by itself: call error_watch.assert_clean() at the end of a walkthrough."""
    watch = ErrorWatch.install(monkeypatch)
    yield watch
    watch.remove()


# --- Opt-in probe: which tests leave top-level widgets behind -------------------------------------------------------
# TE_LEFT_WIDGETS=report.txt pytest tests/ui ...  lists, after each test (all its fixtures torn down), the top-level
# widgets that test left alive, by class and test, and sums them by class and by test at the end. Off unless set
# (CI leaves it unset): it holds no widget between tests, only addresses.
LEFT_WIDGETS_REPORT = os.environ.get("TE_LEFT_WIDGETS")


def _address(widget) -> int:
    import shiboken6

    return shiboken6.getCppPointer(widget)[0]


def describe_widget(widget) -> str:
    """Class, and what tells one such widget from another: its title, text, actions or children's classes."""
    parts = [type(widget).__module__.split(".")[0] + "." + type(widget).__name__]
    if widget.parentWidget() is not None:
        parts.append(f"parent={type(widget.parentWidget()).__name__}")
    if widget.isVisible():
        parts.append("VISIBLE")
    for label, value in (("title", widget.windowTitle()), ("name", widget.objectName()),
                         ("text", getattr(widget, "text", lambda: "")() if hasattr(widget, "text") else "")):
        if isinstance(value, str) and value:
            parts.append(f"{label}={value[:40]!r}")
    actions = [a.text() for a in widget.actions()][:4]
    if actions:
        parts.append(f"actions={actions}")
    kids = [type(c).__name__ for c in widget.children()][:5]
    if kids:
        parts.append(f"children={kids}")
    return " ".join(parts)


def _note_every_timer_made():
    """A WeakSet that every QTimer Python makes from now on joins (for as long as its wrapper lives):
    QTimer.__init__ is wrapped; PySide's QTimer.singleShot makes its own timer through it too. Installed
    when this file is imported, before any UI test's fixture runs."""
    import weakref

    from PySide6.QtCore import QTimer

    made = weakref.WeakSet()
    made_by_init = QTimer.__init__

    def init_and_note(self, *args, **kwargs):
        made_by_init(self, *args, **kwargs)
        made.add(self)

    QTimer.__init__ = init_and_note
    return made


_timers_made = _note_every_timer_made()


def running_timers(calling: bool = False) -> list:
    """Every running QTimer that has a Python wrapper (Qt's own are not seen). `calling`: only those that
    still call something when they fire. A QTimer.singleShot's own timer (parentless, owned by C++: it
    deletes itself) keeps one connection of its own, and one to its callable while that lives: its
    callable's object gone (a deleted context, a method's object collected), it runs on, calling nothing.
    Two sources: gc.get_objects(), which tests/conftest.py's gc.freeze before each test limits to what was
    made since (2-4 ms a call in tests/ui; wrappers made by C++ and handed to Python included), and the
    timers noted as made (_note_every_timer_made), which also holds those made before the test (a
    module fixture's): frozen, gc.get_objects() no longer lists them, so one the test started was unseen."""
    from PySide6.QtCore import QTimer

    found, seen = [], set()
    for obj in [*gc.get_objects(), *_timers_made]:
        if isinstance(obj, QTimer) and id(obj) not in seen and shiboken6.isValid(obj) and obj.isActive():
            seen.add(id(obj))
            single_shot_own = obj.parent() is None and not shiboken6.ownedByPython(obj)
            if not calling or obj.receivers("2timeout()") > (1 if single_shot_own else 0):
                found.append(obj)
    return found


def describe_timer(timer) -> str:
    return f"QTimer interval={timer.interval()} parent={type(timer.parent()).__name__} " \
           f"receivers={timer.receivers('2timeout()')}"


def active_timers() -> dict:
    """address -> description of every running QTimer that has a Python wrapper (Qt's own are not seen)."""
    return {_address(t): describe_timer(t) for t in running_timers()}


if LEFT_WIDGETS_REPORT:
    import collections

    _left_by_class: collections.Counter = collections.Counter()
    _left_by_test: collections.Counter = collections.Counter()
    _left_by_module: collections.Counter = collections.Counter()
    _went_at_gc = collections.Counter()
    _guard = collections.Counter()  # what the guard (no visible window, no running timer left) would fail
    _timers_seen: set = set()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        from PySide6.QtCore import QCoreApplication, QEvent
        from PySide6.QtWidgets import QApplication

        before = {_address(w) for w in QApplication.topLevelWidgets()}
        yield
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # asked for already: not left behind
        left = [w for w in QApplication.topLevelWidgets() if _address(w) not in before]
        n_left = len(left)
        left.clear()
        # those only a reference cycle still holds go at the next collection: counted apart, not listed
        gc.collect()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        left = [w for w in QApplication.topLevelWidgets() if _address(w) not in before]
        _went_at_gc["widgets"] += n_left - len(left)
        timers = {a: d for a, d in active_timers().items() if a not in _timers_seen}
        _timers_seen.update(timers)
        visible = [w for w in left if w.isVisible()]
        if visible or timers:
            _guard["tests"] += 1
            _guard["visible windows"] += len(visible)
            _guard["running timers"] += len(timers)
        with open(LEFT_WIDGETS_REPORT, "a", encoding="utf-8") as out:
            for widget in left:
                line = describe_widget(widget)
                out.write(f"{item.nodeid}\t{line}\n")
                _left_by_class[line.split(" ")[0] + (" (parented)" if widget.parentWidget() is not None else "")] += 1
            for description in timers.values():
                out.write(f"{item.nodeid}\tRUNNING {description}\n")
            if left:
                _left_by_test[item.nodeid] += len(left)
                _left_by_module[item.nodeid.split("::")[0]] += len(left)

    def pytest_sessionfinish(session):
        from PySide6.QtWidgets import QApplication

        with open(LEFT_WIDGETS_REPORT, "a", encoding="utf-8") as out:
            alive = QApplication.topLevelWidgets() if QApplication.instance() else []
            out.write(f"# SUMMARY: {sum(_left_by_class.values())} top-level widgets left by tests after gc.collect "
                      f"({_went_at_gc['widgets']} more went at gc.collect); {len(alive)} top-level alive at end; "
                      f"a guard would fail {_guard['tests']} tests ({_guard['visible windows']} visible windows, "
                      f"{_guard['running timers']} running timers)\n")
            for title, counter in (("class", _left_by_class), ("module", _left_by_module), ("test", _left_by_test)):
                out.write(f"# by {title}\n")
                for key, n in counter.most_common(40):
                    out.write(f"#   {n:6d}  {key}\n")

"""Run by test_timer_guard.py in a pytest session of its own, never collected by the suite (its name does not
start with test_): tests that leave timers running on purpose, and tests that must not be blamed."""
import pytest
from PySide6.QtCore import QObject, QTimer


@pytest.fixture(scope="module")
def made_before():
    """A module fixture's timer, made (its wrapper frozen by tests/conftest.py) before the tests that use it."""
    timer = QTimer()
    timer.timeout.connect(print)
    yield timer
    timer.stop()


@pytest.fixture(scope="module")
def running_before():
    timer = QTimer()
    timer.timeout.connect(print)
    timer.start(60_000)
    yield timer
    timer.stop()


def test_leaves_its_timer_running(qtbot):
    timer = QTimer()
    timer.timeout.connect(lambda: None)
    timer.start(60_000)
    test_leaves_its_timer_running.kept = timer


def test_leaves_a_single_shot_pending(qtbot):
    QTimer.singleShot(60_000, lambda: None)


def test_makes_the_module_fixtures_first(made_before, running_before):
    pass


def test_starts_a_timer_made_before_it(made_before):
    made_before.start(60_000)


def test_a_timer_running_before_it_is_not_its_own(running_before):
    pass


def test_a_single_shot_whose_object_is_gone_calls_nothing(qtbot):
    class Holder(QObject):
        def fire(self):
            pass

    holder = Holder()
    QTimer.singleShot(60_000, holder, holder.fire)
    holder.deleteLater()
    qtbot.wait(10)

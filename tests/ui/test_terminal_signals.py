"""ui.app.main run in-process (as the start-up tests run it): the Ctrl+C/SIGTERM handlers it installs and
the 250 ms timer that lets Python run them end when app.exec returns. They used to outlive the window:
handlers pointing at closed windows and one live timer per window, six of them by the end of the UI suite."""
from __future__ import annotations

import signal

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from desktop_app.ui.main_window import MainWindow

from .test_app_startup import _start_app

TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def test_the_terminal_signal_handlers_and_their_timer_end_with_the_window(qtbot, monkeypatch, isolated_user_files):
    before = {sig: signal.getsignal(sig) for sig in TERMINAL_SIGNALS}
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen, seen
    assert {sig: signal.getsignal(sig) for sig in TERMINAL_SIGNALS} == before
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    assert windows, "the closed window is deleted only in the test's teardown"
    wake_timers = [t for w in windows for t in w.findChildren(QTimer) if t.parent() is w and t.interval() == 250]
    assert wake_timers, "main made no wake-up timer on its window"
    assert not any(t.isActive() for t in wake_timers)

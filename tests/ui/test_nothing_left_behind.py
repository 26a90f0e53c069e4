"""What a session lets go of: a model once another is open."""
from __future__ import annotations

import gc
import weakref

import pytest
from PySide6.QtCore import QCoreApplication, QEvent, QSettings

from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState
from tiny_models import save_tiny_model


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def test_a_model_is_let_go_once_another_is_open(qtbot, tmp_path):
    """Every finished worker job held its arguments for good (its signal carrier's slots reference it, a cycle
    the garbage collector cannot see): the first model's trace job kept that model, weights and all, after
    the person had opened another."""
    for name in ("first", "second"):
        save_tiny_model(tmp_path / name, "abcdefghijklmnopqrstuvwxyz .")
    state = AppState()
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    state.set_text("the cat sat on the mat.")
    with qtbot.waitSignal(state.trace_changed, timeout=15000):
        window.open_model(tmp_path / "first")
    first = weakref.ref(state.loaded.model)
    with qtbot.waitSignal(state.trace_changed, timeout=15000):
        window.open_model(tmp_path / "second")
    qtbot.waitUntil(lambda: state.trace is not None and state.loaded.path == tmp_path / "second", timeout=15000)
    qtbot.wait(200)  # the last jobs' signals delivered
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    assert first() is None, "the first model is still held after the second was opened"


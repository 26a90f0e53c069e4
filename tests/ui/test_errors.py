"""An exception escaping a panel's slot: a dialog with the report, a log entry, and the app goes on."""
from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QApplication

from desktop_app.ui.errors import ErrorDialog, ExceptionHandler, log_file
from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState
from tiny_models import save_tiny_model


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@pytest.fixture
def window_with_model(qtbot, tmp_path):
    save_tiny_model(tmp_path / "m", "abcdefghijklmnopqrstuvwxyz ", d_model=16, n_layers=1, n_heads=2, d_ff=32)
    state = AppState()
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.resize(1000, 700)
    window.show()
    state.set_text("abc")
    with qtbot.waitSignal(state.trace_changed, timeout=15000):
        window.open_model(tmp_path / "m")
    return window


@pytest.mark.qt_no_exception_capture  # our hook, not pytest-qt's, must see the exception
def test_exception_in_a_panel_slot_shows_a_dialog_is_logged_and_the_app_goes_on(qtbot, window_with_model):
    window = window_with_model
    handler = ExceptionHandler(window).install()
    try:
        panel = window.panel("Model")

        def broken_slot(index: int) -> None:
            raise ZeroDivisionError(f"boom in a slot for token {index}")

        panel.token_strip.token_selected.connect(broken_slot)
        qtbot.waitUntil(lambda: panel.token_strip.count() == 3, timeout=5000)
        chip = panel.token_strip.chip_center(1)
        qtbot.mouseClick(panel.token_strip.canvas, Qt.MouseButton.LeftButton, pos=chip)  # a real click, Qt calls the slot

        qtbot.waitUntil(lambda: handler.dialog is not None and handler.dialog.isVisible(), timeout=5000)
        dialog = handler.dialog
        assert isinstance(dialog, ErrorDialog)
        assert "ZeroDivisionError: boom in a slot for token 1" in dialog.details.toPlainText()
        assert "broken_slot" in dialog.report  # the traceback, not just the message
        dialog.copy_button.click()
        assert QApplication.clipboard().text() == dialog.report
        log_text = log_file().read_text(encoding="utf-8")
        assert "boom in a slot for token 1" in log_text and "Traceback" in log_text
        assert str(log_file()).startswith(str(tmp_data_dir()))

        # the application keeps working: the other slots of the same click ran, typing still traces
        assert "token #1" in panel.token_info.text()
        panel.text_edit.setPlainText("abcde")
        qtbot.waitUntil(lambda: panel.token_strip.count() == 5, timeout=10000)

        # a second error while the dialog is open goes into the same dialog
        qtbot.mouseClick(panel.token_strip.canvas, Qt.MouseButton.LeftButton, pos=panel.token_strip.chip_center(2))
        qtbot.waitUntil(lambda: dialog.count == 2, timeout=5000)
        assert handler.dialog is dialog and "token 2" in dialog.report
        dialog.close()
    finally:
        handler.uninstall()
    assert sys.excepthook is not handler


def tmp_data_dir() -> str:
    import os

    return os.environ["XDG_DATA_HOME"]


def test_a_panel_that_fails_to_build_is_logged(qtbot, tmp_path):
    from desktop_app.ui.errors import setup_logging

    setup_logging()
    state = AppState()
    window = MainWindow(state, panels=[("Model", "desktop_app.ui.panels.model", "ModelPanel"),
                                       ("Broken", "desktop_app.ui.panels.no_such_panel", "Nope")])
    qtbot.addWidget(window)
    assert "no_such_panel" not in log_file().read_text(encoding="utf-8")  # built only when first shown
    window.show_panel("Broken")
    assert "no_such_panel" in log_file().read_text(encoding="utf-8")

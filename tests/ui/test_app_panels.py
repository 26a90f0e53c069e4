"""Every registered panel builds inside the main window after a model is open (panels are built
lazily, when their tab is first shown) and explains itself in Help > What am I looking at?"""
from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.panels import PANELS
from desktop_app.ui.state import AppState
from tiny_models import save_tiny_model


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def test_every_panel_builds_after_the_model_is_open_and_has_help(qtbot, tmp_path, monkeypatch):
    from desktop_app.ui import dialogs

    save_tiny_model(tmp_path / "m", "abcdefghijklmnopqrstuvwxyz .")
    state = AppState()
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    state.set_text("the cat sat on the mat.")
    with qtbot.waitSignal(state.trace_changed, timeout=15000):
        window.open_model(tmp_path / "m")
    shown = []
    monkeypatch.setattr(dialogs.HelpDialog, "exec", lambda self: shown.append(self.browser.toPlainText()))
    assert [s.title for s in window.slots] == [title for title, _, _ in PANELS]
    for slot in window.slots:
        window.tabs.setCurrentWidget(slot)  # as a click on the tab does
        assert slot.error is None, f"{slot.title} panel failed to build:\n{slot.error}"
        assert slot.panel is not None
        window.help_action.trigger()
        assert len(shown[-1]) > 80, f"{slot.title} panel has no real help text"
        assert "has no help text" not in shown[-1]
    assert len(shown) == len(PANELS)

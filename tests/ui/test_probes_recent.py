"""Issue 25, probes beyond its list: a settings file listing 50,000 recent models (another program's,
or hand-edited) no longer freezes File > Open Recent (13 s to open, a menu 286,000 pixels wide):
the menu lists the newest MAX_RECENT, as the app itself keeps them."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMenu

from desktop_app.ui import settings as app_settings
from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState


def test_open_recent_lists_at_most_max_recent_models(qtbot, isolated_user_files, tmp_path):
    paths = [str(tmp_path / f"model{i}") for i in range(50_000)]
    s = app_settings.settings()
    s.setValue(app_settings.RECENT_KEY, paths)
    s.sync()
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    bar = window.menuBar()
    file_action = next(a for a in bar.actions() if a.text().replace("&", "") == "File")
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.actionGeometry(file_action).center())
    file_menu = file_action.menu()
    qtbot.waitUntil(file_menu.isVisible, timeout=10_000)
    recent = window.recent_menu.menuAction()
    qtbot.mouseClick(file_menu, Qt.MouseButton.LeftButton, pos=file_menu.actionGeometry(recent).center())
    qtbot.waitUntil(window.recent_menu.isVisible, timeout=10_000)
    shown = [a.text() for a in window.recent_menu.actions() if not a.isSeparator()]
    assert shown == paths[:app_settings.MAX_RECENT] + ["Clear Recent"]
    for menu in (window.recent_menu, file_menu):
        menu.close()


def test_a_recent_list_of_another_type_is_empty(isolated_user_files):
    s = app_settings.settings()
    s.setValue(app_settings.RECENT_KEY, 5)
    s.sync()
    assert app_settings.recent_models() == []

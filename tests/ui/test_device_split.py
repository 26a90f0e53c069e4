"""Device > All CUDA Devices: with two or more cards the model's layers are placed across them (core/streamed.
place_blocks). No card here: the device list is faked, and the entry is checked to ask for every card at
once; tests/core/test_streamed.py runs the placement itself (and on a card, its cuda test)."""
from __future__ import annotations

from PySide6.QtCore import QSettings

from desktop_app.core import devices
from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState


def test_the_device_menu_offers_every_card_at_once(qtbot, tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(devices, "available_devices", lambda: ["cpu", "cuda:0", "cuda:1"])
    state = AppState()
    asked: list[str] = []
    monkeypatch.setattr(state, "set_device", asked.append)
    window = MainWindow(state)
    qtbot.addWidget(window)
    labels = [a.text() for a in window.device_menu.actions()]
    assert "All CUDA Devices (layers split over 2)" in labels
    window.device_actions["cuda:0,cuda:1"].trigger()
    assert asked == ["cuda:0,cuda:1"]


def test_one_card_has_no_split_entry(qtbot, tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(devices, "available_devices", lambda: ["cpu", "cuda:0"])
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    assert list(window.device_actions) == ["cpu", "cuda:0"]

"""Issue 25, probes beyond its list: a settings file whose font size is absurd (edited by hand, or
written by another program) never stops the app from starting and is not applied. font_size=10**12
stopped every start with an OverflowError from Qt; 100000 made a window of 100000-point text, while
the Preferences dialog (0..32) showed 32."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from desktop_app.ui import settings as app_settings

from .test_app_startup import _start_app


@pytest.fixture
def default_font():
    """The application font as the test found it, put back afterwards (apply_appearance sets it)."""
    app = QApplication.instance()
    before = app.font()
    yield before.pointSize()
    app.setFont(before)


@pytest.mark.parametrize("size", [10**12, 100_000, -7])
def test_an_absurd_font_size_in_the_settings_starts_with_the_default_font(
        size, qtbot, monkeypatch, isolated_user_files, default_font):
    s = app_settings.settings()
    s.setValue("prefs/font_size", size)
    s.sync()
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen and seen.get("model") is not None, seen
    assert QApplication.instance().font().pointSize() == default_font
    assert app_settings.Preferences.load().font_size == 0  # the default, which the dialog shows


def test_a_font_size_in_range_still_applies(qtbot, monkeypatch, isolated_user_files, default_font):
    s = app_settings.settings()
    s.setValue("prefs/font_size", 13)
    s.sync()
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen, seen
    assert QApplication.instance().font().pointSize() == 13

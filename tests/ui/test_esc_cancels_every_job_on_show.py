"""esc3: in the Features panel the lens's Cancel (in the panel's header, on every tab) and the dashboard's Cancel
(on its tab) both have Esc. With both jobs running and the Dashboard tab on show, Esc matched two buttons on show:
Qt calls that an ambiguous shortcut and clicks neither, so nothing was cancelled. Esc now clicks every Cancel on
show (panels.key_buttons): each one Help lists for Esc stops, as a person reading the two progress bars expects."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from . import test_features_panel
from .test_features_panel import TEXT, _dashboard_of_first_feature, _dictionary
from .walkthrough import click_tab, open_window

text_file = test_features_panel.text_file  # (the fixture: a UTF-8 text file for the dashboard's contexts)


def _held(monkeypatch, name: str):
    """features.<name> held in its worker (JobControl.wait: a cancel ends the wait) until released: (started,
    release, ended) events; ended once it stopped, cancelled or not."""
    from desktop_app.ui.panels import features as features_module

    real = getattr(features_module, name)
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def held(*args, job=None, **kwargs):
        started.set()
        try:
            job.wait(release)
            return real(*args, job=job, **kwargs)
        finally:
            ended.set()

    monkeypatch.setattr(features_module, name, held)
    return started, release, ended


def test_esc_cancels_the_lens_and_the_dashboard_both_on_show(qtbot, model_dirs, isolated_user_files, error_watch,
                                                             tmp_path, monkeypatch, text_file):
    window, state = open_window(qtbot, model_dirs["demo"], text=TEXT, watch=error_watch)
    window.activateWindow()
    qtbot.waitActive(window)
    panel, dash = _dashboard_of_first_feature(qtbot, window, state, monkeypatch, _dictionary(tmp_path / "sae"),
                                              text_file)

    dash_started, dash_release, dash_ended = _held(monkeypatch, "cached_dashboard")
    lens_started, lens_release, lens_ended = _held(monkeypatch, "lens_on")
    try:
        qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
        assert dash_started.wait(20)
        state.set_text(TEXT + " Then")  # a new text: the lens is read again (the dashboard's contexts stay)
        qtbot.waitUntil(lens_started.is_set, timeout=20_000)
        qtbot.waitUntil(panel.lens_cancel_button.isVisible, timeout=10_000)
        assert panel.tabs.tabText(panel.tabs.currentIndex()) == "Dashboard"
        assert dash.cancel_button.isVisible() and dash.cancel_button.isEnabled()  # two Cancels on show, both Esc
        assert panel.lens_cancel_button.isEnabled()
        assert not dash.job.done and not panel._lens_job.done

        qtbot.keyClick(panel, Qt.Key.Key_Escape)
        # (Qt's animated click presses the button for 100 ms; then the jobs end at their wait)
        qtbot.waitUntil(lambda: dash.job.done and panel._lens_job.done, timeout=10_000)
    finally:
        dash_release.set()
        lens_release.set()
        assert dash_ended.wait(30) and lens_ended.wait(30)
    qtbot.waitUntil(lambda: dash.status.text() == "Cancelled.", timeout=10_000)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Cancelled"), timeout=10_000)
    qtbot.waitUntil(lambda: dash.run_button.isEnabled() and not panel.lens_cancel_button.isVisible(), timeout=10_000)
    assert dash.contexts is None and panel.lens is None  # nothing of either cancelled job is shown
    error_watch.assert_clean()


def test_esc_leaves_the_dashboard_running_while_its_cancel_is_not_on_show(qtbot, model_dirs, isolated_user_files,
                                                                         error_watch, tmp_path, monkeypatch,
                                                                         text_file):
    """The Lens tab on show: only the lens's Cancel is, so Esc stops the lens and the dashboard's contexts go on;
    back on the Dashboard tab, Esc stops them."""
    window, state = open_window(qtbot, model_dirs["demo"], text=TEXT, watch=error_watch)
    window.activateWindow()
    qtbot.waitActive(window)
    panel, dash = _dashboard_of_first_feature(qtbot, window, state, monkeypatch, _dictionary(tmp_path / "sae"),
                                              text_file)

    dash_started, dash_release, dash_ended = _held(monkeypatch, "cached_dashboard")
    lens_started, lens_release, lens_ended = _held(monkeypatch, "lens_on")
    try:
        qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
        assert dash_started.wait(20)
        click_tab(qtbot, panel.tabs, "Lens")
        state.set_text(TEXT + " Then")
        qtbot.waitUntil(lens_started.is_set, timeout=20_000)
        qtbot.waitUntil(panel.lens_cancel_button.isVisible, timeout=10_000)
        assert not dash.cancel_button.isVisible()

        qtbot.keyClick(panel, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: panel._lens_job.done, timeout=10_000)
        assert lens_ended.wait(10)
        assert not dash.job.done and not dash_ended.is_set()

        click_tab(qtbot, panel.tabs, "Dashboard")
        qtbot.keyClick(panel, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: dash.job.done, timeout=10_000)
    finally:
        dash_release.set()
        lens_release.set()
        assert dash_ended.wait(30) and lens_ended.wait(30)
    qtbot.waitUntil(lambda: dash.status.text() == "Cancelled.", timeout=10_000)
    error_watch.assert_clean()

"""The frequent actions of the Lipschitz, Train and Features panels have keys (Ctrl+Return runs, Esc
cancels or stops), pressed in the window as a person does; a key works only on the panel on show, and
Help > Keyboard Shortcuts lists each one."""
from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.ui.dialogs import ShortcutsDialog

from .test_training_panel import _tiny
from .walkthrough import click_panel_tab, click_tab, open_window

CTRL = Qt.KeyboardModifier.ControlModifier


def _rows(window) -> set[tuple[str, str]]:
    dialog = ShortcutsDialog(window.shortcut_actions(), window, window.panel_shortcuts())
    table = dialog.table
    rows = {(table.item(r, 0).text(), table.item(r, 1).text()) for r in range(table.rowCount())}
    dialog.deleteLater()
    return rows


def _press(qtbot, window, key, modifier=Qt.KeyboardModifier.NoModifier) -> None:
    """The key pressed where the focus is; then the button's animated click (Qt's 100 ms press) is let happen."""
    qtbot.keyClick(window.focusWidget() or window, key, modifier)
    qtbot.wait(300)


def test_ctrl_return_runs_and_esc_cancels_on_the_panel_on_show(qtbot, model_dirs, isolated_user_files, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the training run's process: one thread for a tiny model
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitActive(window)
    rows = _rows(window)
    for row in (("Lipschitz: Run", "Ctrl+Return"), ("Lipschitz: Cancel", "Esc"), ("Train: Start", "Ctrl+Return"),
                ("Features: Run the dashboard", "Ctrl+Return"), ("Features: Cancel the dashboard", "Esc")):
        assert row in rows, sorted(rows)

    train = click_panel_tab(qtbot, window, "Train")
    qtbot.waitUntil(train.start_button.isVisible)
    _tiny(train, tmp_path / "runs")
    lip = click_panel_tab(qtbot, window, "Lipschitz")
    qtbot.waitUntil(lip.run_button.isVisible)  # (the panel is built on its first showing)
    lip.lengths.setText("4,256,512,1024,2048")  # long enough to be cancelled while it runs
    lip.samples.setValue(8)
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)
    assert lip.is_running() and lip.cancel_button.isEnabled()
    assert not train.running  # the Train panel's Start (same key) is not on show
    _press(qtbot, window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not lip.is_running(), timeout=60_000)
    assert "cancelled" in lip.status.text()

    click_panel_tab(qtbot, window, "Train")
    assert train.start_button.toolTip() == "Start a run in a new folder (Ctrl+Return)"  # the key, where one looks
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)
    assert train.running and not lip.is_running()
    qtbot.waitUntil(lambda: any(e["event"] == "step" for e in train.events), timeout=90_000)
    _press(qtbot, window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not train.running, timeout=60_000)
    assert train.events[-1]["event"] == "stopped"  # Stop, with its checkpoint: not a kill

    features = click_panel_tab(qtbot, window, "Features")
    click_tab(qtbot, features.tabs, "Dashboard")
    qtbot.waitUntil(features.dashboard.run_button.isVisible)
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)  # Run, with no feature chosen: the dashboard says so
    assert features.dashboard.status.text() == "Click a feature in the lens first."
    click_tab(qtbot, features.tabs, "Attribution")
    assert features.attr_status.text() == ""
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)  # Attribute, with no dictionary attached
    assert features.attr_status.text() == "Attach a dictionary and type a text first."
    assert not lip.is_running() and not train.running


def test_every_cancel_and_trains_stop_take_the_one_cancel_key_and_help_lists_each(qtbot, model_dirs,
                                                                                isolated_user_files):
    """CANCEL_KEY (panels/__init__.py) is the key of every Cancel and of Train's Stop: no panel spells the key
    itself (Train kept its own STOP_KEY = "Esc"), Help > Keyboard Shortcuts lists each with it, and Train's
    Stop button has it."""
    import importlib
    import inspect

    from PySide6.QtGui import QKeySequence

    from desktop_app.ui.panels import CANCEL_KEY, PANELS

    for _title, module, _cls in PANELS:
        assert '"Esc"' not in inspect.getsource(importlib.import_module(module)), module
    window, _state = open_window(qtbot, model_dirs["demo"], name="demo")
    rows = _rows(window)
    stops = {what for what, key in rows if ": Cancel" in what or ": Stop" in what}
    assert "Train: Stop (a checkpoint is written)" in stops and "Lipschitz: Cancel" in stops, sorted(rows)
    assert all((what, CANCEL_KEY) in rows for what in stops), sorted(rows)
    train = click_panel_tab(qtbot, window, "Train")
    qtbot.waitUntil(train.stop_button.isVisible)
    assert train.stop_button.shortcut() == QKeySequence(CANCEL_KEY)
    assert train.stop_button.toolTip().endswith(f"({CANCEL_KEY})")

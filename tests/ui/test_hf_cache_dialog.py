"""File > Open from Hugging Face Cache…: the cached models in a table, opened by clicking."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from fake_hf_cache import make_fake_cache, point_at


@pytest.fixture
def cache(tmp_path, monkeypatch, isolated_user_files):
    cache = make_fake_cache(tmp_path)
    point_at(monkeypatch, cache, tmp_path / "home")
    return cache


def _window(qtbot, watch):
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    watch.watch_state(state)
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    return window, state


def _open_dialog(qtbot, window):
    from desktop_app.ui.hf_cache_dialog import HfCacheDialog

    window.hf_cache_action.trigger()  # File > Open from Hugging Face Cache…
    dialog = window.findChild(HfCacheDialog)
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=20_000)
    return dialog


def _row_of(dialog, repo: str, revision_prefix: str) -> int:
    table = dialog.table
    return next(r for r in range(table.rowCount())
                if table.item(r, 0).text() == repo and table.item(r, 1).text().startswith(revision_prefix))


def _click_cell(qtbot, table, row: int, col: int = 0, double: bool = False) -> None:
    """A click, or a double-click as a mouse makes it: press-release, then the double-click event
    (an item view ignores a double-click on a cell it saw no press on)."""
    pos = table.visualRect(table.model().index(row, col)).center()
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    if double:
        qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def test_table_lists_the_cache_and_open_opens_the_main_revision(qtbot, cache, error_watch):
    window, state = _window(qtbot, error_watch)
    dialog = _open_dialog(qtbot, window)
    table = dialog.table
    assert table.rowCount() == 3
    row = _row_of(dialog, "tiny-org/tiny-gpt2", "b" * 12)
    assert [table.item(row, c).text() for c in range(table.columnCount())] == \
        ["tiny-org/tiny-gpt2", "b" * 12 + " (main)", "gpt2", table.item(row, 3).text(), "yes"]
    assert table.item(row, 3).text().endswith("kB")
    status = dialog.status.text()
    assert str(cache) in status and "3 cached model revision(s), 2 the app can open" in status

    _click_cell(qtbot, table, row)
    assert dialog.open_button.isEnabled()
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    assert state.loaded.path == cache / "models--tiny-org--tiny-gpt2" / "snapshots" / ("b" * 40)
    assert state.loaded.config.family == "gpt2" and state.loaded.tokenizer is not None
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    error_watch.assert_clean()


def test_unsupported_row_is_shown_with_its_reason_and_cannot_be_opened(qtbot, cache, error_watch):
    window, state = _window(qtbot, error_watch)
    dialog = _open_dialog(qtbot, window)
    row = _row_of(dialog, "other-org/mamba-tiny", "c")
    assert dialog.table.item(row, 4).text().startswith("no — model_type 'mamba' is not supported")
    _click_cell(qtbot, dialog.table, row)
    assert not dialog.open_button.isEnabled()
    assert "other-org/mamba-tiny cannot be opened: model_type 'mamba'" in dialog.reason.text()
    _click_cell(qtbot, dialog.table, row, double=True)
    qtbot.wait(200)
    assert dialog.isVisible() and state.loaded is None  # nothing was opened
    error_watch.assert_clean()


def test_double_click_opens_an_older_revision(qtbot, cache, error_watch):
    window, state = _window(qtbot, error_watch)
    dialog = _open_dialog(qtbot, window)
    row = _row_of(dialog, "tiny-org/tiny-gpt2", "a" * 12)
    assert dialog.table.item(row, 1).text() == "a" * 12  # no ref names it
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        _click_cell(qtbot, dialog.table, row, col=2, double=True)
    assert state.loaded.path == cache / "models--tiny-org--tiny-gpt2" / "snapshots" / ("a" * 40)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    from desktop_app.ui.hf_cache_dialog import HfCacheDialog
    qtbot.waitUntil(lambda: window.findChild(HfCacheDialog) is None)  # closed, and deleted on close
    error_watch.assert_clean()


def test_empty_cache_says_where_it_looked(qtbot, tmp_path, monkeypatch, isolated_user_files, error_watch):
    from desktop_app.ui.hf_cache_dialog import HfCacheDialog

    point_at(monkeypatch, tmp_path / "empty-cache", tmp_path / "home")
    window, _ = _window(qtbot, error_watch)
    window.hf_cache_action.trigger()
    dialog = window.findChild(HfCacheDialog)
    qtbot.waitUntil(lambda: "No models" in dialog.status.text(), timeout=20_000)
    assert str(tmp_path / "empty-cache") in dialog.status.text() and dialog.table.rowCount() == 0
    assert not dialog.open_button.isEnabled()

"""Issue 30, the GUI: a model opened from the Hugging Face cache whose revisions are training steps (Pythia's
step1000 branches) shows the timeline bar with those steps; moving its slider opens each step's snapshot."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

from desktop_app.core.checkpoints import load_model_folder
from fake_hf_cache import STEP_REPO, add_step_revisions, point_at, step_revision

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _window(qtbot):
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    return window, state


def _open_from_cache_dialog(qtbot, window, state, revision: str) -> None:
    """File > Open from Hugging Face Cache…, the row of `revision` clicked, Open clicked."""
    from desktop_app.ui.hf_cache_dialog import HfCacheDialog

    window.hf_cache_action.trigger()
    dialog = window.findChild(HfCacheDialog)
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=20_000)
    table = dialog.table
    row = next(r for r in range(table.rowCount()) if table.item(r, 1).text().startswith(revision[:12]))
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton,
                     pos=table.visualRect(table.model().index(row, 0)).center())
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)


def _same_weights(loaded, folder) -> bool:
    ours, there = loaded.model.state_dict(), load_model_folder(folder).model.state_dict()
    return ours.keys() == there.keys() and all(torch.equal(ours[k], there[k]) for k in ours)


def test_the_timeline_bar_walks_a_cached_models_step_revisions(qtbot, tmp_path, monkeypatch, isolated_user_files):
    cache = tmp_path / "hf-cache"
    point_at(monkeypatch, cache, tmp_path / "home")
    repo = add_step_revisions(cache, tmp_path)  # steps 0, 512, 1000; main = step1000's revision
    window, state = _window(qtbot)
    bar = window.timeline_bar
    _open_from_cache_dialog(qtbot, window, state, step_revision(1000))
    qtbot.waitUntil(lambda: bar.isVisible(), timeout=30_000)
    assert bar.steps == [0, 512, 1000] and bar.slider.value() == 2 and "step 1000 of 1000" in bar.step_label.text()
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)

    bar.slider.setFocus()
    for key, step in ((Qt.Key.Key_Home, 0), (Qt.Key.Key_Right, 512), (Qt.Key.Key_End, 1000)):
        before = state.key.model
        qtbot.keyClick(bar.slider, key)
        folder = repo / "snapshots" / step_revision(step)
        qtbot.waitUntil(lambda: state.loaded.path == folder and state.key.model > before, timeout=60_000)
        assert _same_weights(state.loaded, folder)  # exactly that revision's weights
        qtbot.waitUntil(lambda: bar.shown_step == step and f"step {step} of 1000" in bar.step_label.text(),
                        timeout=30_000)
    assert not _same_weights(state.loaded, repo / "snapshots" / step_revision(0))  # the steps differ


def test_main_that_is_no_step_shows_the_bar_at_no_step_until_one_is_chosen(qtbot, tmp_path, monkeypatch,
                                                                          isolated_user_files):
    cache = tmp_path / "hf-cache"
    point_at(monkeypatch, cache, tmp_path / "home")
    repo = add_step_revisions(cache, tmp_path, main_step=-1)
    window, state = _window(qtbot)
    bar = window.timeline_bar
    _open_from_cache_dialog(qtbot, window, state, "f" * 40)
    qtbot.waitUntil(lambda: bar.isVisible(), timeout=30_000)
    assert bar.shown_step is None and bar.step_label.text() == "not a step revision (steps 0 to 1000)"
    assert not bar.marker.isVisible()
    bar.slider.setFocus()
    qtbot.keyClick(bar.slider, Qt.Key.Key_Home)
    folder = repo / "snapshots" / step_revision(0)
    qtbot.waitUntil(lambda: state.loaded.path == folder and bar.shown_step == 0, timeout=60_000)
    assert bar.marker.isVisible() and _same_weights(state.loaded, folder)

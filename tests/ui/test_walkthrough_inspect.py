"""Issue 13: the inspecting panels (Model, Attention, Layers) clicked through as a person would, on
the four walkthrough models. Every signal arrives with the arguments Qt really sends; no error
dialog, no error log, no AppState.error may appear."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog

from .walkthrough import WALKTHROUGH_MODELS, click_tab, open_window, shown_tab_titles

# What a person types next in the Model panel's text box, for each model (ids for 'notok').
NEW_TEXT = {"demo": "The rabbit hole went straight on.", "bert": "the dog sat on the cat .",
            "llama": "the dog sat on the mat.", "notok": "7 8 9 10 11"}


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)


@pytest.mark.parametrize("name", WALKTHROUGH_MODELS)
def test_inspect_panels_clicked_through(qtbot, name, model_dirs, isolated_user_files, error_watch, tmp_path,
                                        monkeypatch):
    window, state = open_window(qtbot, model_dirs[name], name=name, watch=error_watch)
    cfg = state.loaded.config
    # a job is marked done before its result reaches the UI thread: wait for the trace itself
    qtbot.waitUntil(lambda: state.trace is not None or state.trace_problem != "", timeout=30_000)
    assert state.trace is not None, state.trace_problem

    # -- Model: type a new text, click a chip --------------------------------------------------
    click_tab(qtbot, window.tabs, "Model")
    model = window.slot("Model").panel
    model.text_edit.setFocus()
    model.text_edit.selectAll()
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(model.text_edit, NEW_TEXT[name])
    _wait_traced(qtbot, state)
    assert state.text == NEW_TEXT[name] and state.trace is not None
    n = len(state.token_ids)
    assert model.token_strip.count() == n >= 3
    qtbot.mouseClick(model.token_strip.canvas, Qt.MouseButton.LeftButton, pos=model.token_strip.chip_center(1))
    assert model.token_info.text().startswith(f"token #1: id {state.token_ids[1]}")

    # -- Attention: a thumbnail, the spin boxes, every sub-view ---------------------------------
    click_tab(qtbot, window.tabs, "Attention")
    attention = window.slot("Attention").panel
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) == cfg.n_layers * cfg.n_heads
                    and attention.stats is not None, timeout=30_000)
    mv = attention.model_view
    layer, head = cfg.n_layers - 1, cfg.n_heads - 1
    qtbot.mouseClick(mv.viewport(), Qt.MouseButton.LeftButton, pos=mv.mapFromScene(mv.thumb_scene_center(layer, head)))
    assert (attention.layer, attention.head) == (layer, head)
    assert attention.current_view() is attention.heatmap
    assert attention.heatmap.values.shape == (n, n)
    qtbot.keyClick(attention.layer_spin, Qt.Key.Key_Down)
    qtbot.keyClick(attention.head_spin, Qt.Key.Key_Down)
    assert (attention.layer, attention.head) == (layer - 1, head - 1)
    qtbot.keyClick(attention.head_spin, Qt.Key.Key_Up)
    for title in attention.VIEW_TITLES:
        click_tab(qtbot, attention.tabs, title)
    assert attention.stat_combo.isEnabled()  # on Head statistics
    for _ in range(attention.stat_combo.count()):
        qtbot.keyClick(attention.stat_combo, Qt.Key.Key_Down)
    assert attention.stat_combo.currentIndex() == attention.stat_combo.count() - 1
    assert attention.stats_map.values.shape == (cfg.n_layers, cfg.n_heads)
    click_tab(qtbot, attention.tabs, "Rollout")
    assert attention.rollout_map.values.shape == (n, n)
    click_tab(qtbot, attention.tabs, "Head view")
    assert len(attention.head_view.checks) == cfg.n_heads
    check = attention.head_view.checks[0]
    qtbot.mouseClick(check, Qt.MouseButton.LeftButton, pos=QPoint(6, check.height() // 2))  # on its box
    assert attention.head_view.heads_enabled()[0] is False
    click_tab(qtbot, attention.tabs, "Mean over heads")
    assert attention.mean_map.values.shape == (n, n)

    # -- Layers: every sub-view, the depth slider ----------------------------------------------
    click_tab(qtbot, window.tabs, "Layers")
    layers = window.slot("Layers").panel
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)
    mixture = bool(getattr(layers.state.loaded.config, "num_experts", 0))
    moe_titles = {v.title for v in layers.VIEW_TABLE if v.name in layers.MIXTURE_VIEWS}
    assert moe_titles <= set(shown_tab_titles(layers.tabs)) if mixture else not moe_titles & set(shown_tab_titles(layers.tabs))
    for title in shown_tab_titles(layers.tabs):
        click_tab(qtbot, layers.tabs, title)
    layers.depth_slider.setFocus()
    qtbot.keyClick(layers.depth_slider, Qt.Key.Key_End)
    assert layers.depth_slider.value() == cfg.n_layers
    qtbot.keyClick(layers.depth_slider, Qt.Key.Key_Left)
    assert layers.depth_label.text() == f"depth: {layers.result.depth_labels[cfg.n_layers - 1]}"
    assert layers.cosine_view.depth == cfg.n_layers - 1
    click_tab(qtbot, layers.tabs, "PCA")
    assert layers.pca_view.depth == cfg.n_layers - 1
    assert layers.lens_view.lens.rowCount() == n

    # -- File > Export Current View, a name typed without extension -----------------------------
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (str(tmp_path / "pca"), "PNG image (*.png)")))
    window.export_action.trigger()
    assert not QImage(str(tmp_path / "pca.png")).isNull()

    error_watch.assert_clean()

"""What a person sees at 1024x640 (look14): text not cut nor wrapped, widgets whole, columns as wide as what they
hold; the Layers panel shows no previous text's numbers; the Image panel only for a model that takes images;
Generate's screenshot_ready only once its layout has settled."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QStyle, QStyleOptionComboBox

from .walkthrough import choose_item, click_panel_tab, click_tab, graph_with_its_top_feature_clicked, open_window


def _window_1024(qtbot, model_dirs, **kw):
    w, state = open_window(qtbot, model_dirs["demo"], **kw)
    w.resize(1024, 640)
    return w, state


def _one_line(label) -> bool:
    """A word-wrapped label's text fits its width on one line."""
    return label.fontMetrics().horizontalAdvance(label.text()) <= label.contentsRect().width()


def _columns_hold_their_cells(table, first: int = 0) -> None:
    """Every column from `first` as wide as its title and its cells' text, none past the table's right edge."""
    header = table.horizontalHeader()
    margins = 6  # (a cell's text is drawn 3 px in from either side: Fusion's focus frame margin + 1)
    for c in range(first, table.columnCount()):
        title = table.horizontalHeaderItem(c).text()
        assert header.sectionSize(c) >= header.fontMetrics().horizontalAdvance(title) + margins, title
        for r in range(table.rowCount()):
            text = table.item(r, c).text()
            assert table.columnWidth(c) >= table.fontMetrics().horizontalAdvance(text) + margins, (text, c)
    last = table.columnCount() - 1
    assert header.sectionPosition(last) + header.sectionSize(last) <= table.viewport().width()


def test_the_attention_panels_ablate_button_has_room_for_its_text_and_menu_arrow(qtbot, model_dirs,
                                                                                 isolated_user_files):
    """A tool button's instant popup drew its menu arrow over 'Ablate' (the button as wide as its text)."""
    w, state = _window_1024(qtbot, model_dirs, name="demo")
    panel = click_panel_tab(qtbot, w, "Attention")
    qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
    button = panel.ablate_button
    arrow = button.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, button)
    assert button.width() >= button.fontMetrics().horizontalAdvance(button.text()) + arrow + 8, button.width()
    opened = []

    def close_menu() -> None:
        opened.append(button.menu().isVisible() and bool(button.menu().actions()))
        button.menu().close()

    from PySide6.QtCore import QTimer
    QTimer.singleShot(200, close_menu)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # its menu: filled for the layer and head chosen
    qtbot.waitUntil(lambda: bool(opened), timeout=5_000)
    assert opened == [True]


def test_the_dynamics_q_k_v_box_shows_each_choice_whole(qtbot, model_dirs, isolated_user_files):
    """'a head of the loaded model' read 'a head of the loa' in its 16-character box."""
    w, state = _window_1024(qtbot, model_dirs, name="demo")
    panel = click_panel_tab(qtbot, w, "Dynamics")
    qtbot.waitUntil(panel.screenshot_ready, timeout=30_000)
    for combo in (panel.qkv, panel.init):
        for i in range(combo.count()):
            text = combo.itemText(i)
            choose_item(qtbot, combo, text)
            qtbot.wait(20)  # (laid out)
            option = QStyleOptionComboBox()
            combo.initStyleOption(option)
            field = combo.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                                 QStyle.SubControl.SC_ComboBoxEditField, combo)
            assert field.width() >= combo.fontMetrics().horizontalAdvance(text), (text, field.width())
            assert combo.visibleRegion().boundingRect() == combo.rect() or panel.form_scroll.isAncestorOf(combo)
    # the form's column still leaves the particles their room
    assert panel.particles.width() >= 220


def test_the_lipschitz_run_table_shows_one_line_a_run_and_every_number_whole(qtbot, model_dirs, isolated_user_files):
    """The numbers' columns were as wide as '0.00000000', leaving the run's label ~85 px: it wrapped onto a second
    line cut by the row ('demo-model …' over 'model L0 H1 …')."""
    w, state = _window_1024(qtbot, model_dirs, name="demo")
    panel = click_panel_tab(qtbot, w, "Lipschitz")
    panel.lengths.setText("4,8")
    panel.samples.setValue(2)
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running() and panel.table.rowCount() == 4, timeout=60_000)
    qtbot.wait(50)  # (laid out)
    table = panel.table
    _columns_hold_their_cells(table, first=1)  # the numbers whole
    assert not table.horizontalScrollBar().isVisible()
    # the run's label: the rest of the row, on one line (a longer one cut, its tooltip whole)
    assert table.columnWidth(0) >= table.viewport().width() / 3, (table.columnWidth(0), table.viewport().width())
    assert not table.wordWrap()
    assert all(table.item(r, 0).toolTip() == table.item(r, 0).text() for r in range(table.rowCount()))


def test_the_model_panels_count_line_is_one_line_until_a_token_is_clicked(qtbot, model_dirs, isolated_user_files):
    """'51 tokens · colour: p(token | tokens before) · perplexity 23.2' wrapped: an empty label beside it (the
    clicked token's line) took a third of the row."""
    w, state = _window_1024(qtbot, model_dirs, text="Alice was beginning to get very tired of sitting by her sister "
                                                    "on the bank, and of having nothing to do")
    panel = click_panel_tab(qtbot, w, "Model")
    qtbot.waitUntil(lambda: "perplexity" in panel.count_label.text(), timeout=20_000)
    qtbot.wait(50)  # (laid out)
    assert _one_line(panel.count_label), (panel.count_label.text(), panel.count_label.width())
    assert not panel.token_info.isVisible()
    strip = panel.token_strip
    qtbot.mouseClick(strip.canvas, Qt.MouseButton.LeftButton, pos=strip.chip_center(2))
    qtbot.waitUntil(lambda: panel.token_info.isVisible() and panel.token_info.text() != "", timeout=5_000)


def test_the_features_attribution_line_is_one_line(qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    """'Next token ' the' (#267): the 35 active features, … largest: …' ran onto a second line."""
    import torch

    from desktop_app.core.features import SparseDictionary, save_dictionary

    g = torch.Generator().manual_seed(0)
    save_dictionary(SparseDictionary(torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, generator=g) * 0.1,
                                     torch.randn(64, 128, generator=g) * 0.1, torch.randn(128, generator=g) * 0.1,
                                     hook="blocks.2.hook_resid_post"), tmp_path / "sae")
    w, state = _window_1024(qtbot, model_dirs, name="demo")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path / "sae")))
    with qtbot.waitSignal(state.dictionaries_changed, timeout=20_000):
        w.open_features_action.trigger()
    panel = w.slot("Features").panel
    qtbot.waitUntil(lambda: panel.lens is not None, timeout=20_000)
    click_tab(qtbot, panel.tabs, "Attribution")
    qtbot.waitUntil(lambda: panel.attr_chart.attribution is not None and "sum to" in panel.attr_status.text(),
                    timeout=20_000)
    qtbot.wait(50)  # (laid out)
    assert _one_line(panel.attr_status), (panel.attr_status.text(), panel.attr_status.width())


def test_the_feature_dashboards_promotes_and_suppresses_show_their_weights_whole_once_its_tab_is_clicked(
        qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    """A feature clicked in the Features lens fills the Dashboard tab's Promotes / Suppresses while that tab is
    hidden; clicked then at 1024 px, the weight column kept a wider width: its numbers cut ('+0.' for '+0.259')
    under a horizontal scroll bar."""
    from .test_features_panel import _click_row, _dictionary, _lens_shown, _open_from_menu

    w, state = _window_1024(qtbot, model_dirs, text="Alice was beginning to get very tired of sitting by her sister.")
    _open_from_menu(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "sae-l2"))
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    _click_row(qtbot, panel.features_table, 1)
    dash = panel.dashboard
    qtbot.waitUntil(lambda: dash.promoted_table.rowCount() == 10 and dash.suppressed_table.rowCount() == 10,
                    timeout=20_000)
    assert not dash.promoted_table.isVisible()  # (filled on its hidden tab)
    click_tab(qtbot, panel.tabs, "Dashboard")
    qtbot.wait(50)  # (laid out)
    for table in (dash.promoted_table, dash.suppressed_table):
        assert table.verticalScrollBar().isVisible()  # (more rows than fit: the case this is about)
        assert not table.horizontalScrollBar().isVisible(), [table.columnWidth(c) for c in range(2)]
        _columns_hold_their_cells(table)


def test_the_graph_panels_search_box_shows_its_placeholder_whole(qtbot, model_dirs, isolated_user_files):
    """At 1024 px the Graph panel's search box was ~155 px: its placeholder read "search: feature id or la…"."""
    w, state = _window_1024(qtbot, model_dirs, name="demo")
    panel = click_panel_tab(qtbot, w, "Graph")
    qtbot.waitUntil(panel.search_box.isVisible)
    qtbot.wait(50)  # (laid out)
    box = panel.search_box
    assert w.width() == 1024 and box.text() == ""
    room = box.contentsRect().width() - box.textMargins().left() - box.textMargins().right() - 2 * 2  # (Qt's margin)
    assert box.fontMetrics().horizontalAdvance(box.placeholderText()) <= room, (box.placeholderText(), room)


def test_the_graph_nodes_suppresses_table_shows_its_tokens_whole(qtbot, model_dirs, isolated_user_files, tmp_path,
                                                                 monkeypatch):
    """The node's dashboard: the histogram took most of the side pane and 'Suppresses' had ~75 px."""
    w, state = _window_1024(qtbot, model_dirs, text="The cat sat on the mat because it was")
    panel, _ = graph_with_its_top_feature_clicked(qtbot, w, tmp_path, monkeypatch)
    dash = panel.dashboard
    qtbot.waitUntil(lambda: dash.suppressed_table.rowCount() > 0 and dash.promoted_table.rowCount() > 0,
                    timeout=20_000)
    qtbot.wait(50)  # (laid out)
    for table in (dash.promoted_table, dash.suppressed_table):
        assert table.width() >= dash.histogram.width() / 2, (table.width(), dash.histogram.width())
        _columns_hold_their_cells(table)


def test_the_layers_panel_shows_no_previous_texts_numbers_while_it_computes(qtbot, model_dirs, isolated_user_files,
                                                                          monkeypatch):
    """A new text's analysis running, the panel showed the previous text's residual norms under 'computing…'."""
    from desktop_app.ui.panels import layers

    w, state = _window_1024(qtbot, model_dirs, name="demo")
    panel = click_panel_tab(qtbot, w, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None and panel.screenshot_ready(), timeout=30_000)
    norms = panel.resid_map
    assert norms.values.size > 0
    release, started = threading.Event(), threading.Event()
    compute = layers.compute_layers

    def held(*args):
        started.set()
        release.wait(30)
        return compute(*args)

    monkeypatch.setattr(layers, "compute_layers", held)
    try:
        with qtbot.waitSignal(state.trace_changed, timeout=20_000):
            state.set_text("The cat sat on the mat")
        qtbot.waitUntil(started.is_set, timeout=20_000)
        assert panel.status.text().startswith("computing")
        assert panel.data is None and norms.values.size == 0  # nothing of the previous text
        assert panel.tokens.count() == len(state.token_ids)  # this text's tokens
    finally:
        release.set()
    qtbot.waitUntil(lambda: panel.data is not None and panel.screenshot_ready(), timeout=30_000)
    assert norms.values.shape[0] == len(state.token_ids)


def test_the_image_panel_asked_for_on_a_text_model_gives_way_to_the_model_panel_and_says_why(
        qtbot, model_dirs, isolated_user_files):
    """The last session's Image panel (or --panel image) on a text model: its hidden tab was on show, its controls
    disabled; before the model came it was built and current."""
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    state.text = "Alice was beginning to get very tired"
    w = MainWindow(state)
    qtbot.addWidget(w)
    w.show()
    w.show_panel("Image")  # before the model is open (a workspace's panel, --panel): decided when it comes
    assert w.current_slot() is w.slot("Model")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        w.open_model(model_dirs["demo"])
    assert w.current_slot() is w.slot("Model")
    assert not w.tabs.isTabVisible(w.tabs.indexOf(w.slot("Image")))
    said = w.statusBar().currentMessage()
    assert "Image panel is for models that take images" in said and "Model panel is on show" in said, said
    click_panel_tab(qtbot, w, "Layers")
    w.show_panel("Image")  # a text model open: refused at once, the tab on show kept
    assert w.current_slot() is w.slot("Layers") and "Image panel" in w.statusBar().currentMessage()


def test_panel_image_on_a_text_model_is_one_line(tmp_path, capsys, monkeypatch):
    from desktop_app.ui.app import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    code = main(["--panel", "image", "--screenshot", str(tmp_path / "shot.png"), "--timeout", "120"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "shot.png").exists()
    assert err[-1].startswith("transformer-explorer: error: --panel image: the Image panel is for models that take "
                              "images"), err


@pytest.mark.parametrize("size", [(1024, 640), (1280, 800)])
def test_generates_screenshot_ready_waits_for_its_layout_to_settle(qtbot, model_dirs, isolated_user_files, size):
    """Built by the tab's click, the panel said ready before it was shown (a screenshot of an empty page), then one
    relayout before its bars' axis took the width it is drawn at."""
    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    w.resize(*size)
    panel = click_panel_tab(qtbot, w, "Generate")
    qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
    first = panel.grab().toImage()
    qtbot.wait(300)
    assert panel.grab().toImage() == first

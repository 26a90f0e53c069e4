"""AttentionPanel with pytest-qt: thumbnails, hover, token selection, head toggles, exports."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import torch
from PySide6.QtCore import QPoint, QPointF, Qt

from desktop_app.core import analysis
from desktop_app.core.model import KVCache
from desktop_app.ui.panels.attention import AttentionPanel
from desktop_app.ui.state import AppState
from desktop_app.ui.widgets.export import export_view
from tiny_models import tiny_model

TEXT = "the cat sat on a mat"


def _loaded(family="gpt2"):
    return tiny_model(TEXT, family, d_model=36, n_heads=3, init_std=0.3)


def _panel(qtbot, family="gpt2"):
    state = AppState()
    state.loaded = _loaded(family)
    panel = AttentionPanel(state)
    qtbot.addWidget(panel)
    panel.resize(1000, 800)
    panel.show()
    ids = state.loaded.tokenizer.encode(TEXT)
    _, trace = state.loaded.model.run_with_trace(torch.tensor([ids]))
    state.show_trace(trace, ids)
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    return panel, trace, ids


def _hold(monkeypatch, module, name: str):
    """module.name held in the worker until `release` is set (`started`: it was called). Returns (started, release)."""
    import threading

    started, release, real = threading.Event(), threading.Event(), getattr(module, name)

    def held(*args, **kw):
        started.set()
        release.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(module, name, held)
    return started, release


def _view_point(view, scene_pos) -> QPoint:
    return view.mapFromScene(scene_pos)


def test_thumbnail_click_opens_that_head(qtbot):
    panel, trace, _ = _panel(qtbot)
    mv = panel.model_view
    assert len(mv.boxes) == 2 * 3
    qtbot.mouseClick(mv.viewport(), Qt.MouseButton.LeftButton, pos=_view_point(mv, mv.thumb_scene_center(1, 2)))
    assert (panel.layer, panel.head) == (1, 2)
    assert panel.current_view() is panel.heatmap
    np.testing.assert_array_equal(panel.heatmap.values, trace["blocks.1.attn.pattern"][0, 2].numpy())
    qtbot.mouseClick(mv.viewport(), Qt.MouseButton.LeftButton, pos=_view_point(mv, mv.thumb_scene_center(0, 1)))
    assert (panel.layer, panel.head) == (0, 1)


def test_each_thumbnail_is_drawn_in_its_box_with_its_colours(qtbot):
    """The model view paints every head's thumbnail (thumbnails(): RGBA) in its box: the grab's pixel at the middle
    of each thumbnail cell is that cell's colour."""
    from desktop_app.core.views.attention import thumbnails

    panel, trace, _ = _panel(qtbot)
    mv = panel.model_view
    expected = thumbnails([trace.pattern(l)[0] for l in range(trace.n_layers)], panel.mask, mv.lut, mv.THUMB)
    shot = mv.grab().toImage()
    ratio = shot.width() / mv.width()
    for (layer, head), box in mv.boxes.items():
        rgba = expected[layer][head]
        rows, cols = rgba.shape[:2]
        for i, j in ((0, 0), (rows - 1, 0), (rows // 2, cols // 3), (rows - 1, cols - 1)):
            at = QPointF(box.x() + (j + 0.5) * box.width() / cols, box.y() + (i + 0.5) * box.height() / rows)
            pixel = _view_point(mv, mv.view.mapViewToScene(at)) * ratio
            colour = shot.pixelColor(pixel)
            assert (colour.red(), colour.green(), colour.blue()) == tuple(rgba[i, j, :3]), (layer, head, i, j)


def test_hover_gives_query_key_and_weight(qtbot):
    panel, trace, ids = _panel(qtbot)
    panel.open_head(1, 0)
    hm = panel.heatmap
    strings = panel.state.token_strings(ids)
    row, col = 5, 2
    qtbot.waitExposed(hm)
    qtbot.mouseMove(hm.viewport(), QPoint(1, 1))  # start outside the cells (the cursor may be anywhere)
    qtbot.wait(100)  # pyqtgraph's scene drops mouse moves closer than its rate limit
    qtbot.mouseMove(hm.viewport(), _view_point(hm, hm.cell_scene_pos(row, col)))
    qtbot.waitUntil(lambda: hm.hover_text != "", timeout=3000)
    weight = float(trace["blocks.1.attn.pattern"][0, 0, row, col])
    assert f"query {row} {strings[row]!r}" in hm.hover_text.replace("\u00b7", " ")
    assert f"key {col} {strings[col]!r}" in hm.hover_text.replace("\u00b7", " ")
    assert f"{weight:.4g}" in hm.hover_text
    assert hm.toolTip() == hm.hover_text
    # a cell the causal mask hides says so
    qtbot.wait(100)
    qtbot.mouseMove(hm.viewport(), _view_point(hm, hm.cell_scene_pos(2, 7)))
    qtbot.waitUntil(lambda: "masked" in hm.hover_text, timeout=3000)


def test_causal_cells_are_grey_and_encoders_have_none(qtbot):
    panel, _, ids = _panel(qtbot)
    panel.show_view("attention")
    hm = panel.heatmap
    assert hm.mask_polygon.isVisible()
    poly = hm.mask_polygon.polygon()
    n = len(ids)
    for i, j in ((0, 1), (3, 4), (5, n - 1)):  # above the diagonal: grey
        assert poly.containsPoint(QPointF(j + 0.5, i + 0.5), Qt.FillRule.OddEvenFill)
    for i, j in ((1, 0), (4, 4), (n - 1, 0)):  # the causal past and the token itself: not covered
        assert not poly.containsPoint(QPointF(j + 0.5, i + 0.5), Qt.FillRule.OddEvenFill)
    enc, _, _ = _panel(qtbot, "bert")
    enc.show_view("attention")
    assert enc.mask is None and not enc.heatmap.mask_polygon.isVisible()
    assert not enc.heatmap.mask_image.isVisible()
    assert enc.rollout is not None and np.all(enc.rollout[-1] > 0)


def test_token_selection_highlights_rows_everywhere(qtbot):
    panel, trace, _ = _panel(qtbot)
    qtbot.mouseClick(panel.tokens.canvas, Qt.MouseButton.LeftButton, pos=panel.tokens.chip_center(6))
    assert panel.selected_token == 6
    mv = panel.model_view  # row 6 boxed on every thumbnail: its pattern cells' 7th row of pixels
    side = next(iter(mv.boxes.values())).height() / trace.pattern(0).shape[-2]
    np.testing.assert_allclose(sorted((r.x(), r.y(), r.width(), r.height()) for r in mv.row_rects()),
                               sorted((b.x(), b.y() + 6 * side, b.width(), side) for b in mv.boxes.values()))
    for view, hm in (("attention", panel.heatmap), ("mean", panel.mean_map), ("rollout", panel.rollout_map)):
        panel.show_view(view)  # hidden views are drawn when shown, with the selection
        assert hm.row_box.isVisible() and hm.row_box.rect().top() == 6
    # the head view draws only the selected query's lines above the threshold, one per head weight
    p = trace[f"blocks.{panel.layer}.attn.pattern"][0].numpy()
    panel.show_view("head-view")
    hv = panel.head_view
    assert hv.n_lines == int((p[:, 6] >= hv.threshold).sum())
    hv.checks[0].setChecked(False)
    assert hv.n_lines == int((p[1:, 6] >= hv.threshold).sum())
    # clicking a heatmap row selects that query too
    hm = panel.heatmap
    panel.show_view("attention")
    qtbot.mouseClick(hm.viewport(), Qt.MouseButton.LeftButton, pos=_view_point(hm, hm.cell_scene_pos(3, 1)))
    assert panel.selected_token == 3 and hm.row_box.rect().top() == 3


def test_aggregate_views_show_core_numbers(qtbot):
    panel, trace, _ = _panel(qtbot)
    panel.show_view("mean")
    panel.layer_spin.setValue(1)
    np.testing.assert_allclose(panel.mean_map.values, analysis.mean_over_heads(trace, 1), rtol=1e-5)
    panel.show_view("rollout")
    np.testing.assert_allclose(panel.rollout_map.values, analysis.attention_rollout(trace)[1], rtol=1e-5)
    panel.layer_spin.setValue(0)  # the visible view follows the layer at once
    np.testing.assert_allclose(panel.rollout_map.values, analysis.attention_rollout(trace)[0], rtol=1e-5)
    stats = analysis.head_stats(trace)
    panel.show_view("head-stats")
    for i, key in enumerate(("entropy", "mean_distance", "first_token")):
        panel.stat_combo.setCurrentIndex(i)
        np.testing.assert_allclose(panel.stats_map.values, stats.as_dict()[key], rtol=1e-5)
        assert len(panel.stats_map.annotations) == 2 * 3


def test_every_view_exports_png_svg_and_numbers(qtbot, tmp_path):
    panel, _, _ = _panel(qtbot)
    for name in panel.VIEWS:
        panel.show_view(name)
        view = panel.current_view()
        for suffix in (".png", ".svg", ".npz") + ((".csv",) if hasattr(view, "csv_table") else ()):
            out = tmp_path / f"{name}{suffix}"
            export_view(view, out)
            assert out.stat().st_size > (20 if suffix == ".csv" else 100), out
        svg = ET.parse(tmp_path / f"{name}.svg").getroot()  # well-formed XML
        tags = {el.tag.split("}")[-1] for el in svg.iter()}
        assert tags & {"path", "polyline", "text"}, tags  # vector drawing, not only an embedded bitmap
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with np.load(tmp_path / f"{name}.npz") as z:
            assert len(z.files) > 0
    panel.export_bar.copy()
    from PySide6.QtWidgets import QApplication
    assert not QApplication.clipboard().pixmap().isNull()


def test_a_cached_generation_step_is_shown(qtbot):
    panel, _, ids = _panel(qtbot)
    model = panel.state.loaded.model
    cache = KVCache(model.cfg.n_layers)
    model(torch.tensor([ids[:-1]]), cache=cache)
    _, step = model.run_with_trace(torch.tensor([ids[-1:]]), cache=cache)
    panel.state.show_trace(step, ids)
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    panel.show_view("attention")
    assert panel.heatmap.values.shape == (1, len(ids))
    assert panel.rollout is None
    panel.select_token(len(ids) - 1)
    assert panel.heatmap.row_box.isVisible() and panel.heatmap.row_box.rect().top() == 0


def test_the_model_view_is_drawn_before_the_rollout_and_statistics_arrive(qtbot, monkeypatch):
    """The first look waits for what is on show only: the model view's thumbnails are painted (and the panel
    is ready for a screenshot) while the worker still computes the rollout and statistics."""
    import desktop_app.core.views.attention as views

    panel, trace, ids = _panel(qtbot)
    started, release = _hold(monkeypatch, views, "aggregates")
    panel.state.show_trace(trace, ids[:-1] + ids[-1:])  # the same text traced again: a new trace on show
    try:
        qtbot.waitUntil(started.is_set, timeout=10_000)
        assert panel.stats is None and panel.data.thumbs is not None
        assert panel.model_view.filled_layers() == trace.n_layers and panel.screenshot_ready()
        panel.show_view("rollout")
        assert not panel.screenshot_ready()  # the rollout is not drawn yet
    finally:
        release.set()
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    assert panel.screenshot_ready()
    np.testing.assert_allclose(panel.rollout_map.values, analysis.attention_rollout(trace)[0], rtol=1e-5)


def test_help_text_defines_the_quantities():
    for word in ("softmax", "Rollout", "entropy", "distance", "first token"):
        assert word in AttentionPanel.help_text


def test_a_generation_path_trace_is_shown(qtbot):
    from desktop_app.core.generation import GenerationSession

    panel, _, ids = _panel(qtbot)
    session = GenerationSession(panel.state.loaded, ids[:6], seed=0)
    for _ in range(3):
        session.step()
    trace, path_ids = session.step_trace()
    panel.state.show_trace(trace, path_ids)
    qtbot.waitUntil(lambda: panel.rollout is not None and panel.rollout.shape[-1] == 9, timeout=10_000)
    panel.show_view("attention")
    np.testing.assert_allclose(panel.heatmap.values, trace["blocks.0.attn.pattern"][0, 0].numpy())
    np.testing.assert_allclose(panel.rollout, analysis.attention_rollout(trace), rtol=1e-6)


def test_clicking_a_token_in_the_head_view_selects_it_and_a_second_click_clears(qtbot):
    panel, trace, _ = _panel(qtbot)
    panel.show_view("head-view")
    hv = panel.head_view
    qtbot.waitExposed(hv)
    vb = hv.plot.getViewBox()
    pos = hv.graphics.mapFromScene(vb.mapViewToScene(QPointF(0.02, 4.5)))
    qtbot.mouseClick(hv.graphics.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert panel.selected_token == 4
    p = trace["blocks.0.attn.pattern"][0].numpy()
    assert hv.n_lines == int((p[:, 4] >= hv.threshold).sum())
    qtbot.wait(600)  # not a double click
    qtbot.mouseClick(hv.graphics.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert panel.selected_token is None


def test_export_buttons_write_the_current_view(qtbot, tmp_path, monkeypatch):
    import desktop_app.ui.widgets.export as export_module
    from PySide6.QtWidgets import QToolButton

    panel, _, _ = _panel(qtbot)
    panel.open_head(1, 1)
    asked = []

    def fake_ask(parent, title, default_name, filters):
        asked.append((default_name, filters))
        return str(tmp_path / default_name)

    monkeypatch.setattr(export_module, "ask_save_path", fake_ask)
    buttons = {b.text(): b for b in panel.export_bar.findChildren(QToolButton)}
    for text in ("PNG", "SVG", "Data"):
        qtbot.mouseClick(buttons[text], Qt.MouseButton.LeftButton)
    names = [a[0] for a in asked]
    assert names == ["attention-L1-H1.png", "attention-L1-H1.svg", "attention-L1-H1.csv"]
    for name in names:
        assert (tmp_path / name).stat().st_size > 100
    panel.show_view("model-view")  # no table: the numbers go to NPZ
    qtbot.mouseClick(buttons["Data"], Qt.MouseButton.LeftButton)
    assert asked[-1][0] == "model-view.npz" and (tmp_path / "model-view.npz").stat().st_size > 100


def test_the_head_view_of_a_long_text_has_a_scroll_bar_to_every_token(qtbot, tmp_path):
    """Issue 41: the head view opened on 32 of 51 tokens with no scroll bar (only the wheel moved it)."""
    panel, _, _ = _panel(qtbot)
    text = (TEXT + " ") * 3  # 51 tokens
    ids = panel.state.loaded.tokenizer.encode(text[:51])
    _, trace = panel.state.loaded.model.run_with_trace(torch.tensor([ids]))
    panel.state.show_trace(trace, ids)
    panel.show_view("head-view")
    hv = panel.head_view
    qtbot.waitExposed(hv)
    qtbot.waitUntil(lambda: hv.pattern.shape[-1] == 51, timeout=10_000)
    bar = hv.scroll_bar
    assert bar.isVisible() and bar.maximum() + bar.pageStep() == 51
    lo, hi = hv.plot.getViewBox().viewRange()[1]
    assert hi < 40  # a window of the tokens ...
    for _ in range(3):  # ... and clicks below the bar's handle page down to the last of them
        qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=QPoint(bar.width() // 2, bar.height() - 20))
    assert bar.value() == bar.maximum()
    assert hv.plot.getViewBox().viewRange()[1][1] >= 50.5
    qtbot.waitUntil(lambda: hv.n_lines > 0 and not hv._redraw_timer.isActive(), timeout=5_000)  # its lines
    hv.grab().save(str(tmp_path.parent / "edges2_headview.png"))


def test_the_model_views_rows_past_the_bottom_scroll_into_view_with_the_wheel_and_open_on_a_click(qtbot):
    """Rows too many for the view's height keep a readable size and run past its bottom; the wheel scrolls them
    in (the heads' labels stay on top) and a click on one opens that head."""
    from PySide6.QtCore import QPointF as P
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    from desktop_app.ui.panels.attention import ModelView

    mv = ModelView()
    qtbot.addWidget(mv)
    mv.resize(500, 300)
    mv.show()
    rng = np.random.default_rng(0)
    mv.set_patterns([rng.random((2, 8, 8)).astype(np.float32) for _ in range(12)], None)
    assert mv.filled_layers() == 12 and len(mv.boxes) == 12 * 2
    qtbot.waitUntil(lambda: mv.viewport().rect().contains(_view_point(mv, mv.thumb_scene_center(0, 1))))
    assert not mv.viewport().rect().contains(_view_point(mv, mv.thumb_scene_center(11, 1)))
    head_label_y = mv._head_labels[1].mapToScene(0, 0).y()
    for _ in range(30):  # down, past the last row (the scroll stops there)
        where = P(mv.viewport().rect().center())
        QApplication.sendEvent(mv.viewport(), QWheelEvent(where, P(mv.mapToGlobal(where.toPoint())), QPoint(0, 0),
                                                           QPoint(0, -120), Qt.MouseButton.NoButton,
                                                           Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase,
                                                           False))
    last = _view_point(mv, mv.thumb_scene_center(11, 1))
    assert mv.viewport().rect().contains(last)
    assert not mv.viewport().rect().contains(_view_point(mv, mv.thumb_scene_center(0, 1)))
    assert mv._head_labels[1].mapToScene(0, 0).y() == head_label_y  # on top still
    with qtbot.waitSignal(mv.head_clicked) as clicked:
        qtbot.mouseClick(mv.viewport(), Qt.MouseButton.LeftButton, pos=last)
    assert clicked.args == [11, 1]


def test_the_rollout_tab_says_what_is_computed_until_it_arrives(qtbot, monkeypatch):
    """Seconds at 1,024 tokens of a 24-layer model: the tab on show says what the worker computes and how far
    it is (its progress), not a blank plot, then draws the rollout."""
    import threading

    import desktop_app.core.views.attention as views

    panel, trace, ids = _panel(qtbot)
    _click_tab(panel, qtbot, panel.rollout_map)
    started, reported, release = threading.Event(), threading.Event(), threading.Event()
    real = views.aggregates

    def held(trace, job=None, no_rollout="", on_rollout=None):
        started.set()
        reported.wait(10)
        job.progress(3, 24, "rollout")
        release.wait(10)
        return real(trace, job, no_rollout, on_rollout)

    monkeypatch.setattr(views, "aggregates", held)
    panel.state.show_trace(trace, ids[:-1] + ids[-1:])  # the same text traced again: a new trace on show
    title = panel.rollout_map.plot.titleLabel
    try:
        qtbot.waitUntil(started.is_set, timeout=10_000)
        qtbot.waitUntil(lambda: title.text == "Computing the rollout and head statistics\u2026", timeout=10_000)
        assert panel.rollout_map.values.size == 0  # the previous trace's rollout is not on show meanwhile
        reported.set()
        qtbot.waitUntil(lambda: title.text == "Computing the rollout: layer 4 / 24\u2026", timeout=10_000)
    finally:
        reported.set()
        release.set()
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    assert title.text.startswith("Attention rollout through layers")
    np.testing.assert_allclose(panel.rollout_map.values, analysis.attention_rollout(trace)[panel.layer], rtol=1e-5)


def _click_tab(panel, qtbot, widget) -> None:
    bar = panel.tabs.tabBar()
    page = widget.parentWidget()  # (each view's widget sits in its tab's page: view_panel._build_views)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(panel.tabs.indexOf(page)).center())
    assert panel.current_view() is widget


def test_the_rollout_is_drawn_while_the_head_statistics_are_computed(qtbot, monkeypatch):
    """The worker hands the rollout over before it computes the statistics (about half of its time)."""
    panel, trace, ids = _panel(qtbot)
    _click_tab(panel, qtbot, panel.rollout_map)
    started, release = _hold(monkeypatch, analysis, "head_stats")
    panel.state.show_trace(trace, ids[:-1] + ids[-1:])  # the same text traced again: a new trace on show
    try:
        qtbot.waitUntil(started.is_set, timeout=10_000)
        qtbot.waitUntil(lambda: panel.rollout_map.plot.titleLabel.text.startswith("Attention rollout"), timeout=10_000)
        assert panel.stats is None
        np.testing.assert_allclose(panel.rollout_map.values, analysis.attention_rollout(trace)[panel.layer], rtol=1e-5)
        _click_tab(panel, qtbot, panel.stats_map)
        assert panel.stats_map.plot.titleLabel.text == "Computing the head statistics\u2026"
    finally:
        release.set()
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    assert panel.stats_map.plot.titleLabel.text == analysis.STAT_NAMES[panel.view_state.statistic]


def test_cancel_on_the_statistics_tab_stops_their_worker_and_compute_computes_them(qtbot, monkeypatch):
    """The Head statistics tab shows the worker's progress with Cancel (as What if and Features do); a click
    stops the worker, whose numbers are then never shown, and the button, now Compute, computes them again."""
    from desktop_app.ui import workers

    CANCELLED = "Cancelled: press Compute to compute the rollout and head statistics."
    panel, trace, ids = _panel(qtbot)
    _click_tab(panel, qtbot, panel.stats_map)
    assert panel.aggregates_button.isHidden() and panel.aggregates_progress.isHidden()  # drawn: nothing to cancel
    started, release = _hold(monkeypatch, analysis, "head_stats")
    panel.state.show_trace(trace, ids[:-1] + ids[-1:])  # the same text traced again: a new trace on show
    try:
        qtbot.waitUntil(started.is_set, timeout=10_000)
        job = panel._job
        assert panel.aggregates_button.isVisible() and panel.aggregates_button.text() == "Cancel"
        assert panel.aggregates_progress.isVisible()
        _click_tab(panel, qtbot, panel.model_view)
        assert panel.aggregates_button.isHidden()  # (the model view is drawn: no Cancel there)
        _click_tab(panel, qtbot, panel.stats_map)
        qtbot.mouseClick(panel.aggregates_button, Qt.MouseButton.LeftButton)
        assert job.control.cancelled and panel._job is None
        assert panel.aggregates_button.text() == "Compute" and panel.aggregates_progress.isHidden()
        assert panel.stats_map.plot.titleLabel.text == CANCELLED
    finally:
        release.set()
    qtbot.waitUntil(lambda: job not in workers._active, timeout=10_000)  # the worker ended, its signals delivered
    assert panel.stats is None and panel.stats_map.plot.titleLabel.text == CANCELLED
    qtbot.mouseClick(panel.aggregates_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.stats is not None, timeout=10_000)
    assert panel.stats_map.plot.titleLabel.text == analysis.STAT_NAMES[panel.view_state.statistic]
    assert panel.aggregates_button.isHidden() and panel.aggregates_progress.isHidden()


def test_each_views_widget_is_made_when_its_tab_is_first_clicked_then_drawn_with_the_selection(qtbot):
    """The first look made every view's plots (four heatmaps and the head view) before anyone chose their tabs:
    only the model view is made; another at its tab's first click, drawn with the selection, its clicks wired."""
    panel, trace, _ = _panel(qtbot)
    assert set(panel.widgets) == {"model-view"}  # (before: every view's widget)
    panel.select_token(4)
    bar = panel.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(panel.VIEWS.index("head-view")).center())
    assert set(panel.widgets) == {"model-view", "head-view"}
    hv = panel.head_view
    assert hv.isVisible() and hv.selected_row == 4
    p = trace[f"blocks.{panel.layer}.attn.pattern"][0].numpy()
    assert hv.n_lines == int((p[:, 4] >= hv.threshold).sum())  # drawn: the selected query's lines
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(panel.VIEWS.index("attention")).center())
    hm = panel.heatmap
    assert hm.isVisible() and hm.row_box.isVisible() and hm.row_box.rect().top() == 4
    np.testing.assert_allclose(hm.values, p[panel.head], atol=1e-6)
    qtbot.waitUntil(lambda: hm.vb.width() > 0, timeout=5_000)  # its row clicks select too
    qtbot.mouseClick(hm.viewport(), Qt.MouseButton.LeftButton, pos=_view_point(hm, hm.cell_scene_pos(2, 1)))
    assert panel.selected_token == 2 and hv.selected_row == 2

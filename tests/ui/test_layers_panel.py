"""LayersPanel with pytest-qt: the views show core.analysis numbers; depth slider, selection, exports."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import torch
from PySide6.QtCore import QPointF, Qt

from desktop_app.core import analysis
from desktop_app.ui.panels.layers import LayersPanel
from desktop_app.ui.state import AppState
from desktop_app.ui.widgets.export import export_view
from tiny_models import tiny_model

TEXT = "a rose is a rose is a rose"


def _panel(qtbot, **cfg_kw):
    state = AppState()
    state.loaded = tiny_model(TEXT, cfg_kw.pop("family", "gpt2"), seed=1, n_layers=3, init_std=0.3, **cfg_kw)
    tok = state.loaded.tokenizer
    panel = LayersPanel(state)
    qtbot.addWidget(panel)
    panel.resize(1000, 800)
    panel.show()
    ids = tok.encode(TEXT)
    # record what the app records for big vocabularies (no logit_lens): the panel computes it lazily
    _, trace = state.loaded.model.run_with_trace(torch.tensor([ids]), names=(
        "embed", "final_norm.out", "logits", "blocks.*.attn.*", "blocks.*.resid_*", "blocks.*.mlp.out"))
    state.show_trace(trace, ids)
    qtbot.waitUntil(lambda: panel.result is not None, timeout=10_000)
    return panel, trace, ids


def click_tab(qtbot, panel, name: str) -> None:
    """Show a view as a person does: a click on its tab."""
    bar = panel.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(panel.VIEWS.index(name)).center())
    assert panel.view_state.view == name


def test_norm_views_show_core_numbers(qtbot):
    panel, trace, ids = _panel(qtbot)
    np.testing.assert_allclose(panel.resid_map.values, analysis.residual_norms(trace).T, rtol=1e-5)
    assert panel.resid_map.col_labels == ["embed", "L0", "L1", "L2"]
    click_tab(qtbot, panel, "component-norms")
    heads = analysis.head_output_norms(trace).mean(-1)
    mlp = analysis.mlp_output_norms(trace).mean(-1)
    np.testing.assert_allclose(panel.component_map.values[:, :4], heads, rtol=1e-5)
    np.testing.assert_allclose(panel.component_map.values[:, 4], mlp, rtol=1e-5)
    assert panel.component_map.col_labels[-1] == "MLP"


def test_logit_lens_table(qtbot):
    panel, trace, ids = _panel(qtbot)
    click_tab(qtbot, panel, "logit-lens")
    model, tok = panel.state.loaded.model, panel.state.loaded.tokenizer
    lens = panel.lens_view.lens
    assert lens.rowCount() == len(ids) and lens.columnCount() == 1 + 3  # "next" + one column per layer
    # the last layer's lens is the model's own prediction
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    probs = torch.softmax(logits, -1)
    for t in (0, 5, len(ids) - 1):
        top = int(probs[t].argmax())
        text = lens.data(lens.index(t, 3))
        assert text.endswith(f"{float(probs[t, top]):.2f}")
        assert lens.strings[2][t] == tok.token_strings([top])[0]
    assert lens.data(lens.index(0, 0)) == TEXT[1].replace(" ", "\u00b7")  # next-token column
    header, rows = panel.lens_view.csv_table()
    assert header[:3] == ["position", "token", "L0 top"] and len(rows) == len(ids)


def test_depth_slider_moves_pca_and_cosine(qtbot):
    panel, trace, ids = _panel(qtbot)
    pca = analysis.pca_over_depth(trace)
    curve = analysis.mean_cosine_by_depth(trace)
    click_tab(qtbot, panel, "cosine")
    click_tab(qtbot, panel, "pca")  # (both drawn once shown: the slider then moves both)
    for depth in (0, 2, 3):
        panel.depth_slider.setValue(depth)
        np.testing.assert_allclose(panel.cosine_view.heatmap.values, analysis.cosine_similarity(trace, depth),
                                   atol=1e-5)
        assert f"mean {curve[depth]:.3f}" in panel.cosine_view.heatmap.plot.titleLabel.text
        x, y = panel.pca_view.points.getData()
        np.testing.assert_allclose(np.c_[x, y], pca.coords[depth], atol=1e-5)
    np.testing.assert_allclose(panel.cosine_view.curve.getData()[1], curve, atol=1e-6)


def test_token_selection_highlights_every_view(qtbot):
    panel, _, ids = _panel(qtbot)
    qtbot.mouseClick(panel.tokens.canvas, Qt.MouseButton.LeftButton, pos=panel.tokens.chip_center(4))
    assert panel.selected_token == 4
    assert panel.resid_map.row_box.isVisible() and panel.resid_map.row_box.rect().top() == 4
    for name in ("cosine", "logit-lens", "pca"):  # each drawn when shown, with the selection
        click_tab(qtbot, panel, name)
    assert panel.cosine_view.heatmap.row_box.rect().top() == 4
    assert [i.row() for i in panel.lens_view.selectionModel().selectedRows()] == [4]
    x, y = panel.pca_view.selected_point.getData()
    np.testing.assert_allclose([x[0], y[0]], panel.result.pca.coords[panel.depth_slider.value(), 4], atol=1e-6)


def test_every_view_exports(qtbot, tmp_path):
    panel, _, _ = _panel(qtbot)
    for name in panel.VIEWS:
        panel.show_view(name)
        view = panel.current_view()
        for suffix in (".png", ".svg", ".csv", ".npz"):
            out = tmp_path / f"{name}{suffix}"
            export_view(view, out)
            assert out.stat().st_size > 20, out
        svg = ET.parse(tmp_path / f"{name}.svg").getroot()
        assert {el.tag.split("}")[-1] for el in svg.iter()} & {"path", "polyline", "text"}
        with np.load(tmp_path / f"{name}.npz") as z:
            assert len(z.files) > 0


def test_a_model_without_lm_head_still_shows_the_other_views(qtbot):
    panel, trace, _ = _panel(qtbot, family="bert", lm_head=False)
    assert "no language-model head" in panel.status.text()
    assert panel.lens_view.lens.rowCount() == 0
    np.testing.assert_allclose(panel.resid_map.values, analysis.residual_norms(trace).T, rtol=1e-5)


def test_help_text_defines_the_quantities():
    for word in ("Residual", "logit lens", "PCA", "Cosine", "Geshkovski"):
        assert word.lower() in LayersPanel.help_text.lower()


def test_a_generation_step_trace_is_shown(qtbot):
    """What the generation panel hands over: a path trace (head outputs included, no logit lens)."""
    from desktop_app.core.generation import GenerationSession

    panel, _, ids = _panel(qtbot)
    session = GenerationSession(panel.state.loaded, ids[:8], seed=0)
    for _ in range(4):
        session.step()
    trace, path_ids = session.step_trace()
    panel.state.show_trace(trace, path_ids)
    qtbot.waitUntil(lambda: panel.result is not None and panel.result.resid_norms.shape[1] == 12, timeout=10_000)
    np.testing.assert_allclose(panel.resid_map.values, analysis.residual_norms(trace).T, rtol=1e-5)
    click_tab(qtbot, panel, "component-norms")
    n_heads = panel.state.loaded.config.n_heads
    assert panel.component_map.col_labels == [f"head {h}" for h in range(n_heads)] + ["MLP"]
    np.testing.assert_allclose(panel.component_map.values[:, -1], analysis.mlp_output_norms(trace).mean(-1), rtol=1e-5)
    # the heads' outputs of generated tokens are computed after each fused step: they match a full forward
    _, full = panel.state.loaded.model.run_with_trace(torch.tensor([path_ids]))
    np.testing.assert_allclose(panel.component_map.values[:, :-1], analysis.head_output_norms(full).mean(-1),
                               rtol=1e-4, atol=1e-6)
    click_tab(qtbot, panel, "logit-lens")
    assert panel.lens_view.lens.rowCount() == 12  # computed lazily through the model's unembedding


def test_fast_successive_traces_end_on_the_last_one(qtbot):
    panel, _, ids = _panel(qtbot)
    model = panel.state.loaded.model
    traces = [model.run_with_trace(torch.tensor([ids[:n]]))[1] for n in (20, 15, 9)]
    for n, trace in zip((20, 15, 9), traces):
        panel.state.show_trace(trace, ids[:n])  # earlier jobs are cancelled or their results dropped
    qtbot.waitUntil(lambda: panel.result is not None and panel.result.resid_norms.shape[1] == 9, timeout=10_000)
    qtbot.wait(200)
    assert panel.result.resid_norms.shape[1] == 9
    np.testing.assert_allclose(panel.resid_map.values, analysis.residual_norms(traces[-1]).T, rtol=1e-5)


def test_a_screenshot_waits_for_the_layer_numbers(qtbot, monkeypatch):
    """--screenshot of the Layers panel waited only for the trace, so under load it captured an empty
    heatmap saying 'computing…': the panel says when its worker's numbers are shown (screenshot_ready)
    and the screenshot's demo loop (ui.app._run_panel_demo) waits for it."""
    import threading
    import time

    from desktop_app.ui import app as ui_app
    from desktop_app.ui.panels import layers as layers_module

    panel, trace, ids = _panel(qtbot)
    release = threading.Event()
    real = layers_module.compute_layers

    def held(*args, **kwargs):
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(layers_module, "compute_layers", held)
    panel.state.show_trace(trace, ids)  # a new trace: its numbers are held in the worker
    assert not panel.screenshot_ready() and panel.status.text().startswith("computing")

    class Window:  # what _run_panel_demo reads of the main window
        def current_slot(self):
            return type("Slot", (), {"panel": panel})()

    threading.Timer(0.5, release.set).start()
    assert ui_app._run_panel_demo(Window(), time.time() + 30)
    assert panel.screenshot_ready() and not panel.status.text().startswith("computing")
    assert panel.result is not None


def test_a_result_draws_the_view_on_show_and_each_other_view_when_its_tab_is_clicked(qtbot):
    """At 1,024 tokens of the Qwen2.5-0.5B shape drawing every view at a result held the UI thread ~1.2 s
    (bench ui): the view on show is drawn, the others when shown, each with the trace on show then."""
    panel, trace, ids = _panel(qtbot)
    assert panel.component_map.values.size == 0 and panel.pca_view.pca is None  # (before: drawn, hidden)
    assert panel.lens_view.lens.rowCount() == 0
    click_tab(qtbot, panel, "component-norms")
    np.testing.assert_allclose(panel.component_map.values[:, 4], analysis.mlp_output_norms(trace).mean(-1), rtol=1e-5)
    # a shorter text's trace while Component norms is on show: Residual norms, drawn for the first trace,
    # shows the new one's numbers when its tab is clicked again
    model = panel.state.loaded.model
    _, short = model.run_with_trace(torch.tensor([ids[:9]]))
    panel.state.show_trace(short, ids[:9])
    qtbot.waitUntil(lambda: panel.result is not None and panel.result.resid_norms.shape[1] == 9, timeout=10_000)
    np.testing.assert_allclose(panel.component_map.values[:, 4], analysis.mlp_output_norms(short).mean(-1), rtol=1e-5)
    # hidden: not drawn yet (nor the first trace's numbers left in it: cleared when the new trace came, look14)
    assert panel.resid_map.values.size == 0
    click_tab(qtbot, panel, "residual-norms")
    np.testing.assert_allclose(panel.resid_map.values, analysis.residual_norms(short).T, rtol=1e-5)
    panel.depth_slider.setValue(2)  # while PCA is hidden: drawn at depth 2 when shown
    click_tab(qtbot, panel, "pca")
    x, y = panel.pca_view.points.getData()
    np.testing.assert_allclose(np.c_[x, y], analysis.pca_over_depth(short).coords[2], atol=1e-5)
    assert panel.pca_view.plot.titleLabel.text.startswith("Token vectors at depth L1")


def test_each_views_widget_is_made_when_its_tab_is_first_shown_then_drawn_with_the_selection(qtbot):
    """Making every view's plots at the panel's build held its first show 278-525 ms at the Qwen2.5-0.5B shape
    (bench ui): only the view on show is made; another is made at its tab's first click, then drawn, selected."""
    state = AppState()
    panel = LayersPanel(state)
    qtbot.addWidget(panel)
    panel.resize(1000, 800)
    panel.show()
    assert set(panel.widgets) == {"residual-norms"}  # (before: every view's widget, PCA's and cosine's plots)
    click_tab(qtbot, panel, "component-norms")  # no trace yet: made, shown, empty
    assert panel.component_map.isVisible() and panel.component_map.values.size == 0
    click_tab(qtbot, panel, "residual-norms")
    state.loaded = tiny_model(TEXT, "gpt2", seed=1, n_layers=3, init_std=0.3)
    ids = state.loaded.tokenizer.encode(TEXT)
    _, trace = state.loaded.model.run_with_trace(torch.tensor([ids]))
    state.show_trace(trace, ids)
    qtbot.waitUntil(lambda: panel.result is not None, timeout=10_000)
    panel.select_token(4)
    assert set(panel.widgets) == {"residual-norms", "component-norms"}
    click_tab(qtbot, panel, "cosine")
    assert set(panel.widgets) == {"residual-norms", "component-norms", "cosine"}
    cosine = panel.cosine_view
    assert cosine.isVisible() and cosine.heatmap.isVisible()
    depth = panel.depth_slider.value()
    np.testing.assert_allclose(cosine.heatmap.values, analysis.cosine_similarity(trace, depth), atol=1e-5)
    assert cosine.heatmap.row_box.isVisible() and cosine.heatmap.row_box.rect().top() == 4
    # the new view's own connections: a click on its cell row 2 selects token 2 in every view
    hm = cosine.heatmap
    qtbot.waitUntil(lambda: hm.vb.width() > 0, timeout=5_000)
    pos = hm.mapFromScene(hm.vb.mapViewToScene(QPointF(1.5, 2.5)))
    qtbot.mouseClick(hm.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert panel.selected_token == 2 and panel.resid_map.row_box.rect().top() == 2
    click_tab(qtbot, panel, "pca")
    x, y = panel.pca_view.selected_point.getData()
    np.testing.assert_allclose([x[0], y[0]], analysis.pca_over_depth(trace).coords[depth, 2], atol=1e-5)


def _state_with_trace():
    state = AppState()
    state.loaded = tiny_model(TEXT, "gpt2", seed=1, n_layers=3, init_std=0.3)
    ids = state.loaded.tokenizer.encode(TEXT)
    _, trace = state.loaded.model.run_with_trace(torch.tensor([ids]), names=(
        "embed", "final_norm.out", "logits", "blocks.*.attn.*", "blocks.*.resid_*", "blocks.*.mlp.out"))
    state.show_trace(trace, ids)
    return state


def test_a_layers_panel_built_by_a_tab_click_starts_its_analysis_after_its_first_paint(qtbot, monkeypatch):
    """The analysis's worker took the cores from the panel's first show at 0.5B (bench ui): it starts once the
    panel built by the click has painted, and its numbers still arrive."""
    from PySide6.QtCore import QEvent, QObject
    from PySide6.QtWidgets import QApplication, QLabel, QTabWidget

    from desktop_app.ui import workers
    from desktop_app.ui.main_window import PanelSlot

    state = _state_with_trace()
    events: list[str] = []
    real_run_job = workers.run_job
    monkeypatch.setattr(workers, "run_job", lambda *a, **k: (events.append("worker started"), real_run_job(*a, **k))[1])
    slot = PanelSlot("Layers", "desktop_app.ui.panels.layers", "LayersPanel")

    class PaintSeen(QObject):
        def eventFilter(self, obj, event) -> bool:  # noqa: N802
            if event.type() == QEvent.Type.Paint and slot.panel is not None and obj is slot.panel:
                events.append("panel painted")
            return False

    seen = PaintSeen()
    QApplication.instance().installEventFilter(seen)
    try:
        tabs = QTabWidget()
        qtbot.addWidget(tabs)
        tabs.addTab(QLabel("the first look"), "Attention")
        tabs.addTab(slot, "Layers")
        tabs.currentChanged.connect(lambda _i: slot.build(state))  # as MainWindow builds a panel at its tab's click
        tabs.resize(900, 700)
        tabs.show()
        qtbot.waitExposed(tabs)
        bar = tabs.tabBar()
        qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
        assert slot.panel is not None and events == []  # built, nothing started in the click
        qtbot.waitUntil(lambda: slot.panel.result is not None, timeout=10_000)
    finally:
        QApplication.instance().removeEventFilter(seen)
    assert events.index("panel painted") < events.index("worker started")
    assert events.count("worker started") == 1
    assert slot.panel.screenshot_ready()


def test_a_layers_panel_never_shown_still_computes_its_analysis(qtbot):
    """Built alone (a test, a hidden tab): no paint is coming, so the worker starts at the next event-loop turn."""
    panel = LayersPanel(_state_with_trace())
    qtbot.addWidget(panel)
    assert not panel.screenshot_ready()  # (its analysis is still to come)
    qtbot.waitUntil(lambda: panel.result is not None, timeout=10_000)
    assert not panel.isVisible() and panel.screenshot_ready()

"""look15: the What if attribution chart thinned its labels when crowded, and at 1024 px the last bar's label 'norm
bias' went. Its named bars (embed, each layer's MLP and bias, norm bias, logits bias) are always labelled (a second
line for one that would touch another: the Features chart's way, widgets.heatmap.LabelAxis `always`), the numbered
heads thinned around them; no two labels drawn over each other."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.ui.panels.whatif import NUMBERED_COMPONENTS

from .test_features_attribution_labels import _drawn_labels
from .walkthrough import click_panel_tab, open_window


def _chart_shown(qtbot, family: str, width: int, **shape):
    """What if's attribution chart, `width` x 420 px, on show with a tiny `family` model's attribution of 'abc abc'
    (the last token's top prediction): (chart, attribution)."""
    from tiny_models import tiny_model
    from desktop_app.app.whatif import attribute_ids
    from desktop_app.ui.panels.whatif import attribution_chart

    loaded = tiny_model("abcdefgh ", family, **shape)
    ids = loaded.tokenizer.encode("abc abc")
    attribution, _ = attribute_ids(loaded, ids, len(ids) - 1, 1, [])
    chart = attribution_chart()
    qtbot.addWidget(chart)
    chart.resize(width, 420)
    chart.show()
    chart.set_attribution(attribution, "attribution")
    return chart, attribution


def _assert_named_bars_labelled(qtbot, chart, tmp_path, name):
    named = [chart.labels[i] for i, (c, _, _, _) in enumerate(chart.attribution.rows()) if c not in NUMBERED_COMPONENTS]
    assert "norm bias" in named and len(named) < len(chart.labels)
    axis = chart.plot_item.getAxis("bottom")

    def laid_out():  # (the axis grows a line when its labels need one: laid out again after that paint)
        drawn = _drawn_labels(chart)
        return bool(drawn) and all(a.bottom() <= axis.height() + 1 for a, _ in drawn)
    qtbot.waitUntil(laid_out, timeout=10_000)
    chart.window().grab().save(str(tmp_path / f"{name}.png"))
    drawn = _drawn_labels(chart)
    texts = [t for _, t in drawn]
    assert set(named) <= set(texts), sorted(set(named) - set(texts))
    for i, (a, ta) in enumerate(drawn):
        for b, tb in drawn[i + 1:]:
            assert not a.intersects(b), (ta, tb)
        assert a.bottom() <= axis.height() + 1, (ta, a, axis.height())  # inside the axis
    vb = chart.plot_item.getViewBox()  # every label under its own bar (one at an end moved in, still over it)
    for rect, text in drawn:
        left, right = (vb.mapSceneToView(axis.mapToScene(p)).x() for p in (rect.topLeft(), rect.bottomRight()))
        assert left < chart.labels.index(text) + 0.5 < right, (text, left, right)
    ends = [t for t in (chart.labels[0], chart.labels[-1]) if t in named]
    assert ends and set(ends) <= set(texts)  # (the first and last bars' names crossed the axis's ends: left out)


@pytest.mark.parametrize("size", [(1024, 640), (1280, 800)])
def test_the_demo_models_named_bars_are_always_labelled(qtbot, model_dirs, isolated_user_files, tmp_path, size):
    w, state = open_window(qtbot, model_dirs["demo"], text="Alice was beginning to get very tired of sitting")
    w.resize(*size)
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and not panel._dla_running(), timeout=20_000)
    assert panel.dla_chart.labels[-1] == "norm bias"
    _assert_named_bars_labelled(qtbot, panel.dla_chart, tmp_path, f"whatif-{size[0]}")


def test_a_twelve_layer_models_mlps_and_biases_are_all_named_at_1024(qtbot, tmp_path):
    """GPT-2 small's shape of bars (12 layers x 12 heads, an MLP and a bias each: 170 bars) in the chart's width at
    1024 px: the 26 named ones all labelled."""
    chart, _ = _chart_shown(qtbot, "gpt2", 990, n_layers=12, n_heads=12, d_model=48, d_ff=96,
                            attention_out_bias=True)
    _assert_named_bars_labelled(qtbot, chart, tmp_path, "twelve-layers")


def test_the_hover_names_a_head_whose_label_is_thinned_out(qtbot):
    """Heads' names are thinned (170 bars at 990 px): the mouse over a bar names it and its value."""
    from PySide6.QtCore import QPoint, QPointF

    chart, _ = _chart_shown(qtbot, "gpt2", 990, n_layers=12, n_heads=12, d_model=48, d_ff=96)
    qtbot.waitExposed(chart)
    drawn = {t for _, t in _drawn_labels(chart)}
    i = next(i for i, t in enumerate(chart.labels) if t not in drawn and "H" in t)
    vb = chart.plot_item.getViewBox()
    qtbot.mouseMove(chart.viewport(), QPoint(1, 1))  # (start off the bars: the cursor may be anywhere)
    qtbot.wait(100)  # pyqtgraph's scene drops mouse moves closer than its rate limit
    qtbot.mouseMove(chart.viewport(), chart.mapFromScene(vb.mapViewToScene(QPointF(i + 0.5, 0))))
    qtbot.waitUntil(lambda: chart.hover_text != "", timeout=3000)
    assert chart.hover_text == f"{chart.labels[i]}: {chart.values[i]:+.4g}" and chart.toolTip() == chart.hover_text


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
@pytest.mark.parametrize("width", [990, 1240])
def test_twenty_four_layers_named_bars_keep_apart_on_few_lines_a_layer_at_a_time(qtbot, tmp_path, family, width):
    """look16: at 24 layers (Qwen2.5-0.5B's shape: 14 heads and an MLP a layer; GPT-2 medium's: 16 heads, an MLP and
    an attention bias) every named bar kept its label: GPT-2's made five interleaved lines (which bias is whose?) and
    Qwen's 'L21 MLP' and 'L23 MLP' were 4 px apart, read as one. Now labels on a line are two spaces apart, on no
    more lines than a layer has named bars and one; where they need more, every k-th layer's are named (all of a
    layer's together), the embedding and the final norm's bias always; the others are in the hover."""
    from PySide6.QtGui import QFontMetrics

    shape = dict(n_heads=14, n_kv_heads=2, d_model=56) if family == "qwen2" else dict(n_heads=16, d_model=64,
                                                                                   attention_out_bias=True)
    chart, attribution = _chart_shown(qtbot, family, width, n_layers=24, d_ff=96, **shape)
    qtbot.waitExposed(chart)
    rows = attribution.rows()
    named = {chart.labels[i]: l for i, (c, l, _, _) in enumerate(rows) if c not in NUMBERED_COMPONENTS}
    per_layer = max(sum(1 for l in named.values() if l == layer) for layer in range(24))
    assert per_layer == (1 if family == "qwen2" else 2)
    axis = chart.plot_item.getAxis("bottom")

    def laid_out():  # (the axis grows a line when its labels need one: laid out again after that paint)
        drawn = _drawn_labels(chart)
        return bool(drawn) and all(a.bottom() <= axis.height() + 1 for a, _ in drawn)
    qtbot.waitUntil(laid_out, timeout=10_000)
    chart.grab().save(str(tmp_path / f"{family}-{width}.png"))
    drawn = _drawn_labels(chart)
    gap = QFontMetrics(axis.style.get("tickFont") or axis.font()).horizontalAdvance("  ")
    for i, (a, ta) in enumerate(drawn):
        for b, tb in drawn[i + 1:]:
            if a.top() == b.top():  # one line: two spaces apart at least
                assert a.right() + gap <= b.left() or b.right() + gap <= a.left(), (ta, tb, a, b)
            else:
                assert not a.intersects(b), (ta, tb)
    lines = {a.top() for a, _ in drawn}
    assert len(lines) <= per_layer + 1, sorted(lines)
    texts = {t for _, t in drawn}
    always = {t for t, l in named.items() if l < 0}  # embed, norm bias
    assert "embed" in always and always <= texts
    shown_layers = sorted({l for t, l in named.items() if l >= 0 and t in texts})
    step = shown_layers[1] - shown_layers[0]
    assert shown_layers[0] == 0 and shown_layers == list(range(0, 24, step)), shown_layers  # every step-th layer
    assert all(t in texts for t, l in named.items() if l in shown_layers)  # all of each such layer's named bars
    assert step <= 2  # (thinned no more than it needs: at 990 px every other layer's fit)

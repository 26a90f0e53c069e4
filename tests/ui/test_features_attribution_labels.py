"""Issue 41: the Features panel's attribution labels were drawn over each other (24 feature bars, "N other
features", bias, error under a narrow chart). Its axis now thins and elides them to fit, as the heatmaps' do."""
from __future__ import annotations

import pytest
import torch

from desktop_app.app.features import attribute_features
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.features import SparseDictionary, attach
from desktop_app.paths import resources_dir
from desktop_app.ui.panels.features_views import MAX_FEATURE_BARS, feature_attribution_chart


@pytest.fixture(scope="module")
def demo_and_dictionary():
    """The demo model and a random 256-feature dictionary on its layer 2's residual stream."""
    loaded = load_model_folder(resources_dir() / "demo-model")
    g = torch.Generator().manual_seed(0)
    d = SparseDictionary(torch.randn(128, 256, generator=g) * 0.1, torch.randn(256, generator=g) * 0.1,
                         torch.randn(256, 128, generator=g) * 0.1, torch.zeros(128), hook="blocks.2.hook_resid_post")
    return loaded, d


def _drawn_labels(chart) -> list:
    """The bottom axis's labels as it draws them: (rect in the axis, text)."""
    from PySide6.QtGui import QImage, QPainter

    image = QImage(chart.size(), QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, texts = chart.plot_item.getAxis("bottom").generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect, text) for rect, _flags, text in texts]


def test_attribution_labels_never_overlap(qtbot, tmp_path, demo_and_dictionary):
    loaded, d = demo_and_dictionary
    ids = loaded.tokenizer.encode("Alice was beginning to get very tired")
    fa = attribute_features(loaded, ids, attach(d, loaded.config), len(ids) - 1, 5)
    chart = feature_attribution_chart()
    qtbot.addWidget(chart)
    chart.resize(420, 300)
    chart.show()
    chart.set_attribution(fa, "attribution")
    assert len(chart.labels) > MAX_FEATURE_BARS  # the bars, "N other features", bias, error
    qtbot.wait(50)
    chart.grab().save(str(tmp_path / "attribution.png"))
    axis = chart.plot_item.getAxis("bottom")
    drawn = _drawn_labels(chart)  # (what is drawn: the bars after the features are always named, on two lines)
    assert len(drawn) >= 2
    for i, (a, ta) in enumerate(drawn):
        for b, tb in drawn[i + 1:]:
            assert not a.intersects(b), (ta, tb)
    # every bar under its own label: the bar at x holds the value the label names (centred; an always-named one
    # at the axis's end moved in, still over its bar)
    vb = chart.plot_item.getViewBox()
    for rect, text in drawn:
        x = vb.mapSceneToView(axis.mapToScene(rect.center())).x()
        left, right = (vb.mapSceneToView(axis.mapToScene(p)).x() for p in (rect.topLeft(), rect.bottomRight()))
        assert (chart.labels[int(x)] == text and abs(x - int(x) - 0.5) < 0.05
                or text in ("bias", "error") and left < chart.labels.index(text) + 0.5 < right), (text, x)


def test_both_panels_draw_attribution_with_one_widget_that_shows_markup_tokens_in_the_title(qtbot, demo_and_dictionary):
    """The What if and Features panels' bar charts are one widget (widgets/attribution_bars); its title is
    escaped, so the Features panel's names a token such as <|endoftext|> too (its own chart swallowed it)."""
    from desktop_app.ui.panels.features import FeaturesPanel
    from desktop_app.ui.panels.whatif import WhatIfPanel
    from desktop_app.ui.state import AppState
    from desktop_app.ui.widgets.attribution_bars import AttributionBars

    state = AppState()
    features, whatif = FeaturesPanel(state), WhatIfPanel(state)
    qtbot.addWidget(features)
    qtbot.addWidget(whatif)
    assert type(features.attr_chart) is type(whatif.dla_chart) is AttributionBars

    loaded, d = demo_and_dictionary
    ids = loaded.tokenizer.encode("Alice was beginning")
    fa = attribute_features(loaded, ids, attach(d, loaded.config), len(ids) - 1, 0)
    title = "'<|endoftext|>' (#0) at position 2: blocks.2.hook_resid_post adds 1 directly"
    features.attr_chart.set_attribution(fa, title)
    assert features.attr_chart.plot_item.titleLabel.item.toPlainText() == title
    plot = features.attr_chart.plot_item  # the axes back (hidden while the chart was empty)
    assert plot.getAxis("left").isVisible() and plot.getAxis("bottom").isVisible()


def test_the_features_attribution_chart_says_what_to_do_before_any_attribution_not_bare_axes(
        qtbot, model_dirs, isolated_user_files):
    """The Features panel's Attribution tab, no dictionary attached: the chart showed empty 0-1 axes (0.1 ... 0.9,
    'direct contribution to the logit') around nothing; it says what to do, and Attribute keeps it so."""
    from PySide6.QtCore import Qt

    from .walkthrough import click_panel_tab, click_tab, open_window

    window, _state = open_window(qtbot, model_dirs["demo"], name="demo")
    features = click_panel_tab(qtbot, window, "Features")
    click_tab(qtbot, features.tabs, "Attribution")
    plot = features.attr_chart.plot_item
    for _ in range(2):
        assert not plot.getAxis("left").isVisible() and not plot.getAxis("bottom").isVisible()
        assert plot.titleLabel.item.toPlainText() == "No attribution yet: attach a dictionary and type a text"
        qtbot.mouseClick(features.attribute_button, Qt.MouseButton.LeftButton)
    assert features.attr_status.text() == "Attach a dictionary and type a text first."


@pytest.mark.parametrize("width", [980, 600])  # (the chart in a 1024x640 window, and narrower)
def test_the_other_features_bias_and_error_bars_are_always_named(qtbot, demo_and_dictionary, width):
    """At 1024 wide the thinned labels left the 'error' bar unnamed, and the bias bar was never named: the bars
    after the features ('N others', bias, skip, error) are always labelled (a second line for one that would touch
    its neighbour), the features' names thinned around them, no two drawn over each other."""
    loaded, d = demo_and_dictionary
    ids = loaded.tokenizer.encode("Alice was beginning to get very tired")
    fa = attribute_features(loaded, ids, attach(d, loaded.config), len(ids) - 1, 5)
    chart = feature_attribution_chart()
    qtbot.addWidget(chart)
    chart.resize(width, 300)
    chart.show()
    chart.set_attribution(fa, "attribution")
    tail = chart.labels[MAX_FEATURE_BARS:]
    assert "other" in tail[0] and tail[-2:] == ["bias", "error"], tail
    axis = chart.plot_item.getAxis("bottom")
    # the axis grows a line when its labels need one, laid out again after that paint (a fixed wait was too
    # short on a loaded machine)
    def laid_out():
        drawn = _drawn_labels(chart)
        return bool(drawn) and all(a.bottom() <= axis.height() + 1 for a, _ in drawn)
    qtbot.waitUntil(laid_out, timeout=10000)
    drawn = _drawn_labels(chart)
    assert set(tail) <= {text for _, text in drawn}, (tail, [t for _, t in drawn])
    for i, (a, ta) in enumerate(drawn):
        for b, tb in drawn[i + 1:]:
            assert not a.intersects(b), (ta, tb)
        assert a.bottom() <= axis.height() + 1, (ta, a, axis.height())  # (inside the axis: a second line fits)
    assert sum(t.startswith("f") and t[1:].isdigit() for _, t in drawn) >= 3  # features still named

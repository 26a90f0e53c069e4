"""Issue 41: the Features panel's attribution labels were drawn over each other (24 feature bars, "N other
features", bias, error under a narrow chart). Its axis now thins and elides them to fit, as the heatmaps' do."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtGui import QFontMetrics

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
    (x0, x1), _ = chart.plot_item.getViewBox().viewRange()
    width = axis.geometry().width()
    levels = axis.tickValues(x0, x1, width)
    ticks = sorted((x, s) for spacing, xs in levels for x, s in zip(xs, axis.tickStrings(xs, 1.0, spacing)) if s)
    assert len(ticks) >= 2
    fm = QFontMetrics(axis.style.get("tickFont") or axis.font())
    px = width / (x1 - x0)
    for (xa, a), (xb, b) in zip(ticks, ticks[1:]):
        assert (xb - xa) * px >= (fm.horizontalAdvance(a) + fm.horizontalAdvance(b)) / 2, (a, b)
    # every bar under its own label: the bar at x holds the value the label names
    bars = next(i for i in chart.plot_item.items if hasattr(i, "opts") and "height" in i.opts)
    centres = list(bars.opts["x"])
    for x, s in ticks:
        assert any(abs(c - x) < 1e-9 for c in centres), (x, s)


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

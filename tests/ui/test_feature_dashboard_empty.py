"""The feature dashboard (Features panel, Graph panel's node) before any feature's contexts: no bare 0-1 axes on
its histogram and no scroll bars on its empty tables (at 1024x640 the Graph panel's node dashboard showed both,
which looked like an empty histogram of data); once contexts are shown, the histogram has its axes."""
from __future__ import annotations

import numpy as np

from desktop_app.core.features import TopContexts
from desktop_app.ui.panels.features_views import FeatureDashboard


def test_an_empty_dashboard_shows_no_axes_nor_scroll_bars_and_a_shown_one_its_axes(qtbot):
    dash = FeatureDashboard()
    qtbot.addWidget(dash)
    dash.resize(420, 600)
    dash.show()
    qtbot.waitExposed(dash)
    item = dash.histogram.getPlotItem()
    assert not item.getAxis("bottom").isVisible() and not item.getAxis("left").isVisible()
    assert dash.fires_label.text().startswith("Run for")  # what to do (it said nothing: widgets.empty_plot)
    for table in (dash.contexts_table, dash.promoted_table, dash.suppressed_table):
        qtbot.waitUntil(lambda: table.horizontalHeader().length() <= table.viewport().width() + 1)
        assert not table.horizontalScrollBar().isVisible(), table.horizontalHeader().length()

    tc = TopContexts(feature=3, tokens_seen=100, active_tokens=7,
                     rows=[(1, 2.5, 10, " cat", "the", " sat"), (2, 1.25, 40, " dog", "a", " ran")],
                     histogram=(np.array([3, 4]), np.array([0.0, 1.0, 2.5])))
    dash.show_contexts(tc, cached=False)
    assert item.getAxis("bottom").isVisible() and item.getAxis("left").isVisible()
    assert dash.contexts_table.rowCount() == 2 and dash.contexts_table.item(0, 3).text().strip() == "cat"
    assert "fires on 7 of 100 tokens" in dash.fires_label.text()
    dash.clear_contexts()
    assert not item.getAxis("bottom").isVisible() and dash.fires_label.text().startswith("Run for")

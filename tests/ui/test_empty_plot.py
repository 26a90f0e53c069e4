"""widgets.empty_plot: a plot with nothing to show has no axes, legend nor colour bar, only its title."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF

from desktop_app.ui.widgets.empty_plot import show_empty


def test_an_empty_plot_hides_its_axes_legend_and_colour_bar_and_says_what_to_do(qtbot):
    w = pg.GraphicsLayoutWidget()
    qtbot.addWidget(w)
    plot = w.addPlot(row=0, col=0)
    plot.addLegend()
    plot.plot([0, 1], [0, 1], name="a curve")
    image = pg.ImageItem(np.eye(3, dtype=np.float32))
    plot.addItem(image)
    bar = pg.ColorBarItem(values=(0, 1), width=14)
    bar.setImageItem(image)
    w.addItem(bar, row=0, col=1)
    w.resize(400, 300)
    w.show()
    qtbot.waitExposed(w)
    width = bar.maximumWidth()
    assert width > 0

    show_empty(plot, True, "Run for a picture", colorbar=bar)
    assert not plot.getAxis("left").isVisible() and not plot.getAxis("bottom").isVisible()
    assert not plot.legend.isVisible() and not bar.isVisible() and bar.maximumWidth() == 0  # (its place given up)
    assert plot.titleLabel.text == "Run for a picture"
    show_empty(plot, True, colorbar=bar)  # again (a second clear): the width to come back to is kept
    assert plot.titleLabel.text == "Run for a picture"  # (None: the title left as it is)

    show_empty(plot, False, colorbar=bar)
    assert plot.getAxis("left").isVisible() and plot.getAxis("bottom").isVisible()
    assert plot.legend.isVisible() and bar.isVisible() and bar.maximumWidth() == width


def test_bars_filled_after_a_long_empty_title_fit_their_view_when_the_pane_narrows(qtbot):
    """The Generate panel's 'with the edits' bars: cleared with its what-to-do title while alone and wide, then
    narrowed beside the bars without the edits and filled. The empty title's text stayed as the plot's least
    width, so the plot ran past its view: the top bar cut at the right edge, its value out of sight."""
    from desktop_app.ui.widgets.prob_bars import ProbBars

    bars = ProbBars()
    qtbot.addWidget(bars)
    bars.resize(900, 300)
    bars.show()
    qtbot.waitExposed(bars)
    bars.clear("Step (Ctrl+Right) or Run N to see the next token's candidates, the chosen one in orange")
    qtbot.wait(10)  # (the layout settles at the wide size first, as in the panel)
    bars.resize(360, 300)
    bars.set_distribution([1, 2, 3], ["a", "b", "c"], [0.6, 0.3, 0.1])
    qtbot.waitUntil(lambda: bars.plot.getPlotItem().getViewBox().width() < 330, timeout=2000)
    item = bars.plot.getPlotItem()
    assert item.geometry().right() <= bars.plot.viewport().width() + 1  # the plot within its view
    vb = item.getViewBox()
    top_bar_end = vb.mapViewToScene(QPointF(0.6, 0)).x()
    assert top_bar_end < bars.plot.viewport().width()  # the top bar's end in sight (its value beside or inside it)

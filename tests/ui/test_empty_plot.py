"""widgets.empty_plot: a plot with nothing to show has no axes, legend nor colour bar, only its title."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

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

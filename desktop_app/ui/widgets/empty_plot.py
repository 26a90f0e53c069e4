"""A plot with nothing to show: no axes, no legend, no colour bar, only its title saying why or what to do.

Bare 0-1 axes around no data, or a 0-1 colour bar beside an empty frame, looked like data (an empty histogram,
a matrix of zeros). `show_empty(plot, True, "Run for ...")` hides them; `show_empty(plot, False)` brings them
back when there is something to draw (the title is the caller's then: the empty one goes).
"""
from __future__ import annotations

import pyqtgraph as pg

from ..settings import plot_foreground


def show_empty(plot: pg.PlotItem, empty: bool, title: str | None = None,
               colorbar: pg.ColorBarItem | None = None) -> None:
    """title: what the plot says while empty (None: its title left as it is)."""
    for side in ("left", "bottom"):  # (an axis hidden draws no grid either)
        plot.showAxis(side, not empty)
    if plot.legend is not None:  # a legend of curves not drawn
        plot.legend.setVisible(not empty)
    if colorbar is not None:
        if empty and colorbar.maximumWidth() > 0:
            colorbar.width_when_shown = colorbar.maximumWidth()
        colorbar.setVisible(not empty)
        # (a hidden item keeps its place in the layout)
        colorbar.setMaximumWidth(0 if empty else getattr(colorbar, "width_when_shown", colorbar.maximumWidth()))
    if title is not None:
        plot.setTitle(title, color=plot_foreground())
        plot.empty_title = title
    elif not empty and plot.titleLabel.text and plot.titleLabel.text == getattr(plot, "empty_title", None):
        # the empty plot's title goes with it, its text too: a hidden title keeps its text's width as the plot's
        # least width, and a long "what to do" line left a filled plot wider than its view, cut at the right
        # (the Generate panel's top bar past the edge once the pane narrowed)
        plot.titleLabel.setText("")
        plot.setTitle(None)
        scene = plot.scene()
        for view in scene.views() if scene is not None else ():
            if getattr(view, "centralWidget", None) is plot:  # (a PlotWidget sizes its plot on its own resize only:
                view.resizeEvent(None)  # held wide by the title, the plot would stay so until the next one)

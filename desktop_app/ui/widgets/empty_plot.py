"""A plot with nothing to show: no axes, no legend, no colour bar, only its title saying why or what to do.

Bare 0-1 axes around no data, or a 0-1 colour bar beside an empty frame, looked like data (an empty histogram,
a matrix of zeros). `show_empty(plot, True, "Run for ...")` hides them; `show_empty(plot, False)` brings them
back when there is something to draw (the title is the caller's then).
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

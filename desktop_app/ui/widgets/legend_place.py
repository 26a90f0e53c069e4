"""A plot's legend kept off its data: in the corner (or the middle of an edge) of the view where the fewest data
points lie (top-right first, pyqtgraph's usual place), placed again whenever the view's range or size changes.

    keep_legend_clear(plot)   # a PlotWidget or PlotItem; its legend may be replaced later (plot.legend is read)
"""
from __future__ import annotations

import numpy as np

# (x, y) fractions of the view box: the corners (top-right first), then the middles of the edges, for curves
# that run along the top and the bottom (the Dynamics panel's clusters and radius)
CORNERS = ((1, 0), (0, 0), (1, 1), (0, 1), (1, 0.5), (0, 0.5), (0.5, 0), (0.5, 1))
MARGIN = 10  # pixels between the legend and the view's edges
MAX_POINTS = 20_000  # points of the curves looked at (a curve's segments sampled between its points)


def _points(plot, x0, x1, y0, y1, width, height) -> np.ndarray:
    """The visible data items' points (and points along their lines) in view-box pixels, [N, 2]."""
    out = []
    for item in plot.listDataItems():
        if not item.isVisible():
            continue
        x, y = item.getData()  # as displayed (log mode applied)
        if x is None or y is None or not len(x):
            continue
        x, y = np.asarray(x, float), np.asarray(y, float)
        keep = np.isfinite(x) & np.isfinite(y)
        x, y = x[keep], y[keep]
        if len(x) > 1 and len(x) < MAX_POINTS // 8:  # a line between points covers what lies between them
            t = np.linspace(0, len(x) - 1, 8 * (len(x) - 1) + 1)
            x, y = np.interp(t, np.arange(len(x)), x), np.interp(t, np.arange(len(y)), y)
        out.append(np.stack([(x - x0) / (x1 - x0) * width, (y1 - y) / (y1 - y0) * height], 1))
    return np.concatenate(out) if out else np.zeros((0, 2))


def place_legend(plot) -> None:
    plot = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    legend = getattr(plot, "legend", None)
    vb = plot.getViewBox()
    if legend is None or not legend.isVisible() or not legend.items or vb.width() <= 0 or vb.height() <= 0:
        return
    (x0, x1), (y0, y1) = vb.viewRange()
    if x1 <= x0 or y1 <= y0:
        return
    width, height = vb.width(), vb.height()
    pts = _points(plot, x0, x1, y0, y1, width, height)
    w, h = legend.width() + MARGIN, legend.height() + MARGIN

    def covered(corner) -> int:
        left, top = (width - w) * corner[0], (height - h) * corner[1]
        return int(np.sum((pts[:, 0] >= left) & (pts[:, 0] <= left + w) & (pts[:, 1] >= top) & (pts[:, 1] <= top + h)))

    best = min(CORNERS, key=covered)  # min keeps the first of equals: top-right unless another is emptier
    legend.anchor(itemPos=best, parentPos=best, offset=(MARGIN * (1 - 2 * best[0]), MARGIN * (1 - 2 * best[1])))


def keep_legend_clear(plot) -> None:
    """Place the plot's legend now and whenever its view's range or size changes."""
    item = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    vb = item.getViewBox()
    vb.sigRangeChanged.connect(lambda *_: place_legend(item))
    vb.sigResized.connect(lambda *_: place_legend(item))
    place_legend(item)

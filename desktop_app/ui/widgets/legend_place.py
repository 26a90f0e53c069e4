"""A plot's legend kept off its data: in the corner (or the middle of an edge) of the view where the fewest data
points lie (top-right first, pyqtgraph's usual place), placed again whenever the view's range or size changes.
Where every place covers data (a small plot: the Train panel's at 1024x640) and the view ranges its y axis by
itself, the view makes room above the data, as tall as the legend, and the legend goes there.

    keep_legend_clear(plot)   # a PlotWidget or PlotItem; its legend may be replaced later (plot.legend is read)
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QGraphicsGridLayout

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
    if _compact(legend, width, height, covered(best) > 0):  # smaller, and wide rather than tall: tried again
        w, h = legend.width() + MARGIN, legend.height() + MARGIN
        best = min(CORNERS, key=covered)
    if _room_above_the_data(plot, pts, h, covered(best) > 0):
        best = min(CORNERS[:2], key=covered)  # (the room is at the top)
    margin = max(2.0, min(MARGIN, (width - legend.width()) / 2))  # (a compact legend may need the whole width)
    legend.anchor(itemPos=best, parentPos=best, offset=(margin * (1 - 2 * best[0]), MARGIN * (1 - 2 * best[1])))


COMPACT_TEXT = "7.5pt"
COMPACT_SAMPLE = 0.6  # a compact legend's line-and-symbol samples, of pyqtgraph's 20 x 20 pixels


class CompactSample(pg.ItemSample):
    """pyqtgraph's legend sample (a short line and the symbol) drawn smaller: a row as tall as 7.5 pt text."""

    def __init__(self, item) -> None:
        super().__init__(item)
        self.setFixedWidth(20 * COMPACT_SAMPLE)
        self.setFixedHeight(20 * COMPACT_SAMPLE)

    def boundingRect(self):  # noqa: N802 (Qt)
        r = super().boundingRect()
        return type(r)(0, 0, r.width() * COMPACT_SAMPLE, r.height() * COMPACT_SAMPLE)

    def paint(self, p, *args):
        p.scale(COMPACT_SAMPLE, COMPACT_SAMPLE)
        super().paint(p, *args)
COMPACT_SPACING = 6  # pixels between a compact legend's columns (pyqtgraph's 25 by default)


def _compact(legend, width: float, height: float, over_data: bool) -> bool:
    """A legend over the data wherever it goes (a small plot) made compact: smaller text, and in as few rows as its
    height needs to be at most 40% of the view's, in as many columns as fit across; laid out again when the view
    narrows under it. True if laid out anew."""
    compacted = getattr(legend, "_compacted", False)
    too_wide = compacted and legend.width() > width - 4 and legend.columnCount > 1
    if not (too_wide or (over_data and not compacted)):
        return False
    legend._compacted = True
    legend.opts["labelTextSize"] = COMPACT_TEXT
    entries = [(sample.item, label.text) for sample, label in legend.items]

    def lay_out(columns: int) -> None:  # (pyqtgraph's setColumnCount put entries over others: laid out anew)
        legend.clear()
        old = legend.layout
        legend.layout = QGraphicsGridLayout()  # (a cleared grid keeps its row and column counts)
        legend.layout.setVerticalSpacing(old.verticalSpacing())
        legend.layout.setHorizontalSpacing(min(old.horizontalSpacing(), COMPACT_SPACING))
        legend.setLayout(legend.layout)
        legend.columnCount, legend.rowCount = columns, 1
        legend.sampleType = CompactSample
        for item, name in entries:
            legend.addItem(item, name)
        for _, label in legend.items:  # (its text's 4-pixel margins made a row ~30 pixels tall)
            label.item.document().setDocumentMargin(1)
            label.updateMin()
        legend.updateSize()

    fits, tried = 1, set()
    for rows in range(len(entries), 0, -1):  # fewer rows, more columns, while they fit across
        columns = math.ceil(len(entries) / rows)
        if columns in tried:
            continue
        tried.add(columns)
        lay_out(columns)
        if legend.width() > width - 4 and columns > 1:  # (its margin to the edges narrows: place_legend)
            break
        fits = columns
        if legend.height() <= 0.4 * height:
            return True
    lay_out(fits)
    return True


def _room_above_the_data(plot, pts: np.ndarray, legend_height: float, needed: bool) -> bool:
    """Raise the top of a self-ranging y axis so that a band as tall as the legend lies above the data (an
    invisible item's bounds reach up there), or let it down when the legend fits without; True while the room
    is made. A y range fixed by the plot (accuracy: 0 to 1) or the person's zoom is left as it is."""
    vb = plot.getViewBox()
    room = getattr(vb, "_legend_room", None)
    if room is None:
        room = vb._legend_room = pg.PlotCurveItem(pen=pg.mkPen(None))  # (in the view, not a data item)
        vb.addItem(room, ignoreBounds=False)
    (x0, x1), (y0, y1) = vb.viewRange()
    height = vb.height()
    if not vb.autoRangeEnabled()[1] or not len(pts) or height <= 0:
        room.setData([], [])
        return False
    data_top = y1 - (y1 - y0) * pts[:, 1].min() / height  # the highest data point, in view units
    made = room.xData is not None and len(room.xData) > 0
    if made and needed is False and room.yData[0] > data_top:  # the room is there: it holds the legend
        needed = True
    if not needed:
        room.setData([], [])
        return False
    share = min(0.65, (legend_height + MARGIN) / height)  # of the view's height, above the data (the rest theirs)
    bottom = y0
    top = (data_top - share * bottom) / (1 - share)
    if not made or abs(room.yData[0] - top) > 0.02 * (y1 - y0):
        room.setData([x0 + 0.5 * (x1 - x0)], [top])
    return True


def keep_legend_clear(plot) -> None:
    """Place the plot's legend now and whenever its view's range or size changes."""
    item = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    vb = item.getViewBox()
    vb.sigRangeChanged.connect(lambda *_: place_legend(item))
    vb.sigResized.connect(lambda *_: place_legend(item))
    place_legend(item)

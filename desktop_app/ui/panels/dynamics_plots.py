"""The Dynamics panel's plots: the point clouds the particles are drawn with, the hint shown in an empty
plot, and the curves (the simulation's clusters, mean cosine, radius against its bound R(t) and W2 to the
twin, by time; the loaded model's tokens, layer by layer). The panel (dynamics.py) owns the simulation
and the particle view, and hands these its records and the model's layer curves to draw.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QGraphicsTextItem

from ..widgets.empty_plot import show_empty
from ..widgets.legend_place import keep_legend_clear
from ..widgets.menu_on_demand import MenuOnDemandViewBox

CURVE_TITLE = {"size": "9pt"}  # default-size titles made the two columns of curves wider than a 1280 px window
# the smallest the curves get: with the form's column and the particle view they fit a 1024 x 700 window
CURVES_MIN = (380, 330)
PLAY_HINT = "Press Play or Step"  # the time curves need two records to draw a line
TWIN_OFF_HINT = "Twin run off: tick \u201ctwin run for W2\u201d, then Reset"
NO_TRACE_HINT = "Open a model and type a text: its tokens, layer by layer"
CANCELLED_HINT = "The text's trace was cancelled: no tokens to measure"

# what the panel shows of the curves as its own attributes (panel.p_radius, panel.c_w2...)
CURVE_FIELDS = ("p_clusters", "p_cosine", "p_radius", "p_w2", "p_model_cos", "p_model_clusters", "c_clusters",
                "c_cosine", "c_radius", "c_bound", "c_w2", "c_model_cos", "c_model_clusters", "c_model_radius",
                "t_markers", "hints")


class PointCloud(pg.GraphicsObject):
    """Many same-looking points drawn with one QPainter.drawPoints of a cosmetic round pen: the
    ScatterPlotItem rebuilds per-point styles on every setData (about 8 ms for 2,000 points, measured),
    too slow for 30 frames per second. Above ROUND_POINTS_UP_TO points they are squares: Qt's raster
    engine draws 2,000 round 5-pixel points in 18 ms, square ones in 1.5 ms (measured, offscreen), and
    at that density the shape is not seen. getData() mirrors ScatterPlotItem's (x, y)."""

    ROUND_POINTS_UP_TO = 500

    def __init__(self, colour, size: float) -> None:
        super().__init__()
        self._pen = pg.mkPen(colour, width=size)
        self._pen.setCosmetic(True)
        self._xy = np.zeros((0, 2))
        self._poly = pg.functions.create_qpolygonf(0)
        self._rect = None

    def setData(self, pos) -> None:
        xy = np.asarray(pos, dtype=np.float64).reshape(-1, 2)
        self.prepareGeometryChange()
        self._xy = xy
        self._poly = pg.functions.create_qpolygonf(len(xy))
        if len(xy):  # (an empty polygon's buffer is read-only)
            pg.functions.ndarray_from_qpolygonf(self._poly)[:] = xy
        self._rect = None
        self.informViewBoundsChanged()
        self.update()

    def getData(self):
        return self._xy[:, 0], self._xy[:, 1]

    def dataBounds(self, ax, frac=1.0, orthoRange=None):
        if len(self._xy) == 0:
            return None, None
        return float(self._xy[:, ax].min()), float(self._xy[:, ax].max())

    def boundingRect(self):
        """The points' data bounds grown by the round pen's half width (and a pixel) in data units: every
        pixel painted lies inside, as Qt requires. Without the margin the outer half of the outermost
        points was never repainted when the cloud shrank (the view updates only the old and new rects):
        stale dots stayed on screen after the particles had collapsed to one cluster (issue 25)."""
        from PySide6.QtCore import QRectF

        if self._rect is None:
            if not len(self._xy):
                return QRectF()
            lo, hi = self._xy.min(0), self._xy.max(0)
            rect = QRectF(lo[0], lo[1], hi[0] - lo[0], hi[1] - lo[1])
            px, py = self.pixelVectors()
            if px is None:  # not shown yet: no pixel size to pad with; not cached
                return rect
            pad = self._pen.widthF() / 2 + 1
            dx, dy = pad * (abs(px.x()) + abs(py.x())), pad * (abs(px.y()) + abs(py.y()))
            self._rect = rect.adjusted(-dx, -dy, dx, dy)
        return self._rect

    def viewTransformChanged(self) -> None:  # zoom or resize: the margin in data units changes
        self.prepareGeometryChange()
        self._rect = None
        super().viewTransformChanged()

    def paint(self, painter, *args) -> None:
        round_points = len(self._xy) <= self.ROUND_POINTS_UP_TO
        self._pen.setCapStyle(Qt.PenCapStyle.RoundCap if round_points else Qt.PenCapStyle.SquareCap)
        painter.setPen(self._pen)
        painter.drawPoints(self._poly)


class PlotHint:
    """A grey line of text centred in a plot with nothing to draw yet, its axes hidden meanwhile (empty
    axes around no data, autoranged to nothing, say nothing). show(None) brings the axes back."""

    def __init__(self, plot) -> None:
        self.plot = plot
        self.view = plot.getViewBox()
        self.item = QGraphicsTextItem(self.view)  # in the view box's own pixels, not its data coordinates
        self.item.setDefaultTextColor(QColor(120, 120, 120))
        self.item.setZValue(10)
        self.text: str | None = None
        self.view.sigResized.connect(lambda *_: self._place())

    def show(self, text: str | None) -> None:
        if text == self.text:
            return
        self.text = text
        self.item.setVisible(text is not None)
        show_empty(self.plot, text is not None)  # (its title stays: the text says what to do)
        if text is not None:
            self.item.setHtml(f"<div align='center'>{text}</div>")
            self._place()

    def _place(self) -> None:
        rect = self.view.rect()
        self.item.setTextWidth(max(rect.width() - 12, 40))
        box = self.item.boundingRect()
        self.item.setPos(rect.center().x() - box.width() / 2, rect.center().y() - box.height() / 2)


FLAT_HALF_SPAN = 0.5  # a flat curve's y range: its value +- this (pyqtgraph's own for a new view)


def fit_flat_curves(plot) -> None:
    """A plot whose curves are all one value gets the y range FLAT_HALF_SPAN around it: pyqtgraph's auto range
    keeps the view's previous span for zero-span data, so a constant 51 clusters after a run of 400 showed
    -50..150. Any other data: auto range again (only where this set the range, not a range the user zoomed to)."""
    ys = [np.asarray(c.yData, dtype=float) for c in plot.listDataItems() if c.isVisible() and c.yData is not None]
    ys = np.concatenate(ys or [np.zeros(0)])  # (the data as given: in log mode the view's y is its log10)
    if plot.getViewBox().state["logMode"][1]:
        ys = np.log10(ys[ys > 0])
    ys = ys[np.isfinite(ys)]
    flat = len(ys) > 0 and ys.min() == ys.max()
    if flat:
        plot.setYRange(ys[0] - FLAT_HALF_SPAN, ys[0] + FLAT_HALF_SPAN, padding=0)  # (auto range off in y)
    elif getattr(plot, "flat_fitted", False):
        plot.enableAutoRange(axis="y")
    plot.flat_fitted = flat


class DynamicsCurves(pg.GraphicsLayoutWidget):
    """Six plots: four of the simulation by time, two of the model by layer; a hint where one is empty."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumSize(*CURVES_MIN)
        self.setBackground("w")
        # (each plot's right-click menu made at its first right-click: MenuOnDemandViewBox)
        self.p_clusters = self.addPlot(row=0, col=0, viewBox=MenuOnDemandViewBox())
        self.p_cosine = self.addPlot(row=0, col=1, viewBox=MenuOnDemandViewBox())
        self.p_radius = self.addPlot(row=1, col=0, viewBox=MenuOnDemandViewBox())
        self.p_w2 = self.addPlot(row=1, col=1, viewBox=MenuOnDemandViewBox())
        self.p_model_cos = self.addPlot(row=2, col=0, viewBox=MenuOnDemandViewBox())
        self.p_model_clusters = self.addPlot(row=2, col=1, viewBox=MenuOnDemandViewBox())
        # short titles: a title is as wide as its plot at least, and two columns of them fit CURVES_MIN
        for plot, title in ((self.p_clusters, "clusters"), (self.p_cosine, "mean cosine"),
                            (self.p_radius, "radius, bound R(t)"), (self.p_w2, "W2 to the twin"),
                            (self.p_model_cos, "model: mean cosine"),
                            (self.p_model_clusters, "model: clusters, radius")):
            plot.setTitle(title, **CURVE_TITLE)
        self.p_radius.setLogMode(False, True)
        for p in (self.p_clusters, self.p_cosine, self.p_radius, self.p_w2):
            p.setLabel("bottom", "t")
            if p is not self.p_clusters:  # one time axis: an empty W2 plot (twin off) shows the run's span too
                p.setXLink(self.p_clusters)
        for p in (self.p_model_cos, self.p_model_clusters):
            p.setLabel("bottom", "layer (0 = embeddings)")
        blue, red = pg.mkPen((30, 70, 180), width=2), pg.mkPen((200, 60, 40), width=2, style=Qt.PenStyle.DashLine)
        self.c_clusters = self.p_clusters.plot(pen=blue)
        self.c_cosine = self.p_cosine.plot(pen=blue)
        self.p_radius.addLegend(offset=(5, 5))
        self.c_radius = self.p_radius.plot(pen=blue, name="max |x|")
        self.c_bound = self.p_radius.plot(pen=red, name="R(t)")
        self.c_w2 = self.p_w2.plot(pen=blue)
        self.c_model_cos = self.p_model_cos.plot(pen=blue, symbol="o", symbolSize=5)
        self.p_model_clusters.addLegend(offset=(5, 5))
        self.c_model_clusters = self.p_model_clusters.plot(pen=blue, symbol="o", symbolSize=5, name="clusters")
        self.c_model_radius = self.p_model_clusters.plot(pen=red, symbol="t", symbolSize=5, name="radius")
        for p in (self.p_radius, self.p_model_clusters):  # legends in the corner their curves leave free
            p.legend.setBrush(pg.mkBrush(255, 255, 255, 215))
            keep_legend_clear(p)
        self.t_markers = [p.addLine(x=0, pen=pg.mkPen((120, 120, 120), style=Qt.PenStyle.DotLine))
                          for p in (self.p_clusters, self.p_cosine, self.p_radius, self.p_w2)]
        self.hints = {p: PlotHint(p) for p in (self.p_clusters, self.p_cosine, self.p_radius, self.p_w2,
                                               self.p_model_cos, self.p_model_clusters)}

    def set_titles(self, sampled: int | None, twin: bool) -> None:
        """A new simulation's titles: the clusters counted among `sampled` particles (None: all), the twin run."""
        self.p_clusters.setTitle(f"clusters (among {sampled})" if sampled is not None else "clusters", **CURVE_TITLE)
        self.p_w2.setTitle("W2 to the twin" if twin else "W2: twin run off", **CURVE_TITLE)

    def show_hints(self, *, running: bool, twin_off: bool, model_curves: bool, measuring: bool,
                   cancelled: bool = False) -> None:
        """`running`: two records at least (a curve to draw); `model_curves`: the model's are drawn;
        `measuring`: they are being computed; `cancelled`: the text's trace was cancelled (the model is open)."""
        for p in (self.p_clusters, self.p_cosine, self.p_radius):
            self.hints[p].show(None if running else PLAY_HINT)
        self.hints[self.p_w2].show(TWIN_OFF_HINT if twin_off else None if running else PLAY_HINT)
        for p in (self.p_model_cos, self.p_model_clusters):
            self.hints[p].show(None if model_curves else
                               "Measuring the model's tokens…" if measuring else
                               CANCELLED_HINT if cancelled else NO_TRACE_HINT)

    def draw_records(self, records) -> None:
        """The simulation's curves from its records (core.dynamics.Record), nothing when there are none."""
        if not records:
            return
        R = np.array([r.row() for r in records], dtype=float)
        t = R[:, 0]
        self.c_clusters.setData(t, R[:, 1])
        self.c_cosine.setData(t, R[:, 4])
        self.c_radius.setData(t, R[:, 2])
        self.c_bound.setData(t, R[:, 3])
        w2 = R[:, 5]
        ok = np.isfinite(w2) & (w2 > 0)
        self.c_w2.setData(t[ok], w2[ok])
        for plot in (self.p_clusters, self.p_cosine, self.p_radius, self.p_w2):
            fit_flat_curves(plot)

    def clear_records(self) -> None:
        for curve in (self.c_clusters, self.c_cosine, self.c_radius, self.c_bound, self.c_w2):
            curve.setData([], [])

    def draw_layer_curves(self, c) -> None:
        """The model's curves by layer (core.dynamics.LayerCurves), or none."""
        if c is None:
            for curve in (self.c_model_cos, self.c_model_clusters, self.c_model_radius):
                curve.setData([], [])
            return
        x = np.arange(len(c.names))
        self.c_model_cos.setData(x, c.mean_cosine)
        self.c_model_clusters.setData(x, c.clusters)
        self.c_model_radius.setData(x, c.radius)
        for plot in (self.p_model_cos, self.p_model_clusters):
            fit_flat_curves(plot)

    def mark(self, t: float | None) -> None:
        """A dotted line at time t on the time curves while the slider scrubs back (None: hidden; moving them
        every frame would repaint every curve while playing)."""
        for m in self.t_markers:
            m.setVisible(t is not None)
            if t is not None:
                m.setValue(t)

"""Many line segments (a large graph's edges) that pan and zoom at full frame rate: level of detail by image.

QPainter's raster engine draws about 60,000 one-pixel lines a second on a small CPU (measured: 50,000
random edges across a 1400 x 900 view, 0.9 s a frame), so a graph's 100,000+ edges cannot be drawn again
on every mouse move. EdgeLayer draws them once per settled view into a QImage, in a worker thread (QImage
painting is allowed off the UI thread), and paints that image: while the view moves, the last image is
drawn where its data rectangle now lies (translated and scaled with the view, one textured draw), and once
the view has been still for SETTLE_MS the edges are drawn again for it, at the view's own resolution.
Exports that paint without a widget (SVG) get the segments themselves, as vectors.

buckets: [(RGBA colour, pen width in pixels, xs, ys)] with each segment's two ends one after the other
(connect="pairs"), drawn in order.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pyqtgraph as pg
from pyqtgraph.graphicsItems.PlotCurveItem import arrayToLineSegments
from pyqtgraph.graphicsItems.ScatterPlotItem import renderSymbol
from PySide6.QtCore import QObject, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QImage, QPainter, QPen


class _Done(QObject):
    ready = Signal(object)  # (serial, QImage, QRectF)


def _pen(colour, width: float) -> QPen:
    pen = QPen(QColor(*colour))
    pen.setWidthF(width)
    pen.setCosmetic(True)
    pen.setCapStyle(Qt.PenCapStyle.FlatCap)
    return pen


def _sprites(points) -> dict:
    """One image per (group, pixel size) of the points: each marker is drawn once, then copied."""
    out = {}
    for g, (symbol, fill, outline, _xs, _ys, sizes) in enumerate(points):
        for size in np.unique(np.rint(sizes).astype(int)).tolist():
            out[g, size] = renderSymbol(symbol, size, _pen(outline, 0.5), QBrush(QColor(*fill)))
    return out


def render_edges(buckets, rect: QRectF, width: int, height: int, points=()) -> QImage:
    """The segments in `rect` (data coordinates, y up) drawn into a transparent width x height image, and
    over them the `points` (markers of a fixed pixel size, as a pxMode ScatterPlotItem draws them)."""
    image = QImage(max(width, 1), max(height, 1), QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    p = QPainter(image)
    sx, sy = width / max(rect.width(), 1e-12), height / max(rect.height(), 1e-12)
    for colour, pen_width, xs, ys in buckets:
        px = (xs - rect.left()) * sx
        py = (rect.bottom() - ys) * sy  # QRectF from the view box: top() is the smaller y (data y goes up)
        p.setPen(_pen(colour, pen_width))
        segments = arrayToLineSegments(px, py, "pairs", False)  # named: drawargs() points into its memory
        p.drawLines(*segments.drawargs())
    sprites = _sprites(points)
    for g, (_symbol, _fill, _outline, xs, ys, sizes) in enumerate(points):
        px, py = (xs - rect.left()) * sx, (rect.bottom() - ys) * sy
        inside = (px > -50) & (px < width + 50) & (py > -50) & (py < height + 50)
        for x, y, size in zip(px[inside].tolist(), py[inside].tolist(), np.rint(sizes[inside]).astype(int).tolist()):
            sprite = sprites[g, size]
            p.drawImage(QPointF(x - sprite.width() / 2, y - sprite.height() / 2), sprite)
    p.end()
    return image


class EdgeLayer(pg.GraphicsObject):
    SETTLE_MS = 120

    def __init__(self) -> None:
        super().__init__()
        self.buckets: list = []
        self.points: list = []
        self._bounds = QRectF()
        self._image: QImage | None = None
        self._image_rect = QRectF()  # the data rectangle the image shows
        self._image_key = None  # (view rect, pixel size) it was drawn for
        self._serial = 0
        self._done = _Done()
        self._done.ready.connect(self._rendered)
        self._timer = QTimer(self)  # dies with the item: no render into a deleted one
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.SETTLE_MS)
        self._timer.timeout.connect(self._render)
        self.renders = 0  # images drawn (tests, benchmark)
        self._shown_key = None  # the view last painted, and when it last changed
        self._moved_at = 0.0
        self._pending_key = None  # the view the worker is drawing

    def set_buckets(self, buckets, points=()) -> None:
        """The segments, and the markers drawn over them into the same image (`points`: [(symbol, fill RGBA,
        outline RGBA, xs, ys, pixel sizes)]): while the view moves, the image stands in for a marker item
        that skips its own painting (moving_with_view)."""
        self.prepareGeometryChange()
        self.buckets = list(buckets)
        self.points = list(points)
        xs = [b[2] for b in self.buckets if len(b[2])] + [q[3] for q in self.points if len(q[3])]
        ys = [b[3] for b in self.buckets if len(b[3])] + [q[4] for q in self.points if len(q[4])]
        if xs:
            x, y = np.concatenate(xs), np.concatenate(ys)
            self._bounds = QRectF(float(x.min()), float(y.min()), float(x.max() - x.min()) or 1.0,
                                  float(y.max() - y.min()) or 1.0)
        else:
            self._bounds = QRectF()
        self._image, self._image_key, self._pending_key = None, None, None
        self._serial += 1
        self.update()
        self._timer.start()

    @property
    def n_segments(self) -> int:
        return sum(len(b[2]) // 2 for b in self.buckets)

    def boundingRect(self) -> QRectF:  # noqa: N802 (Qt)
        return QRectF(self._bounds)

    def _view(self):
        """(the data rectangle in view, its size in device pixels), or None before the item is in a view."""
        vb = self.getViewBox()
        if vb is None:
            return None
        rect = vb.viewRect()
        size = vb.boundingRect().size()
        scale = vb.scene().views()[0].devicePixelRatioF() if vb.scene() and vb.scene().views() else 1.0
        return QRectF(rect), (int(size.width() * scale), int(size.height() * scale))

    def moving_with_view(self) -> bool:
        """Whether the view is moving (changed less than SETTLE_MS ago) and the image, markers included, is
        moved with it: a marker item drawn into it then skips its own painting (it paints again once the view
        is still, before the image is drawn again for it)."""
        return (bool(self.points) and self._image is not None and not self.is_current()
                and time.monotonic() - self._moved_at < self.SETTLE_MS / 1000)

    def is_current(self) -> bool:
        """Whether the image drawn is of the view shown now (nothing left to draw)."""
        view = self._view()
        key = None if view is None else (tuple(view[0].getRect()), view[1])
        return not (self.buckets or self.points) or (self._image is not None and self._image_key == key)

    def paint(self, p: QPainter, *args) -> None:
        widget = args[1] if len(args) > 1 else None
        if widget is None:  # an export (SVG, a printer): the segments as vectors
            for colour, width, xs, ys in self.buckets:
                p.setPen(_pen(colour, width))
                segments = arrayToLineSegments(xs, ys, "pairs", False)
                p.drawLines(*segments.drawargs())
            return
        if self._image is not None:
            # the image's rows run downwards while the data's y runs upwards: flip it into its rectangle
            p.save()
            r = self._image_rect
            p.translate(r.left(), r.bottom())
            p.scale(r.width() / self._image.width(), -r.height() / self._image.height())
            p.drawImage(0, 0, self._image)
            p.restore()
        view = self._view()
        key = None if view is None else (tuple(view[0].getRect()), view[1])
        if key != self._shown_key:
            self._shown_key, self._moved_at = key, time.monotonic()
        if not self.is_current() and key != self._pending_key:
            self._timer.start()  # draw again once the view stops moving

    def _render(self) -> None:
        view = self._view()
        if view is None or not (self.buckets or self.points):
            return
        rect, (w, h) = view
        self._serial += 1
        serial, buckets, points = self._serial, self.buckets, self.points
        key = (tuple(rect.getRect()), (w, h))
        self._pending_key = key
        self.update()  # the view is still: a marker item paints itself again meanwhile

        def work() -> None:
            image = render_edges(buckets, rect, w, h, points)
            try:
                self._done.ready.emit((serial, image, rect, key))
            except RuntimeError:  # the layer was deleted meanwhile
                pass

        threading.Thread(target=work, daemon=True, name="edge-layer").start()

    def _rendered(self, payload) -> None:
        serial, image, rect, key = payload
        if serial != self._serial:
            return  # the edges or the view changed meanwhile: a newer image is coming
        self._image, self._image_rect, self._image_key = image, rect, key
        self.renders += 1
        self.update()

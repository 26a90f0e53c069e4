"""Attention panel: every head of every layer, one head large, BertViz-style lines, aggregates.

Views (tabs): model view (layers x heads thumbnails; click one to open it), heatmap (one head,
token labels, hover, selected query row), head view (lines from each query to the keys it attends,
one colour per head, heads toggled), mean over heads, attention rollout, per-head statistics.
The views, their view state and every number drawn are declared in core.views.attention (the VIEWS
table); this module draws them. The heavy numbers (rollout, statistics, thumbnails) run in a worker.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QImage, QPainterPath, QPen
from PySide6.QtWidgets import (QCheckBox, QComboBox, QGraphicsItem, QGraphicsPathItem, QGraphicsSimpleTextItem, QHBoxLayout,
                               QInputDialog, QLabel, QMenu, QPushButton, QScrollBar, QSpinBox, QStyle, QToolButton,
                               QVBoxLayout, QWidget)

from ...core import analysis
from ...core.views import find_view, views_using
from ...core.views import attention as attention_views
from ...core.views.attention import AttentionData, AttentionViewState, layer_shape, thumbnails
from ...threads import every_free_core
from ..settings import plot_background, plot_foreground
from ..widgets.heatmap import LabelAxis, screen_label
from ..widgets.job_progress import JobProgressBar
from ..widgets.token_strip import plural
from .view_panel import ViewTablePanel

# Colour-blind-friendly qualitative palette (Okabe-Ito, then Tableau) for heads.
HEAD_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
                "#8c564b", "#7f7f7f", "#bcbd22", "#17becf", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def head_colour(h: int) -> QColor:
    if h < len(HEAD_COLOURS):
        return QColor(HEAD_COLOURS[h])
    return pg.intColor(h, hues=17)


# -- model view ------------------------------------------------------------------------------


class Thumbnails(QGraphicsItem):
    """The model view's thumbnails, drawn by one item: each RGBA thumbnail (thumbnails(): made in a worker) in its
    box, as a QImage over its pixels. (A pyqtgraph ImageItem per head, 336 at Qwen2.5-0.5B's 24 x 14, took about
    0.5 s of the UI thread over a first look: each made its levels and ARGB again, connected its signals and was
    asked its bounds at every paint.) A row filled repaints its own boxes only (update(rect); Qt draws the
    updates asked in an event-loop turn at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemUsesExtendedStyleOption)  # (paint's exposedRect)
        self.setZValue(-1)  # under the selected row's boxes
        self.boxes: dict[tuple[int, int], QRectF] = {}  # ModelView's: each thumbnail's place
        self.images: dict[tuple[int, int], QImage] = {}
        self.pixels: dict[tuple[int, int], np.ndarray] = {}  # the RGBA arrays the images read (kept alive)
        self._bounds = QRectF()

    def place(self, boxes: dict[tuple[int, int], QRectF], bounds: QRectF) -> None:
        self.prepareGeometryChange()
        self.boxes, self._bounds = boxes, bounds
        self.update()

    def clear(self) -> None:
        self.images.clear()
        self.pixels.clear()
        self.update()

    def set_thumb(self, key: tuple[int, int], rgba: np.ndarray) -> None:
        if self.pixels.get(key) is rgba:
            return  # painted already (a trace arriving layer by layer made it)
        rgba = np.ascontiguousarray(rgba)
        height, width = rgba.shape[:2]
        self.pixels[key] = rgba
        self.images[key] = QImage(rgba.data, width, height, 4 * width, QImage.Format.Format_RGBA8888)
        if key in self.boxes:
            self.update(self.boxes[key])

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter, option, _widget=None) -> None:
        exposed = option.exposedRect
        for key, image in self.images.items():
            box = self.boxes.get(key)
            if box is not None and box.intersects(exposed):
                painter.drawImage(box, image)


class ModelView(pg.GraphicsLayoutWidget):
    """A grid of thumbnails, one per (layer, head), drawn by one Thumbnails item in one view box whose coordinates
    are its pixels: every row fits, each thumbnail keeps its pattern's aspect in its cell, labels beside them;
    click one to open it. (A view box per thumbnail, as before, took 0.7-1.2 s of the UI thread to build at
    Qwen2.5-0.5B's 24 x 14, most of the first look's UI work while the trace wanted both cores, and the rows
    past the window's height could not be seen.)"""

    head_clicked = Signal(int, int)
    head_menu_requested = Signal(int, int, QPoint)  # layer, head, global position: right-click on a thumbnail
    THUMB = 96  # thumbnails are max-pooled to at most this many pixels a side
    GAP = 3  # pixels between cells
    LEFT, TOP = 18, 18  # pixels for the layers' labels (turned) and the heads'
    LABEL_PX = 52  # a layer's label, turned, is this long: thinned to every k-th row when the rows are thinner
    MIN_ROW = 48  # pixels: rows that would be thinner run past the bottom, and the wheel scrolls them

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground(plot_background())
        self.ci.setContentsMargins(0, 0, 0, 0)
        self.view = self.addViewBox(row=0, col=0, enableMouse=False, enableMenu=False, invertY=True)
        self.view.sigResized.connect(self._place)
        self.boxes: dict[tuple[int, int], QRectF] = {}  # each thumbnail's place in the view (its pixels)
        self.thumbnails = Thumbnails()
        self.images = self.thumbnails.images  # the thumbnails painted, by (layer, head)
        self.view.addItem(self.thumbnails, ignoreBounds=True)
        self._frames = QGraphicsPathItem()
        pen = pg.mkPen("#bbbbbb")
        pen.setCosmetic(True)
        self._frames.setPen(pen)
        self.view.addItem(self._frames, ignoreBounds=True)
        # the selected query row, a box on every thumbnail: one path (an item per thumbnail took ~60 ms to make
        # at each grid of Qwen2.5-0.5B's shape)
        self.row_marks = QGraphicsPathItem()
        pen = QPen(QColor(255, 40, 40))
        pen.setCosmetic(True)
        pen.setWidthF(1.5)
        self.row_marks.setPen(pen)
        self.view.addItem(self.row_marks, ignoreBounds=True)
        self.selected_row: int | None = None
        self._cell_px = 0.0  # a pattern cell's side in the thumbnails now (_place)
        self._head_labels: list[QGraphicsSimpleTextItem] = []
        self._scroll = 0.0  # pixels of rows scrolled past the top
        self._row_px = 0.0  # a row's height now (_place)
        self._layer_labels: list[QGraphicsSimpleTextItem] = []
        self.patterns: list[np.ndarray] = []
        self.shape = (0, 0)  # the thumbnails' patterns: [t_q, t_k]
        self.grid = (0, 0, 0, 0)  # what begin() laid out: layers, heads, t_q, t_k
        self.lut = pg.colormap.get("viridis").getLookupTable(nPts=256)
        self.scene().sigMouseClicked.connect(self._on_click)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._on_context_menu)

    def _on_context_menu(self, pos: QPoint) -> None:
        hit = self.head_at(self.mapToScene(pos))
        if hit is not None:
            self.head_menu_requested.emit(*hit, self.mapToGlobal(pos))

    def set_patterns(self, patterns: list[np.ndarray], mask: np.ndarray | None,
                     thumbs: list[list[np.ndarray]] | None = None) -> None:
        """Build the grid; `thumbs` (from thumbnails(), e.g. made in a worker) saves the pooling here. A grid
        of the same shape is kept (a trace arriving layer by layer built it, and painted some rows: those
        are not painted again)."""
        if thumbs is None and patterns:
            thumbs = thumbnails(patterns, mask, self.lut, self.THUMB)
        grid = (len(patterns), *(layer_shape(patterns) if patterns else (0, 0, 0)))
        if grid != self.grid or not patterns:
            self.begin(*grid)
        self.patterns = patterns
        for l, row in enumerate(thumbs or []):
            self.fill_layer(l, row)

    def begin(self, n_layers: int, n_heads: int, t_q: int, t_k: int) -> None:
        """An empty grid of n_layers x n_heads thumbnails of [t_q, t_k] patterns (their frames, the labels),
        filled by fill_layer (a trace arriving layer by layer paints its rows as they come)."""
        for item in [*self._head_labels, *self._layer_labels]:
            self.view.removeItem(item)
        self.boxes = {}
        self.thumbnails.clear()
        self.patterns = []
        self.shape = (t_q, t_k)
        self.grid = (n_layers, n_heads, t_q, t_k)
        self.selected_row = None
        self._head_labels = [screen_label(f"head {h}", head_colour(h)) for h in range(n_heads)]
        self._layer_labels = [screen_label(f"layer {l}", QColor(plot_foreground()), turned=True) for l in range(n_layers)]
        for item in [*self._head_labels, *self._layer_labels]:
            self.view.addItem(item, ignoreBounds=True)
        self._place()

    def _place(self, *_args) -> None:
        """Every thumbnail, frame, row box and label at its place for the view's size now (its pixels)."""
        n_layers, n_heads, t_q, t_k = self.grid
        size = self.view.size()
        width, height = max(size.width(), 1.0), max(size.height(), 1.0)
        self.boxes = {}
        frames = QPainterPath()
        cell_h = side = 0.0
        if n_layers and n_heads:
            cell_w = max((width - self.LEFT) / n_heads, 2 * self.GAP + 1)
            cell_h = max((height - self.TOP) / n_layers, min(self.MIN_ROW, cell_w), 2 * self.GAP + 1)
            side = min((cell_w - self.GAP) / t_k, (cell_h - self.GAP) / t_q)  # pixels per pattern cell
            w, h = t_k * side, t_q * side
            for l in range(n_layers):
                for hd in range(n_heads):
                    rect = QRectF(self.LEFT + hd * cell_w + (cell_w - w) / 2, self.TOP + l * cell_h + (cell_h - h) / 2,
                                  w, h)
                    self.boxes[(l, hd)] = rect
                    frames.addRect(rect)
            self._scroll = min(max(self._scroll, 0.0), max(0.0, self.TOP + n_layers * cell_h - height))
            for hd, label in enumerate(self._head_labels):  # (they stay at the top as the rows scroll)
                label.setPos(self.LEFT + (hd + 0.5) * cell_w, self._scroll + self.TOP)
            every = max(1, int(np.ceil(self.LABEL_PX / cell_h)))  # rows too thin for each label: every k-th
            for l, label in enumerate(self._layer_labels):
                label.setPos(self.LEFT, self.TOP + (l + 0.5) * cell_h)
                label.setVisible(l % every == 0)
        self._frames.setPath(frames)
        self.thumbnails.place(self.boxes, frames.boundingRect())
        self._row_px, self._cell_px = cell_h, side
        self.set_selected_row(self.selected_row)
        self.view.setRange(QRectF(0, self._scroll if n_layers else 0.0, width, height), padding=0)

    def wheelEvent(self, event) -> None:
        """The wheel scrolls rows that run past the bottom (a row a notch)."""
        rows = -event.angleDelta().y() / 120
        before = self._scroll
        self._scroll += rows * self._row_px
        self._place()
        if self._scroll == before:
            super().wheelEvent(event)

    def fill_layer(self, layer: int, thumbs: list[np.ndarray]) -> None:
        """Paint one row of the grid begin() made: layer `layer`'s thumbnails, one per head."""
        for h, thumb in enumerate(thumbs):
            self.thumbnails.set_thumb((layer, h), thumb)

    def filled_layers(self) -> int:
        """How many rows, from the first, have their thumbnails painted."""
        return len({l for l, _h in self.images})

    def set_selected_row(self, row: int | None) -> None:
        """Box query row `row` (None: none) on every thumbnail."""
        self.selected_row = row if row is not None and 0 <= row < self.shape[0] else None
        marks = QPainterPath()
        if self.selected_row is not None:
            for rect in self.boxes.values():
                marks.addRect(QRectF(rect.x(), rect.y() + self.selected_row * self._cell_px, rect.width(),
                                     self._cell_px))
        self.row_marks.setPath(marks)

    def row_rects(self) -> list[QRectF]:
        """The selected row's boxes drawn, one per thumbnail (view pixels)."""
        return [polygon.boundingRect() for polygon in self.row_marks.path().toSubpathPolygons()]

    def head_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        at = self.view.mapSceneToView(scene_pos)
        for key, rect in self.boxes.items():
            if rect.contains(at):
                return key
        return None

    def thumb_scene_center(self, layer: int, head: int) -> QPointF:
        return self.view.mapViewToScene(self.boxes[(layer, head)].center())

    def _on_click(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        hit = self.head_at(ev.scenePos())
        if hit is not None:
            self.head_clicked.emit(*hit)

    # export
    def export_widget(self):
        return self

    def svg_item(self):
        return None  # pyqtgraph's SVG exporter trips on the grid of view boxes: QSvgGenerator draws it

    def export_arrays(self) -> dict[str, np.ndarray]:
        return {f"layer{l}": p for l, p in enumerate(self.patterns)}


# -- head view -------------------------------------------------------------------------------


class HeadView(QWidget):
    """BertViz-style: queries on the left, keys on the right, a line per weight above a threshold.

    One colour per head; opacity grows with the weight (4 opacity buckets, each one curve item of
    line pairs, so thousands of lines are a handful of items). Without a selected query the lines of
    the queries in view are drawn (scroll to move the window); with one, only its lines, thicker.
    """

    BUCKETS = ((0.1, 45), (0.3, 100), (0.6, 170), (1.01, 235))  # (upper weight bound, alpha)
    token_clicked = Signal(int)  # position of the token clicked (either column)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.threshold = 0.02  # lines of a selected query
        self.overview_threshold = 0.05  # lines of every query in view (no selection): fewer, the strong ones
        self.pattern = np.zeros((0, 0, 0), dtype=np.float32)
        self.enabled: list[bool] = []
        self.selected_row: int | None = None
        self.checks_row = QHBoxLayout()
        self.checks: list[QCheckBox] = []
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(plot_background())
        self.left_axis, self.right_axis = LabelAxis("left"), LabelAxis("right")
        for ax in (self.left_axis, self.right_axis):
            ax.setPen(pg.mkPen(plot_foreground()))
            ax.setTextPen(pg.mkPen(plot_foreground()))
        self.plot = self.graphics.addPlot(axisItems={"left": self.left_axis, "right": self.right_axis},
                                          enableMenu=False)  # (no menu made, as Heatmap's)
        self.plot.showAxis("right")
        self.plot.hideAxis("bottom")
        self.plot.hideButtons()
        self.plot.getViewBox().invertY(True)
        self.plot.getViewBox().setMouseEnabled(x=False, y=True)
        self.plot.setXRange(0, 1, padding=0.02)
        self.curves: list[pg.PlotCurveItem] = []
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.setInterval(30)
        self._redraw_timer.timeout.connect(self.redraw)
        self.plot.getViewBox().sigYRangeChanged.connect(self._on_scrolled)
        self.graphics.scene().sigMouseClicked.connect(self._on_click)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Heads:"))
        row.addLayout(self.checks_row)
        row.addStretch(1)
        lay.addLayout(row)
        # a long text shows a window of tokens: the scroll bar says there are more and moves the window
        self.scroll_bar = QScrollBar(Qt.Orientation.Vertical)
        self.scroll_bar.valueChanged.connect(self._on_scroll_bar)
        view_row = QHBoxLayout()
        view_row.addWidget(self.graphics, 1)
        view_row.addWidget(self.scroll_bar)
        lay.addLayout(view_row, 1)
        self.n_lines = 0

    def set_layer(self, pattern: np.ndarray, row_labels: list[str], col_labels: list[str],
                  query_offset: int | None = None) -> None:
        """One layer's heads [H, T_q, T_k]; the queries sit at query_offset among the keys (None: the
        last T_q; 0 for cross-attention, whose queries are another sequence: target tokens on the left,
        source tokens on the right)."""
        n_heads = pattern.shape[0]
        if len(self.checks) != n_heads:
            for c in self.checks:
                c.setParent(None)
            self.checks = []
            for h in range(n_heads):
                c = QCheckBox(f"{h}")
                c.setChecked(True)
                c.setStyleSheet(f"QCheckBox {{ color: {head_colour(h).name()}; font-weight: bold; }}")
                c.toggled.connect(self._on_toggle)
                self.checks_row.addWidget(c)
                self.checks.append(c)
        self.pattern = pattern
        _, t_q, t_k = pattern.shape
        # queries sit at the last t_q positions (a cached step has one query for all keys)
        self.offset = t_k - t_q if query_offset is None else query_offset
        self.left_axis.set_labels([""] * self.offset + list(row_labels))
        self.right_axis.set_labels(col_labels)
        vb = self.plot.getViewBox()
        n = max(t_k, self.offset + t_q)
        vb.setLimits(yMin=-0.5, yMax=n + 0.5)
        shown = min(n, 32)
        centre = (self.offset + (self.selected_row or 0)) if self.selected_row is not None else 0
        top = max(0, min(n - shown, centre - shown // 2))
        self.plot.setYRange(top, top + shown, padding=0.01)
        self._sync_scroll_bar()
        self.redraw()

    def _sync_scroll_bar(self) -> None:
        """The scroll bar over the tokens: shown when the view holds fewer than all of them."""
        if self.pattern.size == 0:
            self.scroll_bar.hide()
            return
        n = max(self.pattern.shape[2], self.offset + self.pattern.shape[1])
        lo, hi = self.plot.getViewBox().viewRange()[1]
        shown = max(1, int(round(hi - lo)))
        self.scroll_bar.blockSignals(True)
        self.scroll_bar.setRange(0, max(0, n - shown))
        self.scroll_bar.setPageStep(shown)
        self.scroll_bar.setValue(max(0, int(round(lo))))
        self.scroll_bar.blockSignals(False)
        self.scroll_bar.setVisible(shown < n)

    def _on_scroll_bar(self, top: int) -> None:
        lo, hi = self.plot.getViewBox().viewRange()[1]
        self.plot.setYRange(top, top + (hi - lo), padding=0)

    def set_heads_enabled(self, enabled: list[bool]) -> None:
        for c, on in zip(self.checks, enabled):
            c.blockSignals(True)
            c.setChecked(on)
            c.blockSignals(False)
        self.redraw()

    def heads_enabled(self) -> list[bool]:
        return [c.isChecked() for c in self.checks]

    def set_selected_row(self, row: int | None) -> None:
        self.selected_row = row
        self.redraw()

    def _on_click(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton or self.pattern.size == 0:
            return
        vb = self.plot.getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        y = vb.mapSceneToView(ev.scenePos()).y()
        token = int(np.floor(y))
        if 0 <= token < max(self.pattern.shape[2], self.offset + self.pattern.shape[1]):
            self.token_clicked.emit(token)

    def _on_scrolled(self, *_):
        self._sync_scroll_bar()  # the wheel moved the window: the bar follows
        if self.selected_row is None:
            self._redraw_timer.start()  # lines follow the window of queries in view

    def _on_toggle(self, _checked: bool) -> None:
        self.redraw()

    def redraw(self) -> None:
        for c in self.curves:
            self.plot.removeItem(c)
        self.curves = []
        self.n_lines = 0
        if self.pattern.size == 0:
            return
        _, t_q, _ = self.pattern.shape
        sel = self.selected_row if self.selected_row is not None and 0 <= self.selected_row < t_q else None
        if sel is None:  # every query in the visible window (all of them at once is a thicket beyond ~50)
            lo, hi = self.plot.getViewBox().viewRange()[1]
            first = max(0, int(np.floor(lo)) - self.offset)
            last = min(t_q, int(np.ceil(hi)) - self.offset)
            rows = np.arange(first, max(first, last))
        else:
            rows = np.array([sel])
        width = 1.0 if sel is None else 2.5
        for h, on in enumerate(self.heads_enabled()):
            if not on:
                continue
            w = self.pattern[h][rows]
            threshold = self.threshold if sel is not None else self.overview_threshold
            qi, kj = np.nonzero(w >= threshold)
            weights = w[qi, kj]
            q_pos = rows[qi] + self.offset + 0.5
            k_pos = kj + 0.5
            lower = threshold
            for upper, alpha in self.BUCKETS:
                sel_b = (weights >= lower) & (weights < upper)
                lower = upper
                n = int(sel_b.sum())
                if n == 0:
                    continue
                x = np.tile(np.array([0.0, 1.0]), n)
                y = np.empty(2 * n)
                y[0::2], y[1::2] = q_pos[sel_b], k_pos[sel_b]
                colour = QColor(head_colour(h))
                colour.setAlpha(alpha if sel is None else min(255, alpha + 20))
                curve = pg.PlotCurveItem(x, y, connect="pairs", pen=pg.mkPen(colour, width=width))
                self.plot.addItem(curve)
                self.curves.append(curve)
                self.n_lines += n

    # export
    def export_widget(self):
        return self

    def svg_item(self):
        return self.graphics.ci

    def export_arrays(self) -> dict[str, np.ndarray]:
        return {"pattern": self.pattern, "heads_enabled": np.array(self.heads_enabled()),
                "threshold": np.array(self.threshold)}


# -- the panel -------------------------------------------------------------------------------


class AttentionPanel(ViewTablePanel):
    title = "Attention"
    help_text = (
        "<b>What am I looking at?</b> Attention weights P<sub>ij</sub> = softmax<sub>j</sub>(q<sub>i</sub>&middot;k<sub>j</sub>/&radic;d<sub>k</sub>): "
        "how much query token i (row) reads from key token j (column). Grey cells are masked "
        "(a causal model cannot look ahead). Colours run from 0 to the 99.5th percentile of the visible weights "
        "(a causal model's first rows hold weights near 1 that would leave every other cell dark): the few cells "
        "above saturate; the colour bar shows the range and hovering gives the exact weight.<br>"
        "<b>Model view</b>: every layer x head (the wheel scrolls rows past the bottom); click one to open it. "
        "<b>Head view</b>: a line from each "
        "token to the tokens it attends (click a token to see only its lines), one colour per head, opacity = weight (for a selected token weights below 0.02 are hidden, below 0.05 otherwise). "
        "<b>Mean</b>: (1/H) &Sigma;<sub>h</sub> P<sub>h</sub>. <b>Rollout</b> (Abnar &amp; Zuidema): "
        "R<sub>l</sub> = &Acirc;<sub>l</sub>&hellip;&Acirc;<sub>0</sub>, &Acirc; = rows of (mean + I) renormalised, "
        "how much each input token flows into each position after layer l. <b>Head statistics</b>, averaged "
        "over queries: entropy &minus;&Sigma;<sub>j</sub>P<sub>ij</sub> log P<sub>ij</sub> (nats), mean distance "
        "&Sigma;<sub>j</sub>P<sub>ij</sub>|i&minus;j| (tokens), attention to the first token P<sub>i0</sub>.<br>"
        "<b>Encoder-decoders</b> (T5, BART, Marian) have three kinds of attention, chosen above the views: the "
        "encoder's self-attention (source tokens reading source tokens, bidirectional), the decoder's (its input, "
        "[start] + the target, reading itself, causal) and cross-attention (each decoder position reading the "
        "encoder's output over the source: rows are target tokens, columns source tokens; in the head view, lines "
        "from the target on the left to the source on the right). Cross-attention has no rollout: its rows and "
        "columns are two sequences, so layers do not compose.")

    VIEW_TABLE = attention_views.VIEWS  # the views as data (core.views.attention)
    VIEW_STATE = AttentionViewState

    def __init__(self, state, parent=None, view_state: AttentionViewState | None = None) -> None:
        super().__init__(state, view_state, "Open a model and enter a text to see its attention.", parent)
        self.data: AttentionData | None = None
        self._waiting = ""  # what the rollout and statistics tabs say until the worker's numbers arrive

        self.layer_spin = QSpinBox()
        self.head_spin = QSpinBox()
        self.stat_combo = QComboBox()
        for key, name in analysis.STAT_NAMES.items():
            self.stat_combo.addItem(name, key)
        self.controls = {"layer": self.layer_spin, "head": self.head_spin, "statistic": self.stat_combo}
        # An encoder-decoder's three kinds of attention (shown for encoder-decoders only)
        from ...app.tracing import ATTENTION_KINDS
        self.kind_combo = QComboBox()
        self.kind_combo.setToolTip("Which attention of the encoder-decoder every view shows")
        for key, name in ATTENTION_KINDS.items():
            self.kind_combo.addItem(name, key)
        self.kind_label = QLabel("Attention")
        self.model_view = ModelView()  # (made now: the first look paints its rows as a trace arrives)
        # each other view's widget made when its tab is first shown (view_panel._build_views)
        self._build_views({"model-view": self.model_view, "head-view": HeadView})

        controls = QHBoxLayout()
        controls.addWidget(self.kind_label)
        controls.addWidget(self.kind_combo)
        self._show_kind_choice(False)
        self.control_labels = {}
        for name, label in (("layer", "Layer"), ("head", "Head"), ("statistic", "Statistic")):
            self.control_labels[name] = QLabel(label)
            controls.addWidget(self.control_labels[name])
            controls.addWidget(self.controls[name])
        self.ablate_button = QToolButton()  # the same menu as a right-click, for the layer and head chosen
        self.ablate_button.setText("Ablate")
        self.ablate_button.setToolTip("Switch off the chosen head, or this layer's attention or MLP (what if?)")
        self.ablate_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.ablate_button.setMenu(QMenu(self.ablate_button))
        # room for the menu's arrow, drawn in the button's corner (its size hint counts the text only: the arrow
        # was over 'Ablate')
        button = self.ablate_button
        arrow = button.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, button)
        button.setMinimumWidth(button.sizeHint().width() + arrow)
        self.ablate_button.menu().aboutToShow.connect(
            lambda: self.fill_ablation_menu(self.ablate_button.menu(), self.layer, self.head))
        controls.addWidget(self.ablate_button)
        # the rollout and statistics' worker, beside their tabs: its progress, and Cancel (Compute once cancelled)
        self.aggregates_progress = JobProgressBar()
        self.aggregates_button = QPushButton("Cancel")
        self.aggregates_button.clicked.connect(self._on_aggregates_button)
        corner = QWidget()
        corner_row = QHBoxLayout(corner)
        corner_row.setContentsMargins(0, 0, 0, 2)
        corner_row.addWidget(self.aggregates_progress)
        corner_row.addWidget(self.aggregates_button)
        self.tabs.setCornerWidget(corner, Qt.Corner.TopRightCorner)
        self._aggregates_work = None  # set_trace's job computing them, kept to compute them again
        self._aggregates_job = None  # its run now (a workers.Job), None before or once cancelled
        self._aggregates_what = ""  # what its progress counts now: the rollout's layers, then the statistics'
        self._show_aggregates_controls()
        self._lay_out(controls)

        self._show_view_state_in_controls()
        self.layer_spin.valueChanged.connect(lambda v: self._on_control("layer", v))
        self.head_spin.valueChanged.connect(lambda v: self._on_control("head", v))
        self.stat_combo.currentIndexChanged.connect(
            lambda _i: self._on_control("statistic", self.stat_combo.currentData()))
        self.kind_combo.currentIndexChanged.connect(lambda _i: self._on_kind(self.kind_combo.currentData()))
        self.tabs.currentChanged.connect(self._on_tab)
        self.model_view.head_clicked.connect(self.open_head)
        self.model_view.head_menu_requested.connect(self.show_ablation_menu)
        self.tokens.token_selected.connect(self.select_token)
        self._update_controls()
        self._partial = None  # the trace whose thumbnails are painting row by row (state.layers_ready)
        self._partial_thumbs: list = []  # its rows of thumbnails made so far, layer by layer
        self._partial_done = 0  # its layers recorded
        self._piece_job = None  # the worker making the next rows
        if hasattr(state, "layers_ready"):  # (render's stand-in state has none)
            state.layers_ready.connect(self._on_layers_ready)
            state.hold_logits(self._making_rows)
        self._follow_trace()
        if getattr(state, "tracing", None) is not None:  # opened while a trace arrives: its layers so far
            self._on_layers_ready(state.tracing)

    def _view_made(self, name: str, widget) -> None:
        if name == "head-view":
            widget.selected_row = self.query_row()  # (drawn next, around the selection)
            widget.token_clicked.connect(
                lambda t: self.select_token(None if t == self.selected_token else t))  # a second click clears

    # the views' widgets (each made when first asked for)
    head_view = property(lambda self: self.widgets["head-view"])
    heatmap = property(lambda self: self.widgets["attention"])
    mean_map = property(lambda self: self.widgets["mean"])
    rollout_map = property(lambda self: self.widgets["rollout"])
    stats_map = property(lambda self: self.widgets["head-stats"])

    # -- view state ------------------------------------------------------------------------
    def _show_view_state(self) -> None:
        self._clamp_view_state()
        self._show_view_state_in_controls()
        self._update_controls()
        self._invalidate(*(v.name for v in attention_views.VIEWS if v.name != "model-view"))

    def _clamp_view_state(self) -> None:
        """Choices beyond this trace's layers, heads or tokens fall back to the last one / no selection."""
        vs = self.view_state
        if vs.statistic not in analysis.STAT_NAMES:
            vs.statistic = AttentionViewState.statistic
        if self.data is None:
            return  # no trace yet: kept as they are, for the trace to come (e.g. a workspace being opened)
        vs.layer = min(vs.layer, self.data.n_layers - 1)
        vs.head = min(vs.head, self.data.n_heads - 1)
        if vs.selected_token is not None and vs.selected_token >= len(self.data.positions):
            vs.selected_token = None

    def _show_view_state_in_controls(self) -> None:
        vs = self.view_state
        for w, value in ((self.layer_spin, vs.layer), (self.head_spin, vs.head)):
            w.blockSignals(True)
            w.setValue(value)
            w.blockSignals(False)
        self.stat_combo.blockSignals(True)
        self.stat_combo.setCurrentIndex(max(0, self.stat_combo.findData(vs.statistic)))
        self.stat_combo.blockSignals(False)
        self.kind_combo.blockSignals(True)
        self.kind_combo.setCurrentIndex(max(0, self.kind_combo.findData(vs.kind)))
        self.kind_combo.blockSignals(False)

    def _on_control(self, control: str, value) -> None:
        setattr(self.view_state, control, value)
        self._invalidate(*views_using(attention_views.VIEWS, control))

    def _on_kind(self, kind: str) -> None:
        """Another of an encoder-decoder's kinds of attention: every view shows it (its own tokens)."""
        if kind == self.view_state.kind:
            return
        self.view_state.kind = kind
        self.view_state.selected_token = None  # a position of another sequence
        self.set_trace(self.trace, list(getattr(self.state, "token_ids", []) or []))

    def _show_kind_choice(self, shown: bool) -> None:
        self.kind_label.setVisible(shown)
        self.kind_combo.setVisible(shown)

    def _export_name(self) -> str:
        """An encoder-decoder's exports name the kind of attention they show (cross-attention-L0-H1...)."""
        name = super()._export_name()
        return f"{self.view_state.kind}-{name}" if self._seq2seq_trace(self.trace) else name

    @staticmethod
    def _seq2seq_trace(trace) -> bool:
        return trace is not None and ("encoder.embed" in trace or "encoder.blocks.0.attn.pattern" in trace)

    def _stack_of(self, trace, ids: list[int]):
        """An encoder-decoder's trace as the kind of attention chosen (app.tracing.attention_view): (that
        view, key ids, query ids or None when the queries are the keys' last T_q, causal, why no rollout)."""
        from ...app.tracing import CROSS, DECODER, ENCODER, attention_view

        kind = self.view_state.kind if self.view_state.kind in (ENCODER, DECODER, CROSS) else ENCODER
        self.view_state.kind = kind
        decoder = list(getattr(self.state, "decoder_ids", []) or [])
        view = attention_view(trace, kind)
        if kind == ENCODER:
            return view, ids, None, False, ""
        if kind == DECODER:
            return view, decoder, None, True, ""
        return (view, ids, decoder, False,
                "Cross-attention has no rollout: rows (target) and columns (source) are two sequences")

    def _on_tab(self, index: int) -> None:
        self.view_state.view = self.VIEWS[index]
        self._update_controls()
        self._show_aggregates_controls()
        self._refresh()

    # -- views -----------------------------------------------------------------------------
    def _update_controls(self, *_):
        used = find_view(attention_views.VIEWS, self.view_state.view).controls
        for name, w in self.controls.items():
            w.setEnabled(name in used)
        # the statistic's box only where it applies (Head statistics): disabled on the other views, its ~290 px
        # left an encoder-decoder's summary no room at 1024x640
        for w in (self.stat_combo, self.control_labels["statistic"]):
            w.setVisible("statistic" in used)

    @property
    def layer(self) -> int:
        return self.view_state.layer

    @property
    def head(self) -> int:
        return self.view_state.head

    @property
    def patterns(self) -> list[np.ndarray]:
        return self.data.patterns if self.data is not None else []

    @property
    def mask(self) -> np.ndarray | None:  # (shadows QWidget.mask, as the attribute it replaces did)
        return self.data.mask if self.data is not None else None

    @property
    def row_labels(self) -> list[str]:
        return self.data.row_labels if self.data is not None else []

    @property
    def col_labels(self) -> list[str]:
        return self.data.col_labels if self.data is not None else []

    @property
    def rollout(self) -> np.ndarray | None:
        return self.data.rollout if self.data is not None else None

    @property
    def stats(self) -> analysis.HeadStats | None:
        return self.data.stats if self.data is not None else None

    # -- data ------------------------------------------------------------------------------
    def set_trace(self, trace, token_ids: list[int] | None = None, causal: bool | None = None,
                  sync: bool = False) -> None:
        """Show a trace. sync=True computes rollout and statistics here (CLI); else in a worker."""
        generation = self._new_trace(trace)
        ids = list(token_ids or [])
        seq2seq = self._seq2seq_trace(trace)
        self._show_kind_choice(seq2seq)
        query_ids, no_rollout = None, ""
        if seq2seq:
            trace, ids, query_ids, causal, no_rollout = self._stack_of(trace, ids)
        if trace is None or trace.n_layers == 0 or "blocks.0.attn.pattern" not in trace:
            self._clear(self.state.no_trace_message() if trace is None else "This trace has no attention patterns.")
            return
        t_q, t_k = trace.pattern(0).shape[-2:]
        if causal is None:
            loaded = getattr(self.state, "loaded", None)
            causal = loaded.config.causal if loaded is not None else None
        strings = self.state.token_strings(ids) if len(ids) == t_k else None
        rows = None if query_ids is None else (self.state.token_strings(query_ids) if len(query_ids) == t_q
                                               else [str(i) for i in range(t_q)])
        self.data = data = attention_views.prepare(trace, causal, strings, rows)
        if data.cross:  # the tokens a selection picks: the queries' (the decoder's)
            self.tokens.set_tokens(data.row_labels, query_ids if len(query_ids) == t_q else list(range(t_q)))
        else:
            self.tokens.set_tokens(data.col_labels, ids if len(ids) == t_k else list(range(t_k)))
        n_layers, n_heads = data.n_layers, data.n_heads
        for spin, n in ((self.layer_spin, n_layers), (self.head_spin, n_heads)):
            spin.blockSignals(True)
            spin.setRange(0, n - 1)
            spin.blockSignals(False)
        self._clamp_view_state()
        self._show_view_state_in_controls()
        made = self._partial_thumbs if trace is self._partial else []  # rows painted as the trace arrived
        if not made:
            self.model_view.set_patterns([], None)  # its thumbnails come from the worker
        self._cancel_piece_job()
        self._partial, self._partial_thumbs = None, []
        self._relabel = True
        self._waiting = "Computing the rollout and head statistics\u2026"  # until the worker's progress
        self._invalidate(*(v.name for v in attention_views.VIEWS if v.name != "model-view"))
        self._apply_selection()
        # (cross-attention: the kind's box beside it says so; the line is short enough for a 1024 px window)
        shape = f"{t_q} target x {plural(t_k, 'source token')}" if data.cross else plural(t_k, 'token')
        self.status.setText(f"{shape}, {plural(n_layers, 'layer')} x {plural(n_heads, 'head')}"
                            + ("" if data.cross else " (causal)" if data.causal else " (bidirectional)"))
        patterns, mask, lut, size = data.patterns, data.mask, self.model_view.lut, self.model_view.THUMB

        # what is on show first, then the rest: the model view's thumbnails (the rows made as the trace
        # arrived are not made again), then the rollout and the statistics its other views read (at the
        # Qwen2.5-0.5B shape, 1,024 tokens: ~1.3 s of one core, 8 s in float64 numpy before (bench attention_stats);
        # the first look does not wait for them, and their tabs show the worker's progress meanwhile)
        def thumbs(job=None):
            rest = thumbnails((analysis.attention_pattern_tensor(trace, l) for l in range(len(made), len(patterns))),
                              mask, lut, size)
            return generation, made + rest

        def numbers(job=None, partial=None):
            with every_free_core():  # the UI only shows the progress meanwhile (threads.py)
                rollout_done = None if partial is None else (lambda *rollout: partial((generation, *rollout)))
                return (generation, *attention_views.aggregates(trace, job, no_rollout, rollout_done))

        def thumbs_made(result) -> None:
            if self._on_thumbnails(result):
                self._compute_aggregates(sync)

        self._aggregates_work, self._aggregates_job = numbers, None
        self._run_trace_job(thumbs, thumbs_made, "thumbnails", sync)
        self._show_aggregates_controls()

    def _on_layers_ready(self, ready) -> None:
        """A text's trace arriving layer by layer (app.tracing.LayersReady, of the input now on show):
        the model view's whole grid at its first layer, then each layer's row painted once its thumbnails
        are made (in a worker: a 1,024-token layer of 14 heads takes half a second); set_trace takes over
        at its end, keeping the rows made."""
        trace = ready.trace
        if "blocks.0.attn.pattern" not in trace.tensors:
            return  # a model without attention patterns: nothing to paint before the end
        if trace is not self._partial:
            self._cancel_piece_job()
            self._partial, self._partial_thumbs = trace, []
            n_heads, t_q, t_k = trace.tensors["blocks.0.attn.pattern"].shape[-3:]
            loaded = getattr(self.state, "loaded", None)
            mask = analysis.allowed_mask(t_q, t_k, loaded.config.causal if loaded is not None else False)
            self._partial_mask = None if mask.all() else mask
            ids = list(ready.enc.ids)
            if len(ids) == t_k:  # the text's tokens above the grid, as set_trace shows them
                self.tokens.set_tokens(self.state.token_strings(ids), ids)
            self.model_view.begin(ready.total, n_heads, t_q, t_k)
        self._partial_done = ready.done
        self._paint_pieces()
        self.status.setText(self.state.no_trace_message())

    def _paint_pieces(self) -> None:
        """Make the thumbnails of the layers ready and not yet painted, in a worker, one job at a time."""
        if self._piece_job is not None:
            return
        if self._partial is None or len(self._partial_thumbs) >= self._partial_done:
            self._rows_drawn()
            return
        from ..workers import run_job

        trace, first, stop = self._partial, len(self._partial_thumbs), self._partial_done
        mask, lut, size = self._partial_mask, self.model_view.lut, self.model_view.THUMB

        def work(job=None):
            rows = []
            for layer in range(first, stop):
                rows += thumbnails([analysis.attention_pattern_tensor(trace, layer)], mask, lut, size)
                job.check()
            return rows

        def painted(rows) -> None:
            self._piece_job = None
            if trace is not self._partial:
                self._rows_drawn()
                return  # another trace (or none) is on show now
            for row in rows:
                self.model_view.fill_layer(len(self._partial_thumbs), row)
                self._partial_thumbs.append(row)
            self._paint_pieces()

        def ended(*_args) -> None:
            if self._piece_job is job:
                self._piece_job = None
                self._rows_drawn()

        job = self._piece_job = run_job(work, on_result=painted, on_error=ended, on_cancelled=ended, owner=self)

    def _making_rows(self) -> bool:
        """Rows of the trace arriving are still being made (AppState.hold_logits: the logits wait for them)."""
        return self._piece_job is not None

    def _rows_drawn(self) -> None:
        """No rows are being made now: logits held for them may start (AppState.drawing_ended)."""
        if hasattr(self.state, "drawing_ended"):  # (render's stand-in state has none)
            self.state.drawing_ended()

    def _cancel_piece_job(self) -> None:
        if self._piece_job is not None:
            self._piece_job.cancel()
            self._piece_job = None
            self._rows_drawn()

    def _clear_own(self, message: str) -> None:
        """(A trace without attention is cleared too.)"""
        self._cancel_piece_job()
        self._aggregates_work = self._aggregates_job = None
        self._show_aggregates_controls()
        self._partial, self._partial_thumbs = None, []
        self.model_view.set_patterns([], None)
        if "head-view" in self.widgets:  # (one not made yet shows nothing)
            self.head_view.set_layer(np.zeros((0, 0, 0), dtype=np.float32), [], [])
        for spin in (self.layer_spin, self.head_spin):  # the view state keeps its layer and head for the next trace
            spin.blockSignals(True)
            spin.setRange(0, 0)
            spin.blockSignals(False)
        self._stale.clear()

    def _on_thumbnails(self, result) -> bool:
        """The model view's thumbnails: drawn at once, shown or not (it is the panel's first tab). False when
        a newer trace arrived meanwhile."""
        generation, thumbs = result
        if not self._is_current(generation) or self.data is None:
            return False
        self.data.thumbs = thumbs
        self._render("model-view")
        return True

    def _on_aggregates(self, result) -> None:
        generation, rollout, stats, rollout_problem = result
        if not self._is_current(generation) or self.data is None:
            return  # a newer trace arrived meanwhile
        data = self.data
        data.rollout, data.stats, data.rollout_problem = rollout, stats, rollout_problem
        data.aggregated = data.rollout_arrived = True
        self._invalidate("rollout", "head-stats")  # the views that read the worker's numbers
        self._show_aggregates_controls()

    def _on_rollout(self, result) -> None:
        """The rollout, before the statistics: its tab is drawn while they are computed (~half the wait)."""
        generation, rollout, rollout_problem = result
        if not self._is_current(generation) or self.data is None or not self._aggregates_running():
            return  # (a newer trace's, or the worker was cancelled after it handed the rollout on)
        self.data.rollout, self.data.rollout_problem, self.data.rollout_arrived = rollout, rollout_problem, True
        self._waiting = "Computing the head statistics\u2026"  # until their first layer's progress
        self._invalidate("rollout")

    def _compute_aggregates(self, sync: bool = False) -> None:
        """The rollout and head statistics of the trace on show (set_trace's job), in the worker (sync: here)."""
        self._aggregates_what = ""
        self._waiting = "Computing the rollout and head statistics\u2026"  # until the worker's progress
        self._run_trace_job(self._aggregates_work, self._on_aggregates, "statistics", sync,
                            on_progress=self._show_aggregates_progress, on_partial=self._on_rollout)
        if self._job is not None:  # (a worker's: the controls follow it to its end, whatever the end)
            self._aggregates_job = self._job
            self._job.signals.finished.connect(self._show_aggregates_controls)
        self._show_waiting(self.view_state.view)
        self._show_aggregates_controls()

    def _aggregates_running(self) -> bool:
        return self._aggregates_job is not None and self._job is self._aggregates_job

    def _on_aggregates_button(self) -> None:
        """Cancel the rollout and statistics being computed; once cancelled, compute them again."""
        if self._aggregates_running():
            self._cancel_job()
            self._aggregates_job = None
            self._waiting = "Cancelled: press Compute to compute the rollout and head statistics."
            self._show_waiting(self.view_state.view)
            self._show_aggregates_controls()
        elif self._aggregates_work is not None and self.data is not None:
            self._compute_aggregates()

    def _show_aggregates_controls(self) -> None:
        """The worker's progress and Cancel on the rollout and statistics tabs while it computes them; Compute
        there once cancelled, until they are drawn."""
        running = self._aggregates_running()
        missing = self.data is not None and self._aggregates_work is not None and not self.data.aggregated
        on_show = self.view_state.view in ("rollout", "head-stats") and missing
        self.aggregates_progress.setVisible(on_show and running)
        self.aggregates_button.setVisible(on_show)
        self.aggregates_button.setText("Cancel" if running else "Compute")

    def _show_aggregates_progress(self, done: int, total: int, what: str) -> None:
        if not self._aggregates_running():
            return  # (a cancelled worker's last word)
        if what != self._aggregates_what:  # the rollout's layers, then the statistics': the bar starts again
            self._aggregates_what = what
            self.aggregates_progress.begin(total)
        self.aggregates_progress.show_progress(done, total)
        self._waiting = f"Computing the {what}: layer {done + 1} / {total}\u2026"
        self._show_waiting(self.view_state.view)

    def _show_waiting(self, name: str) -> None:
        """The rollout or statistics tab shown before the worker's numbers arrive: what is being computed
        and how far it is (at 1,024 tokens of the Qwen2.5-0.5B shape, seconds), not a blank plot."""
        if self.data is not None and ((name == "rollout" and not self.data.rollout_arrived)
                                      or (name == "head-stats" and not self.data.aggregated)):
            self.widgets[name].clear_matrix(self._waiting)

    def screenshot_ready(self) -> bool:
        """What is on show is drawn: the model view once its thumbnails are (the rollout and the statistics,
        which it does not show, may still be in the worker), or every row of a trace still arriving
        (drawn_before_the_logits); another view once the worker is done."""
        if self.view_state.view == "model-view" and (
                (self.data is not None and self.data.thumbs is not None) or self.drawn_before_the_logits()):
            return True
        return self._job is None

    def drawn_before_the_logits(self) -> bool:
        """The model view on show has painted every block of the text's trace still arriving (its logits, which
        the model view does not read, are computed after the blocks: AppState.set_text)."""
        ready = getattr(self.state, "tracing", None)
        return (self.view_state.view == "model-view" and ready is not None and ready.trace is self._partial
                and ready.done == ready.total and len(self._partial_thumbs) == ready.total)

    # -- rendering: only the visible view is drawn; the others are marked stale and drawn when shown
    def _invalidate(self, *views: str) -> None:
        self._stale.update(views)
        self._refresh()

    def _draw_stale(self, name: str) -> None:
        self._render(name)

    def _render(self, name: str) -> None:
        view = find_view(attention_views.VIEWS, name)
        result = view.compute(self.data, self.view_state)
        if result is None:
            self._stale.add(name)  # not computed yet (a worker's): drawn when it arrives
            self._show_waiting(name)
            return
        if view.widget == "heatmap":
            self._render_heatmap(view, result)
        elif view.widget == "model-view":
            self.model_view.set_patterns(result.patterns, result.mask, result.thumbs)
            self.model_view.set_selected_row(self.query_row())
        elif view.widget == "head-view":
            self.head_view.set_layer(result.pattern, result.row_labels, result.col_labels, result.query_offset)

    # -- interaction -----------------------------------------------------------------------
    def open_head(self, layer: int, head: int) -> None:
        """Show one head large (what a click on its thumbnail does)."""
        self.layer_spin.setValue(layer)
        self.head_spin.setValue(head)
        self.show_view("attention")

    def query_row(self) -> int | None:
        """Row of the selected token in the attention patterns (queries are the last T_q tokens)."""
        if self.selected_token is None or self.data is None:
            return None
        row = self.selected_token - self.data.query_offset
        return row if 0 <= row < layer_shape(self.data.patterns)[1] else None

    def _row_of_selection(self, view) -> int | None:
        return self.query_row() if view.rows == "queries" else self.selected_token

    def _token_of_row(self, view, row: int) -> int:
        return row + (self.data.query_offset if view.rows == "queries" else 0)

    def _select_in_own_views(self) -> None:
        row = self.query_row()
        self.model_view.set_selected_row(row)
        if "head-view" in self.widgets:  # (one made later is drawn, then given the selection: _refresh)
            self.head_view.set_selected_row(row)

    # -- ablation (what if): edits AppState.interventions; every panel then shows the edited model
    ABLATIONS = (("zero", "Zero"), ("mean", "Mean over the text"), ("resample", "Resample from another text…"))

    def ablation_menu(self, layer: int, head: int) -> QMenu:
        menu = QMenu(self)
        self.fill_ablation_menu(menu, layer, head)
        return menu

    def fill_ablation_menu(self, menu: QMenu, layer: int, head: int) -> None:
        menu.clear()
        if self.state.loaded is None:
            menu.addAction("Open a model first").setEnabled(False)
            return
        targets = ((f"blocks.{layer}.attn.head.{head}", f"head {layer}.{head}"),
                   (f"blocks.{layer}.attn.out", f"layer {layer}'s attention"),
                   (f"blocks.{layer}.mlp.out", f"layer {layer}'s MLP"))
        ablations = self.ABLATIONS
        if self.state.loaded.config.is_encoder_decoder:  # the stack and kind on show; zero only (app.tracing)
            kind = self.view_state.kind
            stack = "encoder" if kind == "encoder" else "decoder"
            attn = "cross_attn" if kind == "cross" else "attn"
            what = {"encoder": "encoder", "decoder": "decoder", "cross": "cross-attention"}[kind]
            targets = ((f"{stack}.blocks.{layer}.{attn}.head.{head}", f"{what} head {layer}.{head}"),
                       (f"{stack}.blocks.{layer}.{attn}.out", f"{what} layer {layer}'s attention"),
                       (f"{stack}.blocks.{layer}.mlp.out", f"{stack} layer {layer}'s MLP"))
            ablations = self.ABLATIONS[:1]
        for target, what in targets:
            sub = menu.addMenu(f"Ablate {what}")
            for how, text in ablations:
                sub.addAction(text).triggered.connect(lambda _=False, t=target, h=how: self.ablate(t, h))
        if self.state.interventions:
            menu.addSeparator()
            menu.addAction("Clear all ablations").triggered.connect(lambda: self.state.edits.clear())

    def show_ablation_menu(self, layer: int, head: int, global_pos) -> None:
        self.last_ablation_menu = menu = self.ablation_menu(layer, head)  # kept: tests and screenshots reach it
        menu.popup(global_pos)

    def ablate(self, target: str, how: str, other_text: str | None = None) -> None:
        """Add one edit to the app's what-if edits (by their rule, app/edits.py: it replaces an edit setting the
        same target)."""
        from ...core.interventions import Intervention

        source = None
        if how == "resample":
            if other_text is None:
                other_text, ok = QInputDialog.getText(self, "Resample from another text",
                                                      "Copy this activation from the model's run on:")
                if not ok:
                    return
            try:
                source = tuple(self._ids_of(other_text)) if other_text.strip() else ()
                if not source:
                    raise ValueError("the other text is empty")
            except Exception as exc:  # bad text: one line, no dialog
                self.status.setText(f"Cannot resample: {exc}")
                return
        from ...app.edits import ALREADY

        iv = Intervention(target, how, source_ids=source)
        if self.state.edits.add(iv) == ALREADY:
            self.status.setText(f"{iv.label} is already applied.")

    def _ids_of(self, text: str) -> list[int]:
        from ...core.inputs import encode_text_or_ids

        return encode_text_or_ids(self.state.loaded, text).ids

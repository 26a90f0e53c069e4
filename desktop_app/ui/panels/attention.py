"""Attention panel: every head of every layer, one head large, BertViz-style lines, aggregates.

Views (tabs): model view (layers x heads thumbnails; click one to open it), heatmap (one head,
token labels, hover, selected query row), head view (lines from each query to the keys it attends,
one colour per head, heads toggled), mean over heads, attention rollout, per-head statistics.
All numbers come from core.analysis; the heavy ones (rollout, statistics) run in a worker.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPen
from PySide6.QtWidgets import (QCheckBox, QComboBox, QGraphicsRectItem, QHBoxLayout, QLabel, QSpinBox,
                               QTabWidget, QVBoxLayout, QWidget)

from ...core import analysis
from ..settings import plot_background, plot_foreground
from ..widgets.export import ExportBar
from ..widgets.heatmap import Heatmap, LabelAxis
from ..widgets.token_strip import TokenStrip, plural

# Colour-blind-friendly qualitative palette (Okabe-Ito, then Tableau) for heads.
HEAD_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
                "#8c564b", "#7f7f7f", "#bcbd22", "#17becf", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def head_colour(h: int) -> QColor:
    if h < len(HEAD_COLOURS):
        return QColor(HEAD_COLOURS[h])
    return pg.intColor(h, hues=17)


def display_levels(m: np.ndarray, mask: np.ndarray | None = None, q: float = 0.995) -> tuple[float, float]:
    """Colour range 0..(99.5th percentile of the visible weights): a causal model's first rows hold
    weights near 1 by construction and would leave every other cell dark; the few cells above the
    range saturate, the colour bar shows the range and hovering gives the exact value."""
    step = max(1, m.shape[0] // 128)  # every step-th row: a percentile needs no more, and stays fast
    shown = m[::step] if mask is None else m[::step][mask[::step]]
    top = float(np.quantile(shown, q)) if shown.size else 1.0
    return 0.0, max(top, 1e-6)


def max_pool(m: np.ndarray, size: int) -> np.ndarray:
    """Shrink a [R, C] matrix to at most size x size by block maxima (sharp patterns stay visible)."""
    r, c = m.shape
    fr, fc = -(-r // size), -(-c // size)
    if fr == 1 and fc == 1:
        return m
    # pad with the smallest value so padding never shows (a block always holds one real cell)
    padded = np.full((-(-r // fr) * fr, -(-c // fc) * fc), m.min() if m.size else 0, dtype=m.dtype)
    padded[:r, :c] = m
    return padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))


def thumbnails(patterns: list[np.ndarray], mask: np.ndarray | None, lut: np.ndarray, size: int) -> list[list[np.ndarray]]:
    """RGBA thumbnails [layer][head] of at most size x size pixels (plain numpy: runs in a worker)."""
    out = []
    for p in patterns:
        row = []
        for m in p:
            if mask is not None:
                m = np.where(mask, m, -1.0)  # masked cells: below every weight, drawn grey
            small = max_pool(m, size)
            top = display_levels(small, small >= 0)[1]
            rgba = np.empty(small.shape + (4,), np.uint8)
            rgba[..., :3] = lut[np.clip(small / max(top, 1e-12) * 255, 0, 255).astype(np.uint8)]
            rgba[..., 3] = 255
            rgba[small < 0] = (190, 190, 190, 255)  # pooled entirely from masked cells
            row.append(rgba)
        out.append(row)
    return out


# -- model view ------------------------------------------------------------------------------


class ModelView(pg.GraphicsLayoutWidget):
    """A grid of thumbnails, one small ImageItem per (layer, head); click one to open it."""

    head_clicked = Signal(int, int)
    THUMB = 96  # thumbnails are max-pooled to at most this many pixels a side

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground(plot_background())
        self.boxes: dict[tuple[int, int], pg.ViewBox] = {}
        self.images: dict[tuple[int, int], pg.ImageItem] = {}
        self.row_boxes: list[QGraphicsRectItem] = []
        self.patterns: list[np.ndarray] = []
        self.lut = pg.colormap.get("viridis").getLookupTable(nPts=256)
        self.scene().sigMouseClicked.connect(self._on_click)

    def set_patterns(self, patterns: list[np.ndarray], mask: np.ndarray | None,
                     thumbs: list[list[np.ndarray]] | None = None) -> None:
        """Build the grid; `thumbs` (from thumbnails(), e.g. made in a worker) saves the pooling here."""
        if thumbs is None and patterns:
            thumbs = thumbnails(patterns, mask, self.lut, self.THUMB)
        self.clear()
        self.boxes.clear()
        self.images.clear()
        self.row_boxes = []
        self.patterns = patterns
        if not patterns:
            return
        n_heads = patterns[0].shape[0]
        for h in range(n_heads):
            self.addLabel(f"head {h}", row=0, col=h + 1, color=head_colour(h))
        for l, p in enumerate(patterns):
            self.addLabel(f"layer {l}", row=l + 1, col=0, angle=-90, color=plot_foreground())
            _, t_q, t_k = p.shape
            for h in range(n_heads):
                vb = self.addViewBox(row=l + 1, col=h + 1, lockAspect=True, enableMouse=False, enableMenu=False,
                                     invertY=True)
                vb.setBorder(pg.mkPen("#bbbbbb"))
                img = pg.ImageItem(thumbs[l][h], axisOrder="row-major")
                img.setRect(QRectF(0, 0, t_k, t_q))
                vb.addItem(img)
                box = QGraphicsRectItem()
                pen = QPen(QColor(255, 40, 40))
                pen.setCosmetic(True)
                pen.setWidthF(1.5)
                box.setPen(pen)
                box.setVisible(False)
                vb.addItem(box)
                vb.setRange(xRange=(0, t_k), yRange=(0, t_q), padding=0.02)
                self.boxes[(l, h)] = vb
                self.images[(l, h)] = img
                self.row_boxes.append(box)

    def set_selected_row(self, row: int | None) -> None:
        for (l, _h), box in zip(self.boxes, self.row_boxes):
            _, t_q, t_k = self.patterns[l].shape
            if row is None or not 0 <= row < t_q:
                box.setVisible(False)
            else:
                box.setRect(QRectF(0, row, t_k, 1))
                box.setVisible(True)

    def head_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        for key, vb in self.boxes.items():
            if vb.sceneBoundingRect().contains(scene_pos):
                return key
        return None

    def thumb_scene_center(self, layer: int, head: int) -> QPointF:
        return self.boxes[(layer, head)].sceneBoundingRect().center()

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
        self.plot = self.graphics.addPlot(axisItems={"left": self.left_axis, "right": self.right_axis})
        self.plot.showAxis("right")
        self.plot.hideAxis("bottom")
        self.plot.setMenuEnabled(False)
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
        lay.addWidget(self.graphics, 1)
        self.n_lines = 0

    def set_layer(self, pattern: np.ndarray, row_labels: list[str], col_labels: list[str]) -> None:
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
        self.offset = t_k - t_q
        self.left_axis.set_labels([""] * self.offset + list(row_labels))
        self.right_axis.set_labels(col_labels)
        vb = self.plot.getViewBox()
        vb.setLimits(yMin=-0.5, yMax=t_k + 0.5)
        shown = min(t_k, 32)
        centre = (self.offset + (self.selected_row or 0)) if self.selected_row is not None else 0
        top = max(0, min(t_k - shown, centre - shown // 2))
        self.plot.setYRange(top, top + shown, padding=0.01)
        self.redraw()

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
        if 0 <= token < self.pattern.shape[2]:
            self.token_clicked.emit(token)

    def _on_scrolled(self, *_):
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


class AttentionPanel(QWidget):
    title = "Attention"
    help_text = (
        "<b>What am I looking at?</b> Attention weights P<sub>ij</sub> = softmax<sub>j</sub>(q<sub>i</sub>&middot;k<sub>j</sub>/&radic;d<sub>k</sub>): "
        "how much query token i (row) reads from key token j (column). Grey cells are masked "
        "(a causal model cannot look ahead). Colours run from 0 to the 99.5th percentile of the visible weights "
        "(a causal model's first rows hold weights near 1 that would leave every other cell dark): the few cells "
        "above saturate; the colour bar shows the range and hovering gives the exact weight.<br>"
        "<b>Model view</b>: every layer x head; click one to open it. <b>Head view</b>: a line from each "
        "token to the tokens it attends (click a token to see only its lines), one colour per head, opacity = weight (for a selected token weights below 0.02 are hidden, below 0.05 otherwise). "
        "<b>Mean</b>: (1/H) &Sigma;<sub>h</sub> P<sub>h</sub>. <b>Rollout</b> (Abnar &amp; Zuidema): "
        "R<sub>l</sub> = &Acirc;<sub>l</sub>&hellip;&Acirc;<sub>0</sub>, &Acirc; = rows of (mean + I) renormalised, "
        "how much each input token flows into each position after layer l. <b>Head statistics</b>, averaged "
        "over queries: entropy &minus;&Sigma;<sub>j</sub>P<sub>ij</sub> log P<sub>ij</sub> (nats), mean distance "
        "&Sigma;<sub>j</sub>P<sub>ij</sub>|i&minus;j| (tokens), attention to the first token P<sub>i0</sub>.")

    VIEWS = ("model-view", "attention", "head-view", "mean", "rollout", "head-stats")
    VIEW_TITLES = ("Model view", "Heatmap", "Head view", "Mean over heads", "Rollout", "Head statistics")

    def __init__(self, state, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.trace = None
        self.patterns: list[np.ndarray] = []
        self.mask: np.ndarray | None = None
        self.row_labels: list[str] = []
        self.col_labels: list[str] = []
        self.rollout: np.ndarray | None = None
        self.stats: analysis.HeadStats | None = None
        self.selected_token: int | None = None
        self._generation = 0
        self._job = None
        self._stale: set[str] = set()  # views whose data changed while hidden
        self._relabel = False  # the big heatmap needs new labels / mask (new trace)

        self.layer_spin = QSpinBox()
        self.head_spin = QSpinBox()
        self.stat_combo = QComboBox()
        for key, name in analysis.STAT_NAMES.items():
            self.stat_combo.addItem(name, key)
        self.status = QLabel("Open a model and enter a text to see its attention.")
        self.tokens = TokenStrip(show_ids=False)
        self.tokens.setMaximumHeight(90)
        self.model_view = ModelView()
        self.heatmap = Heatmap(row_name="query", col_name="key", value_name="weight")
        self.head_view = HeadView()
        self.mean_map = Heatmap(row_name="query", col_name="key", value_name="mean weight")
        self.rollout_map = Heatmap(row_name="token", col_name="source token", value_name="rollout")
        self.stats_map = Heatmap(row_name="layer", col_name="head", value_name="entropy", colormap="magma",
                                 annotate_max_cells=400, row_tokens=False, col_tokens=False)
        self.tabs = QTabWidget()
        for widget, title in zip(self.views(), self.VIEW_TITLES):
            self.tabs.addTab(widget, title)
        self.export_bar = ExportBar(self.current_view, self._export_name)

        controls = QHBoxLayout()
        for label, w in (("Layer", self.layer_spin), ("Head", self.head_spin), ("Statistic", self.stat_combo)):
            controls.addWidget(QLabel(label))
            controls.addWidget(w)
        controls.addWidget(self.status, 1)
        controls.addWidget(self.export_bar)
        lay = QVBoxLayout(self)
        lay.addLayout(controls)
        lay.addWidget(self.tokens)
        lay.addWidget(self.tabs, 1)

        self.layer_spin.valueChanged.connect(self._on_layer)
        self.head_spin.valueChanged.connect(self._on_head)
        self.stat_combo.currentIndexChanged.connect(lambda _i: self._invalidate("head-stats"))
        self.tabs.currentChanged.connect(self._update_controls)
        self.tabs.currentChanged.connect(lambda _i: self._refresh())
        self.model_view.head_clicked.connect(self.open_head)
        self.head_view.token_clicked.connect(
            lambda t: self.select_token(None if t == self.selected_token else t))  # a second click clears
        self.tokens.token_selected.connect(self.select_token)
        for hm in (self.heatmap, self.mean_map, self.rollout_map):
            hm.cell_clicked.connect(lambda row, _col, hm=hm: self._on_row_clicked(hm, row))
        state.trace_changed.connect(self._on_trace_changed)
        self._update_controls()
        if getattr(state, "trace", None) is not None:
            self._on_trace_changed(state.trace)

    # -- views -----------------------------------------------------------------------------
    def views(self) -> list:
        return [self.model_view, self.heatmap, self.head_view, self.mean_map, self.rollout_map, self.stats_map]

    def current_view(self):
        return self.views()[self.tabs.currentIndex()]

    def show_view(self, name: str) -> None:
        self.tabs.setCurrentIndex(self.VIEWS.index(name))

    def _export_name(self) -> str:
        view = self.VIEWS[self.tabs.currentIndex()]
        if view in ("attention",):
            return f"attention-L{self.layer}-H{self.head}"
        if view in ("head-view", "mean", "rollout"):
            return f"{view}-L{self.layer}"
        if view == "head-stats":
            return f"head-stats-{self.stat_combo.currentData()}"
        return view

    def _update_controls(self, *_):
        view = self.VIEWS[self.tabs.currentIndex()]
        self.layer_spin.setEnabled(view in ("attention", "head-view", "mean", "rollout"))
        self.head_spin.setEnabled(view == "attention")
        self.stat_combo.setEnabled(view == "head-stats")

    @property
    def layer(self) -> int:
        return self.layer_spin.value()

    @property
    def head(self) -> int:
        return self.head_spin.value()

    # -- data ------------------------------------------------------------------------------
    def _on_trace_changed(self, trace) -> None:
        ids = list(getattr(self.state, "token_ids", []) or [])
        self.set_trace(trace, ids)

    def set_trace(self, trace, token_ids: list[int] | None = None, causal: bool | None = None,
                  sync: bool = False) -> None:
        """Show a trace. sync=True computes rollout and statistics here (CLI); else in a worker."""
        self.trace = trace
        self._generation += 1
        self.rollout, self.stats = None, None
        if trace is None or trace.n_layers == 0 or "blocks.0.attn.pattern" not in trace:
            self._clear(self.state.no_trace_message() if trace is None else "This trace has no attention patterns.")
            return
        self.patterns = analysis.attention_patterns(trace)
        _, t_q, t_k = self.patterns[0].shape
        if causal is None:
            loaded = getattr(self.state, "loaded", None)
            causal = loaded.config.causal if loaded is not None else bool(
                np.all(np.triu(self.patterns[0][:, :, t_k - t_q:], 1) == 0))
        allowed = analysis.allowed_mask(t_q, t_k, causal)
        self.mask = None if allowed.all() else allowed
        ids = list(token_ids or [])
        strings = self.state.token_strings(ids) if len(ids) == t_k else [str(i) for i in range(t_k)]
        if len(ids) != t_k:
            ids = list(range(t_k))
        self.col_labels = strings
        self.row_labels = strings[t_k - t_q:]
        self.tokens.set_tokens(strings, ids)
        n_layers, n_heads = len(self.patterns), self.patterns[0].shape[0]
        for spin, n in ((self.layer_spin, n_layers), (self.head_spin, n_heads)):
            spin.blockSignals(True)
            spin.setRange(0, n - 1)
            spin.blockSignals(False)
        if self.selected_token is not None and self.selected_token >= t_k:
            self.selected_token = None
        self.model_view.set_patterns([], None)  # its thumbnails come from the worker
        self._relabel = True
        self._invalidate("attention", "head-view", "mean", "rollout", "head-stats")
        self._apply_selection()
        self.status.setText(f"{plural(t_k, 'token')}, {plural(n_layers, 'layer')} x {plural(n_heads, 'head')}"
                            + (" (causal)" if causal else " (bidirectional)"))
        generation = self._generation
        patterns, mask, lut, size = self.patterns, self.mask, self.model_view.lut, self.model_view.THUMB

        def work(job=None):
            return (generation, *_aggregates(trace, job), thumbnails(patterns, mask, lut, size))

        if sync:
            self._on_aggregates(work())
        else:
            from ..workers import run_job

            if self._job is not None and not self._job.done:
                self._job.cancel()  # its result would be dropped anyway
            self._job = run_job(work, on_result=self._on_aggregates,
                                on_error=lambda exc, tb: self.status.setText(f"statistics failed: {exc}"))

    def _clear(self, message: str) -> None:
        """No trace (or one without attention): nothing of a previous text or model stays on show."""
        if self._job is not None and not self._job.done:
            self._job.cancel()
        self.patterns, self.mask, self.row_labels, self.col_labels = [], None, [], []
        self.selected_token = None
        self.tokens.set_tokens([], [])
        self.model_view.set_patterns([], None)
        for hm in (self.heatmap, self.mean_map, self.rollout_map, self.stats_map):
            hm.clear_matrix(message)
        self.head_view.set_layer(np.zeros((0, 0, 0), dtype=np.float32), [], [])
        for spin in (self.layer_spin, self.head_spin):
            spin.blockSignals(True)
            spin.setRange(0, 0)
            spin.blockSignals(False)
        self._stale.clear()
        self.status.setText(message)

    def _on_aggregates(self, result) -> None:
        generation, rollout, stats, rollout_problem, thumbs = result
        if generation != self._generation:
            return  # a newer trace arrived meanwhile
        self.model_view.set_patterns(self.patterns, self.mask, thumbs)
        self.model_view.set_selected_row(self.query_row())
        self.rollout, self.stats = rollout, stats
        if rollout is None:
            self.rollout_map.set_matrix(np.zeros((1, 1)), [""], [""], title=rollout_problem)
        self._invalidate("rollout", "head-stats")

    # -- rendering: only the visible view is drawn; the others are marked stale and drawn when shown
    def _invalidate(self, *views: str) -> None:
        self._stale.update(views)
        self._refresh()

    def _refresh(self) -> None:
        view = self.VIEWS[self.tabs.currentIndex()]
        if view not in self._stale or not self.patterns:
            return
        self._stale.discard(view)
        {"attention": self._show_head, "head-view": self._show_head_view, "mean": self._show_mean,
         "rollout": self._show_rollout, "head-stats": self._show_stats}[view]()

    def _show_head_view(self) -> None:
        self.head_view.set_layer(self.patterns[self.layer], self.row_labels, self.col_labels)

    def _show_mean(self) -> None:
        mean = self.patterns[self.layer].astype(np.float64).mean(axis=0)
        self.mean_map.set_matrix(mean, self.row_labels, self.col_labels, mask=self.mask,
                                 levels=display_levels(mean, self.mask),
                                 title=f"Layer {self.layer}, mean over heads")

    def _show_head(self) -> None:
        m = self.patterns[self.layer][self.head]
        levels = display_levels(m, self.mask)
        relabel, self._relabel = self._relabel, False
        if relabel or self.heatmap.values.shape != m.shape:
            self.heatmap.set_matrix(m, self.row_labels, self.col_labels, mask=self.mask, levels=levels)
        else:
            self.heatmap.set_values(m, levels)  # the fast path: one texture upload
        self.heatmap.set_title(f"Layer {self.layer}, head {self.head}")

    def _show_rollout(self) -> None:
        if self.rollout is None:
            self._stale.add("rollout")  # not computed yet: draw it when it arrives
            return
        r = self.rollout[self.layer]
        self.rollout_map.set_matrix(r, self.col_labels, self.col_labels, mask=self.mask,
                                    levels=display_levels(r, self.mask),
                                    title=f"Attention rollout through layers 0..{self.layer}")
        self.rollout_map.set_selected_row(self.selected_token)

    def _show_stats(self) -> None:
        if self.stats is None:
            self._stale.add("head-stats")
            return
        key = self.stat_combo.currentData()
        values = self.stats.as_dict()[key]
        n_layers, n_heads = values.shape
        self.stats_map.set_axis_names("layer", "head", analysis.STAT_NAMES[key])
        self.stats_map.set_matrix(values, [f"L{l}" for l in range(n_layers)], [f"H{h}" for h in range(n_heads)],
                                  title=analysis.STAT_NAMES[key])

    def _on_layer(self, _value: int) -> None:
        self._invalidate("attention", "head-view", "mean", "rollout")

    def _on_head(self, _value: int) -> None:
        self._invalidate("attention")

    # -- interaction -----------------------------------------------------------------------
    def open_head(self, layer: int, head: int) -> None:
        """Show one head large (what a click on its thumbnail does)."""
        self.layer_spin.setValue(layer)
        self.head_spin.setValue(head)
        self.show_view("attention")

    def select_token(self, index: int | None) -> None:
        """Highlight query token `index` (position in the sequence) in every view."""
        self.selected_token = index
        self.tokens.set_selected(index)
        self._apply_selection()

    def query_row(self) -> int | None:
        """Row of the selected token in the attention patterns (queries are the last T_q tokens)."""
        if self.selected_token is None or not self.patterns:
            return None
        _, t_q, t_k = self.patterns[0].shape
        row = self.selected_token - (t_k - t_q)
        return row if 0 <= row < t_q else None

    def _apply_selection(self) -> None:
        row = self.query_row()
        self.heatmap.set_selected_row(row)
        self.mean_map.set_selected_row(row)
        self.rollout_map.set_selected_row(self.selected_token)
        self.model_view.set_selected_row(row)
        self.head_view.set_selected_row(row)

    def _on_row_clicked(self, hm: Heatmap, row: int) -> None:
        offset = 0 if hm is self.rollout_map else self.patterns[0].shape[2] - self.patterns[0].shape[1]
        self.select_token(row + offset)


def _aggregates(trace, job=None):
    """Rollout and head statistics (worker thread: O(L T^3) and O(L H T^2))."""
    try:
        rollout, problem = analysis.attention_rollout(trace, job=job), ""
    except ValueError as exc:  # a cached generation step has no square patterns
        rollout, problem = None, str(exc)
    return rollout, analysis.head_stats(trace, job=job), problem

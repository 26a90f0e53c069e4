"""Heatmap: a matrix drawn as ONE pyqtgraph ImageItem (one texture, not a widget per cell).

Token labels on both axes (thinned to what fits), hover tooltip "query -> key: weight", a
highlighted row for the selected query, masked cells (e.g. causal) drawn grey by a static overlay
(a staircase polygon for causal masks),
and a colour bar. Switching to another matrix of the same shape (another head) only re-uploads
the values: `set_values(values)`.

    hm = Heatmap(row_name="query", col_name="key", value_name="weight")
    hm.set_matrix(values, row_labels, col_labels, mask=allowed, levels=(0, 1))
    hm.set_values(other_head)             # fast path
    hm.set_selected_row(i)                # outline row i
    hm.hovered -> (row, col, value), hm.cell_clicked -> (row, col)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QCursor, QFontMetrics, QPen, QPolygonF, QTransform
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPolygonItem, QGraphicsRectItem, QGraphicsSimpleTextItem, QToolTip

from ..settings import plot_background, plot_foreground
from .empty_plot import show_empty
from .readable import text_colour_on
from .token_strip import _visible

MASK_GREY = (150, 150, 150, 255)


def short_label(s: str, width: int = 10, token: bool = True) -> str:
    """A label cut to `width`; a token's whitespace made visible (not a name's: "head 0")."""
    s = _visible(s) if token else s
    return s if len(s) <= width else s[: width - 1] + "\u2026"


def annotation_decimals(values: np.ndarray) -> int:
    """One number of decimals for every cell of a matrix (3 significant digits of the largest value,
    0 to 3 decimals), so a column of numbers lines up: 0.512 and 0.050, not 0.512 and 0.05."""
    finite = np.abs(values[np.isfinite(values)])
    if finite.size and np.all(finite == np.round(finite)):
        return 0  # counts, or 0/1 entries
    top = float(finite.max()) if finite.size else 0.0
    if top <= 0:
        return 2
    return int(min(3, max(0, 2 - math.floor(math.log10(top)))))


def screen_label(text: str, colour: QColor, turned: bool = False, centred: bool = False) -> QGraphicsSimpleTextItem:
    """Text in screen pixels whatever the view's scale, its bottom centre 4 px above its position (turned: reading
    upwards; centred: its centre at its position). pyqtgraph's TextItem took ~1 ms each to make and add: the Attention
    panel's head statistics wrote 336 (24 x 14 at Qwen2.5-0.5B) in ~0.5 s of the UI thread, its model view's grid
    labels 65 ms."""
    item = QGraphicsSimpleTextItem(text)
    item.setBrush(colour)
    item.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIgnoresTransformations)
    anchor_label(item, turned, centred)
    return item


def anchor_label(item: QGraphicsSimpleTextItem, turned: bool = False, centred: bool = False) -> None:
    """Put a screen_label's anchor (its bottom centre, 4 px below it, or its centre) at its position: again after
    its text changed."""
    box = item.boundingRect()
    gap = 4  # pixels between the text and its position (TextItem's margin, as before)
    item.setTransform(QTransform().rotate(-90 if turned else 0).translate(
        -box.width() / 2, -box.height() / 2 if centred else -box.height() - gap))


class LabelAxis(pg.AxisItem):
    """Axis whose ticks are cell centres (i + 0.5) labelled by strings, thinned to fit the pixels: every
    1, 2, 5, 10... labels (positions), or with `any_step` every k-th for the smallest k that fits (names).
    A bottom axis's `always` labels (set_labels) are drawn first, one that would touch another on a further line;
    the others are left out where they would touch them. `always` labels in groups (a layer's MLP and bias) get as
    many lines as a group has labels, and one more: when they need more, only every k-th group's are kept (the
    smallest k that fits; the ungrouped ones always), since 24 layers' made five interleaved lines."""

    def __init__(self, orientation: str, tokens: bool = True, any_step: bool = False, **kw) -> None:
        super().__init__(orientation, **kw)
        self.labels: list[str] = []
        self.always: set[int] = set()
        self.groups: dict[int, int] = {}
        self.tokens = tokens  # labels are tokens (show their spaces) rather than names
        self.any_step = any_step
        self.enableAutoSIPrefix(False)

    def set_labels(self, labels: Sequence[str], always: Sequence[int] = (), groups: Sequence[int] = ()) -> None:
        """groups: one per `always` label, its group (a layer; -1: none) for thinning them (see the class)."""
        self.labels = [short_label(s, token=self.tokens) for s in labels]
        self.always = {i for i in always if 0 <= i < len(self.labels)} if self.orientation == "bottom" else set()
        self.groups = {i: g for i, g in zip(always, groups) if i in self.always and g >= 0}
        self.group_step = 1  # every group_step-th group's `always` labels drawn (generateDrawSpecs)
        self._lines = 0  # lines of labels the axis has room for (generateDrawSpecs: as many as the `always` need)
        if self.orientation == "bottom":
            self.setHeight(None)
        if self.orientation in ("left", "right"):
            # room for the longest label up front: pyqtgraph otherwise widens the axis only after a
            # paint, and drops the labels that did not fit in that first paint
            fm = QFontMetrics(self.style.get("tickFont") or self.font())
            longest = max((fm.horizontalAdvance(s) for s in self.labels), default=10)
            self.setWidth(longest + 16)
        self.picture = None
        self.update()

    def _label_pixels(self) -> float:
        fm = QFontMetrics(self.style.get("tickFont") or self.font())
        if self.orientation in ("left", "right"):
            return fm.height() + 1.0
        longest = max((fm.horizontalAdvance(s) for s in self.labels), default=10)
        return longest + 8.0

    def tickValues(self, minVal, maxVal, size):  # noqa: N802 (pyqtgraph API)
        n = len(self.labels)
        if n == 0 or size <= 0:
            return []
        lo = max(0, int(math.floor(min(minVal, maxVal))))
        hi = min(n - 1, int(math.ceil(max(minVal, maxVal))))
        if hi < lo:
            return []
        visible = hi - lo + 1
        cells_per_label = self._label_pixels() * visible / size
        step = max(1, math.ceil(cells_per_label))
        if not self.any_step:
            nice = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000)
            step = next((s for s in nice if s >= step), 10000)
        first = (lo + step - 1) // step * step
        ticks = {i + 0.5 for i in range(first, hi + 1, step)} | {i + 0.5 for i in self.always if lo <= i <= hi}
        return [(float(step), sorted(ticks))]

    def generateDrawSpecs(self, p):  # noqa: N802 (pyqtgraph's name)
        """The `always` labels first (a further line for one that would touch another; every k-th group's when they
        would need more lines than a group has labels and one), then the rest where they touch none."""
        if not self.always:
            return super().generateDrawSpecs(p)
        # pyqtgraph leaves out a label that crosses the axis's ends (the first and last bars' names): every label
        # comes back, and an `always` one is moved in over the end it crossed (still over its bar), the others left out
        self.style["hideOverlappingLabels"] = 1 << 20
        try:
            specs = super().generateDrawSpecs(p)
        finally:
            self.style["hideOverlappingLabels"] = True
        if specs is None:
            return specs
        axis, ticks, texts = specs
        bounds = self.boundingRect()  # (pyqtgraph's own bounds for its labels, the style restored)
        fm = QFontMetrics(self.style.get("tickFont") or self.font())
        gap = fm.horizontalAdvance("  ")  # between two labels on a line (4 px read as one: "L21 MLP L23 MLP")
        sizes = {}
        for g in self.groups.values():
            sizes[g] = sizes.get(g, 0) + 1
        most_lines = max(sizes.values(), default=len(self.always)) + 1
        n_groups = len(sizes)
        for step in range(1, max(n_groups, 1) + 1):
            must = {self.labels[i] for i in self.always if self.groups.get(i, 0) % step == 0}
            kept, used = self._placed(texts, must, bounds, gap)
            if used <= most_lines:
                break
        self.group_step = step
        if used != self._lines:  # (the axis grows a line for each line of labels: laid out again)
            self._lines = used
            self.setHeight(None if used == 1 else used * fm.height() + 12)
        return axis, ticks, kept

    @staticmethod
    def _placed(texts, must: set[str], bounds, gap: float) -> tuple[list, int]:
        """The labels drawn ((rect, flags, text), lines used): the `must` ones first, each on the first line where it
        is `gap` clear of the others (moved in over an end of the axis it crossed), the rest on the first line
        where they are clear, else left out."""
        inside = []
        for rect, flags, text in texts:
            over = max(0.0, bounds.left() - rect.left()) - max(0.0, rect.right() - bounds.right())
            if over and text in must:
                rect = rect.translated(over, 0)
            elif over:
                continue
            inside.append((rect, flags, text))
        lines: list[list] = [[] for _ in range(max(len(must), 1))]
        kept, used = [], 1
        for rect, flags, text in sorted(inside, key=lambda t: t[2] not in must):  # (stable: left to right)
            room = rect.adjusted(-gap / 2, 0, gap / 2, 0)
            for line, placed in enumerate(lines if text in must else lines[:1]):  # (the others: the first line)
                if not any(room.intersects(r) for r in placed):
                    placed.append(room)
                    kept.append((rect.translated(0, line * rect.height()), flags, text))
                    used = max(used, line + 1)
                    break
        return kept, used

    def tickStrings(self, values, scale, spacing):  # noqa: N802
        out = []
        for v in values:
            i = int(math.floor(v))
            out.append(self.labels[i] if 0 <= i < len(self.labels) else "")
        return out


class Heatmap(pg.GraphicsLayoutWidget):
    hovered = Signal(int, int, float)
    cell_clicked = Signal(int, int)
    drawn = Signal()  # a matrix set or cleared (an ExportBar follows it: nothing to export while empty)

    def __init__(self, parent=None, colormap: str = "viridis", row_name: str = "query", col_name: str = "key",
                 value_name: str = "weight", colorbar: bool = True, annotate_max_cells: int = 0,
                 highlight: str = "#ff2828", row_tokens: bool = True, col_tokens: bool = True) -> None:
        super().__init__(parent)
        self.annotate_max_cells = annotate_max_cells  # write each value in its cell when this few cells
        self.annotations: list[QGraphicsSimpleTextItem] = []  # screen_labels in the cells
        self.setBackground(plot_background())
        self.row_name, self.col_name, self.value_name = row_name, col_name, value_name
        self.left_axis = LabelAxis("left", tokens=row_tokens)
        self.bottom_axis = LabelAxis("bottom", tokens=col_tokens)
        for ax in (self.left_axis, self.bottom_axis):
            ax.setPen(pg.mkPen(plot_foreground()))
            ax.setTextPen(pg.mkPen(plot_foreground()))
        # (no view box menu made: it was ~15% of the panel's build, and is never shown)
        self.plot = self.addPlot(row=0, col=0, axisItems={"left": self.left_axis, "bottom": self.bottom_axis},
                                 enableMenu=False)
        self.plot.hideButtons()
        self.vb = self.plot.getViewBox()
        self.vb.invertY(True)
        self.vb.setAspectLocked(False)
        self.vb.sigResized.connect(self._fit_annotations)
        self.vb.sigXRangeChanged.connect(self._fit_annotations)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.mask_image = pg.ImageItem(axisOrder="row-major")
        self.mask_image.setZValue(1)
        self.mask_polygon = QGraphicsPolygonItem()
        self.mask_polygon.setBrush(QBrush(QColor(*MASK_GREY)))
        self.mask_polygon.setPen(QPen(Qt.PenStyle.NoPen))
        self.mask_polygon.setZValue(1)
        self.mask_polygon.setVisible(False)
        self.plot.addItem(self.image)
        self.plot.addItem(self.mask_image)
        self.plot.addItem(self.mask_polygon)
        self.row_box = QGraphicsRectItem()
        pen = QPen(QColor(highlight))
        pen.setCosmetic(True)
        pen.setWidthF(2.0)
        self.row_box.setPen(pen)
        self.row_box.setBrush(QBrush(Qt.BrushStyle.NoBrush))
        self.row_box.setZValue(2)
        self.row_box.setVisible(False)
        self.plot.addItem(self.row_box)
        self.cmap = pg.colormap.get(colormap)
        self._colorbar = None
        self._wants_colorbar = colorbar  # made when first shown or asked (the colorbar property)
        self.image.setLookupTable(self.cmap.getLookupTable(nPts=256))
        self.values = np.zeros((0, 0), dtype=np.float32)
        self.empty_reason = "Nothing to export: no numbers shown yet"
        show_empty(self.plot, True)
        self.mask: np.ndarray | None = None
        self.row_labels: list[str] = []
        self.col_labels: list[str] = []
        self.levels = (0.0, 1.0)
        self.selected_row: int | None = None
        self.hover_text = ""
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.scene().sigMouseClicked.connect(self._on_mouse_clicked)

    @property
    def colorbar(self) -> pg.ColorBarItem | None:
        """The colour bar beside the matrix (None: made without one). Made when the heatmap is first shown or
        this is asked (a matrix set): a ColorBarItem is a plot of its own, ~40 ms to make, and a panel makes
        heatmaps for tabs a person may never open (the Attention panel four, before a first look's first paint)."""
        if self._colorbar is None and self._wants_colorbar:
            bar = self._colorbar = pg.ColorBarItem(values=self.levels, colorMap=self.cmap, interactive=False, width=14,
                                                   pen=plot_foreground(), colorMapMenu=False)
            bar.setImageItem(self.image)
            bar.axis.setTextPen(pg.mkPen(plot_foreground()))
            bar.axis.setPen(pg.mkPen(plot_foreground()))
            self.addItem(bar, row=0, col=1)
            show_empty(self.plot, self.values.size == 0, colorbar=bar)
        return self._colorbar

    def showEvent(self, event) -> None:
        self.colorbar  # (made before its first paint)  # noqa: B018
        super().showEvent(event)

    # -- data ------------------------------------------------------------------------------
    def set_matrix(self, values: np.ndarray, row_labels: Sequence[str] | None = None,
                   col_labels: Sequence[str] | None = None, mask: np.ndarray | None = None,
                   levels: tuple[float, float] | None = None, title: str | None = None) -> None:
        """Show a new matrix. mask: boolean, True where a cell exists (False cells are drawn grey)."""
        values = np.asarray(values, dtype=np.float32)
        if values.ndim != 2:
            raise ValueError(f"a heatmap needs a 2-D matrix, got shape {values.shape}")
        rows, cols = values.shape
        self.row_labels = [str(i) for i in range(rows)] if row_labels is None else list(row_labels)
        self.col_labels = [str(i) for i in range(cols)] if col_labels is None else list(col_labels)
        self.left_axis.set_labels(self.row_labels)
        self.bottom_axis.set_labels(self.col_labels)
        self.mask = None if mask is None or np.all(mask) else np.asarray(mask, dtype=bool)
        self._set_mask_overlay(self.mask)
        if levels is None:
            shown = values if self.mask is None else values[self.mask]
            finite = shown[np.isfinite(shown)]
            levels = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
            if levels[1] <= levels[0]:
                levels = (levels[0], levels[0] + 1.0)
        self.set_values(values, levels)
        self.image.setRect(QRectF(0, 0, cols, rows))
        self.vb.setLimits(xMin=0, xMax=cols, yMin=0, yMax=rows)
        self.vb.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        if title is not None:
            self.plot.setTitle(title, color=plot_foreground())
        if self.selected_row is not None and self.selected_row >= rows:
            self.set_selected_row(None)
        else:
            self.set_selected_row(self.selected_row)

    def clear_matrix(self, title: str = "") -> None:
        """Show nothing (no trace): no cells, no labels, the title saying why."""
        self.values = np.zeros((0, 0), dtype=np.float32)
        self.mask = None
        self.row_labels, self.col_labels = [], []
        self.left_axis.set_labels([])
        self.bottom_axis.set_labels([])
        self._set_mask_overlay(None)
        self.image.clear()
        self._annotate()
        self.row_box.setVisible(False)
        show_empty(self.plot, True, title, self._colorbar)
        self.empty_reason = f"Nothing to export: {title[0].lower() + title[1:]}" if title else \
            "Nothing to export: no numbers shown yet"
        self.drawn.emit()

    def _set_mask_overlay(self, mask: np.ndarray | None) -> None:
        """Grey over masked cells: a staircase polygon when every row allows a prefix of the columns
        (causal masks: vector in SVG, nothing to rescale when drawn), else an RGBA image."""
        self.mask_polygon.setVisible(False)
        self.mask_image.setVisible(False)
        if mask is None:
            return
        rows, cols = mask.shape
        allowed = mask.sum(axis=1)
        if np.array_equal(mask, np.arange(cols)[None, :] < allowed[:, None]):
            pts = [QPointF(cols, 0)]
            for i, k in enumerate(allowed):
                pts += [QPointF(float(k), float(i)), QPointF(float(k), float(i + 1))]
            pts.append(QPointF(cols, rows))
            self.mask_polygon.setPolygon(QPolygonF(pts))
            self.mask_polygon.setVisible(True)
        else:
            overlay = np.zeros((rows, cols, 4), dtype=np.uint8)
            overlay[~mask] = MASK_GREY
            self.mask_image.setImage(overlay, levels=(0, 255))
            self.mask_image.setRect(QRectF(0, 0, cols, rows))
            self.mask_image.setVisible(True)

    def set_values(self, values: np.ndarray, levels: tuple[float, float] | None = None) -> None:
        """Replace the values of a matrix of the same shape (labels and mask kept): one texture upload."""
        values = np.asarray(values, dtype=np.float32)
        if levels is not None:
            self.levels = (float(levels[0]), float(levels[1]))
            if self.colorbar is not None:
                self.colorbar.setLevels(self.levels)
        was_empty = self.values.size == 0
        if was_empty and values.size:
            show_empty(self.plot, False, colorbar=self._colorbar)
        self.values = values
        self.image.setImage(values, levels=self.levels, autoLevels=False)
        self._annotate()
        if was_empty:  # (another head's values: the export bar has nothing new to say)
            self.drawn.emit()

    def _annotate(self) -> None:
        """Each cell's value written in it (screen_labels), the previous matrix's reused."""
        shown = 0
        if self.annotate_max_cells and self.values.size <= self.annotate_max_cells:
            decimals = annotation_decimals(self.values)
            for (r, c), v in np.ndenumerate(self.values):
                if self.mask is not None and not self.mask[r, c]:
                    continue
                tiny = v != 0 and abs(float(v)) < 0.5 * 10 ** -decimals  # would read as 0.000
                text = f"{float(v):.0e}" if tiny else f"{float(v):.{decimals}f}"
                colour = QColor("black" if self._light_cell(float(v)) else "white")
                if shown == len(self.annotations):
                    t = screen_label(text, colour, centred=True)
                    t.setZValue(3)
                    t.setParentItem(self.vb.childGroup)  # (not the view box's items: no auto range to redo)
                    self.annotations.append(t)
                else:
                    t = self.annotations[shown]
                    t.setText(text)
                    t.setBrush(colour)
                    anchor_label(t, centred=True)
                shown += 1
                t.setPos(c + 0.5, r + 0.5)
        for t in self.annotations[shown:]:
            t.setParentItem(None)
            if t.scene() is not None:
                t.scene().removeItem(t)
        del self.annotations[shown:]
        self._fit_annotations()

    def _light_cell(self, value: float) -> bool:
        """Whether the colour map paints `value` light (black text reads on it): by its luminance,
        so a diverging map's pale middle gets black text too."""
        lo, hi = self.levels
        x = min(1.0, max(0.0, (value - lo) / (hi - lo))) if hi > lo else 0.0
        r, g, b = (min(1.0, max(0.0, float(c))) for c in self.cmap.map(x, mode="float")[:3])
        return text_colour_on(QColor.fromRgbF(r, g, b)).lightness() < 128

    def _fit_annotations(self, *_) -> None:
        """Numbers only where they fit their cells: hidden while the cells are narrower than the
        widest number (they would run into each other), shown again when zoomed in or widened."""
        if not self.annotations:
            return
        (x0, x1), _ = self.vb.viewRange()
        cell_px = self.vb.width() / max(x1 - x0, 1e-9)
        widest = max(t.boundingRect().width() for t in self.annotations)
        fits = cell_px >= widest + 2
        for t in self.annotations:
            t.setVisible(fits)

    def set_title(self, title: str) -> None:
        self.plot.setTitle(title, color=plot_foreground())

    def set_axis_names(self, row_name: str, col_name: str, value_name: str | None = None) -> None:
        self.row_name, self.col_name = row_name, col_name
        if value_name is not None:
            self.value_name = value_name

    # -- selection and hover ---------------------------------------------------------------
    def set_selected_row(self, row: int | None) -> None:
        self.selected_row = row
        if row is None or not (0 <= row < self.values.shape[0]):
            self.row_box.setVisible(False)
            return
        self.row_box.setRect(QRectF(0, row, self.values.shape[1], 1))
        self.row_box.setVisible(True)

    def cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        if not self.plot.sceneBoundingRect().contains(scene_pos) or self.values.size == 0:
            return None
        p = self.vb.mapSceneToView(scene_pos)
        col, row = int(math.floor(p.x())), int(math.floor(p.y()))
        if 0 <= row < self.values.shape[0] and 0 <= col < self.values.shape[1]:
            return row, col
        return None

    def cell_scene_pos(self, row: int, col: int) -> QPointF:
        """Scene position of a cell's centre (for tests and for pointing at cells)."""
        return self.vb.mapViewToScene(QPointF(col + 0.5, row + 0.5))

    def describe_cell(self, row: int, col: int) -> str:
        r = self.row_labels[row] if row < len(self.row_labels) else str(row)
        c = self.col_labels[col] if col < len(self.col_labels) else str(col)
        if self.mask is not None and not self.mask[row, col]:
            value = "masked"
        else:
            value = f"{float(self.values[row, col]):.4g}"
        r = repr(_visible(r)) if self.left_axis.tokens else r
        c = repr(_visible(c)) if self.bottom_axis.tokens else c
        return (f"{self.row_name} {row} {r} \u2192 {self.col_name} {col} {c}\n"
                f"{self.value_name}: {value}")

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self.cell_at(scene_pos)
        if cell is None:
            if self.hover_text:
                self.hover_text = ""
                self.setToolTip("")
                QToolTip.hideText()
            return
        row, col = cell
        self.hover_text = self.describe_cell(row, col)
        self.setToolTip(self.hover_text)
        QToolTip.showText(QCursor.pos(), self.hover_text, self)
        self.hovered.emit(row, col, float(self.values[row, col]))

    def _on_mouse_clicked(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        cell = self.cell_at(ev.scenePos())
        if cell is not None:
            self.cell_clicked.emit(*cell)

    # -- export ----------------------------------------------------------------------------
    def export_widget(self):
        return self

    def svg_item(self):
        """What an SVG export draws: the plot with its axes and the colour bar."""
        return self.ci

    def export_unavailable(self) -> str | None:
        return None if self.values.size else self.empty_reason

    def export_arrays(self) -> dict[str, np.ndarray]:
        out = {"values": self.values, "row_labels": np.array(self.row_labels), "col_labels": np.array(self.col_labels)}
        if self.mask is not None:
            out["mask"] = self.mask
        return out

    def csv_table(self) -> tuple[list[str], list[list]]:
        header = [f"{self.row_name} \\ {self.col_name}"] + list(self.col_labels)
        rows = []
        for i, label in enumerate(self.row_labels):
            vals = self.values[i].astype(float)
            if self.mask is not None:
                vals = np.where(self.mask[i], vals, np.nan)
            rows.append([label] + ["" if math.isnan(v) else f"{v:.6g}" for v in vals])
        return header, rows

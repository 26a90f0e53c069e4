"""TokenStrip: tokens as coloured chips (text + id) that wrap like text, one selectable.

Painted in one paintEvent (no widget per token), so thousands of tokens stay fluid.
API kept small because several panels use it:
    strip.set_tokens(strings, ids, values=None)   # values colour the chips (e.g. probability)
    strip.token_selected  -> Signal(int)           # index of the clicked chip
    strip.set_selected(index | None), strip.selected_index
"""
from __future__ import annotations

import math
from typing import Sequence

from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QScrollArea, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from .readable import quiet_text_colour_on, text_colour_on


def id_colour_on(chip: QColor) -> QColor:
    """The colour of the id under a token: a quiet grey where it reads, the token's own text colour on a
    mid or deep blue (the grey there was at a contrast of 1.1, unreadable)."""
    return quiet_text_colour_on(chip, QColor(110, 110, 110))


def value_colour(value: float, vmin: float, vmax: float) -> QColor:
    """Light (low) to saturated blue (high); NaN is grey."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return QColor(225, 225, 225)
    t = 0.0 if vmax <= vmin else min(1.0, max(0.0, (value - vmin) / (vmax - vmin)))
    lo, hi = (247, 251, 255), (33, 113, 181)
    return QColor(*(int(round(a + (b - a) * t)) for a, b in zip(lo, hi)))


def plural(n: int, word: str) -> str:
    """'1 token', '2 tokens' (word's plural by adding s)."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _visible(s: str) -> str:
    """Show whitespace so chips of spaces and newlines are not invisible."""
    return s.replace("\n", "\u21b5").replace("\t", "\u2192").replace(" ", "\u00b7") or "\u2205"


class _StripCanvas(QWidget):
    clicked = Signal(int)

    PAD_X, PAD_Y, GAP, LINE_GAP = 4, 2, 3, 4

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.strings: list[str] = []
        self.ids: list[int] = []
        self.values: list[float] | None = None
        self.vmin, self.vmax = 0.0, 1.0
        self.selected: int | None = None
        self.show_ids = True
        self._rects: list[QRect] = []
        self._rects_width = -1  # the width _rects are laid out at for the chips measured (-1: none)
        self._heights: dict[int, int] = {}  # the chips' height at each width asked, for the chips measured
        self._sizes: list[QSize] = []
        self._sizes_for: tuple | None = None  # what _sizes were measured for (_chip_sizes)
        self._relayout_on_show = False  # chips set while hidden (relayout)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        f = QFont(self.font())
        f.setStyleHint(QFont.StyleHint.Monospace)
        self._id_font = QFont(f)
        self._id_font.setPointSizeF(max(6.0, f.pointSizeF() * 0.7))

    # -- layout ----------------------------------------------------------------------------
    def _chip_size(self, i: int, fm: QFontMetrics, fm_id: QFontMetrics) -> QSize:
        w = fm.horizontalAdvance(_visible(self.strings[i]))
        h = fm.height()
        if self.show_ids:
            w = max(w, fm_id.horizontalAdvance(str(self.ids[i])))
            h += fm_id.height()
        return QSize(w + 2 * self.PAD_X, h + 2 * self.PAD_Y)

    def _chip_sizes(self) -> list[QSize]:
        """Each chip's size, measured once for the tokens and fonts on show: the same tokens set again (the
        Attention panel's, as its trace arrives and once it is whole) are not measured again."""
        key = (self.strings, self.ids, self.font().key(), self._id_font.key(), self.show_ids)
        if self._sizes_for != key:  # (lists compared by value: a copy of the same tokens is the same)
            fm, fm_id = QFontMetrics(self.font()), QFontMetrics(self._id_font)
            self._sizes = [self._chip_size(i, fm, fm_id) for i in range(len(self.strings))]
            self._sizes_for = key
            self._rects_width, self._heights = -1, {}
        return self._sizes

    def _wrap(self, width: int) -> tuple[list[tuple[int, int]], int]:
        """The chips wrapped like text at `width`: each one's top-left corner, and the height of them all."""
        x = y = line_h = 0
        corners = []
        for s in self._sizes:
            if x > 0 and x + s.width() > width:
                x, y = 0, y + line_h + self.LINE_GAP
                line_h = 0
            corners.append((x, y))
            x += s.width() + self.GAP
            line_h = max(line_h, s.height())
        return corners, y + line_h

    def _laid_out(self) -> list[QRect]:
        """The chips' rectangles at the canvas's width: laid out once per change of the chips or the width.
        (The layout is asked at every width the scroll area tries and at every paint: ~51 times while a
        1,024-token first look settled when each ask laid every chip out, 0.1-0.2 s of the UI thread.)"""
        sizes, width = self._chip_sizes(), max(self.width(), 40)
        if self._rects_width != width:
            corners, self._heights[width] = self._wrap(width)
            self._rects = [QRect(x, y, s.width(), s.height()) for (x, y), s in zip(corners, sizes)]
            self._rects_width = width
        return self._rects

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        if self._relayout_on_show:  # hidden, its chips not measured yet (a grab of the window asks it too)
            return self.minimumHeight()
        width = max(width, 40)
        if width == max(self.width(), 40):
            self._laid_out()  # the width on show: laid out once, for this and the paint
        else:
            self._chip_sizes()
        if width not in self._heights:
            if len(self._heights) > 64:  # a window dragged through many widths
                self._heights = {}
            self._heights[width] = self._wrap(width)[1]
        return self._heights[width] + 2

    def sizeHint(self) -> QSize:
        return QSize(400, max(24, self.heightForWidth(self.width() or 400)))

    def relayout(self) -> None:
        """The chips (or their font) changed: the canvas as tall as they are at its width, repainted (laid
        out at the paint). A hidden strip (a panel not on show) waits until it is shown."""
        self._relayout_on_show = not self.isVisible()
        if self._relayout_on_show:
            return
        self.setMinimumHeight(self.heightForWidth(self.width()))
        self.updateGeometry()
        self.update()

    def showEvent(self, event) -> None:
        if self._relayout_on_show:
            self.relayout()
        super().showEvent(event)

    def resizeEvent(self, event) -> None:
        if event.size().width() != event.oldSize().width():
            self.relayout()
        super().resizeEvent(event)

    # -- painting --------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = QFontMetrics(self.font())
        exposed = event.rect()
        for i, r in enumerate(self._laid_out()):
            if not r.intersects(exposed):
                continue
            v = None if self.values is None else self.values[i]
            bg = value_colour(v, self.vmin, self.vmax) if self.values is not None else QColor(240, 240, 240)
            p.setBrush(bg)
            sel = i == self.selected
            p.setPen(QPen(QColor(220, 60, 20), 2) if sel else QPen(QColor(180, 180, 180), 1))
            p.drawRoundedRect(QRectF(r).adjusted(0.5, 0.5, -0.5, -0.5), 3, 3)
            p.setPen(text_colour_on(bg))
            p.setFont(self.font())
            p.drawText(QRect(r.x(), r.y() + self.PAD_Y, r.width(), fm.height()),
                       Qt.AlignmentFlag.AlignHCenter, _visible(self.strings[i]))
            if self.show_ids:
                p.setFont(self._id_font)
                p.setPen(id_colour_on(bg))
                p.drawText(QRect(r.x(), r.y() + self.PAD_Y + fm.height(), r.width(), r.height() - fm.height()),
                           Qt.AlignmentFlag.AlignHCenter, str(self.ids[i]))
        p.end()

    # -- interaction -----------------------------------------------------------------------
    def index_at(self, pos: QPoint) -> int | None:
        for i, r in enumerate(self._laid_out()):
            if r.contains(pos):
                return i
        return None

    def chip_rect(self, index: int) -> QRect:
        return self._laid_out()[index]

    def mousePressEvent(self, event) -> None:
        i = self.index_at(event.position().toPoint())
        if i is not None:
            self.clicked.emit(i)
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:
        i = self.index_at(event.position().toPoint())
        if i is not None:
            tip = f"#{i}  id {self.ids[i]}  {self.strings[i]!r}"
            if self.values is not None and self.values[i] is not None:
                tip += f"  value {self.values[i]:.4g}"
            QToolTip.showText(event.globalPosition().toPoint(), tip, self)
        super().mouseMoveEvent(event)


class TokenStrip(QWidget):
    """Scrollable strip of token chips; emits token_selected(index) when one is clicked."""

    token_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None, show_ids: bool = True) -> None:
        super().__init__(parent)
        self._canvas = _StripCanvas()
        self._canvas.show_ids = show_ids
        self._canvas.clicked.connect(self._on_clicked)
        self._scroll = QScrollArea()
        self._scroll.setWidgetResizable(True)
        self._scroll.setWidget(self._canvas)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self._scroll)

    def set_tokens(self, strings: Sequence[str], ids: Sequence[int], values: Sequence[float] | None = None,
                   vmin: float | None = None, vmax: float | None = None) -> None:
        """Show tokens; `values` (same length) colour the chips, scaled to [vmin, vmax]
        (default: 0..1 when all values lie there, e.g. probabilities, else their min..max)."""
        strings, ids = list(strings), [int(i) for i in ids]
        if len(strings) != len(ids):
            raise ValueError(f"token strip: {len(strings)} strings but {len(ids)} ids")
        c = self._canvas
        c.strings, c.ids = strings, ids
        if values is not None:
            values = [float("nan") if v is None else float(v) for v in values]
            if len(values) != len(ids):
                raise ValueError(f"token strip: {len(values)} values for {len(ids)} tokens")
            finite = [v for v in values if not math.isnan(v)]
            lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
            if lo >= 0.0 and hi <= 1.0:
                lo, hi = 0.0, 1.0
            c.vmin = lo if vmin is None else vmin
            c.vmax = hi if vmax is None else vmax
        c.values = values
        if c.selected is not None and c.selected >= len(ids):
            c.selected = None
        c.relayout()

    def set_selected(self, index: int | None) -> None:
        """Highlight a chip without emitting token_selected (programmatic selection)."""
        c = self._canvas
        c.selected = index if index is not None and 0 <= index < len(c.ids) else None
        if c.selected is not None:
            self._scroll.ensureVisible(c.chip_rect(c.selected).center().x(), c.chip_rect(c.selected).center().y())
        c.update()

    @property
    def selected_index(self) -> int | None:
        return self._canvas.selected

    def count(self) -> int:
        return len(self._canvas.ids)

    def chip_center(self, index: int) -> QPoint:
        """Centre of a chip in the canvas' coordinates (for tests and tooltips)."""
        return self._canvas.chip_rect(index).center()

    @property
    def canvas(self) -> QWidget:
        return self._canvas

    def _on_clicked(self, index: int) -> None:
        self.set_selected(index)
        self.token_selected.emit(index)

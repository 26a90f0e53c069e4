"""ProbBars: the top candidates of a next-token distribution as horizontal bars; click to pick one.

    bars.set_distribution(token_ids, labels, probs, model_probs=None, chosen=None)
    bars.clear(title)                   # no bars: no axes either, the title says what to do
    bars.token_clicked -> Signal(int)   # the token id of the clicked bar

Filled bars are the processed probabilities (after temperature / top-k / top-p); the outlined bars
behind them are the model's own probabilities, so a slider drag shows how the processing reshapes
the distribution. The chosen token's bar is orange. One BarGraphItem per series (no widget per bar).
Each bar's value is written after it, or inside its end where the plot's right edge would cut it.
A click picks a bar; a double click is one gesture and picks it once (its second press is ignored).
"""
from __future__ import annotations

from typing import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QPointF, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QVBoxLayout, QWidget

from .empty_plot import show_empty
from .readable import format_prob, text_colour_on

BAR_BRUSH = (66, 133, 244)
CHOSEN_BRUSH = (240, 120, 20)
FILTERED_BRUSH = (200, 200, 200)


class ProbBars(QWidget):
    token_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot = pg.PlotWidget(background="w", enableMenu=False)  # (made without: ~5-8 ms a plot)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        item = self.plot.getPlotItem()
        item.invertY(True)
        item.setLabel("bottom", "probability")
        item.getAxis("bottom").enableAutoSIPrefix(False)
        item.showGrid(x=True, y=False, alpha=0.3)
        self._model_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.8, brush=None,
                                           pen=pg.mkPen((90, 90, 90), width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        self._bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.6, brushes=[], pen=None)
        item.addItem(self._model_bars)
        item.addItem(self._bars)
        self._value_texts: list[pg.TextItem] = []
        self.token_ids: list[int] = []
        self.probs: list[float] = []
        self.chosen: int | None = None
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        for changed in (item.getViewBox().sigTransformChanged, item.getViewBox().sigResized):  # range, size
            changed.connect(lambda *_: self._place_values())
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)
        show_empty(item, True)  # (bare axes around no bars read as a distribution of tiny probabilities)

    def clear(self, title: str) -> None:
        """No bars; `title` (what to do for some) in place of the axes."""
        self.set_distribution([], [], [])
        show_empty(self.plot.getPlotItem(), True, title)

    def set_distribution(self, token_ids: Sequence[int], labels: Sequence[str], probs: Sequence[float],
                         model_probs: Sequence[float] | None = None, chosen: int | None = None) -> None:
        """Bars from the top down in the given order (most probable first)."""
        self.token_ids = [int(t) for t in token_ids]
        self.probs = [float(p) for p in probs]
        self.chosen = chosen
        n = len(self.token_ids)
        ys = list(range(n))
        brushes = [pg.mkBrush(CHOSEN_BRUSH if t == chosen else (BAR_BRUSH if p > 0 else FILTERED_BRUSH))
                   for t, p in zip(self.token_ids, self.probs)]
        self._bars.setOpts(x0=[0.0] * n, y=ys, width=self.probs, brushes=brushes, height=0.6)
        if model_probs is not None:
            self._model_bars.setOpts(x0=[0.0] * n, y=ys, width=[float(p) for p in model_probs], height=0.8)
        else:
            self._model_bars.setOpts(x0=[], y=[], width=[])
        # a label that is the id itself (a model with no tokenizer) is not repeated as "12  (12)"
        ticks = [(i, str(t) if lab == str(t) else f"{lab}  ({t})") for i, (lab, t) in enumerate(zip(labels, self.token_ids))]
        item = self.plot.getPlotItem()
        if n:
            show_empty(item, False)
            item.setTitle(None)  # (the empty plot's)
        else:
            show_empty(item, True, "")
        item.getAxis("left").setTicks([ticks])
        for t in self._value_texts:
            item.removeItem(t)
        self._value_texts = []
        for i, p in enumerate(self.probs):
            txt = pg.TextItem(format_prob(p) if p > 0 else "cut", color=(40, 40, 40) if p > 0 else (150, 150, 150),
                              anchor=(0, 0.5))
            txt.setPos(p, i)
            item.addItem(txt)
            self._value_texts.append(txt)
        top = max(self.probs + [float(p) for p in (model_probs or [])] + [1e-3])
        item.setXRange(0, min(1.0, top * 1.25), padding=0)
        item.setYRange(-0.6, max(n, 1) - 0.4, padding=0)
        self._place_values()

    def _place_values(self) -> None:
        """A value that would cross the plot's right edge goes inside its bar's end, in white; the
        others stay after their bar. Run whenever the view's size or range changes."""
        vb = self.plot.getPlotItem().getViewBox()
        right = vb.sceneBoundingRect().right()
        for txt, p, t in zip(self._value_texts, self.probs, self.token_ids):
            if p <= 0:
                continue
            end = vb.mapViewToScene(QPointF(p, 0)).x()
            inside = end + txt.textItem.boundingRect().width() > right
            txt.setAnchor((1, 0.5) if inside else (0, 0.5))
            bar = QColor(*(CHOSEN_BRUSH if t == self.chosen else BAR_BRUSH))
            txt.setColor(text_colour_on(bar) if inside else QColor(40, 40, 40))
            txt.updateTransform(force=True)  # the anchor's offset in pixels of the view as it is now

    def bar_scene_pos(self, index: int) -> QPointF:
        """Scene position of the middle of a bar (for tests and tooltips)."""
        vb = self.plot.getPlotItem().getViewBox()
        x = max(self.probs[index] / 2, 1e-4)
        return vb.mapViewToScene(QPointF(x, index))

    def index_at_scene(self, pos: QPointF) -> int | None:
        vb = self.plot.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(pos):
            return None
        y = vb.mapSceneToView(pos).y()
        i = int(round(y))
        return i if 0 <= i < len(self.token_ids) and abs(y - i) <= 0.45 else None

    def _on_click(self, event) -> None:
        if event.double():  # the first click of this double click has picked the bar already
            return
        i = self.index_at_scene(event.scenePos())
        if i is not None:
            self.token_clicked.emit(self.token_ids[i])

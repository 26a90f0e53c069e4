"""The bar chart of a logit's direct attribution: one bar per component (positive blue, negative vermillion),
its name under it. The What if panel's (heads, MLPs, embedding) and the Features panel's (active features,
bias, skip, error) are this one widget; each panel says what its result's bars are (`bars_of`)."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Signal
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QToolTip

from ..settings import plot_background, plot_foreground
from .empty_plot import show_empty
from .heatmap import LabelAxis

POSITIVE, NEGATIVE = "#0072B2", "#D55E00"  # Okabe-Ito blue / vermillion: raise / lower the logit


@dataclass
class Bars:
    """What a result draws: its bars' names and heights, and what the export bar saves of it."""
    labels: list[str]
    values: list[float]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # the NPZ
    header: list[str] = field(default_factory=list)  # the CSV
    rows: list[list] = field(default_factory=list)
    always_labelled: tuple[int, ...] = ()  # bars whose names are never left out (the Features panel's bias, error)
    # one per always_labelled bar: its layer (-1: none), whose bars are left unnamed together, every k-th layer's
    # named, when all would need more lines than a layer has named bars and one (widgets.heatmap.LabelAxis)
    always_groups: tuple[int, ...] = ()


class AttributionBars(pg.PlotWidget):
    """set_attribution(result, title) draws bars_of(result); ExportBar's view of what is drawn.
    The labels are thinned to the chart's width and elided, as a heatmap's axis does (the named bars only a
    layer at a time: Bars.always_labelled, always_groups); the hover names the bar under the mouse and its value, labelled or not."""
    drawn = Signal()  # set_attribution or clear_chart changed what is on show (an ExportBar refreshes on it)

    def __init__(self, bars_of: Callable[[object], Bars], empty: str, parent=None) -> None:
        super().__init__(parent, background=plot_background(),
                         axisItems={"bottom": LabelAxis("bottom", tokens=False, any_step=True)},
                         enableMenu=False)  # (made without a menu: ~5-8 ms a plot)
        self.bars_of, self.empty = bars_of, empty
        self.plot_item = self.getPlotItem()
        self.plot_item.hideButtons()
        self.plot_item.showGrid(y=True, alpha=0.3)
        self.plot_item.setLabel("left", "direct contribution to the logit", color=plot_foreground())
        self.attribution = None
        self.bars = Bars([], [])
        self.hover_text = ""
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)
        # before any attribution, what to do (bare 0-1 axes around nothing looked like a chart of zeros)
        self.clear_chart(empty[:1].upper() + empty[1:])

    def bar_at(self, scene_pos: QPointF) -> int | None:
        """The index of the bar under a scene position (None: between bars, or off the plot)."""
        vb = self.plot_item.getViewBox()
        if not self.bars.values or not vb.sceneBoundingRect().contains(scene_pos):
            return None
        x = vb.mapSceneToView(scene_pos).x()
        i = math.floor(x)
        return i if 0 <= i < len(self.bars.values) and abs(x - i - 0.5) <= 0.4 else None  # (bars 0.8 wide)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        i = self.bar_at(scene_pos)
        text = "" if i is None else f"{self.bars.labels[i]}: {self.bars.values[i]:+.4g}"
        if text == self.hover_text:
            return
        self.hover_text = text
        self.setToolTip(text)
        if text:
            QToolTip.showText(QCursor.pos(), text, self)
        else:
            QToolTip.hideText()

    @property
    def labels(self) -> list[str]:
        return self.bars.labels

    @property
    def values(self) -> list[float]:
        return self.bars.values

    def set_attribution(self, attribution, title: str) -> None:
        self.attribution, self.bars = attribution, self.bars_of(attribution)
        values = self.bars.values
        self.plot_item.clear()
        show_empty(self.plot_item, False)  # the axes again (clear_chart hid them)
        x = np.arange(len(values)) + 0.5  # bar i's centre, where the axis writes label i
        brushes = [pg.mkBrush(POSITIVE if v >= 0 else NEGATIVE) for v in values]
        self.plot_item.addItem(pg.BarGraphItem(x=x, height=values, width=0.8, brushes=brushes, pen=None))
        self.plot_item.getAxis("bottom").set_labels(self.bars.labels, always=self.bars.always_labelled,
                                                      groups=self.bars.always_groups)
        # the title is rich text: a token such as <|endoftext|>, <pad> or <s> is escaped to be shown
        self.plot_item.setTitle(html.escape(title, quote=False), color=plot_foreground())
        self.plot_item.autoRange()
        self.plot_item.getViewBox().setLimits(xMin=-0.5, xMax=len(values) + 0.5)
        self.drawn.emit()

    def clear_chart(self, message: str = "") -> None:
        """No bars, and no axis of the last ones: their labels and range (another model's) go."""
        self.attribution, self.bars = None, Bars([], [])
        self.plot_item.clear()
        self.plot_item.getAxis("bottom").set_labels([])
        self.plot_item.getViewBox().setLimits(xMin=None, xMax=None)
        self.plot_item.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        show_empty(self.plot_item, True, html.escape(message, quote=False))  # no axes, no numbers: the message
        self.drawn.emit()

    # export (ExportBar's view protocol)
    def export_widget(self):
        return self

    def svg_item(self):
        return self.plot_item

    def export_unavailable(self) -> str | None:
        return None if self.attribution is not None else self.empty

    def export_arrays(self) -> dict[str, np.ndarray]:
        return dict(self.bars.arrays)

    def csv_table(self):
        return (list(self.bars.header), [list(r) for r in self.bars.rows]) if self.attribution is not None else None

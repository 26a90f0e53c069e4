"""The Train panel's live plots: loss, accuracy, learning rate and each layer's gradient norm, by step,
drawn from the run's events as they arrive (add), emptied for a new run (clear). An encoder-decoder run also
draws its held-out exact match (beside the accuracies) and, under the plots, the cross-attention of a held-out
sentence (widgets.live_cross_attention), both from its evaluations.
"""
from __future__ import annotations

import math
from typing import Callable, Hashable

import pyqtgraph as pg
from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QGridLayout, QWidget

from ..widgets.empty_plot import show_empty
from ..widgets.legend_place import keep_legend_clear
from ..widgets.live_cross_attention import LiveCrossAttention

LAYER_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


class SpacedAxis(pg.AxisItem):
    """An axis whose tick labels never overlap: over a decade or two, a log axis labels 0.05, 0.06, 0.07...
    on top of each other. Labels are placed powers of ten first; one that would touch a placed one is left
    out (its tick stays)."""

    def generateDrawSpecs(self, p):  # noqa: N802 - pyqtgraph name
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs

        def decade(spec) -> bool:
            try:
                return float(math.log10(float(spec[2]))).is_integer()
            except ValueError:  # "10⁻⁶" and the like are decades too
                return "10" in spec[2]

        kept: list = []
        for spec in sorted(texts, key=lambda t: not decade(t)):  # stable: pyqtgraph's order otherwise
            rect = spec[0].adjusted(-1, -1, 1, 1)
            if not any(rect.intersects(k[0]) for k in kept):
                kept.append(spec)
        return axis, ticks, kept


LEGEND_STYLE = {"brush": (255, 255, 255, 215), "labelTextColor": "#222"}  # readable over the curves


class RedrawSoon:
    """A run's curves redrawn at most every REDRAW_MS, not at each event: a run logs every 10 steps and each
    redraw sets a whole series, so on one core a fast run's events outpaced the UI thread, which then did
    nothing else (test_training_dictionary's waitUntil never came back to see its timeout). changed(key) notes
    a curve whose series grew; the owner's draw(keys) sets those within REDRAW_MS, or at now()."""

    REDRAW_MS = 100

    def __init__(self, owner: QObject, draw: Callable[[set], None]) -> None:
        self._draw = draw
        self._keys: set = set()
        self._timer = QTimer(owner, singleShot=True, interval=self.REDRAW_MS)
        self._timer.timeout.connect(self.now)

    def changed(self, key: Hashable) -> None:
        self._keys.add(key)
        if not self._timer.isActive():
            self._timer.start()

    def now(self) -> None:
        """Set the curves that changed since the last draw (an export calls it too: nothing is left out)."""
        self._timer.stop()
        keys, self._keys = self._keys, set()
        if keys:
            self._draw(keys)

    def forget(self) -> None:
        """The curves were emptied (a new run): nothing of the last one is left to draw."""
        self._timer.stop()
        self._keys = set()


def step_plot(title: str, ylabel: str, left: pg.AxisItem | None = None) -> pg.PlotWidget:
    """One of a run's plots (the model's and the dictionary's): `ylabel` against the training step."""
    w = pg.PlotWidget(background="w", axisItems={"left": left} if left is not None else None)
    w.setTitle(title, color="#222")
    w.setLabel("bottom", "step")
    w.setLabel("left", ylabel)
    w.showGrid(x=True, y=True, alpha=0.3)
    w.setMinimumHeight(160)
    return w


class TrainingPlots(QWidget):
    """The four plots in a grid (what PNG and SVG exports draw)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        self.loss_plot = step_plot("Loss", "cross-entropy")
        self.acc_plot = step_plot("Accuracy", "accuracy")
        self.lr_plot = step_plot("Learning rate", "lr")
        self.grad_plot = step_plot("Gradient norm per layer", "||g||", left=SpacedAxis("left"))
        self.grad_plot.setLogMode(y=True)
        self.grad_plot.getAxis("left").enableAutoSIPrefix(False)  # in log mode it labels 0.5 as "5·10²"
        self.loss_plot.addLegend(offset=(-10, 10), **LEGEND_STYLE)
        self.grad_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)
        self.acc_plot.addLegend(offset=(-10, -10), **LEGEND_STYLE)
        self.train_curve = self.loss_plot.plot(pen=pg.mkPen("#0072B2", width=2), name="train")
        self.val_curve = self.loss_plot.plot(pen=pg.mkPen("#D55E00", width=2), symbol="o", symbolSize=6,
                                             symbolBrush="#D55E00", name="validation")
        self.train_acc_curve = self.acc_plot.plot(pen=pg.mkPen("#0072B2", width=2), symbol="t", symbolSize=6,
                                                  symbolBrush="#0072B2", name="train")
        self.acc_curve = self.acc_plot.plot(pen=pg.mkPen("#009E73", width=2), symbol="o", symbolSize=6,
                                            symbolBrush="#009E73", name="validation")
        self.acc_plot.setYRange(0, 1)
        self.lr_curve = self.lr_plot.plot(pen=pg.mkPen("#CC79A7", width=2))
        self.exact_curve: pg.PlotDataItem | None = None  # an encoder-decoder's held-out exact match (first eval)
        self.cross_attention = LiveCrossAttention()  # shown from an encoder-decoder run's first evaluation
        self.grad_curves: dict[str, pg.PlotDataItem] = {}
        # a mixture of experts' router balance at each evaluation (the trainer's expert_load): per layer, the most
        # loaded expert's share of the routing choices x the number of experts (1: even; E: one expert takes all)
        self.load_plot = step_plot("Router load balance (most loaded expert's share \u00d7 experts)", "max load \u00d7 E")
        self.load_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)
        self.load_curves: list[pg.PlotDataItem] = []
        grid.addWidget(self.loss_plot, 0, 0)
        grid.addWidget(self.acc_plot, 0, 1)
        grid.addWidget(self.lr_plot, 1, 0)
        grid.addWidget(self.grad_plot, 1, 1)
        grid.addWidget(self.cross_attention, 2, 0, 1, 2)
        grid.addWidget(self.load_plot, 3, 0, 1, 2)
        grid.setRowStretch(0, 1)
        grid.setRowStretch(1, 1)
        grid.setRowStretch(2, 1)
        self._redraw = RedrawSoon(self, self._set_curves)  # (at each step event the UI thread did nothing else)
        self.clear()
        for plot in (self.loss_plot, self.acc_plot, self.grad_plot, self.load_plot):
            keep_legend_clear(plot)  # in the corner the curves leave free (one layer's norms were under it)

    def clear(self) -> None:
        """Empty the plots for a new run (the panel does it at the run's first event, so a run that cannot
        start keeps the previous run's curves on screen)."""
        self._series = {"train": ([], []), "val": ([], []), "acc": ([], []), "train_acc": ([], []), "lr": ([], []),
                        "exact": ([], [])}
        if self.exact_curve is not None:
            self.acc_plot.removeItem(self.exact_curve)  # and from the legend
            self.exact_curve = None
        self.cross_attention.clear()
        self.cross_attention.hide()
        self.load_series: list[tuple[list, list]] = []  # per layer: (steps, max load x E)
        for curve in self.load_curves:
            self.load_plot.removeItem(curve)
        self.load_curves = []
        self.load_plot.hide()
        self._redraw.forget()
        self.grad_series: dict[str, tuple[list, list]] = {}  # layer -> (steps, norms), in the order first seen
        for curve in (self.train_curve, self.val_curve, self.acc_curve, self.train_acc_curve, self.lr_curve):
            curve.setData([], [])
        for curve in self.grad_curves.values():
            self.grad_plot.removeItem(curve)
        self.grad_curves.clear()
        self.grad_plot.clear()
        self.grad_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)
        for plot in (self.loss_plot, self.acc_plot, self.lr_plot, self.grad_plot):
            show_empty(plot.getPlotItem(), True)  # its title only, until the run's points (bare 0-1 axes before)

    def add(self, ev: dict) -> None:
        """Draw a "step", "eval" or "cross_attention" event of the run (other events draw nothing): a step's
        points within REDRAW_MS (RedrawSoon), an evaluation's at once with the steps before it."""
        kind = ev["event"]
        if kind == "step":
            s = ev["step"]
            self._append("train", s, ev["train_loss"])
            self._append("lr", s, ev["lr"])
            for i, (layer, value) in enumerate(ev.get("grad_norms", {}).items()):
                xs, ys = self.grad_series.setdefault(layer, ([], []))
                xs.append(s)
                ys.append(max(value, 1e-12))
                if layer not in self.grad_curves:  # (made at once: the legend lists the layers in the event's order)
                    colour = LAYER_COLOURS[i % len(LAYER_COLOURS)]
                    self.grad_curves[layer] = self.grad_plot.plot(pen=pg.mkPen(colour, width=1.5), name=layer)
                self._redraw.changed(("grad", layer))
        elif kind == "eval":
            self._append("val", ev["step"], ev["val_loss"])
            self._append("acc", ev["step"], ev["val_accuracy"])
            if ev.get("train_accuracy") is not None:
                self._append("train_acc", ev["step"], ev["train_accuracy"])
            if ev.get("expert_load") is not None:  # a mixture of experts: its router balance
                self._add_load(ev["step"], ev["expert_load"])
            if ev.get("val_exact_match") is not None:  # an encoder-decoder's: whole held-out targets right
                if self.exact_curve is None:
                    self.exact_curve = self.acc_plot.plot(pen=pg.mkPen("#D55E00", width=2), symbol="s", symbolSize=6,
                                                          symbolBrush="#D55E00", name="held-out exact match")
                self._append("exact", ev["step"], ev["val_exact_match"])
            self.draw()  # (one every eval_every steps)
        elif kind == "cross_attention":
            self.cross_attention.show()
            self.cross_attention.set_event(ev)

    def draw(self) -> None:
        """Every point added so far on the plots now (an export, an evaluation, the run's end)."""
        self._redraw.now()

    def _set_curves(self, keys: set) -> None:
        curves = {"train": self.train_curve, "val": self.val_curve, "acc": self.acc_curve,
                  "train_acc": self.train_acc_curve, "lr": self.lr_curve, "exact": self.exact_curve}
        plots = {"train": self.loss_plot, "val": self.loss_plot, "acc": self.acc_plot, "train_acc": self.acc_plot,
                 "exact": self.acc_plot, "lr": self.lr_plot}
        for key in keys:
            if key in plots or key[0] == "grad":
                show_empty((plots.get(key) or self.grad_plot).getPlotItem(), False)
            if key in curves:
                curves[key].setData(*self._series[key])
            elif key[0] == "grad":
                self.grad_curves[key[1]].setData(*self.grad_series[key[1]])
            else:  # ("load", layer)
                self.load_curves[key[1]].setData(*self.load_series[key[1]])

    def _add_load(self, step: int, load: list[list[float]]) -> None:
        self.load_plot.show()
        for layer, shares in enumerate(load):
            if layer == len(self.load_series):
                self.load_series.append(([], []))
                colour = LAYER_COLOURS[layer % len(LAYER_COLOURS)]
                self.load_curves.append(self.load_plot.plot(pen=pg.mkPen(colour, width=2), symbol="o", symbolSize=5,
                                                            symbolBrush=colour, name=f"L{layer}"))
            xs, ys = self.load_series[layer]
            xs.append(step)
            ys.append(max(shares) * len(shares))
            self._redraw.changed(("load", layer))

    def _append(self, key: str, x, y) -> None:
        xs, ys = self._series[key]
        xs.append(x)
        ys.append(y)
        self._redraw.changed(key)

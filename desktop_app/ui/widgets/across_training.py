"""Across training: a run's metrics against step, in a window of its own (issue 30; the timeline bar's
"Across training…" button opens it).

Four plots of the per-head metrics (core.analysis.HEAD_SCORES: induction, previous-token, entropy, distance),
a line per head, and below them one per-layer metric chosen in the "Per layer" box (app.timeline.LAYER_METRICS:
weight norms, the local Lipschitz constant of each layer's attention, the logit lens of the next token as a
probability or a rank, the gradient norms the trainer logged), a line per layer. Everything is computed by
app.timeline.scrub_metrics in workers: the head metrics once, each per-layer metric when first chosen (then
kept). Export bar: PNG / SVG of the plots, CSV rows (metric, step, layer, head, value; head -1 for the
per-layer metric shown), NPZ.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QComboBox, QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from ...app.timeline import (GRAD_NORM, LIPSCHITZ, LIPSCHITZ_SEQUENCES, LOGIT_LENS, LOGIT_LENS_RANK, WEIGHT_NORM,
                             scrub_metrics)
from ...core.analysis import HEAD_SCORES
from ..workers import run_job
from .export import ExportBar

HEAD_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
LINE_STYLES = [Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine]
# the per-layer plot's legend at the top left (where curves that rise in training are not yet), over a light veil
LEGEND = dict(offset=(60, 8), brush=(255, 255, 255, 210), labelTextColor="#222")

# the "Per layer" box: metric -> (its entry, the plot's title)
LAYER_CHOICES = {
    WEIGHT_NORM: ("Weight norms", "Weight norm of each block (Frobenius)"),
    LIPSCHITZ: ("Lipschitz constant", f"Local Lipschitz constant of each layer's attention "
                                      f"(mean over {LIPSCHITZ_SEQUENCES} repeated sequences)"),
    LOGIT_LENS: ("Logit lens: probability", "Logit lens: probability of the correct next token in the repeats"),
    LOGIT_LENS_RANK: ("Logit lens: rank", "Logit lens: rank of the correct next token in the repeats (0 = top)"),
    GRAD_NORM: ("Gradient norms", "Gradient norm of each block (the steps the trainer logged)"),
}


def _pen(colour_index: int, style_index: int):
    return pg.mkPen(HEAD_COLOURS[colour_index % len(HEAD_COLOURS)], width=1.5,
                    style=LINE_STYLES[style_index % len(LINE_STYLES)])


def _layer_names(sc) -> list[str]:
    """L0, L1 ...; an encoder-decoder's enc L0 ... dec L0 (its two stacks' layers)."""
    if sc.stacks is None:
        return [f"L{layer}" for layer in sc.layer_ids]
    return [f"{stack[:3]} L{layer}" for stack, layer in zip(sc.stacks, sc.layer_ids)]


class AcrossTraining(QWidget):
    """A window: one small plot per head metric against step, a line per head (colour: head; solid for
    layer 0, then dashed, dotted...), and the chosen per-layer metric against step, a line per layer."""
    drawn = Signal()  # what its exports would write changed (its ExportBar follows this)

    METRICS = tuple(HEAD_SCORES)

    def __init__(self, run_dir, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run_dir = run_dir
        self.results: dict | None = None  # head metric -> Scrub
        self.layer_results: dict = {}  # per-layer metric -> Scrub, as each is measured
        self.layer_failed: dict[str, str] = {}  # per-layer metric -> why it could not be measured
        self.layer_job = None
        self.setWindowTitle(f"Across training: {run_dir}")
        screen = QGuiApplication.primaryScreen()
        room = screen.availableGeometry().height() - 60 if screen is not None else 820
        self.resize(900, max(400, min(820, room)))  # never taller than the screen
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.close)
        v = QVBoxLayout(self)
        top = QHBoxLayout()
        self.status = QLabel("Measuring every kept step…")
        self.status.setWordWrap(True)
        top.addWidget(self.status, 1)
        top.addWidget(QLabel("Per layer:"))
        self.layer_metric = QComboBox()
        for metric, (entry, _) in LAYER_CHOICES.items():
            self.layer_metric.addItem(entry, metric)
        self.layer_metric.setToolTip("The per-layer metric plotted under the head metrics, a line per layer")
        self.layer_metric.currentIndexChanged.connect(self._layer_metric_chosen)
        top.addWidget(self.layer_metric)
        self.export_bar = ExportBar(lambda: self, lambda: f"across-training-{self.run_dir.name}")
        top.addWidget(self.export_bar)
        v.addLayout(top)
        self.plots_widget = QWidget()
        grid = QGridLayout(self.plots_widget)
        grid.setContentsMargins(0, 0, 0, 0)
        self.plots: dict[str, pg.PlotWidget] = {}
        for i, metric in enumerate(self.METRICS):
            self.plots[metric] = self._plot(HEAD_SCORES[metric][0])
            grid.addWidget(self.plots[metric], i // 2, i % 2)
        self.plots[self.METRICS[0]].addLegend(**(LEGEND | {"offset": (-10, 60)}), colCount=2)  # right, mid-height:
        # between an induction head's score, near 1 once formed, and the others' near 0
        self.layer_plot = self._plot("")
        self.layer_plot.addLegend(**LEGEND, colCount=4)
        grid.addWidget(self.layer_plot, (len(self.METRICS) + 1) // 2, 0, 1, 2)
        v.addWidget(self.plots_widget, 1)
        self.job = None
        self._measure()

    def _measure(self) -> None:
        """Start what is not measured yet (again after a close stopped it): the head metrics, the per-layer one."""
        if self.results is None and self.job is None:
            self.status.setText("Measuring every kept step…")
            self.job = run_job(scrub_metrics, self.run_dir, self.METRICS, on_result=self._show,
                               on_error=self._failed, owner=self,
                               on_progress=lambda done, total, message: self.status.setText(
                                   f"Measuring every kept step… {done}/{total} ({message})"))
        if self.layer_job is None:
            self._layer_metric_chosen()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt name
        super().showEvent(event)
        self._measure()  # a window closed while it measured stopped its workers: shown again, they start again

    @staticmethod
    def _plot(title: str) -> pg.PlotWidget:
        w = pg.PlotWidget(background="w")
        w.setTitle(title, color="#222")
        w.setLabel("bottom", "step")
        w.showGrid(x=True, y=True, alpha=0.3)
        return w

    @property
    def chosen_layer_metric(self) -> str:
        return self.layer_metric.currentData()

    # -- the head metrics --------------------------------------------------------------------------
    def _show(self, results: dict) -> None:
        if self.results is not None:  # a job stopped by a close that still finished, after the one started since
            return
        self.results = results
        for metric, sc in results.items():
            plot = self.plots[metric]
            for layer, label in enumerate(_layer_names(sc)):
                for head in range(sc.values.shape[2]):
                    plot.plot(sc.steps, sc.values[:, layer, head], pen=_pen(head, layer), symbol="o", symbolSize=4,
                              symbolBrush=HEAD_COLOURS[head % len(HEAD_COLOURS)],
                              name=f"{label}H{head}" if metric == self.METRICS[0] else None)
        first = next(iter(results.values()))
        self.plots[self.METRICS[0]].getPlotItem().legend.setColumnCount(first.values.shape[2])  # a row per layer
        deleted = first.timeline.missing()
        self.status.setText(f"{len(first.steps)} kept steps of {self.run_dir}, each measured on {first.sequences} "
                            "sequences repeating a random half"
                            + (f"; deleted: {', '.join(str(k.step) for k in deleted)}" if deleted else ""))
        self.drawn.emit()

    def _failed(self, exc: BaseException, tb: str) -> None:
        self.job = None  # shown again, the window tries again
        self.status.setText(f"Could not measure {self.run_dir}: {exc}")

    # -- the per-layer metric ----------------------------------------------------------------------
    def _layer_metric_chosen(self, *_) -> None:
        """Draw the chosen per-layer metric: at once when it was measured, else once a worker has."""
        metric = self.chosen_layer_metric
        if self.layer_job is not None:
            self.layer_job.cancel()
            self.layer_job = None
        self._draw_layer_metric()
        if metric in self.layer_results or metric in self.layer_failed:
            return
        self.layer_job = run_job(scrub_metrics, self.run_dir, (metric,), owner=self,
                                 on_result=lambda r, m=metric: self._layer_measured(m, r[m]),
                                 on_error=lambda exc, tb, m=metric: self._layer_measured(m, None, str(exc)),
                                 on_progress=lambda done, total, message, m=metric: self._layer_progress(
                                     m, f"{done}/{total} ({message})"),
                                 accept=lambda m=metric: self.chosen_layer_metric == m)

    def _layer_progress(self, metric: str, message: str) -> None:
        self.layer_plot.setTitle(f"{LAYER_CHOICES[metric][1]}: measuring… {message}", color="#222")

    def _layer_measured(self, metric: str, sc, error: str | None = None) -> None:
        if error is not None:
            self.layer_failed[metric] = error
        else:
            self.layer_results[metric] = sc
        self.layer_job = None
        self._draw_layer_metric()

    def _draw_layer_metric(self) -> None:
        metric = self.chosen_layer_metric
        plot = self.layer_plot
        plot.clear()  # the curves, and the legend's entries
        sc = self.layer_results.get(metric)
        title = LAYER_CHOICES[metric][1]
        if metric in self.layer_failed:
            title = f"{LAYER_CHOICES[metric][0]}: could not be measured: {self.layer_failed[metric]}"
        elif sc is None:
            title = f"{title}: measuring…"
        plot.setTitle(title, color="#222")
        if sc is not None:
            for i, label in enumerate(_layer_names(sc)):
                plot.plot(sc.steps, sc.values[:, i, 0], pen=_pen(i, 0), symbol="o", symbolSize=4,
                          symbolBrush=HEAD_COLOURS[i % len(HEAD_COLOURS)], name=f"layer {label.removeprefix('L')}")
        self.drawn.emit()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt name
        for job in (self.job, self.layer_job):
            if job is not None:
                job.cancel()
        self.job = self.layer_job = None  # shown again, the window starts them again (_measure)
        super().closeEvent(event)

    # -- export (ExportBar view protocol) --------------------------------------------------------
    def _shown(self) -> dict:
        """metric -> Scrub of everything on show: the head metrics and the per-layer metric chosen."""
        layer = self.layer_results.get(self.chosen_layer_metric)
        return {**(self.results or {}), **({self.chosen_layer_metric: layer} if layer is not None else {})}

    def export_unavailable(self) -> str | None:
        if not self.results:
            return "Nothing to export yet: the steps are still being measured."
        if self.chosen_layer_metric not in self.layer_results and self.chosen_layer_metric not in self.layer_failed:
            return f"Nothing to export yet: {LAYER_CHOICES[self.chosen_layer_metric][0].lower()} is being measured."
        return None

    def export_widget(self) -> QWidget:
        return self.plots_widget

    def csv_table(self):
        rows = [[metric, step, layer, head, value] for metric, sc in self._shown().items()
                for step, layer, head, value in sc.rows()]
        return ["metric", "step", "layer", "head", "value"], rows

    def export_arrays(self) -> dict:
        out = {}
        for metric, sc in self._shown().items():
            out[f"{metric}.steps"] = np.array(sc.steps)
            out[f"{metric}.values"] = sc.values
            if not sc.per_head:
                out[f"{metric}.layers"] = np.array(sc.layer_labels)
        return out

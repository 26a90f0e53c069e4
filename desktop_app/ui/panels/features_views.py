"""The Features panel's views: a feature's dashboard (top contexts, histogram, decoder tokens) and the
bars of a next-token logit's direct attribution to features (widgets/attribution_bars, as the What if
panel's). Widgets only: the panel computes (through AppState.run) and hands them plain results
(core.features.TopContexts, FeatureAttribution).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                               QSplitter, QStyledItemDelegate, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from .. import settings as app_settings
from ..settings import plot_background, plot_foreground
from ..widgets.axis_label import keep_bottom_label_inside
from ..widgets.attribution_bars import POSITIVE, AttributionBars, Bars
from ..widgets.empty_plot import show_empty
from ..widgets.job_progress import JobProgressBar


def visible(s: str) -> str:
    """A token or context as one line: newlines and tabs shown, not acted on."""
    return s.replace("\n", "\u21b5").replace("\t", "\u2192")


def fill_table(table: QTableWidget, header: list[str], rows: list[list], align_right: tuple[int, ...] = ()) -> None:
    """Replace a read-only table's contents (numbers as given: format them before)."""
    table.clear()
    table.setColumnCount(len(header))
    table.setHorizontalHeaderLabels(header)
    table.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            item = QTableWidgetItem(str(value))
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
            if c in align_right:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(r, c, item)


def columns_share_width_while_empty(table: QTableWidget) -> None:
    """An empty table's columns share its width (at their default widths an empty narrow table showed a scroll
    bar); a filled one's are sized as read_only_table makes them (the caller's resizeColumnsToContents)."""
    empty = table.rowCount() == 0
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch if empty else QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(not empty)  # (a stretched last section keeps its default width)


class WholeRowsTable(QTableWidget):
    """A table whose viewport ends on a whole row when it holds more rows than it shows: the part of a row it
    would cut is left blank under it (the Promotes / Suppresses tables showed their last row's upper half)."""

    _trimming = False

    def updateGeometries(self) -> None:  # noqa: N802 (Qt)
        # Our own trim resizes the viewport, which comes back here: QTableView's would set the bottom margin to 0
        # again (a loop). Its scroll range is the same for the trimmed height: as many whole rows fit in it.
        if self._trimming:
            return
        super().updateGeometries()  # (the viewport's margins for the headers, the bottom one 0)
        m = self.viewportMargins()
        height = self.viewport().height() + m.bottom()
        row = self.verticalHeader().defaultSectionSize()
        cut = height % row if self.rowCount() * row > height >= row else 0
        if cut != m.bottom():
            self._trimming = True
            try:
                self.setViewportMargins(m.left(), m.top(), m.right(), cut)
            finally:
                self._trimming = False


class LeftElideDelegate(QStyledItemDelegate):
    """Cells cut on the left ("…the end"): the text before a context's token keeps the part next to it."""

    def initStyleOption(self, option, index) -> None:
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideLeft


def read_only_table() -> QTableWidget:
    t = WholeRowsTable()
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setStretchLastSection(True)
    return t


def _plot(left: str, bottom: str) -> pg.PlotWidget:
    w = pg.PlotWidget(background=plot_background(), enableMenu=False)  # (made without: ~5-8 ms a plot)
    item = w.getPlotItem()
    item.hideButtons()
    item.showGrid(y=True, alpha=0.3)
    item.setLabel("left", left, color=plot_foreground())
    item.setLabel("bottom", bottom, color=plot_foreground())
    keep_bottom_label_inside(w)  # (a narrow pane's histogram: "activatio" without it)
    return w


class FeatureDashboard(QWidget):
    """One feature: its top-activating contexts over a text file (with progress and Cancel), its
    activation histogram there, and the tokens its decoder direction promotes and suppresses. It keeps
    the chosen text file and the one contexts job (run_contexts), for the Features panel and the Graph
    panel's node alike."""
    drawn = Signal()  # its top contexts were shown or cleared (the Features panel's ExportBar follows this)

    HINT = "Click a feature in the lens; then choose a text file and Run for its top contexts."
    EMPTY_HISTOGRAM = "Run for the feature's activation histogram"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = QLabel(self.HINT)
        self.header.setWordWrap(True)
        self.file_label = QLabel("no text file")
        self.file_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.file_button = QPushButton("Text file…")
        self.file_button.setToolTip("The UTF-8 text file whose tokens the feature's top contexts are taken from")
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("The feature's top-activating contexts and histogram over the text file "
                                   "(cached: a second run on the same file is read back)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = JobProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.contexts_table = read_only_table()
        # one line a context, cut where it is far from the token: "before" on its left, "after" on its right
        self.contexts_table.setWordWrap(False)
        self.contexts_table.setItemDelegateForColumn(2, LeftElideDelegate(self.contexts_table))
        self.histogram = _plot("tokens", "activation")
        # the histogram's title (how often the feature fires, or what to do while empty) as a label over it: it wraps
        # in a narrow pane, where the plot's one-line title was cut ("fires on 1,11…" in the Graph panel's node pane)
        self.histogram.getPlotItem().setTitle(None)
        self.fires_label = QLabel("")
        self.fires_label.setWordWrap(True)
        self.fires_label.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.promoted_table, self.suppressed_table = read_only_table(), read_only_table()
        self.contexts = None  # the TopContexts shown
        self.text_file: str | None = None
        self.job = None  # the contexts job (workers.Job) running or last run
        self.file_button.clicked.connect(self.choose_text_file)
        self.cancel_button.clicked.connect(self.cancel)

        row = QHBoxLayout()
        for w in (QLabel("Text file"), self.file_label, self.file_button, self.run_button, self.cancel_button,
                  self.progress):
            row.addWidget(w, 1 if w is self.file_label else 0)
        logits = QWidget()
        lv = QHBoxLayout(logits)
        lv.setContentsMargins(0, 0, 0, 0)
        for title, table in (("Promotes (W_U · d)", self.promoted_table), ("Suppresses", self.suppressed_table)):
            box = QVBoxLayout()
            box.addWidget(QLabel(f"<b>{title}</b>"))
            box.addWidget(table, 1)
            lv.addLayout(box, 1)
        histogram = QWidget()
        hv = QVBoxLayout(histogram)
        hv.setContentsMargins(0, 0, 0, 0)
        hv.addWidget(self.fires_label)
        hv.addWidget(self.histogram, 1)
        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(histogram)
        lower.addWidget(logits)
        # the two tables get two thirds: at their size hints the histogram took most of a narrow pane (the Graph
        # panel's node) and Suppresses was ~75 px
        lower.setStretchFactor(0, 1)
        lower.setStretchFactor(1, 2)
        lower.setSizes([1, 2])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.contexts_table)
        split.addWidget(lower)
        split.setSizes([300, 200])
        self.split = split
        lay = QVBoxLayout(self)
        lay.addWidget(self.header)
        lay.addLayout(row)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)
        self.clear()

    def clear(self, header: str | None = None) -> None:
        self.clear_contexts()
        self.show_decoder_tokens([], [])
        self.header.setText(header or self.HINT)

    def clear_contexts(self, status: str = "") -> None:
        self.contexts = None
        fill_table(self.contexts_table, ["rank", "activation", "before", "token", "after"], [])
        columns_share_width_while_empty(self.contexts_table)
        self.histogram.getPlotItem().clear()
        show_empty(self.histogram.getPlotItem(), True)
        self.fires_label.setText(self.EMPTY_HISTOGRAM)
        self.status.setText(status)
        self.drawn.emit()

    def show_contexts(self, tc, cached: bool) -> None:
        self.contexts = tc
        rows = [[rank, f"{act:.4g}", visible(left), visible(token), visible(right)]
                for rank, act, _i, token, left, right in tc.rows]
        fill_table(self.contexts_table, ["rank", "activation", "before", "token", "after"], rows, align_right=(1, 2))
        header = self.contexts_table.horizontalHeader()
        header.setStretchLastSection(False)
        # rank, activation and token as wide as they are, before and after share the rest: at their contents'
        # widths the token column was past the right edge of the Graph panel's node pane
        fit, share = QHeaderView.ResizeMode.ResizeToContents, QHeaderView.ResizeMode.Stretch
        for c, mode in enumerate((fit, fit, share, fit, share)):  # rank, activation, before, token, after
            header.setSectionResizeMode(c, mode)
        item = self.histogram.getPlotItem()
        item.clear()
        show_empty(item, False)
        counts, edges = tc.histogram
        if len(counts):
            item.addItem(pg.BarGraphItem(x0=edges[:-1], x1=edges[1:], height=counts, brush=POSITIVE, pen=None))
            item.autoRange()
        self.fires_label.setText(f"fires on {tc.active_tokens:,} of {tc.tokens_seen:,} tokens "
                                 f"({100 * tc.density:.2f}%)")
        self.status.setText(f"Top {len(tc.rows)} contexts over {tc.tokens_seen:,} tokens"
                            + (" (read from the cache)" if cached else "") + ".")
        self.drawn.emit()

    def show_decoder_tokens(self, promoted, suppressed, problem: str = "") -> None:
        for table, pairs in ((self.promoted_table, promoted), (self.suppressed_table, suppressed)):
            fill_table(table, ["token", "weight"], [[repr(t), f"{w:+.3g}"] for t, w in pairs], align_right=(1,))
        if problem:
            fill_table(self.promoted_table, ["token", "weight"], [[problem, ""]])
        for table in (self.promoted_table, self.suppressed_table):
            columns_share_width_while_empty(table)
            if table.rowCount():
                # the token as wide as it is, the weight the rest, in Stretch mode: a stretched last section kept
                # a width from before it was shown (filled on a hidden tab, at 1024 px the weights were cut under a
                # horizontal scroll bar)
                header = table.horizontalHeader()
                header.setStretchLastSection(False)
                header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
                header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)

    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.progress.setVisible(running)
        if running:
            self.progress.begin()

    def choose_text_file(self) -> None:
        from pathlib import Path

        path, _ = QFileDialog.getOpenFileName(self, "Text file for the feature's top contexts",
                                              app_settings.last_folder(), "Text files (*.txt);;All files (*)")
        if path:
            app_settings.set_last_folder(Path(path).parent)
            self.text_file = path
            self.file_label.setText(path)

    def run_contexts(self, state, title: str, fn, *args, on_finished=None, **kw) -> None:
        """state.run(fn, *args, **kw) for the top contexts of `title` over the text file (fn returns
        (TopContexts, cached)), shown here with progress and Cancel; nothing when no text file is chosen
        (said) or a run is under way. The caller passes self.text_file among args."""
        if not self.text_file:
            self.status.setText("Choose a text file first (Text file…).")
            return
        if self.job is not None and not self.job.done:
            return

        def finished() -> None:
            self.set_running(False)
            if on_finished is not None:
                on_finished()

        self.clear_contexts(f"Top contexts of {title} over {self.text_file}…")
        self.set_running(True)
        self.job = state.run(
            fn, *args, on_result=lambda r: self.show_contexts(*r),
            on_error=lambda exc, tb: self.status.setText(f"Cannot read the top contexts: {exc}"),
            on_progress=lambda d, t, _m: self.show_progress(d, t),
            on_cancelled=lambda: self.status.setText("Cancelled."), on_finished=finished, **kw)

    def cancel(self) -> None:
        """Cancel the contexts job if one runs."""
        if self.job is not None and not self.job.done:
            self.job.cancel()

    def show_progress(self, done: int, total: int) -> None:
        left = self.progress.show_progress(done, total)
        self.status.setText(f"Reading the text file: {done}/{total} windows" + (f", {left}" if left else ""))

    # export (ExportBar's view protocol)
    def export_widget(self):
        return self

    def export_unavailable(self) -> str | None:
        return None if self.contexts is not None else "no top contexts yet: choose a text file and Run"

    def export_arrays(self) -> dict[str, np.ndarray]:
        if self.contexts is None:
            return {}
        counts, edges = self.contexts.histogram
        return {"activation": np.array([r[1] for r in self.contexts.rows]),
                "token_index": np.array([r[2] for r in self.contexts.rows]), "counts": counts, "edges": edges}

    def csv_table(self):
        if self.contexts is None:
            return None
        from ...core.features.contexts import CONTEXT_COLUMNS

        return list(CONTEXT_COLUMNS), [list(r) for r in self.contexts.rows]


def component_label(component: str, feature: int) -> str:
    return f"f{feature}" if component == "feature" else component


MAX_FEATURE_BARS = 24  # the rest of the active features as one bar


def feature_bars(fa) -> Bars:
    """One bar per active feature (the largest |contribution| first, at most MAX_FEATURE_BARS, the rest as one
    'other features' bar), then the decoder bias, the skip term and the error term: they add up to the
    direct contribution of the dictionary's write point to the logit."""
    from ...core.features import ATTRIBUTION_COLUMNS

    rows = fa.rows()
    features = [r for r in rows if r[0] == "feature"]
    rest = [r for r in rows if r[0] != "feature" and (r[0] != "skip" or fa.skip != 0.0)]
    shown = features[:MAX_FEATURE_BARS]
    labels = [component_label(c, f) for c, f, _a, _v in shown]
    values = [float(v) for *_x, v in shown]
    if len(features) > len(shown):
        labels.append(f"{len(features) - len(shown)} others")  # (the other features, as one bar)
        values.append(float(sum(v for *_x, v in features[len(shown):])))
    terms = range(len(shown), len(labels) + len(rest))  # 'N others', bias, skip, error: always named
    labels += [c for c, *_x in rest]
    values += [float(v) for *_x, v in rest]
    arrays = {"features": fa.features, "activations": fa.activations, "contributions": fa.contributions,
              "bias": np.array(fa.bias), "skip": np.array(fa.skip), "error": np.array(fa.error),
              "direct": np.array(fa.direct)}
    return Bars(labels, values, arrays, list(ATTRIBUTION_COLUMNS), [list(r) for r in rows], tuple(terms))


def feature_attribution_chart() -> AttributionBars:
    return AttributionBars(feature_bars, "no attribution yet: attach a dictionary and type a text")

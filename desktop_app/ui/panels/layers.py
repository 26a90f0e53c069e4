"""Layers panel: what the residual stream does with depth.

Views (tabs): residual-stream norms (tokens x depths), component norms (each head's output and
each MLP's output, layers x components), the logit lens (tokens x layers: top prediction and its
probability), PCA of token vectors over depth (depth slider, trajectories), and the token-token
cosine-similarity matrix at a depth with its mean, plus the mean-cosine-vs-depth curve.
The views, their view state and every number drawn are declared in core.views.layers (the VIEWS
table; computed in a worker: the logit lens runs the unembedding); this module draws them.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QPushButton, QSlider, QSplitter, QTableView,
                               QVBoxLayout, QWidget)

from ...core import analysis
from ...core.views import find_view, views_using
from ...core.views import layers as layers_views
from ...core.views.layers import LayersData, LayersResult, LayersViewState, compute_layers
from ..settings import plot_background, plot_foreground
from ..widgets.heatmap import Heatmap, short_label
from ..widgets.readable import format_prob, text_colour_on
from ..widgets.token_strip import _visible, plural, value_colour
from . import CANCEL_KEY, key_buttons
from .view_panel import ViewTablePanel


# -- logit lens table ------------------------------------------------------------------------


class LogitLensModel(QAbstractTableModel):
    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[str] = []
        self.next_tokens: list[str] | None = None
        self.strings: list[list[str]] = []
        self.probs = np.zeros((0, 0))
        self.ids = np.zeros((0, 0), dtype=np.int64)
        self.selected: int | None = None

    def set_data(self, tokens, next_tokens, strings, ids, probs) -> None:
        self.beginResetModel()
        self.tokens, self.next_tokens, self.strings, self.ids, self.probs = tokens, next_tokens, strings, ids, probs
        self.endResetModel()

    def _extra(self) -> int:
        return 1 if self.next_tokens is not None else 0

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return len(self.tokens)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return self._extra() + (self.probs.shape[0] if self.probs.size else 0)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        r, c = index.row(), index.column() - self._extra()
        if c < 0:
            if role == Qt.ItemDataRole.DisplayRole:
                return _visible(self.next_tokens[r])
            if role == Qt.ItemDataRole.ToolTipRole:
                return "the token that actually comes next"
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{short_label(self.strings[c][r], 8)}  {format_prob(self.probs[c, r], 2)}"
        if role == Qt.ItemDataRole.BackgroundRole:
            return value_colour(float(self.probs[c, r]), 0.0, 1.0)
        if role == Qt.ItemDataRole.ForegroundRole:
            return text_colour_on(value_colour(float(self.probs[c, r]), 0.0, 1.0))
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"after layer {c}, token {r} {_visible(self.tokens[r])!r}: top prediction "
                    f"{_visible(self.strings[c][r])!r} (id {int(self.ids[c, r])}), p = {format_prob(self.probs[c, r], 4)}")
        return None

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return "next" if section < self._extra() else f"L{section - self._extra()}"
        return f"{section} {short_label(self.tokens[section], 8)}"


NOTHING_YET = "Nothing to export: no layers shown yet (open a model and enter a text)"


class LogitLensView(QTableView):
    drawn = Signal()  # its rows replaced (an ExportBar follows it: nothing to export while empty)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.lens = LogitLensModel()
        self.setModel(self.lens)
        self.lens.modelReset.connect(self.drawn)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.horizontalHeader().setMinimumSectionSize(40)
        self.verticalHeader().setDefaultSectionSize(20)
        self.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)

    def set_selected_row(self, row: int | None) -> None:
        if row is None:
            self.clearSelection()
        elif 0 <= row < self.lens.rowCount():
            self.selectRow(row)
            self.scrollTo(self.lens.index(row, 0))

    def export_widget(self):
        return self

    def export_unavailable(self) -> str | None:
        return None if self.lens.rowCount() and self.lens.probs.size else NOTHING_YET

    def export_arrays(self) -> dict[str, np.ndarray]:
        return {"top_ids": self.lens.ids, "top_probs": self.lens.probs, "tokens": np.array(self.lens.tokens)}

    def csv_table(self):
        header = ["position", "token"] + [f"L{l} top" for l in range(len(self.lens.strings))] + \
                 [f"L{l} p" for l in range(len(self.lens.strings))]
        rows = []
        for t, tok in enumerate(self.lens.tokens):
            rows.append([t, tok] + [self.lens.strings[l][t] for l in range(len(self.lens.strings))]
                        + [f"{self.lens.probs[l, t]:.6g}" for l in range(len(self.lens.strings))])
        return header, rows


# -- PCA -------------------------------------------------------------------------------------


class PCAView(pg.GraphicsLayoutWidget):
    """Tokens at one depth as points in the first two principal axes (fitted over all depths);
    faint lines trace each token's path through depth."""
    drawn = Signal()  # set_data or clear (an ExportBar follows it)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground(plot_background())
        self.plot = self.addPlot()
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        for name in ("left", "bottom"):
            self.plot.getAxis(name).setPen(pg.mkPen(plot_foreground()))
            self.plot.getAxis(name).setTextPen(pg.mkPen(plot_foreground()))
        self.trajectories = pg.PlotCurveItem(pen=pg.mkPen(QColor(120, 120, 120, 60), width=1))
        self.path_of_selected = pg.PlotCurveItem(pen=pg.mkPen(QColor(220, 30, 30), width=2))
        self.points = pg.ScatterPlotItem(size=7, pen=pg.mkPen(None))
        self.selected_point = pg.ScatterPlotItem(size=14, pen=pg.mkPen(QColor(220, 30, 30), width=2),
                                                 brush=pg.mkBrush(None))
        for item in (self.trajectories, self.path_of_selected, self.points, self.selected_point):
            self.plot.addItem(item)
        self.cmap = pg.colormap.get("plasma")
        self.pca: analysis.PCAResult | None = None
        self.labels: list[str] = []
        self.depth_names: list[str] = []
        self.depth = 0
        self.selected: int | None = None
        self.points.sigHovered.connect(self._on_hover)

    def set_data(self, pca: analysis.PCAResult, labels: list[str], depth_names: list[str]) -> None:
        self.pca, self.labels, self.depth_names = pca, labels, depth_names
        c = pca.coords  # [D, T, 2]
        depth, t, _ = c.shape
        xs = c[:, :, 0].T.reshape(-1)  # token-major: each token's path through depth
        ys = c[:, :, 1].T.reshape(-1)
        connect = np.ones(depth * t, dtype=bool)
        connect[depth - 1::depth] = False
        self.trajectories.setData(xs, ys, connect=connect)
        ev = pca.explained_variance_ratio
        self.plot.setLabel("bottom", f"PC 1 ({100 * ev[0]:.1f}% of variance)", color=plot_foreground())
        self.plot.setLabel("left", f"PC 2 ({100 * ev[1]:.1f}%)", color=plot_foreground())
        self.plot.autoRange()
        self.set_depth(min(self.depth, depth - 1))
        self.drawn.emit()

    def clear(self) -> None:
        self.pca, self.labels, self.depth_names = None, [], []
        for item in (self.trajectories, self.path_of_selected, self.points, self.selected_point):
            item.setData([], [])
        self.plot.setTitle("")
        self.drawn.emit()

    def set_depth(self, depth: int) -> None:
        self.depth = depth
        if self.pca is None:
            return
        pts = self.pca.coords[depth]
        t = pts.shape[0]
        colours = self.cmap.map(np.linspace(0, 1, t) if t > 1 else np.zeros(1), mode="qcolor")
        self.points.setData(pts[:, 0], pts[:, 1], brush=colours, data=np.arange(t))
        self.plot.setTitle(f"Token vectors at depth {self.depth_names[depth]} (colour = position)", color=plot_foreground())
        self.set_selected(self.selected)

    def set_selected(self, index: int | None) -> None:
        self.selected = index
        if self.pca is None or index is None or not 0 <= index < self.pca.coords.shape[1]:
            self.selected_point.setData([], [])
            self.path_of_selected.setData([], [])
            return
        p = self.pca.coords[:, index]
        self.path_of_selected.setData(p[: self.depth + 1, 0], p[: self.depth + 1, 1])
        self.selected_point.setData([p[self.depth, 0]], [p[self.depth, 1]])

    def _on_hover(self, _item, points, _ev) -> None:
        if len(points):
            i = int(points[0].data())
            self.setToolTip(f"token {i} {_visible(self.labels[i])!r} at depth {self.depth_names[self.depth]}")

    def export_widget(self):
        return self

    def svg_item(self):
        return self.ci

    def export_unavailable(self) -> str | None:
        return None if self.pca is not None else NOTHING_YET

    def export_arrays(self) -> dict[str, np.ndarray]:
        if self.pca is None:
            return {}
        return {"coords": self.pca.coords, "components": self.pca.components,
                "explained_variance_ratio": self.pca.explained_variance_ratio, "mean": self.pca.mean,
                "tokens": np.array(self.labels), "depths": np.array(self.depth_names)}

    def csv_table(self):
        if self.pca is None:
            return None
        rows = [[self.depth_names[d], t, self.labels[t], f"{x:.6g}", f"{y:.6g}"]
                for d in range(self.pca.coords.shape[0]) for t, (x, y) in enumerate(self.pca.coords[d])]
        return ["depth", "position", "token", "pc1", "pc2"], rows


# -- cosine similarity -----------------------------------------------------------------------


class CosineView(QWidget):
    drawn = Signal()  # set_data or clear (an ExportBar follows it)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.heatmap = Heatmap(row_name="token", col_name="token", value_name="cosine", colormap="CET-D1",
                               highlight="#00b050")
        self.curve_widget = pg.PlotWidget(background=plot_background())
        self.curve_plot = self.curve_widget.getPlotItem()
        for name in ("left", "bottom"):
            self.curve_plot.getAxis(name).setPen(pg.mkPen(plot_foreground()))
            self.curve_plot.getAxis(name).setTextPen(pg.mkPen(plot_foreground()))
        self.curve_plot.getAxis("left").enableAutoSIPrefix(False)
        self.curve_plot.setLabel("left", "mean cosine (i \u2260 j)", color=plot_foreground())
        self.curve_plot.setLabel("bottom", "depth (0 = embedding)", color=plot_foreground())
        self.curve_plot.showGrid(x=True, y=True, alpha=0.2)
        self.curve = self.curve_plot.plot(pen=pg.mkPen("#0072B2", width=2), symbol="o", symbolSize=6,
                                          symbolBrush="#0072B2")
        self.marker = pg.ScatterPlotItem(size=14, pen=pg.mkPen("#D55E00", width=2), brush=pg.mkBrush(None))
        self.curve_plot.addItem(self.marker)
        split = QSplitter()
        split.addWidget(self.heatmap)
        split.addWidget(self.curve_widget)
        split.setSizes([650, 350])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)
        self.cosine = np.zeros((0, 0, 0))
        self.means = np.zeros(0)
        self.labels: list[str] = []
        self.depth_names: list[str] = []
        self.depth = 0

    def set_data(self, cosine, means, labels, depth_names) -> None:
        self.cosine, self.means, self.labels, self.depth_names = cosine, means, labels, depth_names
        pairs = bool(np.isfinite(means).any())  # one token has no pair to compare: no curve, and a title that says so
        self.curve.setData(np.arange(len(means)) if pairs else [], means if pairs else [])
        ticks = [(i, n) for i, n in enumerate(depth_names)]
        self.curve_plot.getAxis("bottom").setTicks([ticks])
        self.curve_plot.setXRange(-0.4, len(means) - 0.6, padding=0)
        self.curve_plot.setTitle("Mean cosine similarity vs depth" if pairs else
                                 "Mean cosine similarity vs depth: needs two tokens", color=plot_foreground())
        self.set_depth(min(self.depth, len(means) - 1), relabel=True)
        self.drawn.emit()

    def clear(self) -> None:
        self.cosine, self.means, self.labels, self.depth_names = np.zeros((0, 0, 0)), np.zeros(0), [], []
        self.heatmap.clear_matrix("")
        self.curve.setData([], [])
        self.marker.setData([], [])
        self.drawn.emit()

    def set_depth(self, depth: int, relabel: bool = False) -> None:
        self.depth = depth
        if self.cosine.size == 0:
            return
        mean = self.means[depth]
        title = f"Cosine similarity at {self.depth_names[depth]}: " + (
            f"mean {mean:.3f}" if np.isfinite(mean) else "no pair of tokens")
        if relabel or self.heatmap.values.shape != self.cosine[depth].shape:
            self.heatmap.set_matrix(self.cosine[depth], self.labels, self.labels, levels=(-1.0, 1.0), title=title)
        else:
            self.heatmap.set_values(self.cosine[depth])
            self.heatmap.set_title(title)
        self.marker.setData(*(([depth], [mean]) if np.isfinite(mean) else ([], [])))

    def export_widget(self):
        return self

    def export_unavailable(self) -> str | None:
        return None if self.cosine.size else NOTHING_YET

    def export_arrays(self) -> dict[str, np.ndarray]:
        return {"cosine": self.cosine, "mean_cosine": self.means, "tokens": np.array(self.labels),
                "depths": np.array(self.depth_names)}

    def csv_table(self):
        header, rows = self.heatmap.csv_table()
        return header, rows + [[], ["depth", "mean cosine"]] + [[n, f"{m:.6g}"] for n, m in
                                                                zip(self.depth_names, self.means)]


# -- the panel -------------------------------------------------------------------------------


class LayersPanel(ViewTablePanel):
    title = "Layers"
    help_text = (
        "<b>What am I looking at?</b> The residual stream x<sub>t</sub><sup>(l)</sup>: token t's vector after the "
        "embedding (depth 0) and after each block l. <b>Residual norms</b>: ||x<sub>t</sub><sup>(l)</sup>||. "
        "<b>Component norms</b>: mean over tokens of ||what each head writes|| (after W<sub>O</sub>) and "
        "||MLP output||, i.e. which components write most. <b>Logit lens</b>: softmax(unembed(x<sup>(l)</sup>)) "
        "read after every layer (final norm + unembedding): the top token and its probability. "
        "<b>PCA</b>: the 2 principal axes of all depths' vectors pooled, so depths are comparable; lines are "
        "each token's path. <b>Cosine</b>: C<sub>ij</sub> = &lt;x<sub>i</sub>, x<sub>j</sub>&gt;/(|x<sub>i</sub>||x<sub>j</sub>|); "
        "its mean over i &ne; j rising with depth shows tokens clustering (Geshkovski et al. 2023).<br>"
        "<b>Encoder-decoders</b> (T5, BART, Marian): <i>Stack</i> picks the encoder's stream (the source's "
        "tokens) or the decoder's ([start] + the target's tokens). Each decoder block has three depths: after "
        "its self-attention (L<i>l</i> self), after its cross-attention, which reads the encoder's output "
        "(L<i>l</i> cross), and after its MLP (L<i>l</i>); its components include each cross-attention head "
        "(cross <i>h</i>). The logit lens is the decoder's (the encoder's stream is not read by the head).<br>"
        "<b>Mixtures of experts</b> (Mixtral, Qwen-MoE, OLMoE): <b>Routing</b>: each token's router probabilities "
        "softmax(W<sub>router</sub> x) over the experts, in the block at the chosen depth (it runs its top-k); "
        "<b>Expert norms</b>: the norm of each chosen expert's weighted output w<sub>e</sub> expert<sub>e</sub>(x) per "
        "token there (0 where the expert was not chosen); <b>Expert load</b>: the share of each layer's routing choices that went to each expert over the text.")

    VIEW_TABLE = layers_views.VIEWS  # the views as data (core.views.layers)
    MIXTURE_VIEWS = layers_views.MIXTURE_VIEWS  # (shown for a mixture of experts only)
    VIEW_STATE = LayersViewState
    START_AFTER_FIRST_PAINT = True  # (the analysis took the cores from the first show at 0.5B: view_panel)
    shortcuts = (("Ctrl+Return", "Run the layer analysis again"), (CANCEL_KEY, "Cancel the layer analysis"))
    CANCELLED = "Cancelled: nothing shown for this text. Run computes its layers."

    def __init__(self, state, parent=None, view_state: LayersViewState | None = None) -> None:
        super().__init__(state, view_state, "Open a model and enter a text to see its layers.", parent)
        self.data: LayersData | None = None
        self.labels: list[str] = []

        self.depth_slider = QSlider(Qt.Orientation.Horizontal)
        self.depth_slider.setRange(0, 0)
        self.depth_slider.setMinimumWidth(160)
        self.depth_label = QLabel("depth: -")
        self.stack = QComboBox()  # an encoder-decoder's stack (hidden for other models)
        self.stack.addItem("Encoder", "encoder")
        self.stack.addItem("Decoder", "decoder")
        self.stack.setToolTip("Which stack's residual stream: the encoder's (source) or the decoder's "
                              "([start] + target, with its cross-attention as a stage of its own)")
        self.stack_label = QLabel("Stack")
        # the analysis runs by itself for each new text; a long one (~27 s at 512 tokens of a GPT-2-small shape)
        # can be cancelled, and run again for the same text
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Compute this text's layers again (after a cancel)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the layer analysis")
        for b in (self.run_button, self.cancel_button):  # each shown only when it can do something
            b.setVisible(False)
        key_buttons(self.shortcuts, (self.run_button, self.cancel_button))
        # (each view's widget made when its tab is first shown: view_panel._build_views)
        self._build_views({"logit-lens": LogitLensView, "pca": PCAView, "cosine": CosineView})
        controls = QHBoxLayout()
        controls.addWidget(self.stack_label)
        controls.addWidget(self.stack)
        self.depth_controls = (QLabel("Depth"), self.depth_slider, self.depth_label)  # (on the views drawn at a depth)
        for w in self.depth_controls:
            controls.addWidget(w)
        controls.addWidget(self.run_button)
        controls.addWidget(self.cancel_button)
        self._lay_out(controls)
        self.run_button.clicked.connect(self.run_again)
        self.cancel_button.clicked.connect(self.cancel)

        self.depth_slider.valueChanged.connect(self.set_depth)
        self.stack.setCurrentIndex(self.stack.findData(self.view_state.stack))
        # until a person picks a stack (or a workspace gives one) the panel shows the one that holds the input: the
        # encoder's while the target is empty (the decoder's stream is then [start] alone, one token)
        self._stack_picked = False
        self._stack_auto = False  # the encoder shown for want of a target (said in the status line)
        self.stack.activated.connect(self._stack_chosen)
        self._show_stack_choice()
        state.model_changed.connect(lambda _loaded: self._show_stack_choice())
        self.tabs.currentChanged.connect(self._on_tab)
        self._show_depth_controls()
        self.show_the_models_views()  # (after _on_tab: a hidden view's tab gives way to the next, in the view state too)
        state.model_changed.connect(lambda _loaded: self.show_the_models_views())
        self.tokens.token_selected.connect(self.select_token)
        self._follow_trace()

    def _view_made(self, name: str, widget) -> None:
        if name == "cosine":
            widget.heatmap.cell_clicked.connect(lambda r, _c: self.select_token(r))
        elif name == "logit-lens":
            widget.clicked.connect(lambda index: self.select_token(index.row()))

    # the views' widgets (each made when first asked for)
    lens_view = property(lambda self: self.widgets["logit-lens"])
    pca_view = property(lambda self: self.widgets["pca"])
    cosine_view = property(lambda self: self.widgets["cosine"])
    resid_map = property(lambda self: self.widgets["residual-norms"])
    component_map = property(lambda self: self.widgets["component-norms"])

    # -- view state ------------------------------------------------------------------------
    def _show_stack_choice(self) -> None:
        for w in (self.stack_label, self.stack):
            w.setVisible(self.state.is_seq2seq())

    def show_the_models_views(self) -> None:
        """Routing, Expert norms and Expert load only for a mixture of experts (as the Model panel's experts
        row): for any other model their tabs drew a blank map that looked like data."""
        loaded = getattr(self.state, "loaded", None)
        mixture = loaded is not None and bool(getattr(loaded.config, "num_experts", 0))
        for name in self.MIXTURE_VIEWS:
            self.tabs.setTabVisible(self.VIEWS.index(name), mixture)  # (Qt leaves a hidden tab on show for the next)
        if not self.tabs.isTabVisible(self.tabs.currentIndex()):  # a workspace's Routing (apply_view_state)
            self.tabs.setCurrentIndex(0)  # (render's --view routing still draws what it asked for: 'not a mixture')

    def _stack_chosen(self, *_) -> None:
        self._stack_picked = True
        stack = self.stack.currentData()
        if stack == self.view_state.stack:
            return
        self.view_state.stack = stack
        self.view_state.selected_token = None  # another sequence
        self._on_trace_changed(getattr(self.state, "trace", None))

    def _show_view_state(self) -> None:
        self._stack_picked = True  # (a workspace's stack is kept)
        self._show_depth_controls()  # (the tab was set with its signals blocked: set_view_state)
        if self.stack.findData(self.view_state.stack) >= 0 and self.stack.currentData() != self.view_state.stack:
            self.stack.blockSignals(True)
            self.stack.setCurrentIndex(self.stack.findData(self.view_state.stack))
            self.stack.blockSignals(False)
            self._on_trace_changed(getattr(self.state, "trace", None))
            return
        if self.data is not None:
            self.view_state.depth = min(self.view_state.depth, self.data.n_depths - 1)
            if self.view_state.selected_token is not None and self.view_state.selected_token >= len(self.labels):
                self.view_state.selected_token = None
            self.set_depth(self.view_state.depth)
            self._refresh()  # (the tab was set with its signals blocked: set_view_state)

    def _on_tab(self, index: int) -> None:
        self.view_state.view = self.VIEWS[index]
        self._show_depth_controls()
        self._refresh()

    def _show_depth_controls(self) -> None:
        """The depth slider only on a view drawn at one depth (PCA, Cosine, Routing, Expert norms): on the others
        (every depth at once) it moved nothing."""
        at_a_depth = self.view_state.view in views_using(layers_views.VIEWS, "depth")
        for w in self.depth_controls:
            w.setVisible(at_a_depth)

    def _draw_stale(self, name: str) -> None:
        v = find_view(layers_views.VIEWS, name)
        self._render(v, v.compute(self.data, self.view_state), new_data=True)  # (at the depth chosen)
        self._apply_selection()  # (a table's new rows forget their selection)

    @property
    def result(self) -> LayersResult | None:
        return self.data.result if self.data is not None else None

    def _depth_name(self) -> str:
        names = self.result.depth_labels if self.result else []
        d = self.depth_slider.value()
        return names[d] if d < len(names) else "-"

    def _export_name_extras(self) -> dict[str, str]:
        return {"depth_name": self._depth_name()}

    # -- data ------------------------------------------------------------------------------
    def set_trace(self, trace, token_ids: list[int] | None = None, sync: bool = False) -> None:
        stack = None
        if trace is not None and self.state.is_seq2seq() and "encoder.embed" in trace:
            # an encoder-decoder's trace: the chosen stack's stream (app.tracing.attention_view) and tokens
            from ...app.tracing import attention_view

            stack = self._stack_to_show()
            trace = attention_view(trace, stack)
            token_ids = list(self.state.token_ids if stack == "encoder" else self.state.decoder_ids)
        self._stack_shown = stack
        generation = self._new_trace(trace)
        if trace is None or trace.n_layers == 0 or "embed" not in trace:
            self._clear(self.state.no_trace_message() if trace is None else "This trace has no residual stream.")
            return
        t = trace["embed"].shape[1]
        ids = list(token_ids or [])
        labels = self.state.token_strings(ids[-t:]) if len(ids) >= t else [str(i) for i in range(t)]
        shown_ids = ids[-t:] if len(ids) >= t else list(range(t))
        self._show_computing(labels, shown_ids)
        loaded = getattr(self.state, "loaded", None)
        model = loaded.model if loaded is not None else None
        tokenizer = loaded.tokenizer if loaded is not None else None

        def work(job=None):
            return generation, labels, shown_ids, compute_layers(trace, model, tokenizer, job, stack)

        def progress(done: int, total: int, stage: str) -> None:  # a large model's analysis takes a while
            if self._is_current(generation):
                self.status.setText(f"computing {stage} ({done + 1}/{total})\u2026")

        self._run_trace_job(work, self._on_result, "layer analysis", sync, on_progress=progress)

    def _show_computing(self, labels: list[str], ids: list[int]) -> None:
        """This trace's tokens at once and no numbers until its own (_on_result), as the Attention panel clears its
        model view for a new text: the previous text's (or model's, or edits') layers stayed on show under
        'computing…', as if they were this one's."""
        computing = "computing\u2026"
        self.data = None
        self.tokens.set_tokens(labels, ids)
        self._clear_heatmaps(computing)  # (a heatmap made meanwhile says it too)
        self._clear_own(computing)
        self.status.setText(computing)

    def _stack_to_show(self) -> str:
        """The stack picked; else the encoder while the decoder has read [start] alone (no target typed), the
        decoder once it has read a target."""
        self._stack_auto = not self._stack_picked and len(self.state.decoder_ids) <= 1
        auto = "encoder" if self._stack_auto else "decoder"
        if not self._stack_picked and self.view_state.stack != auto:
            self.view_state.stack = auto
            self.view_state.selected_token = None  # another sequence
            self.stack.blockSignals(True)
            self.stack.setCurrentIndex(self.stack.findData(auto))
            self.stack.blockSignals(False)
        return self.stack.currentData()

    def _clear_own(self, message: str) -> None:
        self.labels = []
        self._stale = set()
        if "logit-lens" in self.widgets:  # (a view not made yet shows nothing)
            self.lens_view.lens.set_data([], None, [], np.zeros((0, 0), np.int64), np.zeros((0, 0)))
        for name in ("pca", "cosine"):
            if name in self.widgets:
                self.widgets[name].clear()
        self.depth_slider.blockSignals(True)
        self.depth_slider.setRange(0, 0)
        self.depth_slider.blockSignals(False)
        self.depth_label.setText("depth: -")

    def _on_result(self, payload) -> None:
        generation, labels, shown_ids, res = payload
        if not self._is_current(generation):
            return
        self.labels = labels
        self.tokens.set_tokens(labels, shown_ids)
        causal = self.state.loaded.config.causal if getattr(self.state, "loaded", None) else True
        if getattr(self, "_stack_shown", None) is not None:
            causal = self._stack_shown == "decoder"  # the lens's "next" column: the decoder's next token
        self.data = LayersData(res, self.labels, causal)
        depth = self.data.n_depths
        t = res.resid_norms.shape[1]
        layers = sum(" " not in label for label in res.depth_labels[1:])  # (a decoder block has three depths)
        if getattr(self, "_stack_shown", None) == "encoder" and self._stack_auto:
            # (the encoder's own "no logit lens" line would send a person to a decoder of one token)
            problem = "encoder shown: no target typed (Model panel)"
        else:
            problem = f"no logit lens: {res.lens_problem}" if res.lens_problem else ""
        self.status.setText(f"{plural(t, 'token')}, {plural(layers, 'layer')}" + (f"; {problem}" if problem else ""))
        self._stale = set(self.VIEWS)  # the view on show drawn below (_refresh), each other one when shown
        self.depth_slider.blockSignals(True)
        self.depth_slider.setRange(0, depth - 1)
        self.depth_slider.setValue(min(self.view_state.depth, depth - 1))
        self.depth_slider.blockSignals(False)
        self.set_depth(min(self.view_state.depth, depth - 1))
        self._refresh()
        if self.selected_token is not None and self.selected_token >= t:
            self.view_state.selected_token = None
        self.tokens.set_selected(self.selected_token)
        self._apply_selection()

    def _render(self, view, result, new_data: bool = False) -> None:
        w = self.widgets[view.name]
        if view.widget == "heatmap":
            self._render_heatmap(view, result)
        elif view.widget == "logit-lens":
            w.lens.set_data(result.tokens, result.next_tokens, result.strings, result.ids, result.probs)
            if not result.problem and result.next_tokens is not None:  # (the status line says the problem)
                w.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        elif view.widget == "pca":
            if new_data:
                w.depth = result.depth  # drawn once, at the depth chosen (1,024 points: ~0.1 s a drawing at 0.5B)
                w.set_data(result.pca, result.tokens, result.depth_labels)
            else:
                w.set_depth(result.depth)
        elif view.widget == "cosine":
            if new_data:
                w.depth = result.depth
                w.set_data(result.cosine, result.mean_cosine, result.tokens, result.depth_labels)
            else:
                w.set_depth(result.depth)

    # -- run and cancel --------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the analysis of the text on show (the worker stops at its next stage)."""
        if self._job is not None:
            self._job.cancel()
            self.cancel_button.setEnabled(False)
            self.status.setText("cancelling\u2026")

    def _job_changed(self) -> None:
        self.cancel_button.setVisible(self._job is not None)
        self.cancel_button.setEnabled(True)
        self.run_button.setVisible(False)

    def _job_cancelled(self) -> None:
        # the views showed the previous text's layers: not this text's, so they go
        self._clear(self.CANCELLED)
        self.run_button.setVisible(getattr(self.state, "trace", None) is not None)

    def run_again(self) -> None:
        """The analysis of the app's trace (the text on show), after a cancel."""
        self._on_trace_changed(getattr(self.state, "trace", None))

    # -- interaction -----------------------------------------------------------------------
    def set_depth(self, depth: int) -> None:
        if self.depth_slider.value() != depth:
            self.depth_slider.setValue(depth)  # comes back here through valueChanged
            return
        if self.data is None:
            return
        self.view_state.depth = depth
        self.depth_label.setText(f"depth: {self.result.depth_labels[depth]}")
        for name in views_using(layers_views.VIEWS, "depth"):
            if name not in self._stale:  # (a stale one is drawn at the depth then, when shown)
                v = find_view(layers_views.VIEWS, name)
                self._render(v, v.compute(self.data, self.view_state))

    def _select_in_own_views(self) -> None:
        i = self.selected_token
        if "cosine" in self.widgets:  # (one made later is drawn, then given the selection: _refresh)
            self.cosine_view.heatmap.set_selected_row(i)
        if "pca" in self.widgets:
            self.pca_view.set_selected(i)
        if "logit-lens" in self.widgets:
            self.lens_view.set_selected_row(i)

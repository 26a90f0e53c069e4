"""Graph panel: an attribution graph computed here for the model and text on screen (Compute graph…, a
transcoder folder, progress and Cancel), or opened (a GRAPH.json from the `graph` command, circuit-tracer or
Neuronpedia), drawn as rows of layers and columns of token positions, explored and tested by intervention.

Drawing (smooth at 10,000 nodes): the nodes are one ScatterPlotItem (features circles, error nodes grey
squares, token embeddings green triangles, logits orange diamonds; sized by influence, core.graphs.layout);
the edges are one EdgeLayer (ui/widgets/edge_layer.py: six buckets of segments, one per sign, blue positive
and red negative, and width class, thicker and more opaque for a larger |weight|; drawn as one image per
settled view in a worker thread and moved with the view while it pans or zooms), never one item per edge;
the nodes are drawn into that image too, and while the view moves the node item skips its own painting
(10,000 markers a frame cost more than the image: bench graph_view), painting again once the view is still.
Overlays: the clicked node's strongest ancestors and descendants, the pinned nodes, the search hits, supernode labels.

A computed graph keeps its unpruned adjacency (app.graphs.GraphResult), so the node and edge threshold
sliders prune again in a worker without computing the graph again; it names the model and the text it was
computed for and goes when either changes (ResultView). Its feature nodes get the Features panel's
dashboard (decoder tokens, top contexts over a text file) and can be edited: zero, scale or clamp the
pinned features, re-run with attention frozen (the replacement model) or live (the real model), the logits
before and after in a table, and "Add as What if edits" puts the same edits in the app's edit list.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QLineF, QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QStaticText
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QHBoxLayout, QHeaderView,
                               QInputDialog, QLabel, QLineEdit, QListWidget, QProgressBar, QPushButton, QRadioButton,
                               QSizePolicy, QSlider, QSplitter, QStyle, QStyleOptionFrame, QTabWidget, QVBoxLayout,
                               QWidget)

from ...core.graphs.layout import (GraphLayout, annotated_json, layout, load_graph_json, search_nodes,
                                   strongest_neighbourhood, sub_layout, user_annotations)
from ..state import INPUT, MODEL, ResultView
from ..widgets.edge_layer import EdgeLayer
from ..widgets.empty_plot import show_empty
from ..widgets.export import ExportBar, ask_save_path, say_in_status_bar
from . import CANCEL_KEY, key_buttons
from .features_views import FeatureDashboard, fill_table, read_only_table

NODE_STYLE = {  # KINDS order: symbol, brush
    0: ("o", "#4c72b0"),
    1: ("s", "#9a9a9a"),
    2: ("t1", "#2ca02c"),
    3: ("d", "#ff7f0e"),
}
POSITIVE, NEGATIVE = (31, 119, 180), (214, 39, 40)
WIDTH_CLASSES = ((0.0, 0.1, 0.6, 50), (0.1, 0.4, 1.4, 110), (0.4, 1.01, 2.6, 200))  # |w| / max: width, alpha
HIGHLIGHT = "#e6a100"
NODE_OUTLINE = "#333"
SLIDER_STEPS = 1000


class _Nodes(pg.ScatterPlotItem):
    """The nodes: drawn into the edge layer's image as well, so that while the view moves only that image is
    painted (10,000 markers drawn again each frame cost more than the image); hover and click stay here."""

    def __init__(self, layer: EdgeLayer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.layer = layer

    def paint(self, p, *args) -> None:
        widget = args[1] if len(args) > 1 else None
        if widget is not None and self.layer.moving_with_view():
            return
        super().paint(p, *args)


def line_edit_width(box: QLineEdit, text: str) -> int:
    """The width at which `box` shows `text` whole: as QLineEdit's own size hint counts it (its 2 px margin each
    side, the text margins, the style's frame), for this text instead of 17 'x'."""
    margins = box.textMargins()
    opt = QStyleOptionFrame()
    box.initStyleOption(opt)
    inner = box.fontMetrics().horizontalAdvance(text) + 2 * 2 + margins.left() + margins.right()
    return box.style().sizeFromContents(QStyle.ContentsType.CT_LineEdit, opt, QSize(inner, box.sizeHint().height()),
                                        box).width()


class _LabelAxis(pg.AxisItem):
    """An axis of fixed labelled ticks (the rows, the token positions) painted directly: the tick marks in one
    drawLines, each label laid out once (QStaticText). pyqtgraph's AxisItem lays every label out again into a
    QPicture, and sets its title's HTML again for an SI prefix, whenever the range changes: two thirds of a
    frame's CPU time while the view pans (bench graph_view). Same geometry as AxisItem's generateDrawSpecs
    for one tick level without a grid; anything else is left to AxisItem."""

    def __init__(self, orientation: str, **kwargs) -> None:
        super().__init__(orientation, **kwargs)
        self.enableAutoSIPrefix(False)  # labels, not numbers
        self._texts: dict[str, QStaticText] = {}

    def paint(self, p, opt, widget) -> None:
        levels, view = self._tickLevels, self.linkedView()
        lo, hi = self.range
        if (widget is None or levels is None or len(levels) != 1 or self.grid is not False or view is None
                or self.orientation not in ("left", "bottom") or hi == lo):
            return super().paint(p, opt, widget)
        left = self.orientation == "left"
        bounds = self.mapRectFromParent(self.geometry())
        extent = bounds.height() if left else bounds.width()
        stop = bounds.right() if left else bounds.top()
        end = stop + self.style["tickLength"] * (-1 if left else 1)
        p.setRenderHint(p.RenderHint.Antialiasing, False)
        p.setRenderHint(p.RenderHint.TextAntialiasing, True)
        p.setPen(self.pen())
        if left:
            p.drawLine(QPointF(bounds.right() - 1, bounds.top() - 1), QPointF(bounds.right() - 1, bounds.bottom() + 1))
        else:
            p.drawLine(QPointF(bounds.left() - 1, bounds.top() + 1), QPointF(bounds.right() + 1, bounds.top() + 1))
        shown = []
        for value, text in levels[0]:
            x = extent - (value - lo) * extent / (hi - lo) if left else (value - lo) * extent / (hi - lo)
            if 0 <= x <= extent:
                shown.append((x, text))
        p.setPen(self.tickPen())
        p.drawLines([QLineF(stop, x, end, x) if left else QLineF(x, stop, x, end) for x, _ in shown])
        if self.style["tickFont"] is not None:
            p.setFont(self.style["tickFont"])
        p.setPen(self.textPen())
        offset = max(0, self.style["tickLength"]) + self.style["tickTextOffset"][0 if left else 1]
        outer = self.boundingRect()
        widest = 0.0
        for x, text in shown:
            if text not in self._texts:
                self._texts[text] = QStaticText(text)
                self._texts[text].prepare(font=p.font())
            static = self._texts[text]
            w, h = static.size().width(), static.size().height()
            widest = max(widest, w if left else h)
            rect = QRectF(stop - offset - w, x - h / 2, w, h) if left else QRectF(x - w / 2, stop + offset, w, h)
            if outer & rect == rect:
                p.drawStaticText(rect.topLeft(), static)
        self._updateMaxTextSize(widest)

    def setTicks(self, ticks) -> None:  # noqa: N802 (pyqtgraph)
        self._texts.clear()
        super().setTicks(ticks)


def edge_buckets(data: GraphLayout) -> list[tuple[tuple, float, np.ndarray, np.ndarray]]:
    """The edges as (colour with alpha, width, xs, ys) per sign and width class: xs/ys hold each edge's two
    ends one after the other (connect="pairs")."""
    out = []
    if not len(data.edges):
        return out
    top = np.abs(data.weights).max() or 1.0
    strength = np.abs(data.weights) / top
    sign = np.sign(data.weights)
    for s, colour in ((1, POSITIVE), (-1, NEGATIVE)):
        for lo, hi, width, alpha in WIDTH_CLASSES:
            chosen = (sign == s) & (strength >= lo) & (strength < hi)
            if chosen.any():
                pairs = data.edges[chosen]
                xs = np.stack([data.x[pairs[:, 0]], data.x[pairs[:, 1]]], axis=1).ravel()
                ys = np.stack([data.y[pairs[:, 0]], data.y[pairs[:, 1]]], axis=1).ravel()
                out.append(((*colour, alpha), width, xs, ys))
    return out


def node_sizes(influence: np.ndarray) -> np.ndarray:
    """Symbol sizes in pixels, 6 to 22, whole pixels: few distinct sizes keep the scatter's symbol atlas
    small (a size per node made drawing 10,000 nodes several times slower, measured)."""
    return np.round(6 + 16 * np.clip(influence, 0, 1))


def node_text(node: dict, label: str = "") -> str:
    """One node as rich text: id, kind, layer / position / feature, activation, influence, labels."""
    parts = [f"<b>{html.escape(str(node['node_id']))}</b>", html.escape(node["feature_type"])]
    if node["feature_type"] == "cross layer transcoder":
        layer, feature, pos = str(node["node_id"]).split("_")
        parts.append(f"layer {layer}, position {pos}, feature {feature}")
    if label:
        parts.append(f"<i>{html.escape(label)}</i>")
    if node.get("clerp"):
        parts.append(html.escape(node["clerp"]))
    if node.get("activation") is not None:
        parts.append(f"activation {node['activation']:.4g}")
    if node.get("influence") is not None:
        parts.append(f"cumulative influence {node['influence']:.3f}")
    return " &nbsp;·&nbsp; ".join(parts)


def _prune(result, node_threshold: float, edge_threshold: float):
    from ...app.graphs import pruned_json

    model = pruned_json(result, node_threshold, edge_threshold)
    return model, layout(model)


def _compute_and_prune(loaded, ids, folder, node_threshold: float, edge_threshold: float, job=None):
    """A worker's whole job: the graph (app.graphs.compute_graph), pruned and laid out at the thresholds."""
    from ...app import graphs

    result = graphs.compute_graph(loaded, ids, folder, job=job)
    return (result, *_prune(result, node_threshold, edge_threshold))


class GraphPanel(QWidget, ResultView):
    drawn = Signal()  # what its exports would write changed (its ExportBar follows this)
    shortcuts = (("Ctrl+Return", "Compute graph…"), (CANCEL_KEY, "Cancel the graph"))  # the buttons' keys, listed in Help
    help_text = (
        "<b>Attribution graph</b> (Ameisen et al. 2025): the circuit behind one prediction in the local "
        "replacement model (MLPs replaced by transcoders, attention patterns and norm scales frozen). "
        "Rows are layers (token embeddings at the bottom, the predicted logits on top), columns token "
        "positions. An edge s &rarr; t is the direct effect of s on t's pre-activation, "
        "A<sub>ts</sub> = a<sub>s</sub> W<sub>dec,s</sub> &middot; J &middot; W<sub>enc,t</sub>, along linear "
        "paths only; blue is positive, red negative. Nodes are sized by their influence on the logits "
        "(the normalised adjacency's series A + A&sup2; + &hellip; weighted by the logits' probabilities). "
        "<b>Compute graph…</b> makes one for the model and text on screen over a circuit-tracer transcoder "
        "folder; <b>Open graph…</b> (or File &rsaquo; Open Attribution Graph) reads a GRAPH.json. The sliders "
        "prune a computed graph again (node and edge thresholds). Hover a node for its details, click it for "
        "its strongest ancestors and descendants and its feature's dashboard; pin nodes, group pinned nodes "
        "into a labelled supernode, label a node, search by feature id or label. Intervene: zero, scale or "
        "clamp the pinned features and re-run, attention frozen or live; Add as What if edits puts the same "
        "edits in the app's edit list."
    )
    result_parts = (MODEL, INPUT)

    def __init__(self, state=None, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.layout_data: GraphLayout | None = None  # what is drawn (the pinned subgraph when it is on)
        self.full_layout: GraphLayout | None = None  # the whole pruned graph
        self.model_json: dict | None = None
        self.path: Path | None = None
        self.result = None  # app.graphs.GraphResult of a graph computed here
        self.result_key = None
        self.transcoders_folder = ""
        self.shown = np.zeros(0, int)  # drawn point i is full_layout node shown[i]
        self.selected: int | None = None  # index into full_layout of the clicked node
        self.highlighted: tuple[set[int], np.ndarray] = (set(), np.zeros(0, int))
        self.found: list[int] = []
        self.pinned: list[str] = []  # node ids
        self.supernodes: list[list[str]] = []  # [label, node id, ...]
        self.labels: dict[str, str] = {}  # node id -> the user's label
        self._job = self._prune_job = self._edit_job = None
        self._prune_serial = 0
        self.edit_result = None  # (edits, before, after, live) of the last intervention

        # -- top rows ---------------------------------------------------------------------------
        self.compute_button = QPushButton("Compute graph…")
        self.compute_button.setToolTip("An attribution graph of the model and text on screen over a circuit-tracer "
                                       "transcoder folder (chosen next)")
        self.compute_button.clicked.connect(self.compute_dialog)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        key_buttons(self.shortcuts, (self.compute_button, self.cancel_button))
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.open_button = QPushButton("Open graph…")
        self.open_button.clicked.connect(self.open_dialog)
        self.save_json_button = QPushButton("JSON…")
        self.save_json_button.setToolTip("Save the graph as JSON with the pins, supernodes and labels (qParams), "
                                         "as the attribution-graphs frontend and Neuronpedia read it")
        self.save_json_button.clicked.connect(self.save_json_dialog)
        self.export_bar = ExportBar(lambda: self,
                                    lambda: (self.model_json or {}).get("metadata", {}).get("slug", "graph"))
        self.summary = QLabel("No graph: Compute graph… for the text on screen, or Open graph…")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        top = QHBoxLayout()
        for w in (self.compute_button, self.cancel_button, self.progress, self.open_button, self.save_json_button,
                  self.export_bar):
            top.addWidget(w)
        self.node_slider, self.node_value = self._slider(0.8, "Node threshold: keep the nodes holding this share of "
                                                         "the influence on the logits")
        self.edge_slider, self.edge_value = self._slider(0.98, "Edge threshold: then the edges holding this share")
        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("search: feature id or label")
        self.search_box.setToolTip("Ring the nodes whose feature id or label holds this text (Return)")
        # its placeholder whole (at 1024 px it lost its end, "or la…"): the sliders beside it give the room
        self.search_box.setMinimumWidth(line_edit_width(self.search_box, self.search_box.placeholderText()))
        self.search_box.returnPressed.connect(self.search)
        self.pin_button = QPushButton("Pin")
        self.pin_button.setToolTip("Pin the clicked node (again: unpin it)")
        self.pin_button.clicked.connect(self.toggle_pin)
        self.subgraph_box = QCheckBox("Pinned only")
        self.subgraph_box.setToolTip("Show only the pinned nodes and the edges between them (the subgraph)")
        self.subgraph_box.toggled.connect(lambda _on: self._redraw())
        self.group_button = QPushButton("Group…")
        self.group_button.setToolTip("Group the pinned nodes into a labelled supernode")
        self.group_button.clicked.connect(self.group_dialog)
        self.label_button = QPushButton("Label…")
        self.label_button.setToolTip("Annotate the clicked node with a label of your own")
        self.label_button.clicked.connect(self.label_dialog)
        second = QHBoxLayout()
        for w in (QLabel("Nodes"), self.node_slider, self.node_value, QLabel("Edges"), self.edge_slider,
                  self.edge_value, self.search_box, self.pin_button, self.subgraph_box, self.group_button,
                  self.label_button):
            second.addWidget(w)

        # -- the graph ------------------------------------------------------------------------------
        self.plot = pg.PlotWidget(background="w", axisItems={"left": _LabelAxis("left"), "bottom": _LabelAxis("bottom")},
                                  enableMenu=False)  # (made without a menu: ~5-8 ms a plot)
        self.plot.hideButtons()
        self.plot.getPlotItem().setLabel("bottom", "token position")
        self.edges_item = EdgeLayer()  # every edge, drawn as an image per settled view (level of detail)
        self.edges_item.setZValue(1)
        self.highlight_edges = pg.PlotCurveItem(connect="pairs", pen=pg.mkPen(HIGHLIGHT, width=3))
        self.highlight_edges.setZValue(5)
        self.nodes_item = _Nodes(self.edges_item, pxMode=True, hoverable=True, tip=None)
        self.nodes_item.setZValue(10)
        self.nodes_item.sigClicked.connect(self._on_clicked)
        self.nodes_item.sigHovered.connect(self._on_hovered)
        self.marks_item = pg.ScatterPlotItem(pxMode=True)  # highlighted, pinned and found nodes: rings
        self.marks_item.setZValue(11)
        for item in (self.edges_item, self.highlight_edges, self.nodes_item, self.marks_item):
            self.plot.addItem(item)
        self._show_axes(False)  # (no graph yet: no rows, no tokens)
        self.supernode_items: list[pg.TextItem] = []
        self.hover = QLabel("")
        self.hover.setTextFormat(Qt.TextFormat.RichText)
        # one line that asks for no width: a long node's line (~750 px) made the window's least width ~1,300 px,
        # past a 1280 px screen; cut at the pane's edge, the clicked node's whole line is under it (details)
        self.hover.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.hover.setMinimumWidth(1)
        self.details = QLabel("")
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        # -- side: the node's dashboard, the intervention ------------------------------------------
        self.dashboard = FeatureDashboard()
        self.dashboard.header.setText("Click a feature node of a graph computed here for its dashboard.")
        # a long file path must not widen the side pane past the window (it would cut off the Intervene tab)
        self.dashboard.file_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.dashboard.run_button.clicked.connect(self.run_dashboard)
        self.edit_list = QListWidget()
        self.how_box = QComboBox()
        self.how_box.addItems(["zero", "scale", "clamp"])
        self.value_box = QDoubleSpinBox()
        self.value_box.setRange(-1e6, 1e6)
        self.value_box.setDecimals(3)
        self.value_box.setValue(0.0)
        self.frozen_button = QRadioButton("attention frozen")
        self.frozen_button.setToolTip("The replacement model: attention patterns, norms, the other features and "
                                      "the error nodes held at this prompt's values (the graph's linear world)")
        self.live_button = QRadioButton("live")
        self.live_button.setToolTip("The real model with the same edits at the MLP outputs (attention recomputed)")
        self.frozen_button.setChecked(True)
        self.run_edit_button = QPushButton("Run")
        self.run_edit_button.clicked.connect(self.run_intervention)
        self.add_edits_button = QPushButton("Add as What if edits")
        self.add_edits_button.setToolTip("Put the same feature edits in the app's edit list: every panel and "
                                         "Generate then show the edited model")
        self.add_edits_button.clicked.connect(self.add_whatif_edits)
        self.edit_status = QLabel("Pin feature nodes of a graph computed here to edit them.")
        self.edit_status.setWordWrap(True)
        self.logits_table = read_only_table()
        # each column as wide as what it holds, the token the rest (five of 100 px ran past a 1024 px window's side)
        self.logits_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # ('p after', the last section, stretched over what the token left: most of the width)
        self.logits_table.horizontalHeader().setStretchLastSection(False)
        intervene = QWidget()
        iv = QVBoxLayout(intervene)
        iv.addWidget(QLabel("<b>Features to edit</b> (the pinned feature nodes)"))
        iv.addWidget(self.edit_list, 1)
        row = QHBoxLayout()
        for w in (self.how_box, QLabel("value"), self.value_box, self.frozen_button, self.live_button):
            row.addWidget(w)
        iv.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(self.run_edit_button)
        row.addWidget(self.add_edits_button)
        iv.addLayout(row)
        iv.addWidget(self.edit_status)
        iv.addWidget(self.logits_table, 2)
        self.side = QTabWidget()
        self.side.addTab(self.dashboard, "Node")
        self.side.addTab(intervene, "Intervene")
        split = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.plot, 1)
        lv.addWidget(self.hover)
        lv.addWidget(self.details)
        split.addWidget(left)
        split.addWidget(self.side)
        split.setSizes([800, 360])
        column = QVBoxLayout(self)
        column.addLayout(top)
        column.addWidget(self.summary)
        column.addLayout(second)
        column.addWidget(split, 1)
        self._prune_timer = QTimer(self)
        self._prune_timer.setSingleShot(True)
        self._prune_timer.setInterval(120)
        self._prune_timer.timeout.connect(self.reprune)
        self._set_sliders_enabled(False)
        if state is not None:
            self.watch_inputs(state)

    def _slider(self, value: float, tip: str) -> tuple[QSlider, QLabel]:
        s = QSlider(Qt.Orientation.Horizontal)
        s.setRange(0, SLIDER_STEPS)
        s.setValue(round(value * SLIDER_STEPS))
        s.setToolTip(tip + " (a graph computed here: pruned again at once)")
        s.setMinimumWidth(90)
        label = QLabel(f"{value:.3f}")
        s.valueChanged.connect(lambda v: (label.setText(f"{v / SLIDER_STEPS:.3f}"), self._prune_timer.start()))
        return s, label

    def _set_sliders_enabled(self, on: bool) -> None:
        for s in (self.node_slider, self.edge_slider):
            s.setEnabled(on)
            if not on:
                s.setToolTip("Compute the graph here to prune it again (a GRAPH.json holds only the pruned graph)")

    @property
    def thresholds(self) -> tuple[float, float]:
        return self.node_slider.value() / SLIDER_STEPS, self.edge_slider.value() / SLIDER_STEPS

    # -- computing -----------------------------------------------------------------------------
    def compute_dialog(self) -> None:
        from ..settings import last_folder

        folder = QFileDialog.getExistingDirectory(self, "Transcoders (a circuit-tracer folder)",
                                                  self.transcoders_folder or last_folder())
        if folder:
            self.compute(folder)

    def compute(self, folder: str) -> None:
        """Compute the graph of the model and text on screen over the transcoders in `folder`, in a worker."""
        state = self.state
        if state is None or state.loaded is None or not state.token_ids:
            self.summary.setText("Open a model and type a text first: the graph is of its next-token prediction.")
            return
        if self._job is not None and not self._job.done:
            return
        self.transcoders_folder = str(folder)
        self.summary.setText(f"Computing the graph of {html.escape(state.loaded.name)} over "
                             f"{html.escape(str(folder))}…")
        self.compute_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self._job_thresholds = self.thresholds
        self._job = state.run(_compute_and_prune, state.loaded, list(state.token_ids), str(folder), *self.thresholds,
                              on_result=self._computed, on_error=self._failed, on_progress=self._progress,
                              on_cancelled=lambda: self.summary.setText("Cancelled: no graph computed."),
                              on_finished=self._finished, parts=(MODEL, INPUT), owner=self)

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _progress(self, done: int, total: int, message: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.progress.setFormat(message[:40])

    def _failed(self, exc: BaseException, _tb: str) -> None:
        line = str(exc).splitlines()[0] if str(exc) else repr(exc)
        self.summary.setText(f"<span style='color:#b00'>{html.escape(line)}</span>")

    def _finished(self) -> None:
        self.compute_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setVisible(False)

    def _computed(self, computed) -> None:
        result, model, data = computed
        self.result, self.result_key, self.path = result, self._job.key, None
        self.pinned, self.supernodes, self.labels = [], [], {}
        self._set_sliders_enabled(True)
        self._show(model, data)
        if self.thresholds != self._job_thresholds:
            self.reprune()  # a slider moved while the graph was computed

    def clear_results(self, changed: frozenset) -> None:
        """The model or text changed: a graph computed for the old ones goes (an opened file stays)."""
        if self._job is not None and not self._job.done:
            self._job.cancel()
        if self.result is None:
            return
        state = self.state
        if MODEL not in changed and state is not None and state.token_ids \
                and list(state.token_ids) == self.result.ids[len(self.result.ids) - self.result.n_text:]:
            return  # the same text traced again (e.g. after What-if edits): the graph still belongs to it
        self.result = self.result_key = None
        self.model_json = self.full_layout = self.layout_data = None
        self._set_sliders_enabled(False)
        self._clear_drawing()
        self.edit_list.clear()
        fill_table(self.logits_table, ["token", "logit before", "after", "p before", "p after"], [])
        self.logits_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.dashboard.clear("Click a feature node of a graph computed here for its dashboard.")
        self.summary.setText("The model or text changed: Compute graph… again for the text on screen.")

    def reprune(self) -> None:
        """Prune the computed graph again at the sliders' thresholds (a worker; the latest request wins)."""
        if self.result is None:
            return
        self._prune_serial += 1
        serial = self._prune_serial

        def show(pair) -> None:
            if serial == self._prune_serial and self.result is not None:
                self._show(*pair)

        runner = self.state.run if self.state is not None else None
        if runner is None:
            show(_prune(self.result, *self.thresholds))
            return
        self._prune_job = runner(_prune, self.result, *self.thresholds, on_result=show, on_error=self._failed,
                                 parts=(MODEL, INPUT), owner=self)

    # -- opening and saving ----------------------------------------------------------------------
    def open_dialog(self) -> None:
        from ..settings import last_folder

        path, _ = QFileDialog.getOpenFileName(self, "Open attribution graph", last_folder(), "Graph JSON (*.json)")
        if path:
            self.open_graph(path)

    def open_graph(self, path: str | Path) -> bool:
        """Draw the graph in `path`; a file that is not one is named in the summary line (False)."""
        try:
            model = load_graph_json(path)
            data = layout(model)
        except ValueError as exc:
            self.summary.setText(f"<span style='color:#b00'>{html.escape(str(exc).splitlines()[0])}</span>")
            return False
        self.result = self.result_key = None
        self._set_sliders_enabled(False)
        self.path = Path(path)
        self.pinned, self.supernodes, self.labels = user_annotations(model)
        self._show(model, data)
        return True

    def save_json_dialog(self) -> None:
        if self.model_json is None:
            say_in_status_bar(self, "No graph to save")
            return
        path = ask_save_path(self, "Save graph JSON", str(self.model_json["metadata"].get("slug") or "graph") + ".json",
                             "Graph JSON (*.json)")
        if path:
            self.save_json(path)

    def save_json(self, path: str | Path) -> None:
        """The graph shown, with the pins, supernodes and labels, in the frontend's schema (atomic)."""
        from ...core.graphs.files import write_graph_json

        write_graph_json(path, self.annotated_model())
        say_in_status_bar(self, f"Saved {path}")

    def annotated_model(self) -> dict:
        return annotated_json(self.model_json, self.pinned, self.supernodes, self.labels)

    # export (ExportBar's view protocol): the graph as drawn
    def export_widget(self):
        return self.plot

    def svg_item(self):
        return self.plot.getPlotItem()

    def export_unavailable(self) -> str | None:
        return None if self.layout_data is not None else "no graph yet: Compute graph… or Open graph…"

    # -- drawing -------------------------------------------------------------------------------
    def _show(self, model: dict, data: GraphLayout) -> None:
        self.model_json, self.full_layout = model, data
        meta = model["metadata"]
        what = ""
        if self.result is not None:
            r = self.result
            text = "".join(r.graph.token_strings[len(r.ids) - r.n_text:])  # the text's tokens, not the BOS added
            what = (f"computed for <b>{html.escape(self.result.model_name)}</b> on “{html.escape(text)}”, "
                    f"replacement score {self.result.replacement_score:.3f}, completeness "
                    f"{self.result.completeness_score:.3f}; ")
        else:
            what = (f"<b>{html.escape(str(meta.get('slug', '')))}</b> &nbsp; "
                    f"{html.escape(str(meta.get('prompt', '')))} — ")
        self.summary.setText(f"{what}<span style='color:#666'>{len(data.nodes)} nodes, {len(data.edges)} edges, "
                             f"transcoders {html.escape(str(meta.get('scan', '')))}</span>")
        self.selected = None
        self.highlighted = (set(), np.zeros(0, int))
        self.found = []
        self._redraw(reset_range=True)
        self._refresh_edit_list()
        self.drawn.emit()

    def _index(self) -> dict[str, int]:
        return {n["node_id"]: i for i, n in enumerate(self.full_layout.nodes)} if self.full_layout else {}

    def _clear_drawing(self) -> None:
        for item in self.supernode_items:
            self.plot.removeItem(item)
        self.supernode_items = []
        self.edges_item.set_buckets([])
        self.nodes_item.clear()
        self.marks_item.clear()
        self.highlight_edges.setData([], [])
        self.details.setText("")
        self.hover.setText("")
        self._show_axes(False)  # nothing of the graph gone stays: its rows and its text's tokens
        self.drawn.emit()

    def _show_axes(self, shown: bool) -> None:
        """The axes (rows: Emb, L0.., Logit; columns: the prompt's tokens) with a graph only: without one they
        were bare -0.5..0.5 axes, or the rows and tokens of a graph cleared."""
        plot = self.plot.getPlotItem()
        if not shown:
            for side in ("left", "bottom"):
                plot.getAxis(side).setTicks([])
        show_empty(plot, not shown)

    def _shown_indices(self) -> list[int]:
        """Indices into full_layout of the nodes drawn: all, or the pinned ones (the subgraph)."""
        if not self.subgraph_box.isChecked():
            return list(range(len(self.full_layout.nodes)))
        index = self._index()
        return [index[p] for p in self.pinned if p in index]

    def _redraw(self, reset_range: bool = False) -> None:
        if self.full_layout is None:
            return
        for item in self.supernode_items:
            self.plot.removeItem(item)
        self.supernode_items = []
        shown = self._shown_indices()
        self.shown = np.array(shown, dtype=int)  # drawn point i is full_layout node shown[i]
        data = self.full_layout if len(shown) == len(self.full_layout.nodes) else sub_layout(self.full_layout, shown)
        self.layout_data = data
        sizes = node_sizes(data.size)
        kinds = [(NODE_STYLE[k][0], pg.mkColor(NODE_STYLE[k][1]).getRgb(), pg.mkColor(NODE_OUTLINE).getRgb(),
                  data.x[data.kind == k], data.y[data.kind == k], sizes[data.kind == k]) for k in NODE_STYLE]
        self.edges_item.set_buckets(edge_buckets(data), [k for k in kinds if len(k[3])])
        brushes = {k: pg.mkBrush(b) for k, (_s, b) in NODE_STYLE.items()}
        symbols = np.array([NODE_STYLE[int(k)][0] for k in range(4)], dtype=object)[data.kind]
        self.nodes_item.setData(x=data.x, y=data.y, size=sizes, symbol=list(symbols),
                                brush=[brushes[int(k)] for k in data.kind], pen=pg.mkPen(NODE_OUTLINE, width=0.5),
                                data=self.shown)
        index = self._index()
        for s in self.supernodes:
            members = [index[i] for i in s[1:] if i in index and index[i] in set(shown)]
            if members:
                label = pg.TextItem(s[0], color="#6a3d9a", anchor=(0.5, 1.2), fill=(255, 255, 255, 200))
                label.setZValue(20)
                label.setPos(float(np.mean(self.full_layout.x[members])), float(np.max(self.full_layout.y[members])))
                self.plot.addItem(label)
                self.supernode_items.append(label)
        self._draw_marks()
        plot = self.plot.getPlotItem()
        self._show_axes(True)
        n_rows = data.n_rows
        plot.getAxis("left").setTicks([[(0, "Emb")] + [(r, f"L{r - 1}") for r in range(1, n_rows - 1)]
                                       + [(n_rows - 1, "Logit")]])
        tokens = data.prompt_tokens
        plot.getAxis("bottom").setTicks([[(i, t.replace("\n", "⏎")) for i, t in enumerate(tokens)]])
        if reset_range:
            plot.setXRange(-0.6, max(len(tokens), 1) - 0.4, padding=0)
            plot.setYRange(-0.6, n_rows - 0.4, padding=0)

    def _draw_marks(self) -> None:
        """Rings: the clicked node's neighbourhood (orange), pinned nodes (black), search hits (magenta);
        supernode members (purple); and the neighbourhood's edges."""
        full = self.full_layout
        shown = set(self.shown.tolist())
        nodes, edges = self.highlighted
        index = self._index()
        rings: dict[int, tuple[str, float]] = {}
        for s in self.supernodes:
            for i in s[1:]:
                if i in index:
                    rings[index[i]] = ("#6a3d9a", 2.0)
        for i in nodes:
            rings[i] = (HIGHLIGHT, 2.5)
        for p in self.pinned:
            if p in index:
                rings[index[p]] = ("#000000", 2.5)
        for i in self.found:
            rings[i] = ("#d000d0", 3.0)
        chosen = [i for i in rings if i in shown]
        self.marks_item.setData(x=full.x[chosen], y=full.y[chosen], size=node_sizes(full.size[chosen]) + 6,
                                brush=None, pen=[pg.mkPen(rings[i][0], width=rings[i][1]) for i in chosen],
                                symbol="o")
        keep = [e for e in edges.tolist() if full.edges[e, 0] in shown and full.edges[e, 1] in shown]
        pairs = full.edges[keep] if keep else np.zeros((0, 2), int)
        xs = np.stack([full.x[pairs[:, 0]], full.x[pairs[:, 1]]], axis=1).ravel()
        ys = np.stack([full.y[pairs[:, 0]], full.y[pairs[:, 1]]], axis=1).ravel()
        self.highlight_edges.setData(xs, ys, connect="pairs")

    # -- hover, click, pin, group, label, search ---------------------------------------------------
    def _nearest(self, item, points, event):
        point = points[0]
        if event is not None and len(points) > 1 and hasattr(event, "scenePos"):
            here = event.scenePos()
            point = min(points, key=lambda p: (item.mapToScene(p.pos()) - here).manhattanLength())
        return int(point.data())

    def _on_hovered(self, item, points, event=None) -> None:
        if len(points) == 0 or self.full_layout is None:
            return
        i = self._nearest(item, points, event)
        node = self.full_layout.nodes[i]
        self.hover.setText("hover: " + node_text(node, self.labels.get(node["node_id"], "")))

    def _on_clicked(self, item, points, event=None) -> None:
        if len(points) == 0 or self.full_layout is None:
            return
        self.select_node(self._nearest(item, points, event))

    def select_node(self, i: int) -> None:
        """Click: the node's details, its strongest ancestors and descendants highlighted, its dashboard."""
        self.selected = i
        node = self.full_layout.nodes[i]
        self.highlighted = strongest_neighbourhood(self.full_layout, i)
        self.details.setText(node_text(node, self.labels.get(node["node_id"], ""))
                             + f" &nbsp;·&nbsp; {len(self.highlighted[0]) - 1} strongest ancestors and descendants")
        self._draw_marks()
        self._show_dashboard(node)

    def node_id(self) -> str | None:
        return None if self.selected is None else self.full_layout.nodes[self.selected]["node_id"]

    def toggle_pin(self) -> None:
        nid = self.node_id()
        if nid is None:
            self.details.setText("Click a node first, then Pin.")
            return
        if nid in self.pinned:
            self.pinned.remove(nid)
        else:
            self.pinned.append(nid)
        self._redraw() if self.subgraph_box.isChecked() else self._draw_marks()
        self._refresh_edit_list()

    def group_dialog(self) -> None:
        if len(self.pinned) < 2:
            self.details.setText("Pin two or more nodes, then Group… makes them one labelled supernode.")
            return
        label, ok = QInputDialog.getText(self, "Supernode", f"Label for the {len(self.pinned)} pinned nodes:")
        if ok and label.strip():
            self.group(label.strip(), list(self.pinned))

    def group(self, label: str, node_ids: list[str]) -> None:
        members = set(node_ids)
        self.supernodes = [[s[0], *[i for i in s[1:] if i not in members]] for s in self.supernodes]
        self.supernodes = [s for s in self.supernodes if len(s) > 1] + [[label, *node_ids]]
        self._redraw()

    def label_dialog(self) -> None:
        nid = self.node_id()
        if nid is None:
            self.details.setText("Click a node first, then Label….")
            return
        text, ok = QInputDialog.getText(self, "Label", f"Your label for {nid}:", text=self.labels.get(nid, ""))
        if ok:
            self.annotate(nid, text.strip())

    def annotate(self, node_id: str, text: str) -> None:
        if text:
            self.labels[node_id] = text
        else:
            self.labels.pop(node_id, None)
        if self.selected is not None and self.node_id() == node_id:
            self.select_node(self.selected)

    def search(self) -> None:
        if self.full_layout is None:
            return
        self.found = search_nodes(self.full_layout, self.search_box.text(), self.labels)
        self._draw_marks()
        self.details.setText(f"{len(self.found)} nodes match {html.escape(self.search_box.text())!r}"
                             + (": " + ", ".join(html.escape(self.full_layout.nodes[i]["node_id"])
                                                 for i in self.found[:12])
                                if self.found else ""))
        if len(self.found) == 1:
            self.select_node(self.found[0])

    # -- the node's dashboard (the Features panel's) ------------------------------------------------
    def _feature_of(self, node: dict) -> tuple[int, int, int] | None:
        if node["feature_type"] != "cross layer transcoder":
            return None
        layer, feature, pos = (int(v) for v in str(node["node_id"]).split("_"))
        return layer, pos, feature

    def _show_dashboard(self, node: dict) -> None:
        from ...app.graphs import graph_feature_tokens

        f = self._feature_of(node)
        if f is None or self.result is None or self.state is None or self.state.loaded is None:
            self.dashboard.clear("A feature node of a graph computed here has a dashboard (its transcoders are "
                                 "known); this node: " + node_text(node))
            return
        layer, pos, feature = f
        self.dashboard.clear_contexts()
        self.dashboard.header.setText(f"<b>Feature {feature}</b> of layer {layer} "
                                      f"({html.escape(self.transcoders_folder)}),"
                                      f" active at position {pos}: activation {node.get('activation') or 0:.4g}")
        self.dashboard.show_decoder_tokens([], [])
        self.state.run(graph_feature_tokens, self.state.loaded, self.result.ctx.transcoders, layer, feature, 10,
                       on_result=lambda r: self.dashboard.show_decoder_tokens(*r),
                       on_error=lambda exc, tb: self.dashboard.show_decoder_tokens([], [], str(exc)),
                       parts=(MODEL,), owner=self)

    def run_dashboard(self) -> None:
        from ...app.graphs import graph_feature_dashboard

        node = self.full_layout.nodes[self.selected] if self.selected is not None and self.full_layout else None
        f = self._feature_of(node) if node is not None else None
        if f is None or self.result is None:
            self.dashboard.status.setText("Click a feature node of a graph computed here first.")
            return
        layer, _pos, feature = f
        self.dashboard.run_contexts(self.state, f"feature {feature}", graph_feature_dashboard, self.state.loaded,
                                    self.result.ctx.transcoders, layer, feature, self.dashboard.text_file,
                                    parts=(MODEL,), owner=self)

    # -- intervention ---------------------------------------------------------------------------
    def feature_edits(self) -> list:
        """The pinned feature nodes of the computed graph as FeatureSet edits (how and value from the boxes)."""
        from ...core.graphs.edits import FeatureSet

        if self.result is None or self.full_layout is None:
            return []
        index, out = self._index(), []
        for nid in self.pinned:
            f = self._feature_of(self.full_layout.nodes[index[nid]]) if nid in index else None
            row = self.result.feature_row(*f) if f is not None else None
            if row is not None:
                out.append(FeatureSet(row, self.how_box.currentText(), float(self.value_box.value())))
        return out

    def _refresh_edit_list(self) -> None:
        self.edit_list.clear()
        if self.result is None:
            self.edit_status.setText("Pin feature nodes of a graph computed here to edit them.")
            return
        index = self._index()
        for nid in self.pinned:
            if nid in index and self.full_layout.nodes[index[nid]]["feature_type"] == "cross layer transcoder":
                self.edit_list.addItem(f"{nid}  ({self.labels.get(nid, '')})" if nid in self.labels else nid)
        n = self.edit_list.count()
        self.edit_status.setText(f"{n} pinned features to edit." if n else "Pin feature nodes to edit them.")

    def run_intervention(self) -> None:
        from ...app.graphs import intervene

        edits = self.feature_edits()
        if not edits:
            self.edit_status.setText("Pin one or more feature nodes of a graph computed here first.")
            return
        live = self.live_button.isChecked()
        self.edit_status.setText("Running…")
        self.run_edit_button.setEnabled(False)
        self._edit_job = self.state.run(
            intervene, self.result, edits, live, on_result=lambda r: self._show_logits(edits, live, *r),
            on_error=lambda exc, tb: self.edit_status.setText(f"Cannot run the edit: {exc}"),
            on_finished=lambda: self.run_edit_button.setEnabled(True), parts=(MODEL, INPUT), owner=self)

    def _show_logits(self, edits, live: bool, before, after) -> None:
        from ...app.graphs import logit_rows

        self.edit_result = (edits, before, after, live)
        rows = logit_rows(self.result, before, after)
        fill_table(self.logits_table, ["token", "logit before", "after", "p before", "p after"],
                   [[repr(r[0]), f"{r[2]:.4g}", f"{r[3]:.4g}", f"{r[4]:.3f}", f"{r[5]:.3f}"] for r in rows],
                   align_right=(1, 2, 3, 4))
        # (a section's own mode is set once it exists: the token the rest)
        self.logits_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        how = edits[0].how
        self.edit_status.setText(f"{len(edits)} features {how}" + (f" ({edits[0].value:g})" if how != "zero" else "")
                                 + (", live model" if live else ", attention frozen")
                                 + ": the logits before and after.")

    def add_whatif_edits(self) -> None:
        from ...app.graphs import whatif_edits

        edits = self.feature_edits()
        if not edits or self.state is None:
            self.edit_status.setText("Pin one or more feature nodes of a graph computed here first.")
            return
        try:
            ivs = whatif_edits(self.result, edits, len(self.state.token_ids))
        except ValueError as exc:
            self.edit_status.setText(str(exc))
            return
        self.state.edits.add_all(ivs)  # an edit of the same features (its name) replaces the earlier one
        self.edit_status.setText(f"Added {len(ivs)} What if edits (the Model panel's edit list lists them).")

"""Graph panel: an attribution graph (the `graph` command's JSON, or one from circuit-tracer or Neuronpedia)
drawn as rows of layers and columns of token positions.

Nodes: features (circles), error nodes (grey squares), token embeddings (green triangles, bottom row) and
logits (orange diamonds, top row), sized by influence (core.graphs.layout). Edges: one line per kept link,
blue for a positive weight, red for a negative one, thicker and more opaque for a larger |weight| (three
width classes per sign, so a graph of any size is six line items). A click on a node shows its id, label,
activation and influence.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from ...core.graphs.layout import GraphLayout, layout, load_graph_json

NODE_STYLE = {  # KINDS order: symbol, brush
    0: ("o", "#4c72b0"),
    1: ("s", "#9a9a9a"),
    2: ("t1", "#2ca02c"),
    3: ("d", "#ff7f0e"),
}
POSITIVE, NEGATIVE = (31, 119, 180), (214, 39, 40)


class GraphPanel(QWidget):
    help_text = (
        "<b>Attribution graph</b> (Ameisen et al. 2025): the circuit behind one prediction in the local "
        "replacement model (MLPs replaced by transcoders, attention patterns and norm scales frozen). "
        "Rows are layers (token embeddings at the bottom, the predicted logits on top), columns token "
        "positions. An edge s &rarr; t is the direct effect of s on t's pre-activation, "
        "A<sub>ts</sub> = a<sub>s</sub> W<sub>dec,s</sub> &middot; J &middot; W<sub>enc,t</sub>, along linear "
        "paths only; blue is positive, red negative. Nodes are sized by their influence on the logits "
        "(the normalised adjacency's series A + A&sup2; + &hellip; weighted by the logits' probabilities). "
        "Open a GRAPH.json made by <code>python -m desktop_app graph</code>, circuit-tracer or Neuronpedia "
        "with File &rsaquo; Open Attribution Graph. Click a node for its details."
    )

    def __init__(self, state=None, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.layout_data: GraphLayout | None = None
        self.path: Path | None = None
        self.open_button = QPushButton("Open graph…")
        self.open_button.clicked.connect(self.open_dialog)
        self.summary = QLabel("No graph open: File › Open Attribution Graph, or Open graph…")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(self.open_button)
        top.addWidget(self.summary, 1)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.getPlotItem().setLabel("bottom", "token position")
        self.edge_items: list[pg.PlotCurveItem] = []
        self.nodes_item = pg.ScatterPlotItem(pxMode=True)
        self.nodes_item.setZValue(10)
        self.nodes_item.sigClicked.connect(self._on_clicked)
        self.plot.addItem(self.nodes_item)
        self.details = QLabel("")
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        column = QVBoxLayout(self)
        column.addLayout(top)
        column.addWidget(self.plot, 1)
        column.addWidget(self.details)

    # -- opening -------------------------------------------------------------------------------
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
        self.path, self.layout_data = Path(path), data
        meta = model["metadata"]
        self.summary.setText(
            f"<b>{html.escape(str(meta.get('slug', '')))}</b> &nbsp; {html.escape(str(meta.get('prompt', '')))!s} "
            f"&nbsp; <span style='color:#666'>{len(data.nodes)} nodes, {len(data.edges)} edges, transcoders "
            f"{html.escape(str(meta.get('scan', '')))}</span>")
        self._draw(data)
        return True

    # -- drawing -------------------------------------------------------------------------------
    def _draw(self, data: GraphLayout) -> None:
        for item in self.edge_items:
            self.plot.removeItem(item)
        self.edge_items = []
        if len(data.edges):
            top = np.abs(data.weights).max() or 1.0
            strength = np.abs(data.weights) / top
            for sign, colour in ((1, POSITIVE), (-1, NEGATIVE)):
                for lo, hi, width, alpha in ((0.0, 0.1, 0.6, 50), (0.1, 0.4, 1.4, 110), (0.4, 1.01, 2.6, 200)):
                    chosen = (np.sign(data.weights) == sign) & (strength >= lo) & (strength < hi)
                    if not chosen.any():
                        continue
                    pairs = data.edges[chosen]
                    xs = np.stack([data.x[pairs[:, 0]], data.x[pairs[:, 1]]], axis=1).ravel()
                    ys = np.stack([data.y[pairs[:, 0]], data.y[pairs[:, 1]]], axis=1).ravel()
                    item = pg.PlotCurveItem(xs, ys, connect="pairs", pen=pg.mkPen((*colour, alpha), width=width))
                    self.plot.addItem(item)
                    self.edge_items.append(item)
        spots = []
        for i, node in enumerate(data.nodes):
            symbol, brush = NODE_STYLE[int(data.kind[i])]
            spots.append({"pos": (data.x[i], data.y[i]), "size": 6 + 16 * float(np.clip(data.size[i], 0, 1)),
                          "symbol": symbol, "brush": pg.mkBrush(brush), "pen": pg.mkPen("#333", width=0.5),
                          "data": i})
        self.nodes_item.setData(spots)
        plot = self.plot.getPlotItem()
        n_rows = data.n_rows
        plot.getAxis("left").setTicks([[(0, "Emb")] + [(r, f"L{r - 1}") for r in range(1, n_rows - 1)]
                                       + [(n_rows - 1, "Logit")]])
        tokens = data.prompt_tokens
        plot.getAxis("bottom").setTicks([[(i, t.replace("\n", "⏎")) for i, t in enumerate(tokens)]])
        plot.setXRange(-0.6, max(len(tokens), 1) - 0.4, padding=0)
        plot.setYRange(-0.6, n_rows - 0.4, padding=0)

    def _on_clicked(self, item, points, event=None) -> None:
        if len(points) == 0 or self.layout_data is None:
            return
        point = points[0]
        if event is not None and len(points) > 1:  # overlapping symbols: the one whose centre is nearest
            click = event.scenePos()
            point = min(points, key=lambda p: (item.mapToScene(p.pos()) - click).manhattanLength())
        node = self.layout_data.nodes[int(point.data())]
        parts = [f"<b>{html.escape(node['node_id'])}</b>", html.escape(node["feature_type"])]
        if node.get("clerp"):
            parts.append(html.escape(node["clerp"]))
        if node.get("activation") is not None:
            parts.append(f"activation {node['activation']:.4g}")
        if node.get("influence") is not None:
            parts.append(f"cumulative influence {node['influence']:.3f}")
        self.details.setText(" &nbsp;·&nbsp; ".join(parts))

"""Issue 37 §3 (a first step): the Graph panel opens a graph JSON from File > Open Attribution Graph, draws
its nodes by layer row and position column and its links by sign, and a click on a node shows it."""
from __future__ import annotations

import html
import json
import os

import numpy as np
import pytest
from PySide6.QtCore import QPointF, QSettings, Qt
from PySide6.QtWidgets import QFileDialog

from desktop_app.cli import main
from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.graphs.transcoders import random_transcoders
from desktop_app.core.tokenizer import char_tokenizer
from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.panels.graph import GraphPanel
from desktop_app.ui.state import AppState


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@pytest.fixture
def graph_json(tmp_path):
    tok = char_tokenizer("abcdefgh ", specials=["<pad>", "<s>"])
    cfg = ModelConfig.llama(vocab_size=tok.vocab_size, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=32,
                            context_length=32)
    save_model_folder(new_model(cfg, seed=0).eval(), tmp_path / "m", tokenizer=tok)
    random_transcoders(tmp_path / "clt", 3, 16, 24, cross_layer=True, seed=2)
    out = tmp_path / "g.json"
    assert main(["graph", str(tmp_path / "m"), "--transcoders", str(tmp_path / "clt"), "--prompt", "abc dea",
                 "--out", str(out)]) == 0
    return out


def test_graph_panel_opens_from_the_file_menu_and_shows_a_clicked_node(qtbot, graph_json, monkeypatch, tmp_path):
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.resize(1100, 700)
    window.show()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(graph_json), "Graph JSON (*.json)"))
    window.open_graph_action.trigger()
    panel = window.panel("Graph")
    assert isinstance(panel, GraphPanel) and window.tabs.currentWidget().title == "Graph"
    data = panel.layout_data
    assert data is not None and "g</b>" in panel.summary.text()
    kinds = {n["feature_type"]: data.y[i] for i, n in enumerate(data.nodes)}
    assert kinds["embedding"] == 0 and kinds["logit"] == 4  # 3 layers: rows Emb, L0..L2, Logit
    assert len(panel.nodes_item.points()) == len(data.nodes)
    assert panel.edges_item.n_segments == len(data.edges) > 0
    assert {b[0][0] for b in panel.edges_item.buckets} >= {31, 214}  # both signs drawn
    qtbot.waitExposed(window)
    # click the most influential feature node where it is drawn
    i = int(np.argmax(np.where(data.kind == 0, data.size, -1)))
    view = panel.plot.getPlotItem().vb
    scene_pos = view.mapViewToScene(QPointF(data.x[i], data.y[i]))
    widget_pos = panel.plot.mapFromScene(scene_pos)
    qtbot.mouseClick(panel.plot.viewport(), Qt.MouseButton.LeftButton, pos=widget_pos)
    qtbot.waitUntil(lambda: panel.details.text() != "", timeout=3000)
    assert data.nodes[i]["node_id"] in panel.details.text(), (panel.details.text(), data.nodes[i])
    assert "activation" in panel.details.text()
    shot = os.environ.get("GRAPH_PANEL_SCREENSHOT")
    if shot:
        qtbot.wait(200)
        window.grab().save(shot)
        panel.grab().save(shot.replace(".png", "-panel.png"))


def test_a_file_that_is_not_a_graph_is_named_in_one_line(qtbot, tmp_path):
    panel = GraphPanel()
    qtbot.addWidget(panel)
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {}, "nodes": [], "links": []}')
    assert not panel.open_graph(bad)
    assert "bad.json" in panel.summary.text() and "qParams" in panel.summary.text()
    assert panel.layout_data is None


def test_nodes_move_as_the_edge_image_while_the_view_moves(qtbot, graph_json):
    """While the view moves, the nodes are painted by the edge layer's image (drawn into it with the edges)
    and the node item skips its own painting; once the view is still it paints again and the image is redrawn."""
    panel = GraphPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 600)
    panel.show()
    qtbot.waitExposed(panel)
    assert panel.open_graph(graph_json)
    layer, data = panel.edges_item, panel.layout_data
    qtbot.waitUntil(layer.is_current, timeout=10_000)
    assert sum(len(p[3]) for p in layer.points) == len(data.nodes)
    # the image holds a marker where each node is: the pixel at a logit node's centre is opaque
    i = int(np.flatnonzero(data.kind == 3)[0])
    vb = panel.plot.getPlotItem().vb
    image, rect = layer._image, layer._image_rect
    px = int((data.x[i] - rect.left()) * image.width() / rect.width())
    py = int((rect.bottom() - data.y[i]) * image.height() / rect.height())
    assert image.pixelColor(px, py).alpha() == 255
    renders = layer.renders
    (x0, x1), _ = vb.viewRange()
    vb.setXRange(x0 + 0.3, x1 + 0.3, padding=0)
    panel.plot.viewport().repaint()
    assert layer.moving_with_view()  # the node item skips its paint: the moved image shows the nodes
    qtbot.waitUntil(lambda: not layer.moving_with_view(), timeout=5_000)  # still: the node item paints again
    qtbot.waitUntil(layer.is_current, timeout=10_000)
    assert layer.renders == renders + 1  # one image for the new view, not one per repaint


def _pixels(widget) -> np.ndarray:
    image = widget.grab().toImage()
    return np.frombuffer(bytes(image.constBits()), np.uint8).reshape(image.height(), -1)


def test_label_axes_draw_what_pyqtgraphs_axes_draw(qtbot):
    """The panel's axes (painted directly, each label laid out once) look as pyqtgraph's AxisItem draws them."""
    import pyqtgraph as pg

    from desktop_app.ui.panels.graph import _LabelAxis

    ticks = {"left": [[(0, "Emb"), (1, "L0"), (2, "L1"), (3, "Logit")]],
             "bottom": [[(i, t) for i, t in enumerate(["<s>", "the", " Wh", "ite", " Rabbit", " was"])]]}
    plots = []
    for axes in ({"left": _LabelAxis("left"), "bottom": _LabelAxis("bottom")}, {}):
        plot = pg.PlotWidget(background="w", axisItems=axes or None)
        qtbot.addWidget(plot)
        plot.resize(600, 400)
        for name, t in ticks.items():
            plot.getPlotItem().getAxis(name).setTicks(t)
        plot.getPlotItem().setLabel("bottom", "token position")
        plot.setXRange(0.6, 5.3, padding=0)  # "<s>" out of view
        plot.setYRange(-0.5, 3.5, padding=0)
        plot.show()
        qtbot.waitExposed(plot)
        plots.append(plot)
    ours, theirs = (_pixels(p) for p in plots)
    assert set(plots[0].getPlotItem().getAxis("bottom")._texts) == {"the", " Wh", "ite", " Rabbit", " was"}
    assert ours.shape == theirs.shape and (ours != theirs).mean() < 0.001


@pytest.mark.parametrize("damage", ["NaN", "-Infinity"])
def test_a_graph_with_nan_or_infinite_values_is_refused_and_the_shown_one_kept(qtbot, graph_json, monkeypatch,
                                                                                tmp_path, damage):
    """Python's json reads NaN and Infinity: such a file would draw nothing sensible. File > Open names it and the
    value in the summary line; the graph on screen stays."""
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    chosen = [str(graph_json)]
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (chosen[0], "Graph JSON (*.json)"))
    window.open_graph_action.trigger()
    panel = window.panel("Graph")
    shown, drawn = panel.model_json, panel.layout_data
    assert drawn is not None
    model = json.loads(graph_json.read_text())
    feature = next(n for n in model["nodes"] if n["feature_type"] == "cross layer transcoder")
    feature["influence"] = float(damage.replace("Infinity", "inf"))
    bad = tmp_path / "damaged.json"
    bad.write_text(json.dumps(model))
    assert damage in bad.read_text()
    chosen[0] = str(bad)
    window.open_graph_action.trigger()
    summary = html.unescape(panel.summary.text())  # the summary line is rich text
    assert "damaged.json" in summary and f"node '{feature['node_id']}' has influence" in summary
    assert "not a finite number" in summary and "<br" not in summary
    assert panel.model_json is shown and panel.layout_data is drawn and panel.path == graph_json
    assert len(panel.nodes_item.points()) == len(drawn.nodes)

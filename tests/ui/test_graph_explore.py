"""Issue 37 §3-4: the Graph panel computes a graph for the model and text on screen (a transcoder folder
chosen in a dialog, a worker), and is driven through its real widgets: the node slider prunes again without
computing again (against app.graphs.pruned_json), a click highlights the node's strongest ancestors and
descendants, hover shows a node, pin / pinned-only subgraph / group / label / search, an intervention frozen
(against core.graphs.edits.frozen_logits) and live (against the model run with the same edits), "Add as What
if edits" (the app's edit list), export of the JSON (qParams pinnedIds, supernodes, clerps), PNG and SVG, and a
new text making the computed graph go."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPointF, Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog

from desktop_app.app.graphs import pruned_json
from desktop_app.core.graphs.edits import FeatureSet, feature_interventions, frozen_logits
from desktop_app.core.graphs.files import check_graph_json
from desktop_app.core.graphs.transcoders import random_transcoders

from .walkthrough import click_panel_tab, click_tab, open_window

TEXT = "Alice and the rabbit"


@pytest.fixture
def graph_panel(qtbot, model_dirs, isolated_user_files, error_watch, tmp_path, monkeypatch):
    w, state = open_window(qtbot, model_dirs["llama"], text=TEXT, watch=error_watch)
    random_transcoders(tmp_path / "clt", 2, 32, 48, cross_layer=True, seed=3)
    panel = click_panel_tab(qtbot, w, "Graph")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path / "clt")))
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.result is not None and panel.compute_button.isEnabled(), timeout=60_000)
    return w, state, panel


def _click_node(qtbot, panel, i: int) -> None:
    """Click full_layout node i where it is drawn."""
    d = panel.full_layout
    view = panel.plot.getPlotItem().vb
    pos = panel.plot.mapFromScene(view.mapViewToScene(QPointF(d.x[i], d.y[i])))
    qtbot.mouseClick(panel.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def _features(panel) -> list[int]:
    """Feature nodes, most influential first."""
    d = panel.full_layout
    return [int(i) for i in np.argsort(-d.size) if d.kind[i] == 0]


def test_compute_prune_click_pin_group_search_intervene_export(qtbot, graph_panel, tmp_path, monkeypatch):
    w, state, panel = graph_panel
    w.resize(1500, 950)
    qtbot.waitExposed(w)
    result = panel.result
    assert result.model_name == state.loaded.name and state.loaded.name in panel.summary.text()
    assert result.ids[-len(state.token_ids):] == list(state.token_ids)
    n_drawn = len(panel.full_layout.nodes)
    assert len(panel.nodes_item.points()) == n_drawn == len(pruned_json(result, 0.8, 0.98)["nodes"])
    assert len(panel.edges_item.buckets) <= 6 and panel.edges_item.n_segments == len(panel.full_layout.edges)
    qtbot.waitUntil(panel.edges_item.is_current, timeout=10_000)  # the edges drawn for the view shown
    assert panel.edges_item.renders >= 1

    # the node slider prunes again (keyboard on the real slider), as pruned_json does at that threshold
    panel.node_slider.setFocus()
    for _ in range(3):
        qtbot.keyClick(panel.node_slider, Qt.Key.Key_PageDown)
    low = panel.thresholds[0]
    assert low < 0.8
    want = len(pruned_json(result, low, 0.98)["nodes"])
    assert want != n_drawn  # the threshold moved enough to change the graph
    qtbot.waitUntil(lambda: len(panel.full_layout.nodes) == want, timeout=10_000)
    assert panel.result is result  # not computed again

    # hover, then click the most influential feature: its strongest in-edge's source is highlighted
    feats = _features(panel)
    top = feats[0]
    d = panel.full_layout
    view = panel.plot.getPlotItem().vb
    qtbot.mouseMove(panel.plot.viewport(), panel.plot.mapFromScene(view.mapViewToScene(QPointF(d.x[top], d.y[top]))))
    qtbot.waitUntil(lambda: d.nodes[top]["node_id"] in panel.hover.text(), timeout=3000)
    _click_node(qtbot, panel, top)
    qtbot.waitUntil(lambda: panel.selected == top, timeout=3000)
    incoming = np.nonzero(d.edges[:, 1] == top)[0]
    strongest = int(d.edges[incoming[np.argmax(np.abs(d.weights[incoming]))], 0])
    assert strongest in panel.highlighted[0] and len(panel.highlight_edges.xData) >= 2
    assert d.nodes[top]["node_id"] in panel.details.text()
    qtbot.waitUntil(lambda: panel.dashboard.promoted_table.rowCount() > 0, timeout=10_000)  # decoder tokens
    # the Features panel's dashboard: the feature's top contexts over a text file, against the transcoders'
    # own encoder on the model's recorded input (core.graphs.replacement.freeze)
    from desktop_app.core.graphs.replacement import freeze
    from desktop_app.core.inputs import text_file_ids

    text_file = tmp_path / "text.txt"
    text_file.write_text("Alice and the rabbit hole, and the rabbit ran.")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(text_file), "")))
    qtbot.mouseClick(panel.dashboard.file_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.dashboard.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dashboard.contexts is not None, timeout=20_000)
    layer, feature, _pos = (int(v) for v in d.nodes[top]["node_id"].split("_"))
    tc = result.ctx.transcoders
    file_ids = text_file_ids(state.loaded, text_file)
    recorded = freeze(state.loaded.model, list(file_ids), tc.input_hook).feature_in[layer]
    acts = tc.encode(layer, recorded.float())[:, feature]
    assert panel.dashboard.contexts.feature == feature
    rows = panel.dashboard.contexts.rows
    assert (rows[0][1] if rows else 0.0) == pytest.approx(max(float(acts.max()), 0.0), rel=1e-4, abs=1e-5)
    assert panel.dashboard.contexts.active_tokens == int((acts > 0).sum())

    # pin two features, group them, label one, the pinned-only subgraph
    qtbot.mouseClick(panel.pin_button, Qt.MouseButton.LeftButton)
    second = feats[1]
    _click_node(qtbot, panel, second)
    qtbot.waitUntil(lambda: panel.selected == second, timeout=3000)
    qtbot.mouseClick(panel.pin_button, Qt.MouseButton.LeftButton)
    ids = [d.nodes[top]["node_id"], d.nodes[second]["node_id"]]
    assert panel.pinned == ids and panel.edit_list.count() == 2
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("my supernode", True)))
    qtbot.mouseClick(panel.group_button, Qt.MouseButton.LeftButton)
    assert panel.supernodes == [["my supernode", *ids]] and len(panel.supernode_items) == 1
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("rabbit detector", True)))
    qtbot.mouseClick(panel.label_button, Qt.MouseButton.LeftButton)
    assert panel.labels == {ids[1]: "rabbit detector"}
    qtbot.mouseClick(panel.subgraph_box, Qt.MouseButton.LeftButton)
    assert len(panel.layout_data.nodes) == 2 and len(panel.nodes_item.points()) == 2
    qtbot.mouseClick(panel.subgraph_box, Qt.MouseButton.LeftButton)
    assert len(panel.nodes_item.points()) == len(d.nodes)

    # search by label, then by feature id
    qtbot.keyClicks(panel.search_box, "rabbit det")
    qtbot.keyClick(panel.search_box, Qt.Key.Key_Return)
    assert panel.found == [second]
    feature_id = ids[0].split("_")[1]
    panel.search_box.clear()
    qtbot.keyClicks(panel.search_box, feature_id)
    qtbot.keyClick(panel.search_box, Qt.Key.Key_Return)
    assert top in panel.found and all(d.nodes[i]["node_id"].split("_")[1] == feature_id for i in panel.found)

    # intervene: zero the two pinned features, attention frozen, then live
    rows = []
    for nid in ids:
        layer, feature, pos = (int(v) for v in nid.split("_"))
        a = result.ctx.active
        rows.append(int(((a[:, 0] == layer) & (a[:, 1] == pos) & (a[:, 2] == feature)).nonzero()[0, 0]))
    edits = [FeatureSet(r, "zero") for r in rows]
    click_tab(qtbot, panel.side, "Intervene")
    panel.how_box.setCurrentText("zero")
    qtbot.mouseClick(panel.run_edit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.edit_result is not None, timeout=10_000)
    want = frozen_logits(result.ctx, edits)[-1].float()
    torch.testing.assert_close(panel.edit_result[2], want)
    assert panel.logits_table.rowCount() >= 1 and not panel.edit_result[3]
    panel.edit_result = None
    qtbot.mouseClick(panel.live_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.run_edit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.edit_result is not None, timeout=10_000)
    model = state.loaded.model
    with torch.no_grad():
        live = model(torch.tensor([result.ids]), interventions=feature_interventions(result.ctx, edits)).logits[0, -1]
    torch.testing.assert_close(panel.edit_result[2], live.float())
    assert panel.edit_result[3] and not torch.allclose(panel.edit_result[2], panel.edit_result[1])

    # Add as What if edits: the app's edit list holds them, the text is traced with them, the graph stays
    before = len(state.interventions)
    qtbot.mouseClick(panel.add_edits_button, Qt.MouseButton.LeftButton)
    assert len(state.interventions) > before
    assert all(iv.target.endswith(".mlp.out") and iv.value.shape[0] == len(state.token_ids)
               for iv in state.interventions[before:])
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert panel.result is result

    # export: the JSON keeps the pins, supernodes and labels; PNG and SVG of the view
    out = tmp_path / "annotated.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "Graph JSON (*.json)")))
    qtbot.mouseClick(panel.save_json_button, Qt.MouseButton.LeftButton)
    saved = json.loads(out.read_text())
    check_graph_json(saved)
    assert saved["qParams"]["pinnedIds"] == ids
    assert saved["qParams"]["supernodes"] == [["my supernode", *ids]]
    assert saved["qParams"]["clerps"] == [[ids[1], "rabbit detector"]]
    for suffix, head in ((".png", b"\x89PNG"), (".svg", b"<")):
        path = tmp_path / f"graph{suffix}"
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, p=path, **k: (str(p), "")))
        qtbot.mouseClick(panel.export_bar.buttons[suffix[1:].upper()], Qt.MouseButton.LeftButton)
        assert path.read_bytes().lstrip()[:len(head)] == head
    # the saved JSON opens again with its annotations
    panel.open_graph(out)
    assert panel.pinned == ids and panel.labels == {ids[1]: "rabbit detector"} and panel.result is None

    # a new text: a computed graph for the old one never stays on show
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.result is not None and panel.compute_button.isEnabled(), timeout=60_000)
    state.set_text("the rabbit hole")
    qtbot.waitUntil(lambda: panel.result is None and panel.full_layout is None, timeout=30_000)
    assert "changed" in panel.summary.text()


def test_cancel_stops_the_computation(qtbot, model_dirs, isolated_user_files, error_watch, tmp_path, monkeypatch):
    import threading

    import desktop_app.app.graphs as graphs

    w, state = open_window(qtbot, model_dirs["llama"], text=TEXT, watch=error_watch)
    random_transcoders(tmp_path / "clt", 2, 32, 48, cross_layer=True, seed=3)
    panel = click_panel_tab(qtbot, w, "Graph")
    started, release = threading.Event(), threading.Event()
    real = graphs.compute_graph

    def held(*args, job=None, **kwargs):
        started.set()
        release.wait(10)
        return real(*args, job=job, **kwargs)

    monkeypatch.setattr(graphs, "compute_graph", held)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path / "clt")))
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    assert started.wait(10) and panel.cancel_button.isEnabled()
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    release.set()
    qtbot.waitUntil(lambda: panel.compute_button.isEnabled(), timeout=30_000)
    assert panel.result is None and "Cancelled" in panel.summary.text()


def test_the_edge_image_puts_a_segment_where_the_data_says(qtbot):
    from PySide6.QtCore import QRectF

    from desktop_app.ui.widgets.edge_layer import render_edges

    # (0, 0) -> (1, 1) with y up: from the image's bottom-left corner to its top-right one
    image = render_edges([((255, 0, 0, 255), 2.0, np.array([0.0, 1.0]), np.array([0.0, 1.0]))], QRectF(0, 0, 1, 1),
                         100, 100)
    assert image.pixelColor(50, 50).red() == 255 and image.pixelColor(50, 50).alpha() == 255
    assert image.pixelColor(10, 90).alpha() > 0 and image.pixelColor(10, 10).alpha() == 0
    # many segments, all in the right half: nothing drawn in the left half (no stray segment)
    rng = np.random.default_rng(0)
    xs, ys = 0.55 + 0.45 * rng.random(10_000), rng.random(10_000)
    image = render_edges([((0, 0, 255, 120), 1.0, xs, ys)], QRectF(0, 0, 1, 1), 200, 100)
    alpha = np.array([[image.pixelColor(x, y).alpha() for x in range(0, 100, 3)] for y in range(0, 100, 3)])
    assert alpha.max() == 0
    assert image.pixelColor(150, 50).alpha() > 0 or image.pixelColor(160, 40).alpha() > 0


def test_bench_graph_view_prints_frames_per_second(qtbot, capsys):
    """The benchmark on a small synthetic graph (the 10,000-node figure is in the report): it draws frames."""
    from desktop_app.benchmarks.graph_view import main

    out = main(["--nodes", "1000", "--edges", "3000", "--frames", "6", "--size", "600x400"])
    print(out)
    assert out["nodes"] == 1000 and out["edges"] == 3000 and out["edge_buckets"] <= 6
    assert out["panel_fps"] > 0 and out["every_edge_fps"] > 0

"""packaging/make_graph_figure.py, the README's demo circuit: the Graph panel alone on a graph JSON, two layer-0
features of the last token pinned and grouped, the first clicked, grabbed at 1280 x 720; here test_graph_panel's
graph of a tiny Llama over random cross-layer transcoders (the figure's making, not the demo's circuit)."""
from __future__ import annotations

import json

import pytest

from . import test_graph_panel
from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
graph_json = test_graph_panel.graph_json  # the fixture: the graph of "abc dea", a tiny Llama's


def _features(graph) -> list[int]:
    """Two layer-0 features on the graph's last token."""
    nodes = json.loads(graph.read_text())["nodes"]
    last = max(int(n["ctx_idx"]) for n in nodes)
    features = sorted(int(n["node_id"].split("_")[1]) for n in nodes if n["feature_type"] == "cross layer transcoder"
                      and n["layer"] == "0" and int(n["ctx_idx"]) == last)
    assert len(features) >= 2
    return features[:2]


def test_the_graph_figure_is_the_panel_with_the_features_pinned_and_grouped(tmp_path, qapp, isolated_user_files,
                                                                           graph_json, capsys):
    graph, features = graph_json, _features(graph_json)
    shots = tmp_path / "shots"
    theirs = someone_elses_file(shots)
    out = shots / "graph_demo_circuit.png"
    assert load_script("make_graph_figure").main([str(graph), str(out),
                                                  "--features", ",".join(map(str, features))]) == 0
    assert_only_wrote(shots, {out.name}, theirs)
    assert_drawn(out, (1280, 720))
    printed = capsys.readouterr().out
    pinned = printed.split("pinned and grouped ")[1].split()[0:2]
    assert [int(p.rstrip(",").split("_")[1]) for p in pinned] == features  # node ids: layer_feature_position


def test_a_feature_not_on_the_last_token_is_named_and_nothing_written(tmp_path, qapp, isolated_user_files,
                                                                       graph_json):
    graph, features = graph_json, _features(graph_json)
    out = tmp_path / "shots" / "graph_demo_circuit.png"
    with pytest.raises(SystemExit, match=r"no layer-0 feature \[9999\] on the last token"):
        load_script("make_graph_figure").main([str(graph), str(out), "--features", f"{features[0]},9999"])
    assert not out.exists()

"""Issue 41's probes on graph files (the Graph panel's Open, what `graph` writes): a damaged file is one line naming
it and the problem, never a RecursionError or a TypeError from deep inside the layout."""
from __future__ import annotations

import copy
import json

import pytest

from desktop_app.core.graphs.layout import layout, load_graph_json

GOOD = {"metadata": {"slug": "g", "scan": "s", "transcoder_list": [], "prompt_tokens": ["a", "b"], "prompt": "ab",
                     "node_threshold": 0.8, "schema_version": 1},
        "qParams": {}, "nodes": [
            {"node_id": "E_1_0", "feature": 1, "layer": "E", "ctx_idx": 0, "feature_type": "embedding",
             "jsNodeId": "E_1-0", "influence": 0.1, "activation": None},
            {"node_id": "0_3_1", "feature": 3, "layer": "0", "ctx_idx": 1, "feature_type": "cross layer transcoder",
             "jsNodeId": "0_3-1", "influence": 0.2, "activation": 1.5},
            {"node_id": "2_7_1", "feature": 7, "layer": "2", "ctx_idx": 1, "feature_type": "logit",
             "jsNodeId": "L_7-1", "influence": None, "token_prob": 0.5}],
        "links": [{"source": "E_1_0", "target": "0_3_1", "weight": 0.5},
                  {"source": "0_3_1", "target": "2_7_1", "weight": -1.0}]}


def _with(change):
    model = copy.deepcopy(GOOD)
    change(model)
    return model


@pytest.mark.parametrize("damage,expected", [
    (lambda m: m["nodes"][1].update(layer=None), "has layer None, not a layer number"),
    (lambda m: m["nodes"][1].update(layer="E"), "has layer 'E', not a layer number"),
    (lambda m: m["nodes"][1].update(ctx_idx=-5), "has ctx_idx -5, not a position"),
    (lambda m: m["nodes"][1].update(influence="x"), "has influence 'x', not a finite number"),
    (lambda m: m["links"][0].update(weight="x"), "has weight 'x', not a finite number"),
    (lambda m: m["nodes"][1].update(influence=float("nan")), "node '0_3_1' has influence nan, not a finite number"),
    (lambda m: m["nodes"][1].update(activation=float("-inf")), "has activation -inf, not a finite number"),
    (lambda m: m["nodes"][2].update(token_prob=float("inf")), "has token_prob inf, not a finite number"),
    (lambda m: m["links"][1].update(weight=float("nan")), "link '0_3_1' -> '2_7_1' has weight nan, not a finite"),
    (lambda m: m["links"][0].update(weight=float("inf")), "has weight inf, not a finite number"),
    (lambda m: m.update(nodes={}), "'nodes' is not a list of objects"),
])
def test_a_damaged_graph_is_one_line_naming_the_file(tmp_path, damage, expected):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GOOD))
    assert len(layout(load_graph_json(path)).x) == 3  # the undamaged file opens
    path.write_text(json.dumps(_with(damage)))
    with pytest.raises(ValueError) as err:
        layout(load_graph_json(path))
    assert str(err.value).startswith(f"{path}: ") and expected in str(err.value) and "\n" not in str(err.value)


def test_a_deeply_nested_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_graph_json(path)

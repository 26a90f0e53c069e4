"""The README's Features and Graph screenshots: packaging/make_features_figures.py trains the README's TopK
dictionary and cross-layer transcoder by its commands, clicks the demo model's window offscreen and writes
features.png, features_dashboard.png and graph.png; what they show is what the README's captions say (the
feature clicked is the strongest on " of" and fires on " of" over the demo text; the graph's two most
influential features on the last token pinned, grouped and zeroed, which lowers the top logit)."""
from __future__ import annotations


import pytest
from PySide6.QtGui import QImage

from .figure_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow  # about 40 s on a loaded core (2 minutes on a busy one): trains the README's dictionary (1,500 steps) and CLT (400)
def test_the_features_figures_show_the_readmes_feature_and_graph(tmp_path, qapp, isolated_user_files):
    script = load_script("make_features_figures")
    (sae, sae_tmp), (clt, clt_tmp) = script.readme_runs(None, None)
    try:
        assert sae is not None and clt is not None
        shown = script.make(qapp, tmp_path / "shots", sae, clt)
    finally:
        sae_tmp.cleanup()
        clt_tmp.cleanup()
    for name, size in (("features.png", (1280, 800)), ("features_dashboard.png", (1280, 800)),
                       ("graph.png", (1500, 950))):
        image = QImage(str(tmp_path / "shots" / name))
        assert (image.width(), image.height()) == size, name

    features = shown["features"]
    assert features["token"] == " of"
    assert features["feature"] == features["top_features"][0]  # the token's strongest feature was clicked
    contexts = features["contexts"]
    assert len(contexts) == 20 and sum(t == " of" for t in contexts[:10]) >= 6  # it fires on " of"

    graph = shown["graph"]
    pinned = [n["node_id"] for n in graph["nodes"]]
    assert len(set(pinned)) == 2
    assert all(n["feature_type"] == "cross layer transcoder" and int(n["ctx_idx"]) == graph["last"]
               for n in graph["nodes"])
    assert ["top pair", *pinned] in graph["supernodes"]
    edits, before, after, live = graph["edit"]
    assert not live and [e.how for e in edits] == ["zero", "zero"]
    top = int(before.argmax())
    assert float(after[top]) < float(before[top]) - 0.1  # zeroing them lowers the top token's logit

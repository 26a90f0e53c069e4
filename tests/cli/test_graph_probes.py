"""Issue 41's probes on `graph`: a layer where no transcoder feature fires at all (a fresh transcoder, a short
prompt) ended in a traceback ("cannot reshape tensor of 0 elements into shape [2, 0, -1]")."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from desktop_app.cli import main
from desktop_app.core.graphs.transcoders import random_transcoders
from tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("cross_layer", [False, True])
def test_a_layer_without_an_active_feature_still_makes_a_graph(tmp_path, capsys, cross_layer):
    save_tiny_model(tmp_path / "llama", "abcdefgh ", "llama", specials=["<pad>", "<s>"], d_model=16, n_kv_heads=2,
                    d_ff=32, context_length=32)
    folder = tmp_path / "tc"
    random_transcoders(folder, 2, 16, 20, cross_layer=cross_layer, seed=1)
    silent = [p for p in folder.glob("*.safetensors") if p.stem in ("layer_1", "W_enc_1")]
    assert len(silent) == 1
    tensors = load_file(str(silent[0]))
    bias = next(k for k in tensors if k.startswith("b_enc"))
    tensors[bias] = torch.full_like(tensors[bias], -1e6)  # nothing fires at layer 1
    save_file(tensors, str(silent[0]))
    out = tmp_path / "g.json"
    assert main(["graph", str(tmp_path / "llama"), "--transcoders", str(folder), "--prompt", "abcab",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    nodes = json.loads(out.read_text())["nodes"]
    assert said["active_features"] > 0 and not any(n["feature_type"] == "cross layer transcoder" and n["layer"] == "1"
                                                   for n in nodes)

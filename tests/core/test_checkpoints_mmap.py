"""Weights load memory-mapped: opening a model does not copy its safetensors file into memory."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.core.checkpoints import WEIGHTS, new_model, save_model_folder
from desktop_app.core.config import ModelConfig

CHILD = r"""
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import torch
from desktop_app.core.checkpoints import load_model_folder
before = rss()
loaded = load_model_folder(sys.argv[1])
after = rss()
emb = loaded.model.tok_embed.weight
print(json.dumps({"delta": after - before, "params": loaded.model.num_parameters(),
                  "checksum": float(emb[::997].double().sum())}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc (Linux)")
def test_a_large_checkpoint_loads_without_copying_its_weights(tmp_path):
    # ~200 MB of float32 weights, almost all in one embedding matrix
    cfg = ModelConfig.gpt2(vocab_size=50_000, d_model=1024, n_layers=1, n_heads=4, d_ff=64, context_length=16)
    model = new_model(cfg, seed=0)
    save_model_folder(model, tmp_path / "big")
    expected = float(model.tok_embed.weight.detach()[::997].double().sum())
    del model
    size = (tmp_path / "big" / WEIGHTS).stat().st_size
    assert size > 190e6
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "big")], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["checksum"] == pytest.approx(expected)  # the mapped weights are the saved ones
    # a copy would add the whole file (~205 MB) to the resident set; mapped pages are read on demand
    assert r["delta"] < 0.25 * size, f"resident memory grew by {r['delta'] / 1e6:.0f} MB for a {size / 1e6:.0f} MB file"

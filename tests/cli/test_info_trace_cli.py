"""`python -m desktop_app info` and `trace` against a transformers-made checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32,
                                                              n_layer=2, n_head=4))
    hf.save_pretrained(folder)
    return folder, hf


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True, text=True, timeout=120)


def test_info_prints_architecture_json(gpt2_dir):
    folder, hf = gpt2_dir
    out = _cli("info", str(folder))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"family": "gpt2", "n_layers": 2, "n_heads": 4, "d_model": 32, "vocab_size": 50,
                    "context_length": 16, "parameters": sum(p.numel() for p in hf.parameters())}


def test_trace_writes_hf_compatible_arrays(gpt2_dir, tmp_path):
    folder, hf = gpt2_dir
    out_file = tmp_path / "t.npz"
    r = _cli("trace", str(folder), "--ids", "3,1,4,1,5,9", "--out", str(out_file))
    assert r.returncode == 0, r.stderr
    z = np.load(out_file)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    hf.eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True, output_attentions=True)
    assert z["tokens"].tolist() == ids[0].tolist()
    for l in range(2):
        assert z[f"attn.{l}"].shape == (4, 6, 6)
        np.testing.assert_allclose(z[f"attn.{l}"], ref.attentions[l][0].numpy(), atol=1e-5)
    for i in range(3):
        np.testing.assert_allclose(z[f"hidden.{i}"], ref.hidden_states[i][0].numpy(), atol=1e-4)
    np.testing.assert_allclose(z["logits"], ref.logits[0].numpy(), atol=1e-4)


def test_trace_errors_are_one_clear_line(gpt2_dir, tmp_path):
    folder, _ = gpt2_dir
    r = _cli("trace", str(folder), "--text", "hello", "--out", str(tmp_path / "x.npz"))
    assert r.returncode == 2
    assert "no tokenizer.json" in r.stderr and "Traceback" not in r.stderr
    r = _cli("info", str(tmp_path / "missing"))
    assert r.returncode == 2 and "no such folder" in r.stderr
    r = _cli("trace", str(folder), "--ids", "1,2,99", "--out", str(tmp_path / "x.npz"))
    assert r.returncode == 2 and "out of range" in r.stderr

"""The command line on a mixture of experts (issue 36): `trace` writes each layer's router logits, chosen
experts and their weights (transformers' router's, on a Mixtral folder it saved), `--ablate L.expert.E`
removes an expert, and `families` marks the mixture-of-experts families."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral")
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=50, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2))
    hf.save_pretrained(folder)
    return folder, hf.eval()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True, text=True, timeout=120)


def test_trace_writes_the_routing_of_every_layer(mixtral_dir, tmp_path):
    folder, hf = mixtral_dir
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    r = _cli("trace", str(folder), "--ids", ",".join(map(str, ids)), "--out", str(tmp_path / "t.npz"))
    assert r.returncode == 0, r.stderr
    z = np.load(tmp_path / "t.npz")
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_router_logits=True)
    for l in range(2):
        router = z[f"blocks.{l}.mlp.router"]
        assert router.shape == (8, 4)
        np.testing.assert_allclose(router, ref.router_logits[l].numpy(), atol=1e-5)
        chosen = torch.from_numpy(z[f"blocks.{l}.mlp.experts"])
        assert chosen.shape == (8, 2) and chosen.dtype == torch.int64
        assert torch.equal(chosen.sort(-1).values, ref.router_logits[l].topk(2, -1).indices.sort(-1).values)
        np.testing.assert_allclose(z[f"blocks.{l}.mlp.expert_weights"].sum(-1), 1.0, atol=1e-6)  # renormalised


def test_trace_ablate_an_expert(mixtral_dir, tmp_path):
    folder, _ = mixtral_dir
    args = ("trace", str(folder), "--ids", "3,1,4,1,5,9,2,6")
    assert _cli(*args, "--out", str(tmp_path / "clean.npz")).returncode == 0
    r = _cli(*args, "--ablate", "0.expert.1", "--out", str(tmp_path / "ablated.npz"))
    assert r.returncode == 0, r.stderr
    clean, ablated = np.load(tmp_path / "clean.npz"), np.load(tmp_path / "ablated.npz")
    assert not np.allclose(clean["logits"], ablated["logits"])
    np.testing.assert_array_equal(clean["blocks.0.mlp.experts"], ablated["blocks.0.mlp.experts"])  # routing kept
    r = _cli(*args, "--ablate", "0.expert.4", "--out", str(tmp_path / "x.npz"))
    assert r.returncode != 0 and "experts 0..3" in r.stderr.strip().splitlines()[-1]


def test_families_marks_the_mixtures_of_experts():
    r = _cli("families", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["model_type"]: row for row in json.loads(r.stdout)}
    moe = {name for name, row in rows.items() if row["moe"]}
    assert moe == {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe"}
    assert rows["llama"]["moe"] is False and rows["mixtral"]["kind"] == "decoder"
    text = _cli("families").stdout.splitlines()
    line = next(line for line in text if line.startswith("mixtral "))
    assert " experts " in line and " dense " in next(line for line in text if line.startswith("llama "))

"""Qwen3 against transformers: q/k norms, explicit head_dim (and the class's default of 128),
attention biases on and off, GQA, tied and untied, a sliding window on the late layers, refusals,
and the Lipschitz lab + head_matrices on a loaded folder."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_cases.qwen3 import qwen3  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder  # noqa: E402


@pytest.mark.parametrize("kw", [
    {"tie_word_embeddings": False, "attention_bias": True, "head_dim": 8, "num_key_value_heads": 4},
    {"num_hidden_layers": 3, "num_key_value_heads": 1,
     "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8, "rope_theta": 1e6}},
], ids=["biases-untied-mha", "mqa-llama3-rope"])
def test_qwen3_parity(kw, tmp_path):
    loaded = check_family(qwen3(**kw), tmp_path)
    assert loaded.config.family == "qwen3" and loaded.config.qk_norm
    assert (loaded.model.blocks[0].attn.o.bias is not None) == bool(kw.get("attention_bias"))


def test_qwen3_sliding_window_on_the_late_layers(tmp_path):
    loaded = check_family(qwen3(num_hidden_layers=3, use_sliding_window=True, sliding_window=5,
                                max_window_layers=2), tmp_path)
    assert loaded.config.layer_types == ["full_attention", "full_attention", "sliding_attention"]


def test_qwen3_head_dim_defaults_to_128_as_in_transformers(tmp_path):
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64)).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    del d["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_model_folder(tmp_path).config.d_head == 128


def test_qwen3_unsupported_rope_is_refused(tmp_path):
    qwen3()().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ModelLoadError, match="config.json: rope_parameters type 'dynamic' is not supported"):
        load_model_folder(tmp_path)


def test_qwen3_lipschitz_and_head_matrices(tmp_path):
    """q/k norms make the score non-bilinear: V_h is checked, A_h is not; the lab's estimates
    must still be the exact Jacobian norms of the real sublayer (q/k norms, head_dim 16, GQA)."""
    differences = check_lipschitz_and_heads(qwen3(), tmp_path, bilinear=False)
    assert max(differences.values()) < 1e-6, differences


def test_qwen3_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("qwen3", tmp_path, head_dim=16)

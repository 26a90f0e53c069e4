"""Qwen2 / Qwen2.5 against transformers: q/k/v biases without an o bias, GQA, tied and untied
embeddings, a sliding window shorter than the sequence on the layers from max_window_layers on,
refusals, and the Lipschitz lab on a loaded folder."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.qwen2 import qwen2  # noqa: E402
from family_parity import check_family  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder  # noqa: E402


@pytest.mark.parametrize("kw", [
    {"tie_word_embeddings": True, "num_key_value_heads": 4, "rope_parameters": {"rope_type": "default",
                                                                               "rope_theta": 1e6}},
    {"num_hidden_layers": 3, "num_key_value_heads": 1,
     "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
    {"head_dim": 16},  # transformers' Qwen2 reads a head_dim it has no field for (getattr)
], ids=["tied-mha-theta", "mqa-linear-rope", "head_dim16"])
def test_qwen2_parity(kw, tmp_path):
    loaded = check_family(qwen2(**kw), tmp_path)
    assert loaded.config.family == "qwen2"
    assert loaded.model.blocks[0].attn.q.bias is not None and loaded.model.blocks[0].attn.o.bias is None


def test_qwen2_sliding_window_on_the_late_layers(tmp_path):
    """use_sliding_window with max_window_layers = 1: layer 0 full, layers 1, 2 see 4 keys; the
    sequence (12) and the 32 greedy steps run well past the window."""
    loaded = check_family(qwen2(num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                                max_window_layers=1), tmp_path)
    assert loaded.config.sliding_window == 4
    assert loaded.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]


def test_qwen2_window_without_use_sliding_window_is_no_window(tmp_path):
    """transformers ignores sliding_window unless use_sliding_window is true: so does the app."""
    loaded = check_family(qwen2(use_sliding_window=False, sliding_window=3, max_window_layers=0), tmp_path)
    assert loaded.config.sliding_window is None and loaded.config.layer_types is None


def _edited(tmp_path, edit):
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    return tmp_path


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     "rope_parameters type 'yarn' is not supported"),
    (lambda d: d.update(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
    (lambda d: d.update(use_sliding_window=True, sliding_window=4, layer_types=["full_attention", "chunked"]),
     "layer_types has entries this app does not implement: chunked"),
    (lambda d: (d.pop("layer_types"), d.update(use_sliding_window=True, sliding_window=4, max_window_layers="x")),
     "max_window_layers"),
])
def test_qwen2_refusals_name_the_field(tmp_path, edit, message):
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model_folder(_edited(tmp_path, edit))
    assert "config.json" in str(err.value) and "\n" not in str(err.value)


def test_qwen2_lipschitz_and_head_matrices(tmp_path):
    """Biases on q/k/v, none on o, GQA, full attention: the lab's layer and head estimates are the
    exact Jacobian norms of the real sublayer."""
    differences = check_lipschitz_and_heads(qwen2(num_hidden_layers=2), tmp_path, bilinear=True)
    assert max(differences.values()) < 1e-6, differences


def test_qwen2_lipschitz_on_a_sliding_layer(tmp_path):
    """Layer 1 slides with a window of 3 over n = 7 tokens: the lab must use the layer's window."""
    differences = check_lipschitz_and_heads(qwen2(use_sliding_window=True, sliding_window=3, max_window_layers=1),
                                            tmp_path, bilinear=True)
    assert max(differences.values()) < 1e-6, differences


def test_qwen2_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("qwen2", tmp_path, n_kv_heads=2)


def test_a_hub_style_config_reads_as_transformers_reads_it(tmp_path):
    """Qwen2.5 configs on the Hub: top-level rope_theta, "rope_scaling": null, no layer_types, a
    sliding_window present but off, torch_dtype. Both sides open the same edited folder."""
    torch.manual_seed(0)
    qwen2(num_hidden_layers=3, tie_word_embeddings=True)().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "dtype"):
        d.pop(key, None)
    d.update(rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False, sliding_window=2,
             max_window_layers=1, torch_dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps(d))
    loaded = load_model_folder(tmp_path)
    assert loaded.config.rope_theta == 1e6 and loaded.config.sliding_window is None
    hf = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf.config.rope_parameters["rope_theta"] == 1e6
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)

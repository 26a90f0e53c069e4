"""Mistral against transformers: a sliding window shorter than the sequence (and than the 32 greedy
steps) on every layer, GQA, explicit head_dim, tied and untied, no window, refusals, and the
Lipschitz lab + head_matrices on a loaded folder."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_cases.mistral import mistral  # noqa: E402
from family_parity import check_config_edit_refused, check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


@pytest.mark.parametrize("kw", [
    {"sliding_window": 3, "tie_word_embeddings": True, "head_dim": 16, "num_hidden_layers": 3},
    {"sliding_window": None, "num_key_value_heads": 4,
     "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}},
], ids=["window3-head_dim16-tied", "no-window-mha-linear-rope"])
def test_mistral_parity(kw, tmp_path):
    loaded = check_family(mistral(**kw), tmp_path)
    assert loaded.config.family == "mistral"
    assert loaded.config.sliding_window == kw.get("sliding_window", 5)


def test_a_config_without_sliding_window_gets_the_class_default(tmp_path):
    mistral()().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    del d["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_model_folder(tmp_path).config.sliding_window == transformers.MistralConfig().sliding_window


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(layer_types=["sliding_attention", "full_attention"]), "layer_types is not supported"),
    (lambda d: d.update(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
     "rope_parameters type .longrope. is not supported"),
    (lambda d: d.update(sliding_window="4096"), "sliding_window must be a positive integer"),
])
def test_mistral_refusals_name_the_field(tmp_path, edit, message):
    check_config_edit_refused(mistral(), edit, message, tmp_path)


def test_mistral_lipschitz_and_head_matrices(tmp_path):
    """Window 3 over n = 7 tokens, GQA: the lab's estimates are the exact Jacobian norms of the real
    sublayer, and A_h, V_h agree with transformers' projections and the recorded head outputs."""
    differences = check_lipschitz_and_heads(mistral(sliding_window=3), tmp_path, bilinear=True)
    assert max(differences.values()) < 1e-6, differences


def test_mistral_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("mistral", tmp_path, sliding_window=4)

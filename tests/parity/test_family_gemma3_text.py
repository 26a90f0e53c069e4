"""Gemma 3 text (Gemma3ForCausalLM) against transformers: sliding and full layers in their pattern
with a window shorter than the sequence, the local rotary base, linear scaling on full layers, the
query_pre_attn_scalar score scale, sqrt(d) embedding scale, (1 + w) norms, sandwich norms, GeGLU,
the logit soft cap, tied and untied, older config fields, refusals, and the Lipschitz lab +
head_matrices on a loaded folder."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_cases.gemma3_text import gemma3  # noqa: E402
from family_parity import check_config_edit_refused, check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


@pytest.mark.parametrize("kw", [
    {"final_logit_softcapping": 2.0, "tie_word_embeddings": False, "num_key_value_heads": 1,
     "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}},
    {"layer_types": None, "num_hidden_layers": 4, "sliding_window": 3, "attention_bias": True,
     "head_dim": 8, "num_key_value_heads": 4},  # the default pattern (every 6th full: all 4 slide)
], ids=["softcap-untied-mqa-linear-rope", "default-pattern-biases"])
def test_gemma3_text_parity(kw, tmp_path):
    loaded = check_family(gemma3(**kw), tmp_path)
    cfg = loaded.config
    assert cfg.family == "gemma3_text" and cfg.sliding_window == kw.get("sliding_window", 4)
    assert cfg.layer_types == (kw.get("layer_types", ["sliding_attention", "sliding_attention", "full_attention"])
                               or ["sliding_attention"] * 4)


def test_older_config_fields_read_as_transformers_reads_them(tmp_path):
    """rope_theta / rope_local_base_freq / rope_scaling at the top level (Hub configs of 2025)."""
    hf = gemma3()()
    hf.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    del d["rope_parameters"]
    d.update(rope_theta=1000.0, rope_local_base_freq=50.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = load_model_folder(tmp_path).config
    ref = transformers.Gemma3TextConfig.from_pretrained(tmp_path).rope_parameters
    assert cfg.rope_theta == ref["full_attention"]["rope_theta"] == 1000.0
    assert cfg.rope_local_theta == ref["sliding_attention"]["rope_theta"] == 50.0
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": ref["full_attention"]["factor"]}


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(attn_logit_softcapping=50.0), "attn_logit_softcapping 50.0 is not supported"),
    (lambda d: d.update(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (lambda d: d.update(hidden_activation="relu"), "unsupported hidden_activation 'relu'"),
    (lambda d: d["rope_parameters"]["sliding_attention"].update(rope_type="linear", factor=2.0),
     "not supported on sliding layers"),
    (lambda d: d["rope_parameters"]["full_attention"].update(rope_type="yarn", factor=2.0),
     r"rope_parameters\['full_attention'\] type 'yarn' is not supported"),
])
def test_gemma3_text_refusals_name_the_field(tmp_path, edit, message):
    check_config_edit_refused(gemma3(), edit, message, tmp_path)


def test_gemma3_text_lipschitz_and_head_matrices(tmp_path):
    """Layer 1 slides (window 4 over n = 7) with the local rotary base, q/k norms, scale 24 ** -0.5:
    the lab's estimates are the exact Jacobian norms of the real sublayer; V_h is checked against
    the recorded head outputs (A_h is not the score with q/k norms)."""
    differences = check_lipschitz_and_heads(gemma3(), tmp_path, bilinear=False)
    assert max(differences.values()) < 1e-6, differences


def test_gemma3_text_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("gemma3_text", tmp_path, n_kv_heads=2, sliding_window=3, layer_types=["sliding_attention", "full_attention"], rope_local_theta=100.0)


def test_gemma3_text_lipschitz_on_a_full_layer_with_scaled_rotary(tmp_path):
    """Layer 2 is full attention with linear rotary scaling (factor 4) and MQA: the lab follows it."""
    differences = check_lipschitz_and_heads(gemma3(num_key_value_heads=1, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}), tmp_path, bilinear=False, layer=2)
    assert max(differences.values()) < 1e-6, differences

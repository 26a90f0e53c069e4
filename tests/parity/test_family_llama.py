"""LLaMA against transformers with what Llama 3.x configs carry: the "llama3" rotary scaling (with an
original context short enough that the 12 tokens and 32 greedy steps run through the scaled
frequencies), the "linear" one, and a head_dim other than hidden_size / num_attention_heads; GQA,
tied and untied; refusals that name the field; the Lipschitz lab on such a model; and a preset
model saved here with both opening in transformers."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_cases.llama import LLAMA3_ROPE, llama  # noqa: E402
from family_parity import check_config_edit_refused, check_family  # noqa: E402

from desktop_app.core.checkpoints import hf_compatible, load_model_folder  # noqa: E402

@pytest.mark.parametrize("kw", [
    {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True, "num_key_value_heads": 1},
    {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}, "head_dim": 4,
     "attention_bias": True, "mlp_bias": True},
    {"head_dim": 16},
], ids=["llama3-tied-mqa", "linear-head_dim4-biases", "default-head_dim16"])
def test_llama_parity(kw, tmp_path):
    loaded = check_family(llama(**kw), tmp_path)
    cfg = loaded.config
    assert cfg.family == "llama" and hf_compatible(cfg)  # saved under Hugging Face's names
    assert cfg.d_head == kw.get("head_dim", 8)
    kind = kw.get("rope_parameters", {}).get("rope_type")
    assert (cfg.rope_scaling or {}).get("rope_type") == kind


def test_llama3_scaling_changes_the_logits(tmp_path):
    """The scaled run is not plain rotary by accident: without the scaling the logits differ."""
    import torch
    torch.manual_seed(0)
    hf = llama(rope_parameters=LLAMA3_ROPE, head_dim=16)()
    hf.save_pretrained(tmp_path)
    scaled = load_model_folder(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": LLAMA3_ROPE["rope_theta"]}
    (tmp_path / "config.json").write_text(json.dumps(d))
    plain = load_model_folder(tmp_path)
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        assert (scaled.model(ids).logits - plain.model(ids).logits).abs().max() > 1e-3


def test_legacy_rope_scaling_field_is_read(tmp_path):
    """A Llama 3.x config.json as older transformers wrote it: top-level rope_theta + rope_scaling."""
    llama(head_dim=16)().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d.pop("rope_parameters", None)
    d["rope_theta"] = 500000.0
    d["rope_scaling"] = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = load_model_folder(tmp_path).config
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.rope_scaling["original_max_position_embeddings"] == 16


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}),
     "rope_parameters type 'yarn' is not supported"),
    (lambda d: d.update(head_dim="16"), "head_dim must be a positive integer"),
    (lambda d: d.update(hidden_act="gelu"), "unsupported hidden_act"),
])
def test_llama_refusals_name_the_field(tmp_path, edit, message):
    check_config_edit_refused(llama(), edit, message, tmp_path)


def test_llama3_lipschitz_and_head_matrices(tmp_path):
    differences = check_lipschitz_and_heads(llama(rope_parameters=LLAMA3_ROPE, head_dim=16), tmp_path,
                                            bilinear=True)
    assert max(differences.values()) < 1e-6, differences


@pytest.mark.parametrize("over", [{}, {"head_dim": 16, "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items()
                                                                          if k != "rope_theta"}}],
                         ids=["preset", "llama3-head_dim16"])
def test_llama_preset_model_saved_here_opens_in_transformers(tmp_path, over):
    check_preset_opens_in_transformers("llama", tmp_path, **over)

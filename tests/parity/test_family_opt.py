"""OPT against transformers: parity (biases on and off, pre-LN and opt-350m's post-LN), config
refusals, and the Lipschitz panel's layer."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.opt import opt  # noqa: E402
from family_parity import check_family  # noqa: E402
from test_family_gpt_neox import check_lipschitz  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.families import ModelLoadError  # noqa: E402


@pytest.mark.parametrize("bias", [True, False])
def test_opt_parity(tmp_path, bias):
    loaded = check_family(opt(bias=bias), tmp_path)
    cfg = loaded.config
    assert cfg.position_offset == 2 and cfg.attention_bias == cfg.mlp_bias == bias and cfg.activation == "relu"
    assert loaded.model.pos_embed.weight.shape[0] == 64 + 2


def test_opt_post_layer_norm_untied_gelu(tmp_path):
    loaded = check_family(opt(pre=False, tied=False, heads=2, act="gelu"), tmp_path)
    assert loaded.config.norm_placement == "post" and not loaded.config.final_norm


def opt_style_config(**kw) -> dict:
    d = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 97, "hidden_size": 32,
         "num_hidden_layers": 2, "ffn_dim": 64, "num_attention_heads": 4, "max_position_embeddings": 64,
         "word_embed_proj_dim": 32, "do_layer_norm_before": True, "activation_function": "relu",
         "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, "torch_dtype": "float16"}
    return {**d, **kw}


@pytest.mark.parametrize("fields, message", [
    ({"word_embed_proj_dim": 16}, "word_embed_proj_dim 16 different from hidden_size 32"),
    ({"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine false"),
    ({"_remove_final_layer_norm": True}, "_remove_final_layer_norm true"),
    ({"activation_function": "silu"}, "activation_function 'silu'"),
])
def test_unsupported_fields_are_refused_by_name(tmp_path, fields, message):
    (tmp_path / "config.json").write_text(json.dumps(opt_style_config(**fields)))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model_folder(tmp_path)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


def test_lipschitz_of_an_opt_layer_and_head(tmp_path):
    torch.manual_seed(0)
    hf = opt()()
    hf.save_pretrained(tmp_path / "hf")
    check_lipschitz(tmp_path / "hf", list(range(5, 15)), layer=1, head=2)

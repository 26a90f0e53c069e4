"""GPT-Neo (TinyStories) against transformers: parity with local layers whose window is shorter
than the sequence, config refusals, and the Lipschitz panel's layer."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.gpt_neo import WINDOW, neo  # noqa: E402
from family_parity import check_family  # noqa: E402
from test_family_gpt_neox import check_lipschitz  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.families import ModelLoadError  # noqa: E402
from desktop_app.core.families.gpt_neo import FAMILY  # noqa: E402

SEQ = 13  # longer than the window: the local layers' mask really cuts keys off


def test_gpt_neo_global_local_alternating(tmp_path):
    loaded = check_family(neo([[["global", "local"], 2]], 4), tmp_path, seq_len=SEQ)
    cfg = loaded.config
    assert cfg.layer_types == ["full_attention", "sliding_attention"] * 2 and cfg.sliding_window == WINDOW
    assert cfg.attn_scale == 1.0 and not cfg.attention_bias and cfg.attention_out_bias


def test_gpt_neo_local_first_untied_one_head(tmp_path):
    loaded = check_family(neo([[["local"], 1], [["global"], 2]], 3, window=3, tied=False, heads=1), tmp_path,
                          seq_len=SEQ)
    assert loaded.config.layer_types == ["sliding_attention", "full_attention", "full_attention"]
    assert not loaded.config.tie_embeddings


def test_gpt_neo_all_global(tmp_path):
    loaded = check_family(neo([[["global"], 2]], 2), tmp_path, seq_len=SEQ)
    assert loaded.config.sliding_window is None and loaded.config.layer_types is None


def tinystories_style_config(**kw) -> dict:
    """A config.json as the TinyStories checkpoints ship it (transformers 4.28 fields)."""
    d = {"activation_function": "gelu_new", "architectures": ["GPTNeoForCausalLM"], "attention_dropout": 0,
         "attention_layers": ["global", "local", "global", "local"], "attention_types": [[["global", "local"], 2]],
         "bos_token_id": 50256, "embed_dropout": 0, "eos_token_id": 50256, "hidden_size": 32,
         "intermediate_size": None, "layer_norm_epsilon": 1e-05, "max_position_embeddings": 64,
         "model_type": "gpt_neo", "num_heads": 4, "num_layers": 4, "resid_dropout": 0, "torch_dtype": "float32",
         "vocab_size": 97, "window_size": 256}
    return {**d, **kw}


def test_tinystories_config_fields():
    cfg = FAMILY.config_from_hf(tinystories_style_config(), "tiny/config.json")
    assert (cfg.d_ff, cfg.sliding_window, cfg.activation, cfg.attn_scale) == (128, 256, "gelu_tanh", 1.0)
    assert cfg.layer_types == ["full_attention", "sliding_attention"] * 2


@pytest.mark.parametrize("fields, message", [
    ({"attention_types": [[["global", "sparse"], 2]]}, "unsupported attention type"),
    ({"attention_types": [[["global", "local"], 3]]}, "attention_types give 6 layers but num_layers is 4"),
    ({"activation_function": "swish"}, "activation_function 'swish'"),
])
def test_unsupported_fields_are_refused_by_name(tmp_path, fields, message):
    (tmp_path / "config.json").write_text(json.dumps(tinystories_style_config(**fields)))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model_folder(tmp_path)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


def test_lipschitz_of_a_gpt_neo_local_layer_and_head(tmp_path):
    """The local layer (window 4) on 10 tokens: the window hides keys, and scores are unscaled."""
    torch.manual_seed(0)
    hf = neo([[["global", "local"], 1]], 2)()
    hf.save_pretrained(tmp_path / "hf")
    check_lipschitz(tmp_path / "hf", list(range(5, 15)), layer=1, head=2)

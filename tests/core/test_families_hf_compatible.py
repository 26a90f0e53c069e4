"""Configs using switches a family's Hugging Face class cannot hold are saved with our own tensor
names (hf_compatible False) and still round-trip; the classic presets keep Hugging Face's names."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from desktop_app.core.checkpoints import NATIVE_PROBE, hf_compatible, load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig

SMALL = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=16)

SWITCHES = {
    "parallel_residual": dict(parallel_residual=True),
    "rotary_fraction": dict(positions="rotary", rotary_fraction=0.5),
    "qk_norm": dict(qk_norm=True),
    "sliding_window": dict(sliding_window=4),
    "sandwich_norms": dict(sandwich_norms=True),
    "embed_scale": dict(embed_scale=2.0),
    "attn_scale": dict(attn_scale=0.5),
    "position_offset": dict(position_offset=2),
    "head_dim": dict(head_dim=16),
    "softcap": dict(final_logit_softcap=30.0),
    "attention_out_bias": dict(attention_bias=False, attention_out_bias=True),
}


def preset(family: str, **kw) -> ModelConfig:
    return getattr(ModelConfig, family)(**{**SMALL, **kw})


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_classic_presets_keep_hugging_face_names(family):
    assert hf_compatible(preset(family))


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_new_switches_are_not_hugging_face_compatible(family, switch):
    kw = dict(SWITCHES[switch])
    if family == "llama" and switch == "rotary_fraction":
        kw.pop("positions")
    if family == "bert" and switch in ("parallel_residual", "sandwich_norms"):
        kw["norm_placement"] = "pre"  # both need pre-norm; BERT is post-norm, so pre alone already says False
    if family == "llama" and switch == "attention_out_bias":
        kw = dict(attention_bias=False, attention_out_bias=True)
    if family == "llama" and switch == "head_dim":  # LlamaConfig has head_dim (Llama 3.x reads it)
        assert hf_compatible(preset(family, **kw))
        return
    assert not hf_compatible(preset(family, **kw))


def stored_names(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as st:
        return set(st.keys())


def test_gpt2_with_parallel_residual_round_trips_with_our_names(tmp_path):
    cfg = preset("gpt2", parallel_residual=True)
    model = new_model(cfg, seed=0).eval()
    save_model_folder(model, tmp_path / "m")
    assert NATIVE_PROBE in stored_names(tmp_path / "m") and "h.0.attn.c_attn.weight" not in stored_names(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["transformer_explorer"]["parallel_residual"]
    loaded = load_model_folder(tmp_path / "m")
    assert loaded.config == cfg
    ours, theirs = model.state_dict(), loaded.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = torch.randint(0, cfg.vocab_size, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded.model(ids).logits)
    # the switch changes the function: a model read back without it would not match
    plain = ModelConfig.from_dict({**cfg.to_dict(), "parallel_residual": False})
    serial = new_model(plain).eval()
    serial.load_state_dict(ours)
    with torch.no_grad():
        assert not torch.allclose(serial(ids).logits, model(ids).logits, atol=1e-4)


@pytest.mark.parametrize("kind", ["l2", "sinkhorn"])
def test_l2_and_sinkhorn_attention_are_saved_with_our_names(kind, tmp_path):
    """Every Hugging Face class computes softmax attention: under its names an L2 or Sinkhorn model
    would open in transformers and compute something else without a word."""
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=16,
                           attention_kind=kind)
    model = new_model(cfg, seed=0)
    save_model_folder(model, tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert NATIVE_PROBE in f.keys()
    back = load_model_folder(tmp_path)
    assert back.config.attention_kind == kind
    ids = torch.arange(10)[None]
    assert torch.equal(back.model(ids).logits, model(ids).logits)

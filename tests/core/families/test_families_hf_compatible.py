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


# -- the switch declarations (issue 26): what a family's transformers class computes is declared,
# every other switch away from its default means "not that model" ---------------------------------

import dataclasses  # noqa: E402

from desktop_app.core import config as config_module  # noqa: E402
from desktop_app.core.config import ConfigError  # noqa: E402
from desktop_app.core.families import REGISTRY  # noqa: E402
from desktop_app.core.families.base import ANY, NOT_SWITCHES, Where  # noqa: E402

SWITCH_FIELDS = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in NOT_SWITCHES]


def family_preset(name: str) -> ModelConfig:
    if name == "vit":
        return REGISTRY[name].preset(d_model=32, n_layers=2, n_heads=4, d_ff=64, image_size=8, patch_size=4)
    return REGISTRY[name].preset(**SMALL)


# values away from the default that a type alone does not give (None defaults, and switches that need
# another beside them to make a config ModelConfig accepts); any other switch is moved by its type
SPECIAL = {
    "n_kv_heads": lambda cfg: [dict(n_kv_heads=cfg.n_heads // 2)],
    "head_dim": lambda cfg: [dict(head_dim=2 * cfg.d_head)],
    "attention_out_bias": lambda cfg: [dict(attention_out_bias=not cfg.attention_bias)],
    "rope_scaling": lambda cfg: [dict(rope_scaling={"rope_type": "linear", "factor": 2.0})],
    "rope_local_theta": lambda cfg: [dict(rope_local_theta=500.0)],
    "sliding_window": lambda cfg: [dict(sliding_window=4)],
    "layer_types": lambda cfg: [dict(sliding_window=4, layer_types=["sliding_attention"] + ["full_attention"] * (cfg.n_layers - 1))],
    "attn_scale": lambda cfg: [dict(attn_scale=0.5)],
    "embed_scale": lambda cfg: [dict(embed_scale=2.0)],
    "final_logit_softcap": lambda cfg: [dict(final_logit_softcap=30.0)],
    "attn_logit_softcap": lambda cfg: [dict(attn_logit_softcap=50.0)],
    "clip_qkv": lambda cfg: [dict(clip_qkv=8.0)],
    "rotary_layers": lambda cfg: [dict(rotary_layers=[False] + [True] * (cfg.n_layers - 1))],
    "residual_multiplier": lambda cfg: [dict(residual_multiplier=0.5)],
    "lm_head_scale": lambda cfg: [dict(lm_head_scale=0.5)],
    "residual_multiplier": lambda cfg: [dict(residual_multiplier=0.5)],
    "shared_expert_gate": lambda cfg: [dict(shared_expert_gate=not cfg.shared_expert_gate)],  # Qwen2-MoE: ungated
    "input_kind": lambda cfg: [dict(input_kind="patches", image_size=8, patch_size=4, context_length=5,
                                    positions="learned", causal=False, tie_embeddings=False)],
}


def away_from_default(cfg: ModelConfig, name: str) -> list[dict]:
    """Changes that move switch `name` of `cfg` away from its default (some may not validate)."""
    if name in SPECIAL:
        return SPECIAL[name](cfg)
    default = cfg.default_of(name)
    if isinstance(default, bool):
        return [{name: not default}]
    if isinstance(default, int):
        return [{name: default + 1}, {name: default + 2}]
    if isinstance(default, float):
        return [{name: default / 2}, {name: default * 2}]
    if isinstance(default, str):  # the other values of config's tuple of choices holding the default
        choices = {v for c in vars(config_module).values() if isinstance(c, tuple) and default in c for v in c}
        return [{name: v} for v in sorted(choices - {default})]
    return []


def allowed(declared, value) -> bool:
    if declared is ANY:
        return True
    return declared.test(value) if isinstance(declared, Where) else value in declared


@pytest.mark.parametrize("family", list(REGISTRY))
def test_every_family_preset_is_what_transformers_computes(family):
    assert REGISTRY[family].hf_differences(family_preset(family)) == []


def test_not_switches_are_config_fields_and_declared_switches_are_switches():
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    assert NOT_SWITCHES <= names
    for family in REGISTRY.values():
        assert set(family.switches) <= set(SWITCH_FIELDS), family.model_type


@pytest.mark.parametrize("switch", SWITCH_FIELDS)
def test_a_switch_away_from_its_default_is_named_by_every_family_that_does_not_support_it(switch):
    """Generated over ModelConfig's fields: a switch a family does not declare (or a value it does not
    declare) makes the family's check fail, naming the switch. A switch added to ModelConfig is covered
    without touching this test: nobody declares it, so every family refuses it."""
    tried = 0
    for name, family in REGISTRY.items():
        base = family_preset(name)
        declared = family.switches.get(switch)
        for change in away_from_default(base, switch):
            try:
                cfg = base.replace(**change)
            except ConfigError:
                continue  # not a model this family's other switches allow (e.g. parallel_residual post-LN)
            value = getattr(cfg, switch)
            if declared is not None and allowed(declared, value):
                continue  # the family's class computes it
            if declared is None and cfg.at_default(switch):
                continue
            tried += 1
            problems = family.hf_differences(cfg)
            assert any(p.startswith(f"{switch} ") for p in problems), (name, change, problems)
            assert not hf_compatible(cfg)
    assert tried, f"no family refuses switch {switch!r} away from its default: give this test a value (SPECIAL)"


def test_l2_and_sinkhorn_attention_are_no_family_s_transformers_model():
    """Before the declarations OPT, GPT-Neo and GPT-NeoX listed no attention_kind among the switches
    that must be off: an L2-attention OPT was saved under OPT's names and computed softmax there."""
    for name in REGISTRY:
        for kind in ("l2", "sinkhorn"):
            cfg = family_preset(name).replace(attention_kind=kind)
            assert REGISTRY[name].hf_differences(cfg) == [
                f"attention_kind {kind!r}: {REGISTRY[name].architectures[1]} has no such switch (only 'softmax')"]

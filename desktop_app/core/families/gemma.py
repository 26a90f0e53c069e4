"""Gemma (1): GemmaModel / GemmaForCausalLM. LLaMA-shaped, plus: RMSNorm weights applied as (1 + w),
embeddings scaled by sqrt(hidden_size), a GELU(tanh)-gated MLP, head_dim 256 unless given, tied
embeddings; q, k, v and o biases together (attention_bias).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, ModelLoadError, Weight, preset_of

_switches = preset_of(dict(family="gemma", norm="rmsnorm_offset", norm_placement="pre", activation="geglu",
                           positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                           final_norm=True, tie_embeddings=True, norm_eps=1e-6))


def preset(**kw: Any) -> ModelConfig:
    """Gemma's switches; the embedding scale follows the width (sqrt(d_model)) unless given."""
    cfg = _switches(**kw)
    return cfg.replace(embed_scale=kw.get("embed_scale", math.sqrt(cfg.d_model)))


# GemmaConfig's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 8192, "head_dim": 256,
               "num_key_value_heads": 16, "hidden_act": "gelu_pytorch_tanh", "attention_bias": False,
               "use_bidirectional_attention": False, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
# GemmaConfig turns the legacy "gelu" of the first releases into gelu_pytorch_tanh; all are the tanh GELU
TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu")


def gelu_tanh_only(d: dict, path: Path, key: str) -> None:
    if d[key] not in TANH_GELUS:
        raise ModelLoadError(path, f"unsupported {key} {d[key]!r} (this family computes gelu_pytorch_tanh)")


def causal_only(d: dict, path: Path) -> None:
    if d.get("use_bidirectional_attention"):
        raise ModelLoadError(path, "use_bidirectional_attention true is not supported: this family is a causal "
                                   "decoder here")


def scaled_embeddings(cfg: ModelConfig, title: str) -> list[str]:
    if cfg.embed_scale is None or abs(cfg.embed_scale - math.sqrt(cfg.d_model)) >= 1e-9 * cfg.embed_scale:
        return [f"embed_scale {cfg.embed_scale!r}: {title} scales embeddings by sqrt(hidden_size)"]
    return []


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    gelu_tanh_only(d, path, "hidden_act")
    causal_only(d, path)
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d))
    return preset(**fields, **rope, attention_bias=bool(d["attention_bias"]))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "gelu_pytorch_tanh", "attention_bias": cfg.attention_bias,
            "use_bidirectional_attention": False,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# Gemma's offset RMSNorm, GeGLU and scaled embeddings; q/k/v/o biases together (attention_bias)
SWITCHES = {**llama_like.SWITCHES, "norm": ("rmsnorm_offset",), "activation": ("geglu",), "embed_scale": ANY,
            "attention_bias": (True, False), "mlp_bias": (False,)}


FAMILY = Family(
    model_type="gemma", title="Gemma (decoder, RoPE, (1 + w) RMSNorm, GeGLU, scaled embeddings)", decoder=True,
    architectures=("GemmaModel", "GemmaForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "rope_parameters", "attention_bias"),
    weights=weights, preset=preset, switches=SWITCHES,
    requires=lambda cfg: scaled_embeddings(cfg, "Gemma"))

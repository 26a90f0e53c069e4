"""Gemma 2: Gemma2Model / Gemma2ForCausalLM. Gemma (offset RMSNorm, GeGLU, sqrt(d) embeddings) plus:
four norms per layer (the attention and MLP outputs normed before their residual add), scores
scaled by query_pre_attn_scalar ** -0.5 and soft-capped (attn_logit_softcapping), sliding-window
layers alternating with full ones (layer_types; by default every other layer from the first slides),
one rotary for every layer, and soft-capped logits (final_logit_softcapping).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from . import gemma, gemma3_text, llama_like
from .base import ANY, Family, ModelLoadError, Weight, preset_of, real

_switches = preset_of(dict(family="gemma2", norm="rmsnorm_offset", norm_placement="pre", activation="geglu",
                           positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                           sandwich_norms=True, final_norm=True, tie_embeddings=True, norm_eps=1e-6,
                           attn_logit_softcap=50.0, final_logit_softcap=30.0))


def preset(**kw: Any) -> ModelConfig:
    """Gemma 2's switches; the embedding scale sqrt(d_model) and the score scale (query_pre_attn_scalar =
    head_dim) follow the width unless given."""
    cfg = _switches(**kw)
    return cfg.replace(embed_scale=kw.get("embed_scale", math.sqrt(cfg.d_model)),
                       attn_scale=kw.get("attn_scale", cfg.d_head ** -0.5))


# Gemma2Config's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 8192, "head_dim": 256,
               "num_key_value_heads": 4, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
               "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
               "attention_bias": False, "use_bidirectional_attention": False, "bos_token_id": 2, "eos_token_id": 1,
               "pad_token_id": 0}


def _cap(d: dict, path: Path, key: str) -> float | None:
    value = d[key]
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ModelLoadError(path, f"{key} must be a positive number or null, got {value!r}")
    return real(value)


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    gemma.gelu_tanh_only(d, path, "hidden_activation")
    gemma.causal_only(d, path)
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d))
    n_layers = fields["n_layers"]
    types = llama_like.layer_types_from_hf(d, path, n_layers)
    if types is None and isinstance(n_layers, int):  # Gemma2Config: every other layer slides, from the first
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    window = d["sliding_window"]
    if window is None and types and "sliding_attention" in types:
        raise ModelLoadError(path, "layer_types has sliding_attention layers but sliding_window is null")
    scalar = d["query_pre_attn_scalar"]
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
        raise ModelLoadError(path, f"query_pre_attn_scalar must be a positive number, got {scalar!r}")
    hidden = fields["d_model"]
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise ModelLoadError(path, f"hidden_size must be a positive integer, got {hidden!r}")
    return preset(**fields, **rope, layer_types=types, sliding_window=window, attn_scale=float(scalar) ** -0.5,
                  embed_scale=math.sqrt(hidden), attn_logit_softcap=_cap(d, path, "attn_logit_softcapping"),
                  final_logit_softcap=_cap(d, path, "final_logit_softcapping"),
                  attention_bias=bool(d["attention_bias"]))


def config_to_hf(cfg: ModelConfig) -> dict:
    types = cfg.layer_types or ["sliding_attention" if cfg.sliding_window else "full_attention"] * cfg.n_layers
    return {**llama_like.decoder_to_hf(cfg), "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": gemma3_text.query_pre_attn_scalar(cfg), "sliding_window": cfg.sliding_window,
            "layer_types": list(types), "attention_bias": cfg.attention_bias,
            "final_logit_softcapping": cfg.final_logit_softcap, "attn_logit_softcapping": cfg.attn_logit_softcap,
            "use_bidirectional_attention": False,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg, gemma3_text.NORMS)  # the same four norms per layer as Gemma 3


# Gemma's offset RMSNorm, GeGLU, scaled embeddings; sandwich norms, scaled and soft-capped scores,
# sliding layers, soft-capped logits; q/k/v/o biases together (attention_bias)
SWITCHES = {**llama_like.SWITCHES, "norm": ("rmsnorm_offset",), "activation": ("geglu",), "sandwich_norms": (True,),
            "embed_scale": ANY, "attn_scale": ANY, "attention_bias": (True, False), "mlp_bias": (False,),
            "sliding_window": ANY, "layer_types": ANY, "final_logit_softcap": ANY, "attn_logit_softcap": ANY}


FAMILY = Family(
    model_type="gemma2", title="Gemma 2 (decoder, alternating sliding/global layers, soft-capped scores and logits)",
    decoder=True, architectures=("Gemma2Model", "Gemma2ForCausalLM"), prefixes=("", "model."),
    probe="embed_tokens.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                                        "rope_parameters", "final_logit_softcapping", "attn_logit_softcapping"),
    weights=weights, preset=preset, switches=SWITCHES, requires=lambda cfg: gemma3_text.scaled_problems(cfg, "Gemma 2"))

"""Granite (IBM Granite 3.x dense): GraniteModel / GraniteForCausalLM. LLaMA-shaped with four scalars:
embeddings multiplied by embedding_multiplier, scores by attention_multiplier (in place of
1/sqrt(head_dim)), each sublayer's output by residual_multiplier before its residual add, and the
logits divided by logits_scaling; q/k/v/o and MLP biases as attention_bias / mlp_bias say.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, ModelLoadError, Weight, heads_fill_width, preset_of, real

preset = preset_of(dict(family="granite", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-6))

# GraniteConfig's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048,
               "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "embedding_multiplier": 1.0,
               "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
               "bos_token_id": 1, "eos_token_id": 2}
MULTIPLIERS = ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier")


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    for key in MULTIPLIERS:
        value = d[key]
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise ModelLoadError(path, f"{key} must be a positive finite number, got {value!r}")
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields({**d, "head_dim": None}, path, lm_head=FAMILY.has_lm_head(d))
    residual = real(d["residual_multiplier"])
    return preset(**fields, **rope, attention_bias=bool(d["attention_bias"]), mlp_bias=bool(d["mlp_bias"]),
                  embed_scale=real(d["embedding_multiplier"]), attn_scale=real(d["attention_multiplier"]),
                  residual_multiplier=None if residual == 1.0 else residual,
                  lm_head_scale=None if d["logits_scaling"] == 1 else 1.0 / d["logits_scaling"],
                  pad_token_id=d.get("pad_token_id"))


def config_to_hf(cfg: ModelConfig) -> dict:
    out = llama_like.decoder_to_hf(cfg)
    del out["head_dim"]
    return {**out, "hidden_act": "silu", "attention_bias": cfg.attention_bias, "mlp_bias": cfg.mlp_bias,
            "embedding_multiplier": cfg.embed_scale if cfg.embed_scale is not None else 1.0,
            "attention_multiplier": cfg.attn_scale if cfg.attn_scale is not None else cfg.d_head ** -0.5,
            "residual_multiplier": cfg.residual_multiplier if cfg.residual_multiplier is not None else 1.0,
            "logits_scaling": 1.0 / cfg.lm_head_scale if cfg.lm_head_scale is not None else 1.0,
            "pad_token_id": cfg.pad_token_id,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# the four multipliers; q/k/v/o biases together, MLP biases
SWITCHES = {**llama_like.SWITCHES, "embed_scale": ANY, "attn_scale": ANY, "residual_multiplier": ANY,
            "lm_head_scale": ANY, "attention_bias": (True, False), "mlp_bias": (True, False)}


FAMILY = Family(
    model_type="granite", title="Granite (decoder, RoPE, RMSNorm, SwiGLU, embedding/attention/residual/logit scalars)",
    decoder=True, architectures=("GraniteModel", "GraniteForCausalLM"), prefixes=("", "model."),
    probe="embed_tokens.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_parameters") + MULTIPLIERS,
    weights=weights, preset=preset, switches=SWITCHES, requires=lambda cfg: heads_fill_width(cfg, "Granite"))

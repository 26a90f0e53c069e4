"""Mistral: MistralModel / MistralForCausalLM. LLaMA-shaped without biases, grouped-query attention,
and one sliding window (when sliding_window is set) on every layer.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, ModelLoadError, Weight, preset_of

preset = preset_of(dict(family="mistral", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-6))

# MistralConfig's defaults for the fields that change the computation: note the 4096-token window
# a config.json without "sliding_window" gets.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 4096 * 32,
               "sliding_window": 4096, "num_key_value_heads": 8, "bos_token_id": 1, "eos_token_id": 2}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    if d.get("layer_types") is not None:
        # MistralModel ignores layer_types (it windows every layer); such a config was written for
        # Ministral's alternating layers, which this family does not compute
        raise ModelLoadError(path, "layer_types is not supported for model_type 'mistral' (every Mistral layer "
                                   "uses the same sliding_window; per-layer types are Ministral's)")
    window = d.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ModelLoadError(path, f"sliding_window must be a positive integer or null, got {window!r}")
    rope = llama_like.rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope,
                  sliding_window=window)


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "sliding_window": cfg.sliding_window,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# no biases; one sliding window on every layer (per-layer types would be Ministral's)
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (False,), "mlp_bias": (False,), "sliding_window": ANY}


FAMILY = Family(
    model_type="mistral", title="Mistral (decoder, RoPE, RMSNorm, SwiGLU, sliding window)", decoder=True,
    architectures=("MistralModel", "MistralForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "sliding_window", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES)

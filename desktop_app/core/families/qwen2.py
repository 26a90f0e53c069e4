"""Qwen2 / Qwen2.5: Qwen2Model / Qwen2ForCausalLM. LLaMA-shaped, with biases on q, k and v (always,
whatever attention_bias says: the transformers class hard-codes them) and none on o_proj; an optional
sliding window on the layers from max_window_layers on (or those layer_types names).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, Weight, preset_of

preset = preset_of(dict(family="qwen2", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=True, attention_out_bias=False,
                        mlp_bias=False, final_norm=True, tie_embeddings=False, norm_eps=1e-6))

# Qwen2Config's defaults for the fields that change the computation (a config.json may omit them).
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
               "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope,
                  **llama_like.qwen_windows(d, path))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu",
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            **llama_like.qwen_windows_to_hf(cfg)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# q, k, v biases without an o_proj bias; Qwen2's optional sliding window
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (True,), "attention_out_bias": (False,), "mlp_bias": (False,),
            "sliding_window": ANY, "layer_types": ANY}


FAMILY = Family(
    model_type="qwen2", title="Qwen2 / Qwen2.5 (decoder, RoPE, RMSNorm, SwiGLU, q/k/v biases)", decoder=True,
    architectures=("Qwen2Model", "Qwen2ForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "rope_parameters", "use_sliding_window", "sliding_window",
                                        "layer_types"),
    weights=weights, preset=preset, switches=SWITCHES)

"""Qwen3: Qwen3Model / Qwen3ForCausalLM. LLaMA-shaped, with an RMSNorm over each head's q and k
(before rotary), an explicit head_dim (128 when config.json has none), biases on q, k, v and o only
when attention_bias says so, and Qwen2's optional sliding window.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, Weight, preset_of

preset = preset_of(dict(family="qwen3", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False, qk_norm=True,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-6))

# Qwen3Config's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
               "head_dim": 128, "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
               "max_window_layers": 28}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope,
                  attention_bias=bool(d["attention_bias"]), **llama_like.qwen_windows(d, path))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            **llama_like.qwen_windows_to_hf(cfg)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# q/k norms; q, k, v and o biases together (attention_bias); Qwen2's optional sliding window
SWITCHES = {**llama_like.SWITCHES, "qk_norm": (True,), "attention_bias": (True, False), "mlp_bias": (False,),
            "sliding_window": ANY, "layer_types": ANY}


FAMILY = Family(
    model_type="qwen3", title="Qwen3 (decoder, RoPE, RMSNorm, SwiGLU, q/k norm)", decoder=True,
    architectures=("Qwen3Model", "Qwen3ForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "attention_bias", "rope_parameters", "use_sliding_window",
                                        "sliding_window", "layer_types"),
    weights=weights, preset=preset, switches=SWITCHES)

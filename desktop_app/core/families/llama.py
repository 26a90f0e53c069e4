"""LLaMA: LlamaModel / LlamaForCausalLM (RMSNorm, rotary positions, SwiGLU, grouped-query attention).

Every tensor maps one to one; biases exist only where attention_bias / mlp_bias say so. The
config.json fields LLaMA shares with Qwen2, Qwen3, Mistral and Gemma 3 (sizes, head_dim, the rotary
block with its "linear" and "llama3" scalings) are read and written by llama_like.
"""
from __future__ import annotations

from pathlib import Path

from ..config import CLASSIC_PRESETS, ModelConfig
from . import llama_like
from .base import Family, Weight, preset_of

preset = preset_of(CLASSIC_PRESETS["llama"])  # the switches ModelConfig.llama() builds too


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope,
                  attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)))


def config_to_hf(cfg: ModelConfig) -> dict:
    # rope_theta stays at the top level (older readers, and an edit to it alone is still checked);
    # a scaling goes in rope_parameters, which transformers reads first
    scaled = {} if cfg.rope_scaling is None else {
        "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}
    return {**llama_like.decoder_to_hf(cfg), "rope_theta": cfg.rope_theta, **scaled, "hidden_act": "silu",
            "attention_bias": cfg.attention_bias, "mlp_bias": cfg.mlp_bias}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)  # the table Qwen2, Qwen3, Mistral and Gemma 3 share


# q/k/v/o biases together (attention_bias), MLP biases (mlp_bias); no windows, no q/k norms
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (True, False), "mlp_bias": (True, False)}


FAMILY = Family(
    model_type="llama", title="LLaMA (decoder, RoPE, RMSNorm, SwiGLU)", decoder=True,
    architectures=("LlamaModel", "LlamaForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "rope_theta", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES)

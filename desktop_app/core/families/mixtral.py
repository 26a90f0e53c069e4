"""Mixtral: MixtralModel / MixtralForCausalLM. Mistral's attention (grouped-query, an optional sliding
window on every layer) with a mixture of experts for each MLP (core/moe.py): a router over
num_local_experts SwiGLU experts (w1 gate, w3 up, w2 down), num_experts_per_tok of them per token,
weighted by their softmax probabilities renormalised over the chosen.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, POSITIVE, Family, ModelLoadError, Weight, preset_of

preset = preset_of(dict(family="mixtral", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-5, rope_theta=1e6,
                        num_experts=8, experts_per_token=2, expert_weights_float32=True))

# MixtralConfig's defaults for the fields that change the computation
HF_DEFAULTS = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 4096 * 32,
               "sliding_window": None, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
               "rope_theta": 1e6, "bos_token_id": 1, "eos_token_id": 2}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    window = d.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ModelLoadError(path, f"sliding_window must be a positive integer or null, got {window!r}")
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **llama_like.rope(d, path),
                  sliding_window=window, **llama_like.experts_from_hf(d, path, "num_local_experts"))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "sliding_window": cfg.sliding_window,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            **llama_like.experts_to_hf(cfg, "num_local_experts")}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg, experts=llama_like.MIXTRAL_EXPERTS)


# Mistral's switches, and experts always renormalised over the chosen
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (False,), "mlp_bias": (False,), "sliding_window": ANY,
            "num_experts": POSITIVE, "router_norm": ("renormalised",),
            "expert_weights_float32": (True,)}  # MixtralTopKRouter's weights stay float32


FAMILY = Family(
    model_type="mixtral", title="Mixtral (decoder, mixture of experts, RoPE, RMSNorm, SwiGLU experts)", decoder=True,
    architectures=("MixtralModel", "MixtralForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "sliding_window", "rope_parameters", "num_local_experts",
                                        "num_experts_per_tok"),
    weights=weights, preset=preset, switches=SWITCHES, moe=True)

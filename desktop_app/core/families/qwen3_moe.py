"""Qwen3-MoE: Qwen3MoeModel / Qwen3MoeForCausalLM. Qwen3's attention (q/k norm per head, explicit
head_dim, optional biases) with a mixture of experts for each MLP (core/moe.py): num_experts SwiGLU
experts of width moe_intermediate_size, num_experts_per_tok per token, their softmax probabilities
renormalised over the chosen only when norm_topk_prob. Every layer sparse (mlp_only_layers empty);
sliding windows refused.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import POSITIVE, Family, Weight, preset_of

preset = preset_of(dict(family="qwen3_moe", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False, qk_norm=True,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-6,
                        num_experts=8, experts_per_token=2, router_norm="softmax"))

# Qwen3MoeConfig's defaults for the fields that change the computation
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
               "head_dim": 128, "attention_bias": False, "num_local_experts": 128, "num_experts_per_tok": 8,
               "norm_topk_prob": False, "moe_intermediate_size": 768}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **llama_like.aliased(d, "num_local_experts", "num_experts")}
    llama_like.silu_only(d, path)
    fields = {**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **llama_like.qwen_moe_fields(d, path, "num_local_experts")}
    return preset(**fields, **llama_like.rope(d, path), attention_bias=bool(d["attention_bias"]))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling), "sliding_window": None,
            **llama_like.qwen_moe_to_hf(cfg, "num_local_experts")}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


SWITCHES = {**llama_like.SWITCHES, "qk_norm": (True,), "attention_bias": (True, False), "mlp_bias": (False,),
            "num_experts": POSITIVE, "router_norm": ("renormalised", "softmax")}


FAMILY = Family(
    model_type="qwen3_moe", title="Qwen3-MoE (decoder, mixture of experts, RoPE, q/k norm)", decoder=True,
    architectures=("Qwen3MoeModel", "Qwen3MoeForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "attention_bias", "rope_parameters", "num_local_experts",
                                        "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"),
    weights=weights, preset=preset, switches=SWITCHES, moe=True)

"""Qwen2-MoE: Qwen2MoeModel / Qwen2MoeForCausalLM. Qwen2's attention (biases on q, k, v when qkv_bias,
none on o) with a mixture of experts for each MLP (core/moe.py): num_experts SwiGLU experts of width
moe_intermediate_size, num_experts_per_tok per token (renormalised only when norm_topk_prob), plus a
shared expert every token runs (width shared_expert_intermediate_size), scaled by a sigmoid gate.
Every layer sparse (mlp_only_layers empty); sliding windows refused.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import POSITIVE, Family, Weight, preset_of

preset = preset_of(dict(family="qwen2_moe", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=True, attention_out_bias=False,
                        mlp_bias=False, final_norm=True, tie_embeddings=False, norm_eps=1e-6,
                        num_experts=8, experts_per_token=2, router_norm="softmax", shared_expert_d_ff=256,
                        shared_expert_gate=True))

# Qwen2MoeConfig's defaults for the fields that change the computation
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
               "qkv_bias": True, "num_experts": 60, "num_experts_per_tok": 4, "norm_topk_prob": False,
               "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    fields = {**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **llama_like.qwen_moe_fields(d, path, "num_experts")}
    shared = d["shared_expert_intermediate_size"]
    return preset(**fields, **llama_like.rope(d, path), attention_bias=bool(d["qkv_bias"]),
                  shared_expert_d_ff=shared, shared_expert_gate=bool(shared))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "qkv_bias": cfg.attention_bias,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            "shared_expert_intermediate_size": cfg.shared_expert_d_ff, **llama_like.qwen_moe_to_hf(cfg, "num_experts")}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# q/k/v biases together (qkv_bias), never on o; the shared expert always gated
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (True, False), "attention_out_bias": (False,),
            "mlp_bias": (False,), "num_experts": POSITIVE, "router_norm": ("renormalised", "softmax"),
            "shared_expert_d_ff": POSITIVE, "shared_expert_gate": (True,)}


FAMILY = Family(
    model_type="qwen2_moe", title="Qwen2-MoE (decoder, mixture of experts with a shared expert, RoPE)", decoder=True,
    architectures=("Qwen2MoeModel", "Qwen2MoeForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "qkv_bias", "rope_parameters", "num_experts",
                                        "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                                        "shared_expert_intermediate_size"),
    weights=weights, preset=preset, switches=SWITCHES, moe=True)

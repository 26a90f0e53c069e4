"""OLMoE: OlmoeModel / OlmoeForCausalLM. LLaMA-shaped attention with RMSNorms over the whole q and k
projections (all heads at once: qk_norm_across_heads) and biases on q, k, v and o when attention_bias,
and a mixture of experts for each MLP (core/moe.py): num_experts SwiGLU experts of width
intermediate_size, num_experts_per_tok per token (renormalised only when norm_topk_prob). clip_qkv is
refused.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import POSITIVE, Family, ModelLoadError, Weight, preset_of

preset = preset_of(dict(family="olmoe", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False, qk_norm=True,
                        qk_norm_across_heads=True, final_norm=True, tie_embeddings=False, norm_eps=1e-5,
                        num_experts=8, experts_per_token=2, router_norm="softmax",
                        router_aux_loss_coef=0.01))  # OlmoeConfig's (the others' 0.001)

# OlmoeConfig's defaults for the fields that change the computation
HF_DEFAULTS = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 4096,
               "attention_bias": False, "clip_qkv": None, "num_experts": 64, "num_experts_per_tok": 8,
               "norm_topk_prob": False, "pad_token_id": 1, "eos_token_id": 50279}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **llama_like.aliased(d, "num_experts", "num_local_experts")}
    llama_like.silu_only(d, path)
    if d.get("clip_qkv") is not None:
        raise ModelLoadError(path, f"clip_qkv {d['clip_qkv']!r} is not supported (only null)")
    fields = llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d))
    if fields["head_dim"] is not None:  # the norms' widths are hidden_size-based in transformers' class
        raise ModelLoadError(path, "head_dim must be hidden_size / num_attention_heads for model_type 'olmoe'")
    return preset(**fields, **llama_like.rope(d, path), attention_bias=bool(d["attention_bias"]),
                  **llama_like.experts_from_hf(d, path, "num_experts", aux_loss_coef=0.01))


def config_to_hf(cfg: ModelConfig) -> dict:
    out = {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "attention_bias": cfg.attention_bias,
           "clip_qkv": None, "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
           **llama_like.experts_to_hf(cfg, "num_experts")}
    del out["head_dim"]  # OlmoeConfig has none (the width is hidden_size / heads)
    return out


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


SWITCHES = {**llama_like.SWITCHES, "qk_norm": (True,), "qk_norm_across_heads": (True,), "attention_bias": (True, False),
            "mlp_bias": (False,), "num_experts": POSITIVE, "router_norm": ("renormalised", "softmax")}
del SWITCHES["head_dim"]


def requires(cfg: ModelConfig) -> list[str]:
    return [] if cfg.at_default("head_dim") else [f"head_dim {cfg.head_dim}: OlmoeForCausalLM's is hidden_size / heads"]


FAMILY = Family(
    model_type="olmoe", title="OLMoE (decoder, mixture of experts, RoPE, q/k norm over all heads)", decoder=True,
    architectures=("OlmoeModel", "OlmoeForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=tuple(k for k in llama_like.STRUCTURAL if k != "head_dim") + (
        "hidden_act", "attention_bias", "rope_parameters", "num_experts", "num_experts_per_tok", "norm_topk_prob",
        "clip_qkv"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, moe=True)

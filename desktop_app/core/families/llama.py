"""LLaMA: LlamaModel / LlamaForCausalLM (RMSNorm, rotary positions, SwiGLU, grouped-query attention).

Every tensor maps one to one; biases exist only where attention_bias / mlp_bias say so.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import Family, ModelLoadError, Weight, hf_dtype, preset_of, real, required
from .gpt2 import classic_switches

preset = preset_of(dict(family="llama", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-6))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    if d.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(path, f"unsupported hidden_act {d.get('hidden_act')!r}")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ModelLoadError(path, f"unsupported rope scaling {rope!r}")
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    if d.get("head_dim") not in (None, hidden // heads):
        raise ModelLoadError(path, "head_dim different from hidden_size / num_attention_heads is not supported")
    eos = d.get("eos_token_id")
    return preset(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"), n_heads=heads,
        n_kv_heads=d.get("num_key_value_heads") or heads, d_ff=need("intermediate_size"),
        context_length=d.get("max_position_embeddings", 2048), norm_eps=d.get("rms_norm_eps", 1e-6),
        rope_theta=real(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
        attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)), lm_head=FAMILY.has_lm_head(d),
        dtype=hf_dtype(d), bos_token_id=d.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
            "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "mlp_bias": cfg.mlp_bias, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)  # the table Qwen2, Qwen3, Mistral and Gemma 3 share


def hf_compatible(cfg: ModelConfig) -> bool:
    return (cfg.norm == "rmsnorm" and cfg.positions == "rotary" and cfg.norm_placement == "pre"
            and cfg.activation == "swiglu" and cfg.final_norm and not cfg.type_vocab_size and not cfg.embed_norm
            and cfg.causal and cfg.lm_head_kind == "linear" and classic_switches(cfg))


FAMILY = Family(
    model_type="llama", title="LLaMA (decoder, RoPE, RMSNorm, SwiGLU)", decoder=True,
    architectures=("LlamaModel", "LlamaForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "max_position_embeddings", "hidden_act", "rms_norm_eps", "rope_theta"),
    weights=weights, preset=preset, hf_compatible=hf_compatible)

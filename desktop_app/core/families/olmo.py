"""OLMo (1): OlmoModel / OlmoForCausalLM. LLaMA-shaped with non-parametric LayerNorms (no weight, no
bias, eps 1e-5) before each sublayer and at the end, q, k and v optionally clamped to [-clip_qkv,
clip_qkv], and biases on q, k, v and o together (attention_bias).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, Weight, heads_fill_width, preset_of, real
from .rope import rope_to_hf

preset = preset_of(dict(family="olmo", norm="layernorm_plain", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-5, rotary_precision="float32"))

# OlmoConfig's defaults for the fields that change the computation; its LayerNorm's eps is fixed at 1e-5
HF_DEFAULTS = {"tie_word_embeddings": False, "max_position_embeddings": 2048, "hidden_act": "silu",
               "attention_bias": False, "clip_qkv": None, "pad_token_id": 1, "bos_token_id": None,
               "eos_token_id": 50279}
EPS = 1e-5


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields({**d, "rms_norm_eps": EPS, "head_dim": None}, path,
                                       lm_head=FAMILY.has_lm_head(d))
    clip = d["clip_qkv"]
    return preset(**fields, **rope, attention_bias=bool(d["attention_bias"]),
                  clip_qkv=None if clip is None else real(clip), pad_token_id=d["pad_token_id"])


def config_to_hf(cfg: ModelConfig) -> dict:
    out = llama_like.decoder_to_hf(cfg)
    del out["head_dim"], out["rms_norm_eps"]
    return {**out, "hidden_act": "silu", "attention_bias": cfg.attention_bias, "clip_qkv": cfg.clip_qkv,
            "pad_token_id": cfg.pad_token_id, "rope_parameters": rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    """LLaMA's table without any norm (OLMo's have no weights)."""
    return [w for w in llama_like.weights(cfg, norms=()) if w.theirs != "norm.weight"]


# the non-parametric LayerNorm, clipped q/k/v, q/k/v/o biases together
SWITCHES = {**llama_like.SWITCHES, "norm": ("layernorm_plain",), "attention_bias": (True, False),
            "mlp_bias": (False,), "clip_qkv": ANY,
            "rotary_precision": ("float32",)}  # its cos and sin float32, q and k upcast to them


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.norm_eps != EPS:
        problems.append(f"norm_eps {cfg.norm_eps!r}: OLMo's LayerNorm eps is fixed at {EPS}")
    return problems + heads_fill_width(cfg, "OLMo")


FAMILY = Family(
    model_type="olmo", title="OLMo (decoder, RoPE, non-parametric LayerNorm, SwiGLU, clipped q/k/v)", decoder=True,
    architectures=("OlmoModel", "OlmoForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "hidden_act", "attention_bias", "clip_qkv", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires)

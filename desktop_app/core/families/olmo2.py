"""OLMo 2: Olmo2Model / Olmo2ForCausalLM. LLaMA-shaped, but its norms sit on each sublayer's output,
before the residual add, and none on its input (norm_placement "output": x + norm(attn(x)), then
+ norm(mlp(.))), and q and k are RMS-normed over all heads at once before the split into heads
(qk_norm_across_heads). Biases on q, k, v and o only when attention_bias says so.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import Family, Weight, preset_of

preset = preset_of(dict(family="olmo2", norm="rmsnorm", norm_placement="output", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False, qk_norm=True,
                        qk_norm_across_heads=True, final_norm=True, tie_embeddings=False, norm_eps=1e-5,
                        rotary_precision="float32", norm_gain_float32=True))

# Olmo2Config's defaults for the fields that change the computation
HF_DEFAULTS = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 2048,
               "attention_bias": False}

# (Hugging Face name under layers.{i}., ours under blocks.{i}.): the two output norms
NORMS = (("post_attention_layernorm", "post_attn_norm"), ("post_feedforward_layernorm", "post_mlp_norm"))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope,
                  attention_bias=bool(d["attention_bias"]))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg, NORMS)


# output norms, q/k norms over all heads, q/k/v/o biases together (attention_bias); head_dim as config.json gives it
SWITCHES = {**llama_like.SWITCHES, "norm_placement": ("output",),
            "qk_norm": (True,), "qk_norm_across_heads": (True,), "attention_bias": (True, False), "mlp_bias": (False,),
            "rotary_precision": ("float32",), "norm_gain_float32": (True,)}  # its cos and sin float32, q and k upcast to them


FAMILY = Family(
    model_type="olmo2", title="OLMo 2 (decoder, RoPE, RMSNorm on sublayer outputs, SwiGLU, q/k norm)", decoder=True,
    architectures=("Olmo2Model", "Olmo2ForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "attention_bias", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES)

"""StableLM (StableLM 2, StableLM-3B-4E1T, Zephyr): StableLmModel / StableLmForCausalLM. LLaMA-shaped
with LayerNorms (weight and bias), a partial rotary factor (0.25 unless given), and biases on q, k
and v only when use_qkv_bias says so (never on o). Two of its options are refused: per-head q/k
LayerNorms (qk_layernorm) and the parallel residual with one shared norm (use_parallel_residual).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like, phi
from .base import ANY, Family, ModelLoadError, Weight, heads_fill_width, preset_of, weight
from .rope import partial_rope, rope_to_hf

preset = preset_of(dict(family="stablelm", norm="layernorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", rotary_fraction=0.25, causal=True, attention_bias=False,
                        attention_out_bias=False, mlp_bias=False, final_norm=True, tie_embeddings=False,
                        norm_eps=1e-5))

# StableLmConfig's defaults for the fields that change the computation.
HF_DEFAULTS = {"layer_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 4096,
               "hidden_act": "silu", "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False,
               "bos_token_id": 0, "eos_token_id": 0}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    phi.one_qk_norm_only(d, path, "StableLM")
    if d["use_parallel_residual"]:
        raise ModelLoadError(path, "use_parallel_residual true is not supported yet: attention and MLP read one "
                                   "shared norm there")
    rope = partial_rope(d, path, 0.25)
    fields = llama_like.decoder_fields({**d, "rms_norm_eps": d["layer_norm_eps"], "head_dim": None}, path,
                                       lm_head=FAMILY.has_lm_head(d))
    return preset(**fields, **rope, attention_bias=bool(d["use_qkv_bias"]))


def config_to_hf(cfg: ModelConfig) -> dict:
    out = llama_like.decoder_to_hf(cfg)
    del out["head_dim"], out["rms_norm_eps"]
    return {**out, "layer_norm_eps": cfg.norm_eps, "hidden_act": "silu", "use_qkv_bias": cfg.attention_bias,
            "qk_layernorm": False, "use_parallel_residual": False, "pad_token_id": cfg.pad_token_id,
            "rope_parameters": {**rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
                                "partial_rotary_factor": cfg.rotary_fraction}}


def weights(cfg: ModelConfig) -> list[Weight]:
    """LLaMA's table, and the LayerNorms' biases."""
    biases = [weight(f"layers.{i}.{theirs}.bias", f"blocks.{i}.{ours}.bias")
              for i in range(cfg.n_layers) for theirs, ours in llama_like.LLAMA_NORMS]
    return llama_like.weights(cfg) + biases + [weight("norm.bias", "final_norm.bias")]


# LayerNorm, partial rotary, q/k/v biases without o's
SWITCHES = {**llama_like.SWITCHES, "norm": ("layernorm",), "rotary_fraction": ANY, "attention_bias": (True, False),
            "attention_out_bias": (False,), "mlp_bias": (False,)}


FAMILY = Family(
    model_type="stablelm", title="StableLM (decoder, partial RoPE, LayerNorm, SwiGLU)", decoder=True,
    architectures=("StableLmModel", "StableLmForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "layer_norm_eps", "hidden_act", "use_qkv_bias", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES, requires=lambda cfg: heads_fill_width(cfg, "StableLM"))

"""Cohere (Command R): CohereModel / CohereForCausalLM. Attention and MLP side by side from ONE LayerNorm
per layer (a weight, no bias; the block's shared_input_norm, as Phi's and GPT-J's), a SwiGLU MLP,
rotary positions that rotate interleaved pairs (dims 2i, 2i+1), logits multiplied by logit_scale, tied
embeddings; q, k, v and o biases together (attention_bias). Per-head q/k LayerNorms (use_qk_norm,
Command R+) are refused.

Interleaved pairs are LLaMA's rotate-half on q and k with each head's dims reordered (even ones, then odd
ones): the weight table reorders the rows (and biases) of q_proj and k_proj on reading and back on writing
(INTERLEAVED_ROTARY, as GPT-J's), and since q . k is the same under one reordering of both, scores, patterns
and outputs are Cohere's. Only the recorded queries (blocks.L.attn.q) list each head's dims in that order.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, INTERLEAVED_ROTARY, Family, ModelLoadError, Weight, heads_fill_width, preset_of, weight

preset = preset_of(dict(family="cohere", norm="layernorm_nobias", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        parallel_residual=True, shared_input_norm=True, final_norm=True, tie_embeddings=True,
                        norm_eps=1e-5, lm_head_scale=0.0625, rotary_precision="float32_rounded",
                        parallel_sum="input_first"))

HF_DEFAULTS = {"layer_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 8192,
               "hidden_act": "silu", "attention_bias": False, "use_qk_norm": False, "logit_scale": 0.0625,
               "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    if d["use_qk_norm"]:
        raise ModelLoadError(path, "use_qk_norm true is not supported: Cohere's q/k LayerNorms are one per head "
                                   "(this app shares one across heads)")
    scale = d["logit_scale"]
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
        raise ModelLoadError(path, f"logit_scale must be a positive number, got {scale!r}")
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields({**d, "rms_norm_eps": d["layer_norm_eps"], "head_dim": None}, path,
                                       lm_head=FAMILY.has_lm_head(d))
    return preset(**fields, **rope, attention_bias=bool(d["attention_bias"]), lm_head_scale=float(scale),
                  pad_token_id=d["pad_token_id"])


def config_to_hf(cfg: ModelConfig) -> dict:
    out = llama_like.decoder_to_hf(cfg)
    del out["head_dim"], out["rms_norm_eps"]
    return {**out, "layer_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "use_qk_norm": False, "logit_scale": cfg.lm_head_scale if cfg.lm_head_scale is not None else 1.0,
            "pad_token_id": cfg.pad_token_id, "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    """LLaMA's table with q/k rows reordered and the one input norm of a layer."""
    reordered = ("self_attn.q_proj", "self_attn.k_proj")
    table = []
    for w in llama_like.weights(cfg, norms=()):
        rows = any(w.theirs.endswith((p + ".weight", p + ".bias")) for p in reordered)
        table.append(weight(w.theirs, w.ours, INTERLEAVED_ROTARY, outside_prefix=w.outside_prefix) if rows else w)
    table += [weight(f"layers.{i}.input_layernorm.weight", f"blocks.{i}.norm1.weight") for i in range(cfg.n_layers)]
    return table


# the weight-only LayerNorm, the parallel block with its one input norm, the logit scale; q/k/v/o biases together
SWITCHES = {**llama_like.SWITCHES, "norm": ("layernorm_nobias",), "parallel_residual": (True,),
            "shared_input_norm": (True,),
            "lm_head_scale": ANY, "attention_bias": (True, False), "mlp_bias": (False,),
            "rotary_precision": ("float32_rounded",),
            "parallel_sum": ("input_first",)}  # residual + attn + mlp  # q, k upcast, times cos and sin rounded to their dtype


def requires(cfg: ModelConfig) -> list[str]:
    problems = heads_fill_width(cfg, "Cohere")
    if cfg.rotary_fraction != 1.0:
        problems.append(f"rotary_fraction {cfg.rotary_fraction}: Cohere rotates every dim")
    return problems


FAMILY = Family(
    model_type="cohere", title="Cohere / Command R (decoder, parallel attention and MLP from one LayerNorm, "
                               "interleaved RoPE)", decoder=True,
    architectures=("CohereModel", "CohereForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "layer_norm_eps", "hidden_act", "rope_parameters", "logit_scale"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, trainable=False)

"""Cohere (Command R): CohereModel / CohereForCausalLM. Attention and MLP side by side from ONE LayerNorm
per layer (a weight, no bias; the block's shared_input_norm, as Phi's and GPT-J's), a SwiGLU MLP,
rotary positions that rotate interleaved pairs (dims 2i, 2i+1), logits multiplied by logit_scale, tied
embeddings; q, k, v and o biases together (attention_bias). Per-head q/k LayerNorms (use_qk_norm,
Command R+) are refused.

Interleaved pairs are LLaMA's rotate-half on q and k with each head's dims reordered (even ones, then odd
ones): the weight table reorders the rows of q_proj and k_proj on reading (and back on writing), and
since q . k is the same under one reordering of both, scores, patterns and outputs are Cohere's. Only
the recorded queries (blocks.L.attn.q) list each head's dims in that order.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Conversion, Family, ModelLoadError, Weight, preset_of, weight

preset = preset_of(dict(family="cohere", norm="layernorm_nobias", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        parallel_residual=True, shared_input_norm=True, final_norm=True, tie_embeddings=True,
                        norm_eps=1e-5, lm_head_scale=0.0625))

HF_DEFAULTS = {"layer_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 8192,
               "hidden_act": "silu", "attention_bias": False, "use_qk_norm": False, "logit_scale": 0.0625,
               "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001}


def _halves(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows (or biases) from pair order (0, 1, 2, 3, ...) to halves order (0, 2, ..., 1, 3, ...)."""
    per_head = t.reshape(heads, -1, 2, *t.shape[1:])
    return per_head.transpose(1, 2).reshape(t.shape)


def _pairs(t: torch.Tensor, heads: int) -> torch.Tensor:
    per_head = t.reshape(heads, 2, -1, *t.shape[1:])
    return per_head.transpose(1, 2).reshape(t.shape)


def interleaved(heads_of) -> Conversion:
    """q_proj / k_proj rows (weights or biases) in Cohere's pair order <-> rotate-half order, per head."""
    return Conversion("interleaved rotary", lambda t, cfg: [_halves(t, heads_of(cfg))],
                      lambda parts, cfg: _pairs(parts[0], heads_of(cfg)))


Q_ROWS, K_ROWS = interleaved(lambda cfg: cfg.n_heads), interleaved(lambda cfg: cfg.n_kv_heads)


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
    reorder = {"self_attn.q_proj": Q_ROWS, "self_attn.k_proj": K_ROWS}
    table = []
    for w in llama_like.weights(cfg, norms=()):
        proj = next((p for p in reorder if w.theirs.endswith((p + ".weight", p + ".bias"))), None)
        table.append(weight(w.theirs, w.ours, reorder[proj], outside_prefix=w.outside_prefix) if proj else w)
    table += [weight(f"layers.{i}.input_layernorm.weight", f"blocks.{i}.norm1.weight") for i in range(cfg.n_layers)]
    return table


# the weight-only LayerNorm, the parallel block with its one input norm, the logit scale; q/k/v/o biases together
SWITCHES = {**llama_like.SWITCHES, "norm": ("layernorm_nobias",), "parallel_residual": (True,),
            "shared_input_norm": (True,),
            "lm_head_scale": ANY, "attention_bias": (True, False), "mlp_bias": (False,)}


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.head_dim is not None and cfg.head_dim * cfg.n_heads != cfg.d_model:
        problems.append(f"head_dim {cfg.head_dim}: Cohere's heads are hidden_size / num_attention_heads wide")
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

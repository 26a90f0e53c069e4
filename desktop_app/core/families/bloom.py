"""Bloom: BloomModel / BloomForCausalLM. ALiBi instead of position vectors (a per-head bias on the scores
by distance: attention.alibi_mask), a LayerNorm on the embeddings, pre-LN blocks with biases, a GELU(tanh)
MLP 4x wide, tied embeddings, and q, k and v fused per head: query_key_value's rows are, for each head,
its q, then its k, then its v (not all q's first as GPT-2's c_attn).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig
from .base import (Conversion, Family, ModelLoadError, Weight, head_weights, heads_fill_width, hf_dtype, preset_of,
                   required, weight, weights_and_biases)

_switches = preset_of(dict(family="bloom", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                           positions="alibi", causal=True, attention_bias=True, mlp_bias=True, embed_norm=True,
                           final_norm=True, tie_embeddings=True, norm_eps=1e-5, context_length=2048))


def preset(**kw) -> ModelConfig:
    """Bloom's switches; its MLP is 4 x d_model wide whatever d_ff is given (BloomConfig has no such field:
    the family is load only, so no builder offers a width that would be overridden)."""
    cfg = _switches(**kw)
    return cfg.replace(d_ff=4 * cfg.d_model)


def _split(t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
    per_head = t.view(cfg.n_heads, 3, cfg.d_head, *t.shape[1:])
    return [per_head[:, i].reshape(cfg.n_heads * cfg.d_head, *t.shape[1:]) for i in range(3)]


def _join(parts: list[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    q, k, v = (p.view(cfg.n_heads, cfg.d_head, *p.shape[1:]) for p in parts)
    return torch.stack([q, k, v], dim=1).reshape(3 * cfg.n_heads * cfg.d_head, *parts[0].shape[1:])


# query_key_value [heads x (q, k, v) x d_head, ...] <-> q, k, v [heads x d_head, ...] (weights and biases;
# GPT-NeoX's and Falcon's per-head layout too)
PER_HEAD_QKV = Conversion("per-head q|k|v", _split, _join)
# a layer's input norm, and its second norm and 4x MLP, as BLOOM names them (GPT-NeoX's names too)
INPUT_NORM = (("input_layernorm", "norm1"),)
NORM2_AND_MLP = (("post_attention_layernorm", "norm2"), ("mlp.dense_h_to_4h", "mlp.up"),
                 ("mlp.dense_4h_to_h", "mlp.down"))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    if d.get("apply_residual_connection_post_layernorm"):
        raise ModelLoadError(path, "apply_residual_connection_post_layernorm true is not supported (the residual "
                                   "would start from the norm's output)")
    hidden = d.get("hidden_size", d.get("n_embed"))
    if hidden is None:
        raise ModelLoadError(path, "missing field 'hidden_size'")
    heads = d.get("n_head", d.get("num_attention_heads"))
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0 or hidden % heads:
        raise ModelLoadError(path, f"hidden_size {hidden!r} is not a multiple of n_head {heads!r}")
    eos = d.get("eos_token_id", 2)
    return preset(vocab_size=need("vocab_size"), d_model=hidden, n_layers=d.get("n_layer", d.get("num_hidden_layers")),
                  n_heads=heads, norm_eps=d.get("layer_norm_epsilon", 1e-5),
                  context_length=d.get("seq_length", 2048), tie_embeddings=bool(d.get("tie_word_embeddings", True)),
                  lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d), bos_token_id=d.get("bos_token_id", 1),
                  eos_token_id=eos[0] if isinstance(eos, list) else eos, pad_token_id=d.get("pad_token_id"))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"hidden_size": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
            "layer_norm_epsilon": cfg.norm_eps, "seq_length": cfg.context_length,
            "apply_residual_connection_post_layernorm": False, "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("word_embeddings.weight", "tok_embed.weight"),
             weight("word_embeddings_layernorm.weight", "embed_norm.weight"),
             weight("word_embeddings_layernorm.bias", "embed_norm.bias")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        table += weights_and_biases(h, b, INPUT_NORM)
        table += [weight(h + "self_attention.query_key_value.weight", tuple(b + f"attn.{x}.weight" for x in "qkv"),
                         PER_HEAD_QKV),
                  weight(h + "self_attention.query_key_value.bias", tuple(b + f"attn.{x}.bias" for x in "qkv"),
                         PER_HEAD_QKV),
                  weight(h + "self_attention.dense.weight", b + "attn.o.weight"),
                  weight(h + "self_attention.dense.bias", b + "attn.o.bias")]
        table += weights_and_biases(h, b, NORM2_AND_MLP)
    table += [weight("ln_f.weight", "final_norm.weight"), weight("ln_f.bias", "final_norm.bias")]
    return table + head_weights(cfg)


# ALiBi, the embedding LayerNorm; every size but the 4x MLP is free
SWITCHES = {"positions": ("alibi",), "activation": ("gelu_tanh",), "embed_norm": (True,)}


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.d_ff != 4 * cfg.d_model:
        problems.append(f"d_ff {cfg.d_ff}: Bloom's MLP is 4 x hidden_size = {4 * cfg.d_model} wide")
    return problems + heads_fill_width(cfg, "Bloom", "n_head")


FAMILY = Family(
    model_type="bloom", title="Bloom (decoder, ALiBi, embedding LayerNorm, per-head fused q|k|v)", decoder=True,
    architectures=("BloomModel", "BloomForCausalLM"), prefixes=("", "transformer."),
    probe="word_embeddings.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "n_layer", "n_head", "layer_norm_epsilon", "apply_residual_connection_post_layernorm"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, trainable=False)

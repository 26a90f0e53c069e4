"""GPT-NeoX (Pythia): GPTNeoXModel / GPTNeoXForCausalLM (parallel residual, partial rotary, LayerNorm).

q, k and v live in one query_key_value tensor laid out per head, [H, (q, k, v), d_head], not as
three blocks; the unembedding is `embed_out` on disk (transformers 5 writes that name too, and
reads an older `lm_head` as well).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import bloom
from .base import (ANY, UNGATED_ACTIVATIONS, Family, ModelLoadError, Weight, activation_from_hf, hf_dtype, preset_of,
                   required, weight, weights_and_biases)
from .rope import rope_block, rope_fields

# rotary_fraction stays 1.0 here: Pythia's 0.25 always comes from config.json (config_from_hf sets
# it), and a full rotary builds at any even head width (0.25 of a 4-wide head is not a rotation).
preset = preset_of(dict(family="gpt_neox", norm="layernorm", norm_placement="pre", activation="gelu",
                        positions="rotary", rotary_fraction=1.0, parallel_residual=True, causal=True,
                        attention_bias=True, mlp_bias=True, final_norm=True, tie_embeddings=False, norm_eps=1e-5))


def _rope(d: dict, path: Path) -> dict:
    """rope_theta, rotary_fraction and rope_scaling from rope_parameters (transformers 5), the older
    rope_scaling (both agreeing: families.rope), or else Pythia's rotary_pct / rotary_emb_base."""
    defaults = {"rope_theta": d.get("rope_theta", d.get("rotary_emb_base", 10000.0)),
                "partial_rotary_factor": d.get("partial_rotary_factor", d.get("rotary_pct", 0.25))}
    key, block = rope_block(d, path, defaults=defaults)
    return rope_fields(block, path, key, partial=True)


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = activation_from_hf(d, path, "hidden_act", "gelu", UNGATED_ACTIVATIONS)
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0 or hidden % heads:
        raise ModelLoadError(path, f"hidden_size {hidden!r} is not a multiple of num_attention_heads {heads!r}")
    eos = d.get("eos_token_id")
    bias = d.get("attention_bias", True)
    return preset(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"), n_heads=heads,
        d_ff=need("intermediate_size"), context_length=d.get("max_position_embeddings", 2048), activation=act,
        norm_eps=d.get("layer_norm_eps", 1e-5), **_rope(d, path),
        parallel_residual=d.get("use_parallel_residual", True),
        attention_bias=bias, tie_embeddings=d.get("tie_word_embeddings", False), lm_head=FAMILY.has_lm_head(d),
        dtype=hf_dtype(d), bos_token_id=d.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: ModelConfig) -> dict:
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_fraction}
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.context_length,
            "hidden_act": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "layer_norm_eps": cfg.norm_eps, "use_parallel_residual": cfg.parallel_residual,
            "attention_bias": cfg.attention_bias, "rope_parameters": rope,
            # the names transformers 4 reads (it ignores rope_parameters)
            "rotary_pct": cfg.rotary_fraction, "rotary_emb_base": cfg.rope_theta,
            "hidden_dropout": cfg.dropout, "attention_dropout": cfg.dropout,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("embed_in.weight", "tok_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"layers.{i}."
        # the per-head q|k|v layout and the norms' and MLP's names are BLOOM's; the attention's prefix is not
        table += weights_and_biases(h, b, bloom.INPUT_NORM)
        table += [weight(h + "attention.query_key_value.weight", tuple(b + f"attn.{x}.weight" for x in "qkv"),
                         bloom.PER_HEAD_QKV),
                  weight(h + "attention.dense.weight", b + "attn.o.weight")]
        if cfg.attention_bias:
            table += [weight(h + "attention.query_key_value.bias", tuple(b + f"attn.{x}.bias" for x in "qkv"),
                             bloom.PER_HEAD_QKV),
                      weight(h + "attention.dense.bias", b + "attn.o.bias")]
        table += weights_and_biases(h, b, bloom.NORM2_AND_MLP)
    table += [weight("final_layer_norm.weight", "final_norm.weight"),
              weight("final_layer_norm.bias", "final_norm.bias")]
    if cfg.lm_head and not cfg.tie_embeddings:
        table.append(weight("embed_out.weight", "lm_head.weight", outside_prefix=True, aliases=("lm_head.weight",)))
    return table


# rotary (partial, scaled), parallel or serial residual, biases on or off together
SWITCHES = {"positions": ("rotary",), "activation": ("gelu", "gelu_tanh", "relu"), "attention_bias": (True, False),
            "parallel_residual": (True, False), "rotary_fraction": ANY, "rope_scaling": ANY}


FAMILY = Family(
    model_type="gpt_neox", title="GPT-NeoX / Pythia (decoder, parallel residual, partial RoPE)", decoder=True,
    architectures=("GPTNeoXModel", "GPTNeoXForCausalLM"), prefixes=("", "gpt_neox."), probe="embed_in.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "hidden_act", "layer_norm_eps", "use_parallel_residual",
                "attention_bias", "rotary_pct", "rotary_emb_base"),
    weights=weights, preset=preset, switches=SWITCHES, trainable=False)

"""Falcon: FalconModel / FalconForCausalLM. Rotary positions, LayerNorms, a GELU MLP (ffn_hidden_size,
4 x hidden unless given), biases on every linear map when `bias` says so, tied embeddings, and one fused
query_key_value whose layout follows the architecture: Falcon-7B's multi-query (every q, then one k, one
v), the new decoder architecture's key/value groups (per group its q's, then its k, then its v), or
per head q, k, v (Bloom's). Attention and MLP run side by side (parallel_attn) from one LayerNorm (the
block's shared_input_norm, as Phi's) or, in the new architecture, from two (ln_attn, ln_mlp); without
parallel_attn the block is sequential. ALiBi (alibi: true, scaled with the scores in
Falcon) is refused.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig
from . import bloom
from .base import (ANY, Conversion, Family, ModelLoadError, Weight, fused, head_weights, heads_fill_width, hf_dtype,
                   preset_of, qkv_sizes, required, weight)
from .rope import rope_block, rope_fields, rope_to_hf

preset = preset_of(dict(family="falcon", norm="layernorm", norm_placement="pre", activation="gelu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        parallel_residual=True, shared_input_norm=True, final_norm=True, tie_embeddings=True,
                        norm_eps=1e-5))

HF_DEFAULTS = {"layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 2048,
               "alibi": False, "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
               "bias": False, "activation": "gelu", "num_ln_in_parallel_attn": None, "bos_token_id": 11,
               "eos_token_id": 11}


def _grouped_split(t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
    g = cfg.n_heads // cfg.n_kv_heads
    groups = t.view(cfg.n_kv_heads, g + 2, cfg.d_head, *t.shape[1:])
    return [groups[:, :g].reshape(cfg.n_heads * cfg.d_head, *t.shape[1:]),
            groups[:, g].reshape(cfg.n_kv_heads * cfg.d_head, *t.shape[1:]),
            groups[:, g + 1].reshape(cfg.n_kv_heads * cfg.d_head, *t.shape[1:])]


def _grouped_join(parts: list[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    q, k, v = parts
    rest = q.shape[1:]
    g = cfg.n_heads // cfg.n_kv_heads
    groups = torch.cat([q.view(cfg.n_kv_heads, g, cfg.d_head, *rest), k.view(cfg.n_kv_heads, 1, cfg.d_head, *rest),
                        v.view(cfg.n_kv_heads, 1, cfg.d_head, *rest)], dim=1)
    return groups.reshape((cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head, *rest)


# the new decoder architecture's query_key_value: per key/value group, its q's, then its k, then its v
GROUPED_QKV = Conversion("grouped q|k|v", _grouped_split, _grouped_join)


def _layout(cfg: ModelConfig) -> str:
    return cfg.extra.get("falcon_layout", "multi_query")


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    need = required(d, path)
    if d["alibi"]:
        raise ModelLoadError(path, "alibi true is not supported: Falcon scales ALiBi's bias with the scores "
                                   "(Bloom's ALiBi is not that)")
    if d["activation"] != "gelu":
        raise ModelLoadError(path, f"unsupported activation {d['activation']!r} (this family computes gelu)")
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    new, multi_query = bool(d["new_decoder_architecture"]), bool(d["multi_query"])
    layout = "grouped" if new else "multi_query" if multi_query else "per_head"
    kv = d.get("num_kv_heads") or heads if new else 1 if multi_query else heads
    norms = d["num_ln_in_parallel_attn"] or (2 if new else 1)
    parallel = bool(d["parallel_attn"]) or new
    if new and not d["parallel_attn"]:
        raise ModelLoadError(path, "new_decoder_architecture with parallel_attn false is not supported")
    key, block = rope_block(d, path, defaults={"rope_theta": d.get("rope_theta", 10000.0)})
    rope = rope_fields(block, path, key)
    eos = d["eos_token_id"]
    return preset(vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"), n_heads=heads,
                  n_kv_heads=kv, d_ff=d.get("ffn_hidden_size") or 4 * hidden,
                  context_length=d["max_position_embeddings"], norm_eps=d["layer_norm_epsilon"], **rope,
                  attention_bias=bool(d["bias"]), mlp_bias=bool(d["bias"]), parallel_residual=parallel,
                  tie_embeddings=bool(d["tie_word_embeddings"]), lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d),
                  bos_token_id=d["bos_token_id"], eos_token_id=eos[0] if isinstance(eos, list) else eos,
                  pad_token_id=d.get("pad_token_id"), shared_input_norm=parallel and norms == 1,
                  extra={"falcon_layout": layout})


def config_to_hf(cfg: ModelConfig) -> dict:
    layout = _layout(cfg)
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_kv_heads": cfg.n_kv_heads, "ffn_hidden_size": cfg.d_ff, "max_position_embeddings": cfg.context_length,
            "layer_norm_epsilon": cfg.norm_eps, "bias": cfg.attention_bias, "alibi": False, "activation": "gelu",
            "new_decoder_architecture": layout == "grouped", "multi_query": layout == "multi_query",
            "parallel_attn": cfg.parallel_residual,
            "num_ln_in_parallel_attn": (1 if cfg.shared_input_norm else 2) if cfg.parallel_residual else None,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
            "rope_parameters": rope_to_hf(cfg.rope_theta, cfg.rope_scaling)}


def weights(cfg: ModelConfig) -> list[Weight]:
    layout = _layout(cfg)
    qkv = {"grouped": GROUPED_QKV, "per_head": bloom.PER_HEAD_QKV, "multi_query": fused(qkv_sizes, "q|k|v")}[layout]
    biases = ("weight", "bias") if cfg.attention_bias else ("weight",)
    table = [weight("word_embeddings.weight", "tok_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        for x in ("weight", "bias"):
            if cfg.shared_input_norm:
                table.append(weight(h + f"input_layernorm.{x}", b + f"norm1.{x}"))
            else:
                first, second = ("ln_attn", "ln_mlp") if cfg.parallel_residual else ("input_layernorm",
                                                                                      "post_attention_layernorm")
                table += [weight(h + f"{first}.{x}", b + f"norm1.{x}"), weight(h + f"{second}.{x}", b + f"norm2.{x}")]
        for x in biases:
            table += [weight(h + f"self_attention.query_key_value.{x}", tuple(b + f"attn.{p}.{x}" for p in "qkv"), qkv),
                      weight(h + f"self_attention.dense.{x}", b + f"attn.o.{x}"),
                      weight(h + f"mlp.dense_h_to_4h.{x}", b + f"mlp.up.{x}"),
                      weight(h + f"mlp.dense_4h_to_h.{x}", b + f"mlp.down.{x}")]
    table += [weight("ln_f.weight", "final_norm.weight"), weight("ln_f.bias", "final_norm.bias")]
    return table + head_weights(cfg)


# GELU MLP, rotary, grouped keys and values, the parallel block (with one input norm or two) or not, biases together
SWITCHES = {"activation": ("gelu",), "positions": ("rotary",), "n_kv_heads": ANY, "rope_scaling": ANY,
            "parallel_residual": (True, False), "shared_input_norm": (True, False), "attention_bias": (True, False), "mlp_bias": (True, False)}


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.attention_bias != cfg.mlp_bias:
        problems.append("attention_bias and mlp_bias differ: Falcon's one `bias` sets both")
    problems += heads_fill_width(cfg, "Falcon")
    layout = _layout(cfg)
    if (layout == "multi_query" and cfg.n_kv_heads != 1) or (layout == "per_head" and cfg.n_kv_heads != cfg.n_heads):
        problems.append(f"n_kv_heads {cfg.n_kv_heads}: Falcon's {layout} layout fixes it")
    return problems


FAMILY = Family(
    model_type="falcon", title="Falcon (decoder, multi-query or grouped fused q|k|v, parallel attention and MLP)",
    decoder=True, architectures=("FalconModel", "FalconForCausalLM"), prefixes=("", "transformer."),
    probe="word_embeddings.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                "layer_norm_epsilon", "bias", "alibi", "new_decoder_architecture", "multi_query", "parallel_attn",
                "num_ln_in_parallel_attn", "rope_parameters"),
    weights=weights, preset=lambda **kw: preset(**{"n_kv_heads": 1, "shared_input_norm": kw.get("parallel_residual", True),
                                                   **kw}), switches=SWITCHES, requires=requires,
    trainable=False)

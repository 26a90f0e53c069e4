"""GPT-2: GPT2Model / GPT2LMHeadModel (learned positions, pre-LN, GELU, causal).

GPT-2 stores its linear maps as Conv1D weights ([in, out], transposed from ours) and q, k, v fused
in one c_attn tensor; the table says so once and both directions follow.
"""
from __future__ import annotations

from pathlib import Path

from ..config import CLASSIC_PRESETS, ModelConfig
from .base import (TRANSPOSE, Family, Weight, activation_from_hf, fused, head_weights, hf_dtype, preset_of, required,
                   weight)

preset = preset_of(CLASSIC_PRESETS["gpt2"])  # the switches ModelConfig.gpt2() builds too


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = activation_from_hf(d, path, "activation_function", "gelu_new")
    n_embd = need("n_embd")
    return preset(
        vocab_size=need("vocab_size"), d_model=n_embd, n_layers=need("n_layer"), n_heads=need("n_head"),
        d_ff=d.get("n_inner") or 4 * n_embd, context_length=need("n_positions"), activation=act,
        norm_eps=d.get("layer_norm_epsilon", 1e-5), tie_embeddings=d.get("tie_word_embeddings", True),
        lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d),
        bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
            "n_positions": cfg.context_length,
            "activation_function": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    conv1d_qkv = TRANSPOSE.then(fused(3))
    table = [weight("wte.weight", "tok_embed.weight"), weight("wpe.weight", "pos_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        table += [
            weight(h + "ln_1.weight", b + "norm1.weight"), weight(h + "ln_1.bias", b + "norm1.bias"),
            weight(h + "attn.c_attn.weight", tuple(b + f"attn.{x}.weight" for x in "qkv"), conv1d_qkv),
            weight(h + "attn.c_attn.bias", tuple(b + f"attn.{x}.bias" for x in "qkv"), fused(3)),
            weight(h + "attn.c_proj.weight", b + "attn.o.weight", TRANSPOSE),
            weight(h + "attn.c_proj.bias", b + "attn.o.bias"),
            weight(h + "ln_2.weight", b + "norm2.weight"), weight(h + "ln_2.bias", b + "norm2.bias"),
            weight(h + "mlp.c_fc.weight", b + "mlp.up.weight", TRANSPOSE),
            weight(h + "mlp.c_fc.bias", b + "mlp.up.bias"),
            weight(h + "mlp.c_proj.weight", b + "mlp.down.weight", TRANSPOSE),
            weight(h + "mlp.c_proj.bias", b + "mlp.down.bias"),
        ]
    table += [weight("ln_f.weight", "final_norm.weight"), weight("ln_f.bias", "final_norm.bias")]
    return table + head_weights(cfg)


# GPT2LMHeadModel computes the default of every switch but its activation
SWITCHES = {"activation": ("gelu", "gelu_tanh", "relu")}


FAMILY = Family(
    model_type="gpt2", title="GPT-2 (decoder, learned positions, pre-LN)", decoder=True,
    architectures=("GPT2Model", "GPT2LMHeadModel"), prefixes=("", "transformer."), probe="wte.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "activation_function",
                "layer_norm_epsilon"),
    weights=weights, preset=preset, switches=SWITCHES)

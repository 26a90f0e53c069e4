"""Marian: MarianModel / MarianMTModel (the Helsinki-NLP opus-mt models; the original Transformer's
layout): BART's post-LN encoder-decoder (bart.py) with sinusoidal positions laid out as Marian does
(every sine, then every cosine), no embedding norm, embeddings scaled by sqrt(d_model) when
scale_embedding, the activation from the config (opus-mt: swish) and final_logits_bias.

One vocabulary for both sides: a separate decoder vocabulary (share_encoder_decoder_embeddings
false, or decoder_vocab_size different from vocab_size) is refused.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import ModelConfig
from .base import Family, ModelLoadError
from .bart import SEQ2SEQ_SWITCHES, scale_problems, seq2seq_fields, seq2seq_to_hf, seq2seq_weights

_BASE = dict(family="marian", is_encoder_decoder=True, causal=True, norm="layernorm", norm_placement="post",
             activation="silu", positions="sinusoidal", sinusoidal_layout="halves", final_norm=False,
             attention_bias=True, mlp_bias=True, tie_embeddings=True, final_logits_bias=True, norm_eps=1e-5,
             pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def preset(**kw) -> ModelConfig:
    """The opus-mt layout: embeddings scaled by sqrt(d_model) (scale_embedding, as in the original
    Transformer) unless embed_scale is given (None: unscaled)."""
    cfg = {**_BASE, **kw}
    if "embed_scale" not in kw:
        cfg["embed_scale"] = math.sqrt(cfg.get("d_model", ModelConfig.d_model))
    return ModelConfig(**cfg)


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    if d.get("share_encoder_decoder_embeddings", True) is not True:
        raise ModelLoadError(path, "separate encoder and decoder embeddings (share_encoder_decoder_embeddings "
                                   "false) are not supported")
    if d.get("decoder_vocab_size") not in (None, d.get("vocab_size")):
        raise ModelLoadError(path, f"decoder_vocab_size {d['decoder_vocab_size']!r} different from vocab_size "
                                   f"{d.get('vocab_size')!r} is not supported")
    return preset(**seq2seq_fields(d, path))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**seq2seq_to_hf(cfg), "decoder_vocab_size": cfg.vocab_size, "share_encoder_decoder_embeddings": True}


SWITCHES = {**SEQ2SEQ_SWITCHES, "positions": ("sinusoidal",), "sinusoidal_layout": ("halves",)}


FAMILY = Family(
    model_type="marian", title="Marian (encoder-decoder, the original Transformer: sinusoidal positions, post-LN)",
    decoder=True, architectures=("MarianModel", "MarianMTModel"), prefixes=("", "model."), probe="shared.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                "max_position_embeddings", "activation_function", "scale_embedding"),
    weights=seq2seq_weights, preset=preset, switches=SWITCHES, requires=scale_problems, trainable=True,
    encoder_decoder=True)

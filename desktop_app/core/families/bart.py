"""BART: BartModel / BartForConditionalGeneration (encoder-decoder, learned positions offset by 2,
post-LN, an embedding LayerNorm in each stack, GELU, final_logits_bias).

Marian (marian.py) is the same layout with sinusoidal positions and no embedding norm: the config
fields and the weight table below serve both. Both stacks share the token embedding (`shared`), and
the head is tied to it unless tie_word_embeddings is false.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import ModelConfig
from .base import (ANY, Conversion, Family, ModelLoadError, Weight, activation_from_hf, hf_dtype, preset_of, required,
                   weight)

POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding.offset

# transformers' ACT2FN names -> ours (ungated: swish / silu is silu(fc1 x))
SEQ2SEQ_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                       "swish": "silu", "silu": "silu"}

preset = preset_of(dict(family="bart", is_encoder_decoder=True, causal=True, norm="layernorm", norm_placement="post",
                        activation="gelu", positions="learned", position_offset=POSITION_OFFSET, embed_norm=True,
                        final_norm=False, attention_bias=True, mlp_bias=True, tie_embeddings=True,
                        final_logits_bias=True, norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2))


def seq2seq_fields(d: dict, path: Path) -> dict:
    """The config.json fields BART and Marian share, as ModelConfig keywords (one head count and one
    MLP width for both stacks: the app's blocks share one config)."""
    need = required(d, path)
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if need(a) != need(b):
            raise ModelLoadError(path, f"{a} {d[a]!r} different from {b} {d[b]!r} is not supported")
    act = activation_from_hf(d, path, "activation_function", "gelu", SEQ2SEQ_ACTIVATIONS)
    if d.get("normalize_before", False) or d.get("add_final_layer_norm", False):
        raise ModelLoadError(path, "pre-LN layers (normalize_before / add_final_layer_norm, as in mBART) are not supported")
    scale = d.get("scale_embedding", False)
    if not isinstance(scale, bool):
        raise ModelLoadError(path, f"scale_embedding must be true or false, got {scale!r}")
    eos = d.get("eos_token_id")
    return dict(vocab_size=need("vocab_size"), d_model=need("d_model"), n_layers=need("encoder_layers"),
                n_decoder_layers=need("decoder_layers"), n_heads=d["encoder_attention_heads"],
                d_ff=d["encoder_ffn_dim"], context_length=need("max_position_embeddings"), activation=act,
                embed_scale=math.sqrt(d["d_model"]) if scale and isinstance(d["d_model"], int) else None,
                tie_embeddings=d.get("tie_word_embeddings", True), dtype=hf_dtype(d),
                pad_token_id=d.get("pad_token_id"), bos_token_id=d.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
                decoder_start_token_id=d.get("decoder_start_token_id"))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    return preset(**seq2seq_fields(d, path))


def seq2seq_to_hf(cfg: ModelConfig) -> dict:
    return {"d_model": cfg.d_model, "encoder_layers": cfg.n_layers, "decoder_layers": cfg.n_decoder_layers,
            "encoder_attention_heads": cfg.n_heads, "decoder_attention_heads": cfg.n_heads,
            "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "max_position_embeddings": cfg.context_length,
            "activation_function": {"gelu_tanh": "gelu_new", "silu": "swish"}.get(cfg.activation, cfg.activation),
            "scale_embedding": cfg.embed_scale is not None, "dropout": cfg.dropout, "attention_dropout": cfg.dropout,
            "activation_dropout": 0.0, "is_encoder_decoder": True,
            "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
            "decoder_start_token_id": cfg.decoder_start_token_id, "forced_eos_token_id": None}


def config_to_hf(cfg: ModelConfig) -> dict:
    return seq2seq_to_hf(cfg)


ROW = Conversion("row", lambda t, cfg: [t.reshape(-1)], lambda parts, cfg: parts[0].reshape(1, -1))

_SELF = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
         "attn.o": "self_attn.out_proj", "norm1": "self_attn_layer_norm", "mlp.up": "fc1", "mlp.down": "fc2",
         "norm2": "final_layer_norm"}
_CROSS = {"cross_attn.q": "encoder_attn.q_proj", "cross_attn.k": "encoder_attn.k_proj",
          "cross_attn.v": "encoder_attn.v_proj", "cross_attn.o": "encoder_attn.out_proj",
          "norm_cross": "encoder_attn_layer_norm"}


def seq2seq_weights(cfg: ModelConfig) -> list[Weight]:
    """BART's and Marian's tensors (Marian has no position table in its files nor embedding norms)."""
    table = [weight("shared.weight", "tok_embed.weight",
                    aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"))]
    for stack, n, names in (("encoder", cfg.n_layers, _SELF), ("decoder", cfg.n_decoder_layers, {**_SELF, **_CROSS})):
        if cfg.positions == "learned":
            table.append(weight(f"{stack}.embed_positions.weight", f"{stack}.pos_embed.weight"))
        if cfg.embed_norm:
            table += [weight(f"{stack}.layernorm_embedding.{p}", f"{stack}.embed_norm.{p}") for p in ("weight", "bias")]
        for i in range(n):
            for ours, theirs in names.items():
                for p in ("weight", "bias"):
                    table.append(weight(f"{stack}.layers.{i}.{theirs}.{p}", f"{stack}.blocks.{i}.{ours}.{p}"))
    table.append(weight("final_logits_bias", "lm_bias", ROW, outside_prefix=True))
    if not cfg.tie_embeddings:
        # transformers ties nothing then (not even each stack's embed_tokens to shared): written out, all the
        # same table; read back only if present (a folder whose stacks hold different tables is not supported)
        table += [weight(f"{stack}.embed_tokens.weight", "tok_embed.weight", optional=True, same_as_before=True)
                  for stack in ("encoder", "decoder")]
        table.append(weight("lm_head.weight", "lm_head.weight", outside_prefix=True))
    return table


# The layout BART and Marian share: a post-LN encoder-decoder, every bias, no final norms, the logits bias
SEQ2SEQ_SWITCHES = {"is_encoder_decoder": (True,), "norm_placement": ("post",), "final_norm": (False,),
                    "final_logits_bias": (True,), "embed_scale": ANY, "activation": tuple(dict.fromkeys(SEQ2SEQ_ACTIVATIONS.values()))}


def scale_problems(cfg: ModelConfig) -> list[str]:
    """scale_embedding is sqrt(d_model) or nothing."""
    if cfg.embed_scale is not None and abs(cfg.embed_scale - math.sqrt(cfg.d_model)) > 1e-9 * cfg.embed_scale:
        return [f"embed_scale {cfg.embed_scale!r}: scale_embedding multiplies by sqrt(d_model) = "
                f"{math.sqrt(cfg.d_model)!r} or nothing"]
    return []


SWITCHES = {**SEQ2SEQ_SWITCHES, "position_offset": (POSITION_OFFSET,), "embed_norm": (True,), "embed_scale": ANY}


FAMILY = Family(
    model_type="bart", title="BART (encoder-decoder, learned positions offset by 2, post-LN)", decoder=True,
    architectures=("BartModel", "BartForConditionalGeneration"), prefixes=("", "model."), probe="shared.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                "max_position_embeddings", "activation_function", "scale_embedding"),
    weights=seq2seq_weights, preset=preset, switches=SWITCHES, requires=scale_problems, trainable=False,
    encoder_decoder=True)

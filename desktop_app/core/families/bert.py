"""BERT: BertModel / BertForMaskedLM (post-LN encoder, token types, MLM head).

Every tensor maps one to one. Checkpoints from the original TensorFlow conversion name LayerNorm
parameters gamma/beta; those names are read as aliases.
"""
from __future__ import annotations

from pathlib import Path

from ..config import CLASSIC_PRESETS, ModelConfig
from .base import (POSITIVE, UNGATED_ACTIVATIONS, Family, ModelLoadError, Weight, activation_from_hf, hf_dtype,
                   preset_of, required, weight)

preset = preset_of(CLASSIC_PRESETS["bert"])  # the switches ModelConfig.bert() builds too


def encoder_fields(d: dict, path: Path) -> dict:
    """The config.json fields BERT and RoBERTa share (same names, same meaning), as ModelConfig keywords."""
    need = required(d, path)
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(path, f"unsupported position_embedding_type {d['position_embedding_type']!r}")
    if d.get("is_decoder"):
        raise ModelLoadError(path, f"{d.get('model_type', 'bert')} as a decoder (is_decoder=true) is not supported")
    act = activation_from_hf(d, path, "hidden_act", "gelu", UNGATED_ACTIVATIONS)
    return dict(vocab_size=need("vocab_size"), d_model=need("hidden_size"), n_layers=need("num_hidden_layers"),
                n_heads=need("num_attention_heads"), d_ff=need("intermediate_size"),
                context_length=need("max_position_embeddings"), activation=act,
                type_vocab_size=d.get("type_vocab_size", 2), norm_eps=d.get("layer_norm_eps", 1e-12),
                tie_embeddings=d.get("tie_word_embeddings", True), dtype=hf_dtype(d), pad_token_id=d.get("pad_token_id"))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    return preset(**encoder_fields(d, path), lm_head=FAMILY.has_lm_head(d))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.context_length,
            "hidden_act": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.norm_eps,
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
            "pad_token_id": cfg.pad_token_id if cfg.pad_token_id is not None else 0}


def _linear(theirs: str, ours: str, **kw) -> list[Weight]:
    return [weight(theirs + ".weight", ours + ".weight", **kw), weight(theirs + ".bias", ours + ".bias", **kw)]


def _layernorm(theirs: str, ours: str, **kw) -> list[Weight]:
    return [weight(theirs + ".weight", ours + ".weight", aliases=(theirs + ".gamma",), **kw),
            weight(theirs + ".bias", ours + ".bias", aliases=(theirs + ".beta",), **kw)]


def embedding_weights(cfg: ModelConfig, e: str = "embeddings.") -> list[Weight]:
    """Word, position (unless sinusoidal: computed, not stored by us) and token-type tables, LayerNorm."""
    table = [weight(e + "word_embeddings.weight", "tok_embed.weight")]
    if cfg.positions == "learned":
        table.append(weight(e + "position_embeddings.weight", "pos_embed.weight"))
    if cfg.type_vocab_size:
        table.append(weight(e + "token_type_embeddings.weight", "type_embed.weight"))
    return table + _layernorm(e + "LayerNorm", "embed_norm")


def layer_weights(cfg: ModelConfig, names: dict[str, str], h: str, b: str) -> list[Weight]:
    """One encoder layer: `names` maps our module (attn.q, ..., norm2) to the family's, under `h`."""
    table: list[Weight] = []
    for ours, theirs in names.items():
        table += (_layernorm if ours.startswith("norm") else _linear)(h + theirs, b + ours)
    return table


BERT_LAYER = {"attn.q": "attention.self.query", "attn.k": "attention.self.key", "attn.v": "attention.self.value",
              "attn.o": "attention.output.dense", "norm1": "attention.output.LayerNorm",
              "mlp.up": "intermediate.dense", "mlp.down": "output.dense", "norm2": "output.LayerNorm"}


def base_weights(cfg: ModelConfig) -> list[Weight]:
    """BertModel's tensors (RoBERTa's base model has the same names)."""
    table = embedding_weights(cfg)
    for i in range(cfg.n_layers):
        table += layer_weights(cfg, BERT_LAYER, f"encoder.layer.{i}.", f"blocks.{i}.")
    return table


def mlm_head_weights(dense: str, norm: str, bias: str) -> list[Weight]:
    """The MLM head's transform (dense -> GELU -> LayerNorm) and output bias, beside the base model."""
    return (_linear(dense, "mlm_dense", outside_prefix=True) + _layernorm(norm, "mlm_norm", outside_prefix=True)
            + [weight(bias, "lm_bias", outside_prefix=True)])


def weights(cfg: ModelConfig) -> list[Weight]:
    table = base_weights(cfg)
    if cfg.lm_head:
        c = "cls.predictions."
        table += mlm_head_weights(c + "transform.dense", c + "transform.LayerNorm", c + "bias")
        if not cfg.tie_embeddings:
            # optional: a folder without it is refused later, by our name ("missing tensors for: lm_head.weight")
            table.append(weight(c + "decoder.weight", "lm_head.weight", optional=True, outside_prefix=True))
            # Untied, Hugging Face's forward adds decoder.bias, no longer shared with cls.predictions.bias:
            # read last so it wins, written as a copy of the same bias.
            table.append(weight(c + "decoder.bias", "lm_bias", optional=True, outside_prefix=True))
    return table


# What BERT, RoBERTa and DistilBERT classes share: a post-LN encoder with an embedding norm, no final
# norm, and the MLM head; every other switch at its default (LayerNorm, learned positions, biases ...).
ENCODER_SWITCHES = {"norm_placement": ("post",), "embed_norm": (True,), "final_norm": (False,), "causal": (False,),
                    "lm_head_kind": ("mlm",), "activation": ("gelu", "gelu_tanh", "relu")}


SWITCHES = {**ENCODER_SWITCHES, "type_vocab_size": POSITIVE}  # BertModel always embeds token types


FAMILY = Family(
    model_type="bert", title="BERT (encoder, post-LN, token types)", decoder=False,
    architectures=("BertModel", "BertForMaskedLM"), prefixes=("", "bert."), probe="embeddings.word_embeddings.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "hidden_act", "type_vocab_size", "layer_norm_eps"),
    weights=weights, preset=preset, switches=SWITCHES)

"""DistilBERT: DistilBertModel / DistilBertForMaskedLM (BERT's post-LN encoder without token types).

Its own tensor names (transformer.layer.i.attention.q_lin, sa_layer_norm, ffn.lin1, ...), and its
own config names (dim, hidden_dim, n_layers, n_heads, activation). Every LayerNorm has eps 1e-12,
fixed in Hugging Face's code. sinusoidal_pos_embds: the position table is computed (ours), so its
stored copy is not read; Hugging Face recomputes it for a folder written here. The MLM head is
vocab_transform -> activation -> vocab_layer_norm -> vocab_projector (tied to the word embeddings).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import Family, ModelLoadError, Weight, hf_dtype, preset_of, required, weight
from .bert import ENCODER_SWITCHES, embedding_weights, layer_weights, mlm_head_weights

EPS = 1e-12  # DistilBERT's LayerNorms, hard-coded in transformers

preset = preset_of(dict(family="distilbert", norm="layernorm", norm_placement="post", activation="gelu",
                        positions="learned", causal=False, attention_bias=True, mlp_bias=True,
                        embed_norm=True, final_norm=False, type_vocab_size=0, tie_embeddings=True,
                        norm_eps=EPS, lm_head_kind="mlm", pad_token_id=0))

LAYER = {"attn.q": "attention.q_lin", "attn.k": "attention.k_lin", "attn.v": "attention.v_lin",
         "attn.o": "attention.out_lin", "norm1": "sa_layer_norm", "mlp.up": "ffn.lin1", "mlp.down": "ffn.lin2",
         "norm2": "output_layer_norm"}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = d.get("activation", "gelu")
    if act not in ("gelu", "relu"):
        raise ModelLoadError(path, f"unsupported activation {act!r}")
    lm_head = FAMILY.has_lm_head(d)
    if lm_head and act != "gelu":
        # DistilBertForMaskedLM applies `activation` inside its MLM head too; ours is GELU there
        raise ModelLoadError(path, f"a DistilBERT MLM head with activation {act!r} is not supported (only gelu)")
    return preset(
        vocab_size=need("vocab_size"), d_model=need("dim"), n_layers=need("n_layers"), n_heads=need("n_heads"),
        d_ff=need("hidden_dim"), context_length=need("max_position_embeddings"), activation=act,
        positions="sinusoidal" if d.get("sinusoidal_pos_embds") else "learned", lm_head=lm_head,
        tie_embeddings=d.get("tie_word_embeddings", True), dtype=hf_dtype(d), pad_token_id=d.get("pad_token_id", 0))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"dim": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "hidden_dim": cfg.d_ff,
            "max_position_embeddings": cfg.context_length, "activation": cfg.activation,
            "sinusoidal_pos_embds": cfg.positions == "sinusoidal", "dropout": cfg.dropout,
            "attention_dropout": cfg.dropout, "pad_token_id": cfg.pad_token_id if cfg.pad_token_id is not None else 0}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = embedding_weights(cfg)
    for i in range(cfg.n_layers):
        table += layer_weights(cfg, LAYER, f"transformer.layer.{i}.", f"blocks.{i}.")
    if cfg.lm_head:
        table += mlm_head_weights("vocab_transform", "vocab_layer_norm", "vocab_projector.bias")
        if not cfg.tie_embeddings:
            table.append(weight("vocab_projector.weight", "lm_head.weight", optional=True, outside_prefix=True))
    return table


# BERT's encoder without token types; sinusoidal positions are its own option
SWITCHES = {**ENCODER_SWITCHES, "activation": ("gelu", "relu"), "positions": ("learned", "sinusoidal")}


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.norm_eps != EPS:
        problems.append(f"norm_eps {cfg.norm_eps!r}: DistilBERT's LayerNorms are fixed at {EPS}")
    if cfg.activation != "gelu" and cfg.lm_head:  # DistilBertForMaskedLM's head applies `activation` too
        problems.append(f"activation {cfg.activation!r}: DistilBertForMaskedLM's head computes it, ours GELU")
    return problems


FAMILY = Family(
    model_type="distilbert", title="DistilBERT (encoder, post-LN, no token types)", decoder=False,
    architectures=("DistilBertModel", "DistilBertForMaskedLM"), prefixes=("", "distilbert."),
    probe="embeddings.word_embeddings.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings", "activation",
                "sinusoidal_pos_embds"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires)

"""RoBERTa: RobertaModel / RobertaForMaskedLM (BERT's encoder; positions offset by padding_idx + 1).

The base model's tensors have BERT's names (bert.py's table, shared). Hugging Face numbers the
positions of non-pad tokens from padding_idx + 1, so the position table has context + pad + 1 rows
and position t reads row t + pad + 1 (ModelConfig.position_offset). The MLM head is lm_head.dense /
layer_norm / decoder (tied to the word embeddings) / bias.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import POSITIVE, Family, ModelLoadError, Weight, preset_of, weight
from .bert import ENCODER_SWITCHES, base_weights, encoder_fields, mlm_head_weights
from .bert import config_to_hf as bert_config_to_hf

DEFAULT_PAD = 1  # RobertaConfig's pad_token_id (<pad>); <s> = 0, </s> = 2

preset = preset_of(dict(family="roberta", norm="layernorm", norm_placement="post", activation="gelu",
                        positions="learned", causal=False, attention_bias=True, mlp_bias=True,
                        embed_norm=True, final_norm=False, type_vocab_size=1, tie_embeddings=True,
                        norm_eps=1e-5, lm_head_kind="mlm", pad_token_id=DEFAULT_PAD,
                        position_offset=DEFAULT_PAD + 1, bos_token_id=0, eos_token_id=2))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    fields = encoder_fields({"type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": DEFAULT_PAD, **d}, path)
    pad = fields["pad_token_id"]
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise ModelLoadError(path, f"pad_token_id must be a non-negative integer (RoBERTa numbers positions "
                                   f"from it), got {pad!r}")
    if fields["context_length"] <= pad + 1:
        raise ModelLoadError(path, f"max_position_embeddings {fields['context_length']} leaves no position after "
                                   f"the {pad + 1} rows RoBERTa reserves (pad_token_id + 1)")
    fields["context_length"] -= pad + 1
    return preset(**fields, position_offset=pad + 1, lm_head=FAMILY.has_lm_head(d),
                  bos_token_id=d.get("bos_token_id", 0), eos_token_id=d.get("eos_token_id", 2))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {**bert_config_to_hf(cfg), "max_position_embeddings": cfg.context_length + cfg.position_offset,
            "pad_token_id": cfg.position_offset - 1, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = base_weights(cfg)
    if cfg.lm_head:
        table += mlm_head_weights("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
        if not cfg.tie_embeddings:
            table.append(weight("lm_head.decoder.weight", "lm_head.weight", optional=True, outside_prefix=True))
            # as BERT's untied decoder.bias: read last so it wins, written as a copy of the same bias
            table.append(weight("lm_head.decoder.bias", "lm_bias", optional=True, outside_prefix=True))
    return table


# Hugging Face numbers positions from pad_token_id + 1 (position_offset = pad + 1 >= 1); token types as BERT
SWITCHES = {**ENCODER_SWITCHES, "type_vocab_size": POSITIVE, "position_offset": POSITIVE}


FAMILY = Family(
    model_type="roberta", title="RoBERTa (encoder, post-LN, positions after padding_idx)", decoder=False,
    architectures=("RobertaModel", "RobertaForMaskedLM"), prefixes=("", "roberta."),
    probe="embeddings.word_embeddings.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "hidden_act", "type_vocab_size", "layer_norm_eps", "pad_token_id"),
    weights=weights, preset=preset, switches=SWITCHES)

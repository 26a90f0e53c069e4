"""The model families this app reads, writes and trains, one module each; REGISTRY is the only list.

A family is everything family-specific about a Hugging Face model_type: its config.json fields
both ways, ONE weight-name table (read for loading, walked backwards for saving), the preset the
training builder starts from, and what it can do here. checkpoints.py reads and writes folders
through these records and knows no family by name.

Adding a family = one module here defining FAMILY, one line in REGISTRY, and its parity case file
tests/parity/family_cases/<model_type>.py (the test generated over REGISTRY fails without it).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, ModelConfig
from . import (bart, bert, bloom, cohere, distilbert, falcon, gemma, gemma2, gemma3_text, gpt2, gpt_neo, gpt_neox,
               gptj, granite, llama, marian, mistral, mixtral, olmo, olmo2, olmoe, opt, phi, phi3, qwen2, qwen2_moe,
               qwen3, qwen3_moe, roberta, smollm3, stablelm, t5, vit)
from .base import (IDENTITY, TRANSPOSE, Conversion, Family, ModelLoadError, Weight,  # noqa: F401 (the API)
                   fused, weight)

REGISTRY: dict[str, Family] = {f.model_type: f for f in (
    gpt2.FAMILY, bert.FAMILY, llama.FAMILY, gpt_neox.FAMILY, gpt_neo.FAMILY, opt.FAMILY, roberta.FAMILY,
    distilbert.FAMILY, qwen2.FAMILY, qwen3.FAMILY, mistral.FAMILY, gemma3_text.FAMILY, vit.FAMILY, t5.FAMILY,
    marian.FAMILY, bart.FAMILY, gemma.FAMILY, gemma2.FAMILY, phi3.FAMILY, stablelm.FAMILY, olmo.FAMILY,
    smollm3.FAMILY, granite.FAMILY, bloom.FAMILY, phi.FAMILY, olmo2.FAMILY, gptj.FAMILY, mixtral.FAMILY,
    qwen3_moe.FAMILY, qwen2_moe.FAMILY, olmoe.FAMILY, cohere.FAMILY, falcon.FAMILY)}


# transformers' encoder-decoder (sequence-to-sequence) model_types: an encoder and a decoder with
# cross-attention between them; those with a family here (t5, bart, marian) open, the others are refused
ENCODER_DECODER = ("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "plbart", "marian",
                   "pegasus", "pegasus_x", "bigbird_pegasus", "led", "blenderbot", "blenderbot-small", "m2m_100",
                   "nllb-moe", "fsmt", "prophetnet", "xlm-prophetnet", "encoder-decoder", "t5gemma", "mvp")


def encoder_decoder_problem(config: dict) -> str | None:
    """'encoder-decoder models (pegasus) are not supported yet' for an encoder-decoder config.json (its
    model_type, or is_encoder_decoder: true) that no family here computes, else None."""
    model_type = config.get("model_type")
    family = REGISTRY.get(model_type) if isinstance(model_type, str) else None
    if family is not None and family.encoder_decoder:
        return None
    if model_type in ENCODER_DECODER or config.get("is_encoder_decoder") is True:
        return f"encoder-decoder models ({model_type}) are not supported yet"
    return None


def family_of(cfg: ModelConfig | str) -> Family:
    """The registry's record of a config's family (or of a family name); ConfigError "unknown family
    'x' (known: ...)" for a name no family has. ModelConfig itself does not know the registry: this is
    where a config's family is checked, wherever one is looked up (saving, loading, training)."""
    name = cfg if isinstance(cfg, str) else cfg.family
    family = REGISTRY.get(name) if isinstance(name, str) else None
    if family is None:
        raise ConfigError(f"unknown family {name!r} (known: {', '.join(REGISTRY)})")
    return family


def family_for(model_type: object, path: str | Path, config: dict | None = None) -> Family:
    """The family of a config's model_type, or a ModelLoadError naming it and the supported ones
    (an encoder-decoder, from `config`: that those are not supported yet)."""
    problem = encoder_decoder_problem({**(config or {}), "model_type": model_type})
    if problem:
        raise ModelLoadError(path, problem)
    if model_type is None:
        raise ModelLoadError(path, "no 'model_type' field: cannot tell which architecture this is")
    family = REGISTRY.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ModelLoadError(path, f"unknown model_type {model_type!r} (supported: {', '.join(REGISTRY)})")
    return family


def trainable_families(input_kind: str = "tokens") -> list[str]:
    """The families the Train panel and `train` offer for a kind of input, in REGISTRY order."""
    return [name for name, family in REGISTRY.items()
            if family.trainable and family.preset().input_kind == input_kind]

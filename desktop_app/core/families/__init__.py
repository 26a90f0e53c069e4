"""The model families this app reads, writes and trains, one module each; REGISTRY is the only list.

A family is everything family-specific about a Hugging Face model_type: its config.json fields
both ways, ONE weight-name table (read for loading, walked backwards for saving), the preset the
training builder starts from, and what it can do here. checkpoints.py reads and writes folders
through these records and knows no family by name.

Adding a family = one module here defining FAMILY, one line in REGISTRY, one parity test.
"""
from __future__ import annotations

from pathlib import Path

from . import bert, distilbert, gemma3_text, gpt2, gpt_neo, gpt_neox, llama, mistral, opt, qwen2, qwen3, roberta, vit
from .base import (IDENTITY, TRANSPOSE, Conversion, Family, ModelLoadError, Weight,  # noqa: F401 (the API)
                   fused, weight)

REGISTRY: dict[str, Family] = {f.model_type: f for f in (gpt2.FAMILY, bert.FAMILY, llama.FAMILY,
                                                           gpt_neox.FAMILY, gpt_neo.FAMILY, opt.FAMILY,
                                                           roberta.FAMILY, distilbert.FAMILY,
                                                           qwen2.FAMILY, qwen3.FAMILY, mistral.FAMILY,
                                                           gemma3_text.FAMILY, vit.FAMILY)}


def family_for(model_type: object, path: str | Path) -> Family:
    """The family of a config's model_type, or a ModelLoadError naming it and the supported ones."""
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

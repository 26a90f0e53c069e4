"""The rotary block of a config.json, for every family with rotary positions (LLaMA, Qwen2, Qwen3,
Mistral, Gemma 3, GPT-NeoX): read from whichever key holds it, checked, and written back.

config.json may give it under `rope_parameters` (transformers 5 writes that), under the older
`rope_scaling` (+ a top-level `rope_theta`), or under both. transformers 5 lets a non-empty
rope_scaling replace rope_parameters wholesale (Gemma 3 merges it into the full-attention block),
older tools read only rope_scaling: when the two are both there and describe different rotary
positions, no reading is right for everyone, so the folder is refused naming both keys. The
scalings computed here are "linear" and "llama3" (model.rotary_inv_freq), and "longrope" for the
families that ask for it (Phi-3: `extra=LONGROPE`); every other type (yarn, dynamic, ...) and a
non-positive or non-finite parameter is refused by name, never run as plain rotary.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .base import ModelLoadError, real

# The scalings ModelConfig implements, with the fields each one reads (all positive numbers).
ROPE_FIELDS = {"linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
SUPPORTED = ("default", *ROPE_FIELDS)
LONGROPE = ("longrope",)  # Phi-3's: short and long factor lists (rope_fields reads them)
# types whose original_max_position_embeddings transformers fills from max_position_embeddings
_NEEDS_ORIGINAL_CONTEXT = ("llama3", "yarn", "longrope")


def _given(value: Any, path: Path, key: str) -> dict | None:
    """One key's rotary block with its type under "rope_type", or None when the key is absent, null or
    empty (transformers then reads the other key)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise ModelLoadError(path, f"{key} must be a JSON object or null, got {value!r}")
    if "rope_type" in value and "type" in value and value["rope_type"] != value["type"]:
        raise ModelLoadError(path, f"{key} gives two types, rope_type {value['rope_type']!r} and type "
                                   f"{value['type']!r}; keep one")
    block = {k: v for k, v in value.items() if k not in ("rope_type", "type")}
    return {"rope_type": value.get("rope_type", value.get("type", "default")), **block}


def rope_block(d: dict, path: Path, *, defaults: dict[str, Any], new: Any = None,
               new_key: str = "rope_parameters", old_key: str | None = "rope_scaling",
               extra: tuple[str, ...] = ()) -> tuple[str, dict]:
    """(the key that holds it, the rotary block) from config.json `d`.

    `new` is the transformers 5 block (by default d["rope_parameters"]; Gemma 3 passes its
    full-attention entry and names it in `new_key`), `old_key` the older one (None: there is none,
Gemma 3's sliding layers). `defaults` fills what
    a block leaves out (rope_theta, and GPT-NeoX's partial_rotary_factor), as transformers does, and
    llama3's original_max_position_embeddings comes from max_position_embeddings when missing.
    Both keys given and disagreeing: a ModelLoadError naming both and the fields that differ.
    """
    if new is None and new_key == "rope_parameters":
        new = d.get("rope_parameters")
    blocks: dict[str, dict] = {}
    given = [(new_key, new)] + ([(old_key, d.get(old_key))] if old_key else [])
    for key, value in given:
        block = _given(value, path, key)
        if block is None:
            continue
        if block["rope_type"] not in SUPPORTED + extra:  # said first: keeping the other key would not help
            raise ModelLoadError(path, f"{key} type {block['rope_type']!r} is not supported "
                                       f"(supported: {', '.join(SUPPORTED + extra)})")
        for name, default in defaults.items():
            block.setdefault(name, default)
        if block["rope_type"] in _NEEDS_ORIGINAL_CONTEXT and d.get("max_position_embeddings") is not None:
            block.setdefault("original_max_position_embeddings", d["max_position_embeddings"])
        blocks[key] = block
    if len(blocks) == 2:
        a, b = blocks[new_key], blocks[old_key]
        differ = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        if a["rope_type"] != b["rope_type"]:
            differ = ["rope_type"]
        if differ:
            detail = ", ".join(f"{k} {a.get(k)!r} against {b.get(k)!r}" for k in differ)
            raise ModelLoadError(path, f"{new_key} and {old_key} disagree ({detail}); keep one of the two keys")
    if not blocks:  # plain rotary; "" names no key (a bad top-level rope_theta is named by itself)
        return "", {"rope_type": "default", **defaults}
    return next(iter(blocks.items()))


def partial_rope(d: dict, path: Path, fraction: float) -> dict[str, Any]:
    """rope_fields of a partial rotary whose config.json may also give rope_theta and partial_rotary_factor
    at its top level (Phi, StableLM), `fraction` when it gives none."""
    key, block = rope_block(d, path, defaults={"rope_theta": d.get("rope_theta", 10000.0),
                                               "partial_rotary_factor": d.get("partial_rotary_factor", fraction)})
    return rope_fields(block, path, key, partial=True)


def rope_fields(block: dict, path: Path, where: str, *, partial: bool = False, extra: tuple[str, ...] = (),
                context: Any = None) -> dict[str, Any]:
    """rope_theta and rope_scaling (+ rotary_fraction when `partial`: GPT-NeoX) from one rotary block
    as rope_block returns it; `where` names its key in errors. Only "default", "linear" and "llama3"
    are computed here; any other type, a partial rotary factor where the family has none, and a
    scaling parameter that is not a positive finite number are refused by name."""
    kind = block.get("rope_type", "default")
    if kind not in SUPPORTED + extra:
        raise ModelLoadError(path, f"{where} type {kind!r} is not supported (supported: {', '.join(SUPPORTED + extra)})")
    prefix = f"{where}: " if where else ""
    if kind == "longrope":
        return _longrope(block, path, prefix, partial, context)
    fraction = block.get("partial_rotary_factor", 1.0)
    if not partial and fraction != 1.0:
        raise ModelLoadError(path, f"{prefix}partial_rotary_factor {fraction!r} is not supported for this family")
    for name in ("rope_theta", *ROPE_FIELDS.get(kind, ())):
        value = block.get(name)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise ModelLoadError(path, f"{prefix}{name} must be a positive finite number, got {value!r}")
    scaling = None if kind == "default" else {"rope_type": kind, **{k: block[k] for k in ROPE_FIELDS[kind]}}
    out = {"rope_theta": real(block["rope_theta"]), "rope_scaling": scaling}
    if partial:
        out["rotary_fraction"] = real(fraction)
    return out


def _longrope(block: dict, path: Path, prefix: str, partial: bool, context: Any) -> dict[str, Any]:
    """rope_theta and the longrope scaling as modeling_rope_utils computes it: attention_factor given, or
    sqrt(1 + ln(factor) / ln(original context)) with factor given or context / original context (1 when
    factor <= 1). The factor lists' lengths are checked against the head by ModelConfig."""
    original = block.get("original_max_position_embeddings")
    for name, value in (("rope_theta", block.get("rope_theta")), ("original_max_position_embeddings", original)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise ModelLoadError(path, f"{prefix}{name} must be a positive finite number, got {value!r}")
    for name in ("short_factor", "long_factor"):
        factors = block.get(name)
        if not (isinstance(factors, list) and factors and all(isinstance(f, (int, float)) and not isinstance(f, bool)
                                                              and math.isfinite(f) and f > 0 for f in factors)):
            raise ModelLoadError(path, f"{prefix}longrope needs {name} as a list of positive numbers, got {factors!r}")
    attention_factor = block.get("attention_factor")
    if attention_factor is None:
        factor = block.get("factor")
        if factor is None:
            if not isinstance(context, int) or isinstance(context, bool) or context <= 0:
                raise ModelLoadError(path, f"{prefix}longrope without factor needs max_position_embeddings, got {context!r}")
            factor = context / original
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor)):
            raise ModelLoadError(path, f"{prefix}factor must be a finite number, got {factor!r}")
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    elif not (isinstance(attention_factor, (int, float)) and not isinstance(attention_factor, bool)
              and math.isfinite(attention_factor) and attention_factor > 0):
        raise ModelLoadError(path, f"{prefix}attention_factor must be a positive finite number, got {attention_factor!r}")
    fraction = block.get("partial_rotary_factor", 1.0)
    if not partial and fraction != 1.0:
        raise ModelLoadError(path, f"{prefix}partial_rotary_factor {fraction!r} is not supported for this family")
    out = {"rope_theta": real(block["rope_theta"]),
           "rope_scaling": {"rope_type": "longrope", "short_factor": [real(f) for f in block["short_factor"]],
                            "long_factor": [real(f) for f in block["long_factor"]],
                            "original_max_position_embeddings": original, "attention_factor": real(attention_factor)}}
    if partial:
        out["rotary_fraction"] = real(fraction)
    return out


def rope_to_hf(theta: float, scaling: dict | None) -> dict:
    """The rope_parameters block transformers 5 reads back as the same rotary positions."""
    return {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}

"""ViT: ViTModel / ViTForImageClassification (pre-LN encoder over image patches, [CLS] classifier).

The image is cut into patches by a Conv2d (kernel = stride = patch size), a learned [CLS] token
goes first, learned position embeddings are added, then a pre-LN encoder (LayerNorm, GELU, biases)
and a final LayerNorm; the classifier reads [CLS]. Our vocab_size is the number of classes.

ViTModel's pooler (dense + tanh on [CLS]) is a constructor argument in transformers, not a
config.json field: a headless folder has one when its weights hold pooler.dense.*.
DeiT folders do not open here: DeiT's embeddings always carry a distillation token (2 + patches).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .base import (ANY, UNGATED_ACTIVATIONS, Conversion, Family, ModelLoadError, Weight, activation_from_hf, hf_dtype,
                   real, required, weight)
from ..weights import weight_files

ARCHITECTURES = ("ViTModel", "ViTForImageClassification")
POOLER_PROBE = "pooler.dense.weight"

_SWITCHES: dict[str, Any] = dict(
    family="vit", input_kind="patches", norm="layernorm", norm_placement="pre", activation="gelu",
    positions="learned", causal=False, attention_bias=True, mlp_bias=True, embed_norm=False, final_norm=True,
    type_vocab_size=0, tie_embeddings=False, norm_eps=1e-12, lm_head_kind="classifier", vocab_size=2,
    image_size=224, patch_size=16, num_channels=3)


def preset(**kw: Any) -> ModelConfig:
    """ViT's switches. context_length is no free choice here: it is always 1 + the number of
    patches (a context_length given, e.g. by a text preset's keywords, is replaced)."""
    merged = {**_SWITCHES, **kw}
    if isinstance(merged["image_size"], int) and isinstance(merged["patch_size"], int) and merged["patch_size"] > 0:
        merged["context_length"] = 1 + (merged["image_size"] // merged["patch_size"]) ** 2
    return ModelConfig(**merged)


def _square(d: dict, key: str, path: Path) -> int:
    """An int, or a [n, n] pair; a non-square size is refused by name."""
    value = d.get(key, 224 if key == "image_size" else 16)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ModelLoadError(path, f"{key} {value!r}: only square sizes are supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelLoadError(path, f"{key} must be a positive integer, got {value!r}")
    return value


def _folder_has_pooler(path: Path) -> bool:
    """Whether the folder of config.json `path` holds ViTModel's pooler weights (headers only)."""
    try:
        return POOLER_PROBE in weight_files(path.parent)
    except ModelLoadError:  # no readable weights: the load itself reports that, by name
        return False


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    archs = d.get("architectures") or []
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        raise ModelLoadError(path, f"unsupported ViT architecture {unknown[0]!r} (supported: {', '.join(ARCHITECTURES)})")
    act = activation_from_hf(d, path, "hidden_act", "gelu", UNGATED_ACTIVATIONS)
    if d.get("pooler_act", "tanh") != "tanh":
        raise ModelLoadError(path, f"unsupported pooler_act {d.get('pooler_act')!r} (only tanh)")
    image_size, patch_size = _square(d, "image_size", path), _square(d, "patch_size", path)
    if image_size % patch_size:
        raise ModelLoadError(path, f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    labels = d.get("id2label") or {}
    lm_head = FAMILY.has_lm_head(d)
    d_model = need("hidden_size")
    pooler_size = 0
    if not lm_head and _folder_has_pooler(path):
        pooler_size = d.get("pooler_output_size") or d_model
    extra = {"id2label": {str(k): v for k, v in labels.items()}} if isinstance(labels, dict) and labels else {}
    return preset(d_model=d_model, n_layers=need("num_hidden_layers"), n_heads=need("num_attention_heads"),
                  d_ff=need("intermediate_size"), activation=act, norm_eps=real(d.get("layer_norm_eps", 1e-12)),
                  attention_bias=d.get("qkv_bias", True), attention_out_bias=True,
                  image_size=image_size, patch_size=patch_size, num_channels=d.get("num_channels", 3),
                  vocab_size=len(labels) if isinstance(labels, dict) and labels else d.get("num_labels", 2),
                  lm_head=lm_head, pooler_size=pooler_size, dtype=hf_dtype(d), extra=extra)


def config_to_hf(cfg: ModelConfig) -> dict:
    labels = cfg.extra.get("id2label")
    if not isinstance(labels, dict) or len(labels) != cfg.vocab_size:
        labels = {str(i): f"LABEL_{i}" for i in range(cfg.vocab_size)}
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "hidden_act": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "layer_norm_eps": cfg.norm_eps, "image_size": cfg.image_size, "patch_size": cfg.patch_size,
            "num_channels": cfg.num_channels, "qkv_bias": cfg.attention_bias,
            "pooler_output_size": cfg.pooler_size or cfg.d_model, "pooler_act": "tanh",
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
            "id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}


# position_embeddings is a parameter [1, 1 + patches, d]; ours is the table [1 + patches, d]
BATCH_OF_ONE = Conversion("batch_of_one", lambda t, cfg: [t[0]], lambda parts, cfg: parts[0][None])

VIT_LAYER = {"attn.o": "attention.output.dense", "mlp.up": "intermediate.dense", "mlp.down": "output.dense",
             "norm1": "layernorm_before", "norm2": "layernorm_after"}


def _linear(theirs: str, ours: str, bias: bool = True, **kw: Any) -> list[Weight]:
    table = [weight(theirs + ".weight", ours + ".weight", **kw)]
    return table + [weight(theirs + ".bias", ours + ".bias", **kw)] if bias else table


def weights(cfg: ModelConfig) -> list[Weight]:
    e = "embeddings."
    table = [weight(e + "cls_token", "cls_token"),
             weight(e + "position_embeddings", "pos_embed.weight", BATCH_OF_ONE),
             *_linear(e + "patch_embeddings.projection", "patch_embed")]
    for i in range(cfg.n_layers):
        h, b = f"encoder.layer.{i}.", f"blocks.{i}."
        for x, name in (("q", "query"), ("k", "key"), ("v", "value")):
            table += _linear(h + "attention.attention." + name, b + "attn." + x, cfg.attention_bias)
        for ours, theirs in VIT_LAYER.items():  # layernorms too: weight and bias, the same names
            table += _linear(h + theirs, b + ours)
    table += _linear("layernorm", "final_norm")
    if cfg.pooler_size:
        table += _linear("pooler.dense", "pooler")
    if cfg.lm_head:
        table += [weight("classifier.weight", "lm_head.weight", outside_prefix=True),
                  weight("classifier.bias", "lm_bias", outside_prefix=True)]
    return table


# ViTForImageClassification: patch input, the [CLS] classifier, qkv_bias (the output projection
# always has its bias), the optional pooler; every other switch at its default
SWITCHES = {"input_kind": ("patches",), "causal": (False,), "lm_head_kind": ("classifier",),
            "activation": ("gelu", "gelu_tanh", "relu"), "attention_bias": (True, False), "attention_out_bias": (True,),
            "pooler_size": ANY}


FAMILY = Family(
    model_type="vit", title="ViT (vision encoder, pre-LN, image patches)", decoder=False,
    architectures=ARCHITECTURES, prefixes=("", "vit."), probe="embeddings.cls_token",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                "layer_norm_eps", "image_size", "patch_size", "num_channels", "qkv_bias"),
    weights=weights, preset=preset, switches=SWITCHES, trainable=True)

"""Gemma 3 text (Gemma 3 270M, 1B, ...): Gemma3TextModel / Gemma3ForCausalLM.

LLaMA-shaped, plus: RMSNorm weights applied as (1 + w); embeddings scaled by sqrt(hidden_size);
q/k norms; four norms per layer (input, post-attention, pre-feedforward, post-feedforward: the
attention and MLP outputs are normed before their residual add); a GELU(tanh)-gated MLP; scores
scaled by query_pre_attn_scalar ** -0.5; sliding-window layers (layer_types) with their own rotary
base and no rotary scaling; logits soft-capped.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from . import gemma, llama_like
from .base import ANY, Family, ModelLoadError, Weight, preset_of, real
from .rope import rope_block, rope_fields

_switches = preset_of(dict(family="gemma3_text", norm="rmsnorm_offset", norm_placement="pre", activation="geglu",
                           positions="rotary", causal=True, attention_bias=False, mlp_bias=False, qk_norm=True,
                           sandwich_norms=True, final_norm=True, tie_embeddings=True, norm_eps=1e-6))


def preset(**kw: Any) -> ModelConfig:
    """Gemma 3's switches; the embedding scale sqrt(d_model) and the score scale (Gemma 3 270M's
    query_pre_attn_scalar = head_dim) follow the width unless given."""
    cfg = _switches(**kw)
    return cfg.replace(embed_scale=kw.get("embed_scale", math.sqrt(cfg.d_model)),
                       attn_scale=kw.get("attn_scale", cfg.d_head ** -0.5))

# Gemma3TextConfig's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 131072,
               "head_dim": 256, "num_key_value_heads": 4, "hidden_activation": "gelu_pytorch_tanh",
               "query_pre_attn_scalar": 256, "sliding_window": 4096, "attention_bias": False,
               "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
               "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig.default_theta
SLIDING_WINDOW_PATTERN = 6  # older configs: every 6th layer full, the others sliding
TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new")  # both are 0.5 x (1 + tanh(...)): the "geglu" gate here
NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_attn_norm"),
         ("pre_feedforward_layernorm", "norm2"), ("post_feedforward_layernorm", "post_mlp_norm"))


def _rope(d: dict, path: Path) -> tuple[dict, dict]:
    """(full-attention, sliding-attention) rotary fields as Gemma3TextConfig builds them: the nested
    rope_parameters, or the older rope_theta / rope_scaling / rope_local_base_freq fields; a
    rope_scaling beside rope_parameters['full_attention'] must agree with it (families.rope)."""
    given = d.get("rope_parameters")
    if given is not None and (not isinstance(given, dict)
                              or not set(given) <= {"full_attention", "sliding_attention"}):
        raise ModelLoadError(path, f"rope_parameters must map 'full_attention' and 'sliding_attention' to their "
                                   f"rotary parameters, got {given!r}")
    given = given or {}
    key, full = rope_block(d, path, new=given.get("full_attention"), new_key="rope_parameters['full_attention']",
                           defaults={"rope_theta": d.get("rope_theta", DEFAULT_THETA["full_attention"])})
    where = "rope_parameters['sliding_attention']"
    _, sliding = rope_block(d, path, new=given.get("sliding_attention"), new_key=where, old_key=None,
                            defaults={"rope_theta": d.get("rope_local_base_freq", DEFAULT_THETA["sliding_attention"])})
    rope, local = rope_fields(full, path, key), rope_fields(sliding, path, where)
    if local["rope_scaling"] is not None:
        raise ModelLoadError(path, f"{where}: rope type {local['rope_scaling']['rope_type']!r} is not supported on "
                                   f"sliding layers (only 'default')")
    return rope, local


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    if d["hidden_activation"] not in TANH_GELUS:
        raise ModelLoadError(path, f"unsupported hidden_activation {d['hidden_activation']!r} "
                                   f"(this family computes gelu_pytorch_tanh)")
    if d["use_bidirectional_attention"]:
        raise ModelLoadError(path, "use_bidirectional_attention true (EmbeddingGemma) is not supported: this "
                                   "family is a causal decoder here")
    if d["attn_logit_softcapping"] is not None:
        raise ModelLoadError(path, f"attn_logit_softcapping {d['attn_logit_softcapping']!r} is not supported "
                                   f"(scores are not soft-capped here)")
    rope, local = _rope(d, path)
    fields = llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d))
    n_layers = fields["n_layers"]
    types = llama_like.layer_types_from_hf(d, path, n_layers)
    if types is None and isinstance(n_layers, int):
        pattern = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", SLIDING_WINDOW_PATTERN))
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern <= 0:
            raise ModelLoadError(path, f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    window = d["sliding_window"]
    if window is None and types and "sliding_attention" in types:
        raise ModelLoadError(path, "layer_types has sliding_attention layers but sliding_window is null")
    scalar, hidden = d["query_pre_attn_scalar"], fields["d_model"]
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
        raise ModelLoadError(path, f"query_pre_attn_scalar must be a positive number, got {scalar!r}")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise ModelLoadError(path, f"hidden_size must be a positive integer, got {hidden!r}")
    cap = d["final_logit_softcapping"]
    return preset(**fields, **rope, rope_local_theta=local["rope_theta"], layer_types=types, sliding_window=window,
                  attn_scale=float(scalar) ** -0.5, embed_scale=math.sqrt(hidden),
                  final_logit_softcap=None if cap is None else real(cap),
                  attention_bias=bool(d["attention_bias"]))


def query_pre_attn_scalar(cfg: ModelConfig) -> int | None:
    """The integer s with attn_scale = s ** -0.5 (Gemma3TextConfig types it int), or None."""
    if cfg.attn_scale is None:
        return cfg.d_head  # the default 1/sqrt(d_head)
    s = cfg.attn_scale ** -2
    return round(s) if abs(s - round(s)) < 1e-6 * s else None


def config_to_hf(cfg: ModelConfig) -> dict:
    types = cfg.layer_types or ["sliding_attention" if cfg.sliding_window else "full_attention"] * cfg.n_layers
    local_theta = cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta
    return {**llama_like.decoder_to_hf(cfg), "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": query_pre_attn_scalar(cfg), "sliding_window": cfg.sliding_window,
            "layer_types": list(types), "attention_bias": cfg.attention_bias,
            "final_logit_softcapping": cfg.final_logit_softcap, "attn_logit_softcapping": None,
            "use_bidirectional_attention": False,
            "rope_parameters": {"full_attention": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
                                "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg, NORMS)


# Gemma's offset RMSNorm, GeGLU, q/k norms, sandwich norms, scaled embeddings and scores, sliding layers
# with their own rotary base, soft-capped logits; q/k/v/o biases together (attention_bias)
SWITCHES = {**llama_like.SWITCHES, "norm": ("rmsnorm_offset",), "activation": ("geglu",), "qk_norm": (True,),
            "sandwich_norms": (True,), "embed_scale": ANY, "attn_scale": ANY, "attention_bias": (True, False),
            "mlp_bias": (False,), "rope_local_theta": ANY, "sliding_window": ANY, "layer_types": ANY,
            "final_logit_softcap": ANY}


def scaled_problems(cfg: ModelConfig, title: str) -> list[str]:
    """What Gemma 2 and Gemma 3 both fix: embeddings scaled by sqrt(hidden_size), scores by an integer
    query_pre_attn_scalar ** -0.5, heads that divide the width (their validate_architecture insists)."""
    problems = gemma.scaled_embeddings(cfg, title)
    if query_pre_attn_scalar(cfg) is None:
        problems.append(f"attn_scale {cfg.attn_scale!r}: not s ** -0.5 for an integer query_pre_attn_scalar s")
    if cfg.d_model % cfg.n_heads:
        problems.append(f"d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
    return problems


def requires(cfg: ModelConfig) -> list[str]:
    problems = scaled_problems(cfg, "Gemma 3")
    windowed = cfg.sliding_window is not None and (cfg.layer_types is None or "sliding_attention" in cfg.layer_types)
    if windowed and cfg.rope_local_theta is None and cfg.rope_scaling is not None:
        # without its own base a sliding layer here reads the scaled global rotary; Gemma's class gives
        # sliding layers no scaling
        problems.append("rope_scaling with sliding layers needs rope_local_theta (Gemma 3's sliding layers are unscaled)")
    return problems


FAMILY = Family(
    model_type="gemma3_text", title="Gemma 3 text (decoder, sliding/global layers, sandwich norms, GeGLU)",
    decoder=True, architectures=("Gemma3TextModel", "Gemma3ForCausalLM"), prefixes=("", "model."),
    probe="embed_tokens.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_activation", "query_pre_attn_scalar", "sliding_window",
                                        "layer_types", "rope_parameters", "final_logit_softcapping"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires)

"""Phi-3 (Phi-3, Phi-3.5, Phi-4-mini): Phi3Model / Phi3ForCausalLM. LLaMA-shaped with fused weights:
one qkv_proj holding q, k and v one after the other (k and v smaller with grouped-query attention),
one gate_up_proj holding the MLP's gate then up; rotary positions with Phi-3's "longrope" scaling
(short factors, long ones past original_max_position_embeddings, cos and sin scaled), an optional
partial rotary factor, and Mistral's optional sliding window on every layer.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, ModelLoadError, Weight, fused, head_weights, preset_of, qkv_sizes, weight
from .rope import LONGROPE, rope_block, rope_fields

preset = preset_of(dict(family="phi3", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=False, norm_eps=1e-5))

# Phi3Config's defaults for the fields that change the computation (original_max_position_embeddings
# is the one longrope reads: Phi3Config puts its top-level value in the rotary block)
HF_DEFAULTS = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 4096,
               "original_max_position_embeddings": 4096, "sliding_window": None, "hidden_act": "silu",
               "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}


def _rope(d: dict, path: Path) -> dict:
    defaults = {"rope_theta": d.get("rope_theta", 10000.0)}
    if "partial_rotary_factor" in d:
        defaults["partial_rotary_factor"] = d["partial_rotary_factor"]
    key, block = rope_block(d, path, defaults=defaults, extra=LONGROPE + ("su", "yarn"))
    if block["rope_type"] in ("su", "yarn"):  # Phi3Config reads both older names as longrope
        block["rope_type"] = "longrope"
    if block["rope_type"] == "longrope":
        block["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return rope_fields(block, path, key, partial=True, extra=LONGROPE, context=d.get("max_position_embeddings"))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise ModelLoadError(path, "attention_bias / mlp_bias are not Phi-3's (its projections have no biases)")
    window = d.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ModelLoadError(path, f"sliding_window must be a positive integer or null, got {window!r}")
    rope = _rope(d, path)
    return preset(**llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d)), **rope, sliding_window=window)


def config_to_hf(cfg: ModelConfig) -> dict:
    scaling = cfg.rope_scaling
    rope = {"rope_type": "default"} if scaling is None else dict(scaling)
    rope.update(rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.rotary_fraction)
    original = {} if scaling is None else {"original_max_position_embeddings": scaling["original_max_position_embeddings"]}
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "sliding_window": cfg.sliding_window,
            "rope_parameters": rope, "pad_token_id": cfg.pad_token_id, **original}  # (Phi3Config's pad is 32000)


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("embed_tokens.weight", "tok_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"layers.{i}."
        table += [weight(h + "self_attn.qkv_proj.weight", tuple(b + f"attn.{x}.weight" for x in "qkv"),
                         fused(qkv_sizes, "q|k|v")),
                  weight(h + "self_attn.o_proj.weight", b + "attn.o.weight"),
                  weight(h + "mlp.gate_up_proj.weight", (b + "mlp.gate.weight", b + "mlp.up.weight"), fused(2)),
                  weight(h + "mlp.down_proj.weight", b + "mlp.down.weight"),
                  weight(h + "input_layernorm.weight", b + "norm1.weight"),
                  weight(h + "post_attention_layernorm.weight", b + "norm2.weight")]
    table.append(weight("norm.weight", "final_norm.weight"))
    return table + head_weights(cfg)


# no biases; longrope (and linear/llama3, which the class computes too), partial rotary, one window
SWITCHES = {**llama_like.SWITCHES, "attention_bias": (False,), "mlp_bias": (False,), "rotary_fraction": ANY,
            "sliding_window": ANY}


FAMILY = Family(
    model_type="phi3", title="Phi-3 (decoder, fused q|k|v and gate|up, longrope, RMSNorm, SwiGLU)", decoder=True,
    architectures=("Phi3Model", "Phi3ForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "sliding_window", "rope_parameters",
                                        "original_max_position_embeddings"),
    weights=weights, preset=preset, switches=SWITCHES)

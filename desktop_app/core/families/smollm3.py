"""SmolLM3: SmolLM3Model / SmolLM3ForCausalLM. LLaMA-shaped with "NoPE" layers: no_rope_layers says per
layer whether q and k rotate (1) or the layer has no positions at all (0; by default every 4th layer);
q/k/v/o and MLP biases as attention_bias / mlp_bias say; an optional sliding window on the layers
layer_types names (counted only with use_sliding_window, as Qwen2's).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from . import llama_like
from .base import ANY, Family, ModelLoadError, Weight, preset_of

preset = preset_of(dict(family="smollm3", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                        positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                        final_norm=True, tie_embeddings=True, norm_eps=1e-6))

# SmolLM3Config's defaults for the fields that change the computation.
HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 32768,
               "num_key_value_heads": 4, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
               "use_sliding_window": False, "sliding_window": None, "no_rope_layer_interval": 4,
               "pad_token_id": 128004, "bos_token_id": 128000, "eos_token_id": 128001}


def _rotary_layers(d: dict, path: Path, n_layers) -> list[bool] | None:
    flags = d.get("no_rope_layers")
    if flags is None:  # SmolLM3Config: every no_rope_layer_interval-th layer has no positions
        interval = d["no_rope_layer_interval"]
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            raise ModelLoadError(path, f"no_rope_layer_interval must be a positive integer, got {interval!r}")
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)] if isinstance(n_layers, int) else []
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise ModelLoadError(path, f"no_rope_layers must list 1 (rotary) or 0 (no positions) for each of the "
                                   f"{n_layers} layers, got {flags!r}")
    return None if all(flags) else [bool(f) for f in flags]


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    llama_like.silu_only(d, path)
    rope = llama_like.rope(d, path)
    fields = llama_like.decoder_fields(d, path, lm_head=FAMILY.has_lm_head(d))
    rotary = _rotary_layers(d, path, fields["n_layers"])
    window = d["sliding_window"] if d["use_sliding_window"] else None
    types = None
    if window is not None:
        types = llama_like.layer_types_from_hf(d, path, fields["n_layers"]) or [
            "full_attention" if r else "sliding_attention" for r in rotary or [True] * fields["n_layers"]]
        if "sliding_attention" not in types:
            window, types = None, None
    return preset(**fields, **rope, attention_bias=bool(d["attention_bias"]), mlp_bias=bool(d["mlp_bias"]),
                  rotary_layers=rotary, sliding_window=window, layer_types=types, pad_token_id=d["pad_token_id"])


def config_to_hf(cfg: ModelConfig) -> dict:
    windows = {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
               "layer_types": list(cfg.layer_types or ["sliding_attention" if cfg.sliding_window else
                                                       "full_attention"] * cfg.n_layers)}
    return {**llama_like.decoder_to_hf(cfg), "hidden_act": "silu", "attention_bias": cfg.attention_bias,
            "mlp_bias": cfg.mlp_bias, "no_rope_layers": [int(r) for r in cfg.rotary_layers or [True] * cfg.n_layers],
            "pad_token_id": cfg.pad_token_id, "rope_parameters": llama_like.rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            **windows}


def weights(cfg: ModelConfig) -> list[Weight]:
    return llama_like.weights(cfg)


# NoPE layers; q/k/v/o biases together, MLP biases; Qwen2-like windows
SWITCHES = {**llama_like.SWITCHES, "rotary_layers": ANY, "attention_bias": (True, False), "mlp_bias": (True, False),
            "sliding_window": ANY, "layer_types": ANY}


FAMILY = Family(
    model_type="smollm3", title="SmolLM3 (decoder, RoPE with NoPE layers, RMSNorm, SwiGLU)", decoder=True,
    architectures=("SmolLM3Model", "SmolLM3ForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=llama_like.STRUCTURAL + ("hidden_act", "rope_parameters", "no_rope_layers", "use_sliding_window",
                                        "sliding_window", "layer_types", "attention_bias", "mlp_bias"),
    weights=weights, preset=preset, switches=SWITCHES)

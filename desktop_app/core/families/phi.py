"""Phi (Phi-1, Phi-1.5, Phi-2): PhiModel / PhiForCausalLM. Attention and MLP side by side from ONE
LayerNorm per layer (x + attn(ln(x)) + mlp(ln(x))), partial rotary (0.5 unless given), biases everywhere
(the LM head's too), an ungated GELU(tanh) MLP and a final LayerNorm. The one norm is the block's
shared_input_norm (norm1, read by attention and MLP alike, as GPT-J's). Per-head q/k LayerNorms
(qk_layernorm) are refused.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import (ANY, Family, ModelLoadError, Weight, head_weights, heads_fill_width, hf_dtype, preset_of, required,
                   weight)
from .rope import partial_rope, rope_to_hf

preset = preset_of(dict(family="phi", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                        positions="rotary", rotary_fraction=0.5, causal=True, attention_bias=True, mlp_bias=True,
                        parallel_residual=True, shared_input_norm=True, final_norm=True, final_logits_bias=True,
                        tie_embeddings=False,
                        norm_eps=1e-5))

HF_DEFAULTS = {"layer_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 2048,
               "hidden_act": "gelu_new", "qk_layernorm": False, "bos_token_id": 1, "eos_token_id": 2}
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def one_qk_norm_only(d: dict, path: Path, title: str) -> None:
    """Refuse qk_layernorm (Phi, StableLM): their q/k LayerNorms are one per head, ours one for all heads."""
    if d["qk_layernorm"]:
        raise ModelLoadError(path, f"qk_layernorm true is not supported: {title}'s q/k LayerNorms are one per head "
                                   "(this app shares one across heads)")


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    d = {**HF_DEFAULTS, **d}
    need = required(d, path)
    if d["hidden_act"] not in TANH_GELUS:
        raise ModelLoadError(path, f"unsupported hidden_act {d['hidden_act']!r} (this family computes gelu_new)")
    one_qk_norm_only(d, path, "Phi")
    rope = partial_rope(d, path, 0.5)
    heads = need("num_attention_heads")
    eos = d["eos_token_id"]
    return preset(vocab_size=need("vocab_size"), d_model=need("hidden_size"), n_layers=need("num_hidden_layers"),
                  n_heads=heads, n_kv_heads=d.get("num_key_value_heads") or heads, d_ff=need("intermediate_size"),
                  context_length=d["max_position_embeddings"], norm_eps=d["layer_norm_eps"], **rope,
                  tie_embeddings=bool(d["tie_word_embeddings"]), lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d),
                  bos_token_id=d["bos_token_id"], eos_token_id=eos[0] if isinstance(eos, list) else eos,
                  pad_token_id=d.get("pad_token_id"))


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
            "max_position_embeddings": cfg.context_length, "layer_norm_eps": cfg.norm_eps, "hidden_act": "gelu_new",
            "qk_layernorm": False, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id,
            "rope_parameters": {**rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
                                "partial_rotary_factor": cfg.rotary_fraction}}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("embed_tokens.weight", "tok_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"layers.{i}."
        for x in ("weight", "bias"):
            table.append(weight(h + f"input_layernorm.{x}", b + f"norm1.{x}"))
            table += [weight(h + f"self_attn.{theirs}.{x}", b + f"attn.{ours}.{x}")
                      for theirs, ours in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("dense", "o"))]
            table += [weight(h + f"mlp.fc1.{x}", b + f"mlp.up.{x}"), weight(h + f"mlp.fc2.{x}", b + f"mlp.down.{x}")]
    table += [weight("final_layernorm.weight", "final_norm.weight"), weight("final_layernorm.bias", "final_norm.bias")]
    return table + head_weights(cfg, bias=True)


# the parallel block with its one input norm, partial rotary, grouped-query attention, the head's bias
SWITCHES = {"positions": ("rotary",), "activation": ("gelu_tanh",), "parallel_residual": (True,),
            "shared_input_norm": (True,),
            "rotary_fraction": ANY, "rope_scaling": ANY, "n_kv_heads": ANY, "final_logits_bias": (True,)}


FAMILY = Family(
    model_type="phi", title="Phi / Phi-2 (decoder, parallel attention and MLP from one LayerNorm, partial RoPE)",
    decoder=True, architectures=("PhiModel", "PhiForCausalLM"), prefixes=("", "model."), probe="embed_tokens.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "layer_norm_eps", "hidden_act", "rope_parameters"),
    weights=weights, preset=preset, switches=SWITCHES, requires=lambda cfg: heads_fill_width(cfg, "Phi"),
    trainable=False)

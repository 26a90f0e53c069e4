"""GPT-Neo (the TinyStories models): GPTNeoModel / GPTNeoForCausalLM.

GPT-2's layout with three differences that change the computation: attention scores are NOT scaled
by 1/sqrt(d_head); q, k, v have no bias while the output projection has one; and layers alternate
between global and local attention (`attention_types`), a local layer seeing only the last
`window_size` keys (the query included) - the app's sliding-window layers.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import (ANY, UNGATED_ACTIVATIONS, Family, ModelLoadError, Weight, activation_from_hf, head_weights, hf_dtype,
                   preset_of, required, weight)

preset = preset_of(dict(family="gpt_neo", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                        positions="learned", causal=True, attention_bias=False, attention_out_bias=True,
                        mlp_bias=True, attn_scale=1.0, final_norm=True, tie_embeddings=True, norm_eps=1e-5))

_LAYER_TYPES = {"global": "full_attention", "local": "sliding_attention"}


def _attention_layers(d: dict, n_layers: int, path: Path) -> list[str]:
    """Per layer "global"/"local", from attention_types ([[[kinds...], repeat], ...]) or attention_layers."""
    types = d.get("attention_types")
    if types is not None:
        try:
            layers = [kind for kinds, repeat in types for _ in range(repeat) for kind in kinds]
        except (TypeError, ValueError):
            raise ModelLoadError(path, f"attention_types {types!r} is not a list of [[kinds...], repeat]") from None
    else:
        layers = d.get("attention_layers")
        if not isinstance(layers, list):
            raise ModelLoadError(path, "missing field 'attention_types' (or 'attention_layers')")
    if len(layers) != n_layers:
        raise ModelLoadError(path, f"attention_types give {len(layers)} layers but num_layers is {n_layers}")
    unknown = sorted({str(k) for k in layers if k not in _LAYER_TYPES})
    if unknown:
        raise ModelLoadError(path, f"unsupported attention type(s) {', '.join(unknown)} in attention_types "
                                   f"(supported: global, local)")
    return layers


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = activation_from_hf(d, path, "activation_function", "gelu_new", UNGATED_ACTIVATIONS)  # silu is ungated
    hidden, n_layers = need("hidden_size"), need("num_layers")
    layers = _attention_layers(d, n_layers, path)
    window = d.get("window_size", 256) if "local" in layers else None
    return preset(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=n_layers, n_heads=need("num_heads"),
        d_ff=d.get("intermediate_size") or 4 * hidden, context_length=d.get("max_position_embeddings", 2048),
        activation=act, norm_eps=d.get("layer_norm_epsilon", 1e-5), sliding_window=window,
        layer_types=[_LAYER_TYPES[k] for k in layers] if window is not None else None,
        tie_embeddings=d.get("tie_word_embeddings", True), lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d),
        bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"))


def config_to_hf(cfg: ModelConfig) -> dict:
    layers = ["local" if cfg.layer_window(l) is not None else "global" for l in range(cfg.n_layers)]
    return {"hidden_size": cfg.d_model, "num_layers": cfg.n_layers, "num_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.context_length,
            "activation_function": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "layer_norm_epsilon": cfg.norm_eps, "attention_types": [[layers, 1]], "attention_layers": layers,
            "window_size": cfg.sliding_window if cfg.sliding_window is not None else 256,
            "resid_dropout": cfg.dropout, "embed_dropout": cfg.dropout, "attention_dropout": cfg.dropout,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("wte.weight", "tok_embed.weight"), weight("wpe.weight", "pos_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        table += [weight(h + "ln_1.weight", b + "norm1.weight"), weight(h + "ln_1.bias", b + "norm1.bias")]
        table += [weight(h + f"attn.attention.{x}_proj.weight", b + f"attn.{x}.weight") for x in "qkv"]
        table += [weight(h + "attn.attention.out_proj.weight", b + "attn.o.weight"),
                  weight(h + "attn.attention.out_proj.bias", b + "attn.o.bias"),
                  weight(h + "ln_2.weight", b + "norm2.weight"), weight(h + "ln_2.bias", b + "norm2.bias"),
                  weight(h + "mlp.c_fc.weight", b + "mlp.up.weight"), weight(h + "mlp.c_fc.bias", b + "mlp.up.bias"),
                  weight(h + "mlp.c_proj.weight", b + "mlp.down.weight"),
                  weight(h + "mlp.c_proj.bias", b + "mlp.down.bias")]
    table += [weight("ln_f.weight", "final_norm.weight"), weight("ln_f.bias", "final_norm.bias")]
    return table + head_weights(cfg)


# no q/k/v bias, an output bias, unscaled scores, global and local (sliding) layers
SWITCHES = {"activation": ("gelu", "gelu_tanh", "relu"), "attention_bias": (False,), "attention_out_bias": (True,),
            "attn_scale": (1.0,), "sliding_window": ANY, "layer_types": ANY}


FAMILY = Family(
    model_type="gpt_neo", title="GPT-Neo / TinyStories (decoder, local + global attention)", decoder=True,
    architectures=("GPTNeoModel", "GPTNeoForCausalLM"), prefixes=("", "transformer."), probe="wte.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
                "activation_function", "layer_norm_epsilon", "attention_layers", "window_size"),
    weights=weights, preset=preset, switches=SWITCHES, trainable=False)

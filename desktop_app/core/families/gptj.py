"""GPT-J: GPTJModel / GPTJForCausalLM. A parallel block with ONE input norm (shared_input_norm:
x + attn(ln_1(x)) + mlp(ln_1(x))), partial rotary on the first rotary_dim dims of each head, no attention
biases, a biased MLP and a biased unembedding (final_logits_bias: lm_head.bias).

GPT-J rotates interleaved pairs of dims (2i, 2i + 1) (rotate_every_two); the model here rotates halves
(i, i + r/2), so the rows of q_proj and k_proj are reordered on reading and back on writing
(INTERLEAVED_ROTARY, as Cohere's). Recorded attn.q holds its rotating dims in that order.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import ModelConfig
from .base import (ANY, INTERLEAVED_ROTARY, UNGATED_ACTIVATIONS, Family, ModelLoadError, Weight, activation_from_hf,
                   head_weights, hf_dtype, preset_of, required, weight)

preset = preset_of(dict(family="gptj", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                        positions="rotary", parallel_residual=True, shared_input_norm=True, causal=True,
                        attention_bias=False, mlp_bias=True, final_logits_bias=True, final_norm=True,
                        tie_embeddings=False, norm_eps=1e-5))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = activation_from_hf(d, path, "activation_function", "gelu_new", UNGATED_ACTIVATIONS)  # the MLP is ungated
    hidden, heads, rotary = need("n_embd"), need("n_head"), d.get("rotary_dim", 64)
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0 or hidden % heads:
        raise ModelLoadError(path, f"n_embd {hidden!r} is not a multiple of n_head {heads!r}")
    if not isinstance(rotary, int) or isinstance(rotary, bool) or not 0 < rotary <= hidden // heads:
        # transformers rotates hidden_size dims without one, which only fits a one-head model
        raise ModelLoadError(path, f"rotary_dim must be a positive integer up to the head width {hidden // heads}, "
                                   f"got {rotary!r}")
    fraction = rotary / (hidden // heads)
    if int(hidden // heads * fraction) != rotary:  # e.g. 30 / 44 * 44 is 29.999...: one step up gives 30 back
        fraction = math.nextafter(fraction, 1.0)
    eos, lm_head = d.get("eos_token_id"), FAMILY.has_lm_head(d)
    return preset(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("n_layer"), n_heads=heads,
        d_ff=d.get("n_inner") or 4 * hidden, context_length=d.get("n_positions", 2048), activation=act,
        norm_eps=d.get("layer_norm_epsilon", 1e-5), rotary_fraction=fraction,
        tie_embeddings=bool(d.get("tie_word_embeddings", False)), lm_head=lm_head, final_logits_bias=lm_head,
        dtype=hf_dtype(d),
        bos_token_id=d.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
            "n_positions": cfg.context_length, "rotary_dim": int(cfg.d_head * cfg.rotary_fraction),
            "activation_function": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("wte.weight", "tok_embed.weight")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        table += [weight(h + "ln_1.weight", b + "norm1.weight"), weight(h + "ln_1.bias", b + "norm1.bias"),
                  weight(h + "attn.q_proj.weight", b + "attn.q.weight", INTERLEAVED_ROTARY),
                  weight(h + "attn.k_proj.weight", b + "attn.k.weight", INTERLEAVED_ROTARY),
                  weight(h + "attn.v_proj.weight", b + "attn.v.weight"),
                  weight(h + "attn.out_proj.weight", b + "attn.o.weight"),
                  weight(h + "mlp.fc_in.weight", b + "mlp.up.weight"), weight(h + "mlp.fc_in.bias", b + "mlp.up.bias"),
                  weight(h + "mlp.fc_out.weight", b + "mlp.down.weight"),
                  weight(h + "mlp.fc_out.bias", b + "mlp.down.bias")]
    table += [weight("ln_f.weight", "final_norm.weight"), weight("ln_f.bias", "final_norm.bias")]
    return table + head_weights(cfg, bias=True)


# partial rotary (rotary_dim), the one shared input norm, the biased unembedding; no attention biases
SWITCHES = {"positions": ("rotary",), "activation": ("gelu", "gelu_tanh", "relu"), "parallel_residual": (True,),
            "shared_input_norm": (True,), "attention_bias": (False,), "final_logits_bias": (True, False),
            "rotary_fraction": ANY}


def requires(cfg: ModelConfig) -> list[str]:
    if cfg.final_logits_bias != cfg.lm_head:
        return [f"final_logits_bias {cfg.final_logits_bias!r}: GPTJForCausalLM's unembedding always has a bias"]
    return []


FAMILY = Family(
    model_type="gptj", title="GPT-J (decoder, parallel residual with one norm, partial interleaved RoPE)",
    decoder=True, architectures=("GPTJModel", "GPTJForCausalLM"), prefixes=("", "transformer."), probe="wte.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "rotary_dim", "activation_function",
                "layer_norm_epsilon"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, trainable=False)

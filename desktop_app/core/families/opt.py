"""OPT: OPTModel / OPTForCausalLM (learned positions offset by 2, ReLU, pre-LN or post-LN).

OPT's position table has two extra rows at the front (position t reads row t + 2); every linear
map has a bias unless enable_bias says otherwise. opt-350m's post-LN layout (do_layer_norm_before
false) is read as post-norm blocks without a final norm; its down-projected word embeddings
(word_embed_proj_dim != hidden_size, project_in / project_out) are not supported.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import (UNGATED_ACTIVATIONS, Family, ModelLoadError, Weight, activation_from_hf, head_weights, hf_dtype,
                   preset_of, required, weight)

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset

preset = preset_of(dict(family="opt", norm="layernorm", norm_placement="pre", activation="relu",
                        positions="learned", position_offset=POSITION_OFFSET, causal=True, attention_bias=True,
                        mlp_bias=True, final_norm=True, tie_embeddings=True, norm_eps=1e-5))


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    act = activation_from_hf(d, path, "activation_function", "relu", UNGATED_ACTIVATIONS)  # silu is ungated
    hidden = need("hidden_size")
    proj = d.get("word_embed_proj_dim")
    if proj not in (None, hidden):
        raise ModelLoadError(path, f"word_embed_proj_dim {proj!r} different from hidden_size {hidden!r} "
                                   f"(project_in / project_out, as in opt-350m) is not supported")
    if d.get("layer_norm_elementwise_affine", True) is not True:
        raise ModelLoadError(path, "layer_norm_elementwise_affine false (layer norms without weights) is not supported")
    if d.get("_remove_final_layer_norm", False):
        raise ModelLoadError(path, "_remove_final_layer_norm true is not supported")
    pre = d.get("do_layer_norm_before", True)
    if not isinstance(pre, bool):
        raise ModelLoadError(path, f"do_layer_norm_before must be true or false, got {pre!r}")
    bias = d.get("enable_bias", True)
    eos = d.get("eos_token_id")
    return preset(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"),
        n_heads=need("num_attention_heads"), d_ff=need("ffn_dim"), context_length=need("max_position_embeddings"),
        activation=act, norm_placement="pre" if pre else "post", final_norm=pre, attention_bias=bias, mlp_bias=bias,
        tie_embeddings=d.get("tie_word_embeddings", True), lm_head=FAMILY.has_lm_head(d), dtype=hf_dtype(d),
        pad_token_id=d.get("pad_token_id"), bos_token_id=d.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: ModelConfig) -> dict:
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "ffn_dim": cfg.d_ff, "max_position_embeddings": cfg.context_length, "word_embed_proj_dim": cfg.d_model,
            "activation_function": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
            "do_layer_norm_before": cfg.norm_placement == "pre", "enable_bias": cfg.attention_bias,
            "layer_norm_elementwise_affine": True, "dropout": cfg.dropout, "attention_dropout": cfg.dropout,
            "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def weights(cfg: ModelConfig) -> list[Weight]:
    bias = cfg.attention_bias
    table = [weight("embed_tokens.weight", "tok_embed.weight"), weight("embed_positions.weight", "pos_embed.weight")]
    linears = [("self_attn.q_proj", "attn.q"), ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v"),
               ("self_attn.out_proj", "attn.o"), ("fc1", "mlp.up"), ("fc2", "mlp.down")]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"layers.{i}."
        for theirs, ours in linears:
            table.append(weight(h + theirs + ".weight", b + ours + ".weight"))
            if bias:
                table.append(weight(h + theirs + ".bias", b + ours + ".bias"))
        # OPT's per-layer final_layer_norm is the norm around the MLP (ours: norm2)
        table += [weight(h + "self_attn_layer_norm.weight", b + "norm1.weight"),
                  weight(h + "self_attn_layer_norm.bias", b + "norm1.bias"),
                  weight(h + "final_layer_norm.weight", b + "norm2.weight"),
                  weight(h + "final_layer_norm.bias", b + "norm2.bias")]
    if cfg.final_norm:
        table += [weight("final_layer_norm.weight", "final_norm.weight"),
                  weight("final_layer_norm.bias", "final_norm.bias")]
    return table + head_weights(cfg)


# learned positions offset by 2, pre-LN (with a final norm) or post-LN (without), all biases or none
SWITCHES = {"position_offset": (POSITION_OFFSET,), "activation": ("gelu", "gelu_tanh", "relu"), "norm_placement": ("pre", "post"),
            "final_norm": (True, False), "attention_bias": (True, False), "mlp_bias": (True, False)}


def requires(cfg: ModelConfig) -> list[str]:
    problems = []
    if cfg.final_norm != (cfg.norm_placement == "pre"):
        problems.append(f"final_norm {cfg.final_norm!r} with norm_placement {cfg.norm_placement!r}: OPT has a final "
                        f"norm exactly when its layers are pre-LN")
    if cfg.mlp_bias != cfg.attention_bias:
        problems.append(f"mlp_bias {cfg.mlp_bias!r} with attention_bias {cfg.attention_bias!r}: OPT's enable_bias "
                        f"sets every bias at once")
    return problems


FAMILY = Family(
    model_type="opt", title="OPT (decoder, learned positions offset by 2, ReLU)", decoder=True,
    architectures=("OPTModel", "OPTForCausalLM"), prefixes=("decoder.", "model.decoder."),
    probe="embed_tokens.weight", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "max_position_embeddings",
                "word_embed_proj_dim", "activation_function", "do_layer_norm_before", "enable_bias"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, trainable=False)

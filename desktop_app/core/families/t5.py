"""T5: T5Model / T5ForConditionalGeneration, v1.0 and v1.1 / Flan-T5 (encoder-decoder, pre-norm with
T5's RMS norm (no mean, no bias), relative position buckets, no biases, no score scaling).

v1.0: ReLU MLP (wi, wo), the head tied to the embedding and the last hidden state rescaled by
d_model ** -0.5 (transformers' scale_decoder_outputs). v1.1 / Flan-T5: gated-GELU (wi_0 through
gelu_new, times wi_1), an untied lm_head (tie_word_embeddings false) and no rescaling. The relative
position table sits in the first layer of each stack and is shared by all its layers: bidirectional
buckets in the encoder, causal ones in the decoder.
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig
from .base import ANY, Family, ModelLoadError, Weight, Where, hf_dtype, required, weight

# feed_forward_proj -> our activation (gated-gelu: gelu_new on wi_0, times wi_1)
FEED_FORWARD = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gated-gelu": "geglu",
                "gated-gelu_new": "geglu", "gated-silu": "swiglu"}
GATED = ("geglu", "swiglu")

_BASE = dict(family="t5", is_encoder_decoder=True, causal=True, norm="rmsnorm", norm_placement="pre",
             activation="relu", positions="none", relative_buckets=32, relative_max_distance=128, attn_scale=1.0,
             attention_bias=False, mlp_bias=False, final_norm=True, tie_embeddings=True, norm_eps=1e-6,
             pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def preset(**kw) -> ModelConfig:
    """T5 v1.0 by default (tied head, rescaled by d_model ** -0.5); v1.1 with activation="geglu",
    tie_embeddings=False (then no rescaling unless lm_head_scale is given)."""
    cfg = {**_BASE, **kw}
    if "lm_head_scale" not in kw and cfg["tie_embeddings"]:
        cfg["lm_head_scale"] = cfg.get("d_model", ModelConfig.d_model) ** -0.5
    return ModelConfig(**cfg)


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    need = required(d, path)
    proj = d.get("feed_forward_proj", "relu")
    act = FEED_FORWARD.get(proj)
    if act is None:
        raise ModelLoadError(path, f"unsupported feed_forward_proj {proj!r} (supported: {', '.join(FEED_FORWARD)})")
    tie = d.get("tie_word_embeddings", True)
    # transformers: the output is rescaled unless the config says tie_word_embeddings false (v1.1), or
    # (written by transformers 5) scale_decoder_outputs
    scale = d.get("scale_decoder_outputs", tie is not False)
    if not isinstance(scale, bool):
        raise ModelLoadError(path, f"scale_decoder_outputs must be true or false, got {scale!r}")
    d_model = need("d_model")
    eos = d.get("eos_token_id", 1)
    pad = d.get("pad_token_id", 0)
    # transformers: only a missing (None) num_decoder_layers follows num_layers; 0 stays 0 (and is refused)
    n_decoder_layers = d.get("num_decoder_layers")
    return preset(vocab_size=need("vocab_size"), d_model=d_model, n_layers=need("num_layers"),
                  n_decoder_layers=d["num_layers"] if n_decoder_layers is None else n_decoder_layers, n_heads=need("num_heads"),
                  head_dim=need("d_kv"), d_ff=need("d_ff"), context_length=d.get("n_positions", 512),
                  activation=act, relative_buckets=d.get("relative_attention_num_buckets", 32),
                  relative_max_distance=d.get("relative_attention_max_distance", 128),
                  norm_eps=d.get("layer_norm_epsilon", 1e-6), tie_embeddings=tie,
                  lm_head_scale=d_model ** -0.5 if scale and isinstance(d_model, int) and d_model > 0 else None,
                  dtype=hf_dtype(d), pad_token_id=pad, eos_token_id=eos[0] if isinstance(eos, list) else eos,
                  decoder_start_token_id=d.get("decoder_start_token_id", pad))


def config_to_hf(cfg: ModelConfig) -> dict:
    # (an activation T5 has no name for is written as ours: such a model is saved with our tensor names)
    proj = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "geglu": "gated-gelu",
            "swiglu": "gated-silu"}.get(cfg.activation, cfg.activation)
    return {"d_model": cfg.d_model, "num_layers": cfg.n_layers, "num_decoder_layers": cfg.n_decoder_layers,
            "num_heads": cfg.n_heads, "d_kv": cfg.d_head, "d_ff": cfg.d_ff, "n_positions": cfg.context_length,
            "feed_forward_proj": proj, "relative_attention_num_buckets": cfg.relative_buckets,
            "relative_attention_max_distance": cfg.relative_max_distance, "layer_norm_epsilon": cfg.norm_eps,
            "scale_decoder_outputs": cfg.lm_head_scale is not None, "dropout_rate": cfg.dropout,
            "is_encoder_decoder": True, "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
            "decoder_start_token_id": cfg.decoder_start_token_id}


def _mlp(cfg: ModelConfig, h: str, b: str) -> list[Weight]:
    if cfg.activation in GATED:
        pairs = (("wi_0", "mlp.gate"), ("wi_1", "mlp.up"), ("wo", "mlp.down"))
    else:
        pairs = (("wi", "mlp.up"), ("wo", "mlp.down"))
    return [weight(f"{h}DenseReluDense.{theirs}.weight", f"{b}{ours}.weight") for theirs, ours in pairs]


def _attention(h: str, b: str) -> list[Weight]:
    return [weight(f"{h}.{p}.weight", f"{b}.{p}.weight") for p in ("q", "k", "v", "o")]


def weights(cfg: ModelConfig) -> list[Weight]:
    table = [weight("shared.weight", "tok_embed.weight",
                    aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"))]
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        table.append(weight(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                            f"{stack}.rel_bias.weight"))
        for i in range(n):
            h, b = f"{stack}.block.{i}.layer.", f"{stack}.blocks.{i}."
            table += _attention(h + "0.SelfAttention", b + "attn")
            table.append(weight(h + "0.layer_norm.weight", b + "norm1.weight"))
            ff = 1
            if stack == "decoder":
                table += _attention(h + "1.EncDecAttention", b + "cross_attn")
                table.append(weight(h + "1.layer_norm.weight", b + "norm_cross.weight"))
                ff = 2
            table += _mlp(cfg, f"{h}{ff}.", b)
            table.append(weight(f"{h}{ff}.layer_norm.weight", b + "norm2.weight"))
        table.append(weight(f"{stack}.final_layer_norm.weight", f"{stack}.final_norm.weight"))
    if not cfg.tie_embeddings:
        table.append(weight("lm_head.weight", "lm_head.weight", outside_prefix=True))
    return table


def requires(cfg: ModelConfig) -> list[str]:
    if cfg.lm_head_scale is not None and abs(cfg.lm_head_scale - cfg.d_model ** -0.5) > 1e-12:
        return [f"lm_head_scale {cfg.lm_head_scale!r}: T5 rescales by d_model ** -0.5 = {cfg.d_model ** -0.5!r} "
                f"or not at all"]
    return []


SWITCHES = {"is_encoder_decoder": (True,), "norm": ("rmsnorm",), "positions": ("none",),
            "relative_buckets": Where(lambda v: v > 0 and v % 2 == 0, "a positive even number"),
            "attn_scale": (1.0,), "attention_bias": (False,), "mlp_bias": (False,),
            "activation": tuple(FEED_FORWARD[k] for k in ("relu", "gelu", "gelu_new", "gated-gelu", "gated-silu")),
            "head_dim": ANY, "lm_head_scale": ANY}

FAMILY = Family(
    model_type="t5", title="T5 (encoder-decoder, relative position buckets, RMS norm)", decoder=True,
    architectures=("T5Model", "T5ForConditionalGeneration"), prefixes=("", ""), probe="shared.weight",
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    structural=("d_model", "num_layers", "num_decoder_layers", "num_heads", "d_kv", "d_ff", "feed_forward_proj",
                "relative_attention_num_buckets", "relative_attention_max_distance"),
    weights=weights, preset=preset, switches=SWITCHES, requires=requires, trainable=True, encoder_decoder=True)

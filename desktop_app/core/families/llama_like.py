"""What the LLaMA-shaped decoders (LLaMA, Qwen2, Qwen3, Mistral, Gemma 3) share: the config.json
fields read and written the same way, the rotary parameters (families.rope: linear and llama3 scalings),
head_dim, and the one weight table.

Each family module keeps only what differs: which fields it refuses, its biases, its windows and
its norms. The table is parameterised by the names of each layer's norms (Gemma 3 has four).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .base import ANY, ModelLoadError, Weight, head_weights, hf_dtype, required, weight
from .rope import rope_block, rope_fields, rope_to_hf  # noqa: F401 (rope_to_hf: the families write through it)

def rope(d: dict, path: Path) -> dict[str, Any]:
    """rope_theta and rope_scaling from config.json's rotary block, whichever key holds it
    (rope_parameters, rope_scaling, both agreeing): see families.rope. A top-level rope_theta or
    partial_rotary_factor fills in what the block leaves out, as transformers does."""
    defaults = {"rope_theta": d.get("rope_theta", 10000.0)}
    if "partial_rotary_factor" in d:
        defaults["partial_rotary_factor"] = d["partial_rotary_factor"]
    key, block = rope_block(d, path, defaults=defaults)
    return rope_fields(block, path, key)


def decoder_fields(d: dict, path: Path, *, lm_head: bool) -> dict[str, Any]:
    """ModelConfig keywords every LLaMA-like config.json gives the same way. `d` already holds the
    family's transformers defaults (Qwen3's head_dim 128, Gemma's 256); no head_dim means
    hidden_size // num_attention_heads."""
    need = required(d, path)
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    head_dim = d.get("head_dim")
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool)):
        raise ModelLoadError(path, f"head_dim must be a positive integer, got {head_dim!r}")
    if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads and head_dim * heads == hidden:
        head_dim = None  # the implied width: stored as None so the config reads like any other
    eos = d.get("eos_token_id")
    return dict(
        vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"), n_heads=heads,
        n_kv_heads=d.get("num_key_value_heads") or heads, d_ff=need("intermediate_size"), head_dim=head_dim,
        context_length=d.get("max_position_embeddings", 2048), norm_eps=d.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)), lm_head=lm_head, dtype=hf_dtype(d),
        bos_token_id=d.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos)


def decoder_to_hf(cfg: ModelConfig) -> dict:
    """The fields decoder_fields reads, from a config (head_dim always written: Qwen3's default is 128)."""
    return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff, "head_dim": cfg.d_head,
            "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.norm_eps,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


# What every LLaMA-like class computes beyond the defaults: RMSNorm, SwiGLU, rotary positions (with the
# linear and llama3 scalings), grouped-query attention and an explicit head width. Each family adds
# its biases, windows and norms.
SWITCHES = {"norm": ("rmsnorm",), "activation": ("swiglu",), "positions": ("rotary",), "n_kv_heads": ANY,
            "head_dim": ANY, "rope_scaling": ANY}

STRUCTURAL = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "head_dim", "max_position_embeddings", "rms_norm_eps")

# (Hugging Face name under layers.{i}., ours under blocks.{i}.) of each layer's norms
LLAMA_NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"))
QK_NORMS = (("self_attn.q_norm", "attn.q_norm"), ("self_attn.k_norm", "attn.k_norm"))


# A mixture of experts' names in Hugging Face's files: (the layer's MLP module, an expert's gate, up and
# down projections). Its router is {module}.gate, expert e {module}.experts.{e}.*.
QWEN_EXPERTS = ("mlp", "gate_proj", "up_proj", "down_proj")  # Qwen2-MoE, Qwen3-MoE, OLMoE
MIXTRAL_EXPERTS = ("block_sparse_moe", "w1", "w3", "w2")


def weights(cfg: ModelConfig, norms: tuple[tuple[str, str], ...] = LLAMA_NORMS,
            experts: tuple[str, str, str, str] = QWEN_EXPERTS) -> list[Weight]:
    """The LLaMA weight table: every tensor one to one; biases where the config has them, q/k norms
    with qk_norm, and the per-layer norms the family names; with num_experts, the router, the experts
    (named as `experts` says) and any shared expert in place of the MLP."""
    table = [weight("embed_tokens.weight", "tok_embed.weight")]
    linears = [("self_attn.q_proj", "attn.q", cfg.attention_bias), ("self_attn.k_proj", "attn.k", cfg.attention_bias),
               ("self_attn.v_proj", "attn.v", cfg.attention_bias),
               ("self_attn.o_proj", "attn.o", cfg.attention_out_bias)]
    if not cfg.num_experts:
        linears += [("mlp.gate_proj", "mlp.gate", cfg.mlp_bias), ("mlp.up_proj", "mlp.up", cfg.mlp_bias),
                    ("mlp.down_proj", "mlp.down", cfg.mlp_bias)]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"layers.{i}."
        for theirs, ours, bias in linears:
            table.append(weight(h + theirs + ".weight", b + ours + ".weight"))
            if bias:
                table.append(weight(h + theirs + ".bias", b + ours + ".bias"))
        if cfg.num_experts:
            table += expert_weights(cfg, h, b, experts)
        for theirs, ours in norms + (QK_NORMS if cfg.qk_norm else ()):
            table.append(weight(h + theirs + ".weight", b + ours + ".weight"))
    table.append(weight("norm.weight", "final_norm.weight"))
    return table + head_weights(cfg)


def expert_weights(cfg: ModelConfig, h: str, b: str, experts: tuple[str, str, str, str]) -> list[Weight]:
    """One layer's mixture of experts (core/moe.py): router, experts, shared expert and its gate."""
    module, gate, up, down = experts
    table = [weight(f"{h}{module}.gate.weight", f"{b}mlp.router.weight")]
    for e in range(cfg.num_experts):
        table += [weight(f"{h}{module}.experts.{e}.{theirs}.weight", f"{b}mlp.experts.{e}.{ours}.weight")
                  for theirs, ours in ((gate, "gate"), (up, "up"), (down, "down"))]
    if cfg.shared_expert_d_ff:
        table += [weight(f"{h}{module}.shared_expert.{theirs}.weight", f"{b}mlp.shared_expert.{ours}.weight")
                  for theirs, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))]
    if cfg.shared_expert_gate:
        table.append(weight(f"{h}{module}.shared_expert_gate.weight", f"{b}mlp.shared_expert_gate.weight"))
    return table


def experts_from_hf(d: dict, path: Path, count_key: str, aux_loss_coef: float = 0.001) -> dict[str, Any]:
    """num_experts, experts_per_token and router_norm from config.json (count_key: num_local_experts in
    Mixtral and Qwen3-MoE, num_experts in the others; norm_topk_prob,
    where the family has it, says whether the
    chosen experts' probabilities are renormalised). Only every layer sparse is computed here
    (mlp_only_layers empty, decoder_sparse_step 1): other configs are refused in one line."""
    if d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1:
        raise ModelLoadError(path, "dense MLP layers between the sparse ones (mlp_only_layers, decoder_sparse_step) "
                                   "are not supported: every layer must be a mixture of experts")
    need = required(d, path)
    norm = "renormalised" if d.get("norm_topk_prob", True) else "softmax"
    coef = d.get("router_aux_loss_coef", aux_loss_coef)
    if not isinstance(coef, (int, float)) or isinstance(coef, bool) or coef < 0:
        raise ModelLoadError(path, f"router_aux_loss_coef must be a number >= 0, got {coef!r}")
    return dict(num_experts=need(count_key), experts_per_token=need("num_experts_per_tok"), router_norm=norm,
                router_aux_loss_coef=float(coef))


def aliased(d: dict, name: str, alias: str) -> dict:
    """config.json with `alias` read as `name` when only the alias is there (a transformers config's
    attribute_map: Qwen3-MoE reads num_experts as num_local_experts, OLMoE the other way round)."""
    return {**d, name: d[alias]} if name not in d and alias in d else d


def experts_to_hf(cfg: ModelConfig, count_key: str) -> dict[str, Any]:
    out = {count_key: cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token,
           "router_aux_loss_coef": cfg.router_aux_loss_coef}
    if cfg.family != "mixtral":  # the Qwen-MoE and OLMoE configs say how the weights are normalised
        out["norm_topk_prob"] = cfg.router_norm == "renormalised"
    return out


def qwen_moe_fields(d: dict, path: Path, count_key: str) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: the experts' width is moe_intermediate_size (intermediate_size is a dense
    layer's, and every layer here is sparse); their sliding windows are not computed here."""
    if d.get("use_sliding_window"):
        raise ModelLoadError(path, f"use_sliding_window is not supported for model_type {d.get('model_type')!r}")
    return dict(d_ff=required(d, path)("moe_intermediate_size"), **experts_from_hf(d, path, count_key))


def qwen_moe_to_hf(cfg: ModelConfig, count_key: str) -> dict[str, Any]:
    return {**experts_to_hf(cfg, count_key), "moe_intermediate_size": cfg.d_ff, "mlp_only_layers": [],
            "decoder_sparse_step": 1, "use_sliding_window": False}


def layer_types_from_hf(d: dict, path: Path, n_layers: Any) -> list[str] | None:
    """config.json's explicit layer_types, checked: a list of known entries, one per layer."""
    types = d.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != n_layers:
        raise ModelLoadError(path, f"layer_types must list one entry per layer ({n_layers}), got {types!r}")
    unknown = sorted({str(t) for t in types if t not in ("full_attention", "sliding_attention")})
    if unknown:
        raise ModelLoadError(path, f"layer_types has entries this app does not implement: {', '.join(unknown)}")
    return list(types)


def qwen_windows(d: dict, path: Path) -> dict[str, Any]:
    """Qwen2/Qwen3's sliding window as transformers 5 computes it: `sliding_window` only counts when
    use_sliding_window is true; the sliding layers are config.json's layer_types, or else the layers
    from max_window_layers on. Without an effective window every layer is full (whatever layer_types
    says: transformers then gives the "sliding" layers no window either)."""
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    if window is None:
        return {"sliding_window": None, "layer_types": None}
    n_layers = d.get("num_hidden_layers")
    types = layer_types_from_hf(d, path, n_layers)
    if types is None:
        first = d.get("max_window_layers")
        if not isinstance(first, int) or isinstance(first, bool) or not isinstance(n_layers, int):
            raise ModelLoadError(path, f"use_sliding_window needs an integer max_window_layers, got {first!r}")
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if "sliding_attention" not in types:
        return {"sliding_window": None, "layer_types": None}
    return {"sliding_window": window, "layer_types": types}


def qwen_windows_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The inverse of qwen_windows: layer_types written out (transformers reads them first) and
    max_window_layers consistent with them where they are full-then-sliding."""
    if cfg.sliding_window is None:
        return {"use_sliding_window": False, "sliding_window": None, "layer_types": ["full_attention"] * cfg.n_layers}
    types = cfg.layer_types or ["sliding_attention"] * cfg.n_layers
    leading_full = next((i for i, t in enumerate(types) if t == "sliding_attention"), cfg.n_layers)
    return {"use_sliding_window": True, "sliding_window": cfg.sliding_window, "max_window_layers": leading_full,
            "layer_types": list(types)}


def silu_only(d: dict, path: Path) -> None:
    if d.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(path, f"unsupported hidden_act {d.get('hidden_act')!r} (this family computes silu)")

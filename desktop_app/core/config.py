"""ModelConfig: one dataclass describing every model family the app knows.

The families (core/families/, one module each; its REGISTRY is the only list) are presets over
the same switches (norm, placement, activation, positions, attention kind); the model builder in
the training panel may mix them freely. This module sits below the families and imports none of
them: a config is valid or not by its switches alone, and whether its `family` names a known one is
checked where families are looked up (core.families.family_of). The three original families'
switches are written here (CLASSIC_PRESETS) so that ModelConfig.gpt2() / .bert() / .llama() need no
registry; their family modules take their presets from the same table.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# rmsnorm_offset: Gemma's RMSNorm, weight applied as (1 + w) (stored zero-centred), all in float32;
# layernorm_plain: LayerNorm without weight or bias (OLMo's non-parametric norm); layernorm_nobias: with a
# weight only (Cohere)
NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset", "layernorm_plain", "layernorm_nobias")
# pre: a norm on each sublayer's input (GPT-2, LLaMA); post: on the stream after each residual add (BERT);
# output: on each sublayer's output before its residual add, none on its input (OLMo 2)
PLACEMENTS = ("pre", "post", "output")
# swiglu: silu(gate) * up (LLaMA, Qwen, Mistral); geglu: gelu_tanh(gate) * up (Gemma, T5 v1.1 gated-gelu);
# silu: ungated silu(up) (Marian's "swish")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu", "geglu", "silu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
ROPE_SCALINGS = ("linear", "llama3", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")  # as Hugging Face configs write them
LM_HEAD_KINDS = ("linear", "mlm", "classifier")
INPUT_KINDS = ("tokens", "patches")
# alibi: no position vectors, a per-head linear bias on the scores by distance (Bloom; attention.alibi_mask)
POSITIONS = ("learned", "sinusoidal", "rotary", "none", "alibi")
ROTARY_PRECISIONS = ("activations", "float32", "float32_rounded")
PARALLEL_SUMS = ("outputs_first", "input_first")
# sinusoidal tables: "interleaved" (Vaswani: sin, cos, sin, ... per frequency) or "halves" (Marian:
# every sin first, then every cos)
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
ATTENTION_KINDS = ("softmax", "l2", "sinkhorn")
INITS = ("default", "glorot", "he")
DTYPES = ("float32", "bfloat16", "float16")
# how a mixture-of-experts router turns the chosen experts' softmax probabilities into their weights:
# "renormalised" to sum to 1 over the chosen (Mixtral; Qwen-MoE and OLMoE with norm_topk_prob), or "softmax"
# as they are (Qwen-MoE and OLMoE without it)
ROUTER_NORMS = ("renormalised", "softmax")
# Beyond these a config is damaged or hostile, not a model this app can show: attention maps are
# T x T, and a learned or sinusoidal position table of 1e8 elements is already 400 MB of float32.
MAX_CONTEXT = 1 << 20
MAX_POSITION_TABLE = 100_000_000
# Upper bounds on every size and count, far above any real model (the largest have ~130 layers, widths
# of ~20,000, vocabularies of ~260,000): a config beyond them is damaged or hostile, and refused before
# anything is built (10**9 layers would build 10**9 Python blocks, even on the meta device).
MAX_SIZES = {"n_layers": 1024, "n_heads": 4096, "n_kv_heads": 4096, "d_model": 1 << 17, "head_dim": 1 << 17,
             "d_ff": 1 << 20, "vocab_size": 1 << 24, "type_vocab_size": 1 << 24, "sinkhorn_iters": 1000,
             "position_offset": MAX_CONTEXT, "sliding_window": MAX_CONTEXT, "image_size": 1 << 16,
             "patch_size": 1 << 16, "num_channels": 1024, "pooler_size": 1 << 17,
             "n_decoder_layers": 1024, "relative_buckets": 1 << 16, "relative_max_distance": MAX_CONTEXT,
             "num_experts": 1 << 14, "shared_expert_d_ff": 1 << 20}
MAX_PARAMETERS = 1 << 40  # ~1.1e12 weights (4 TB of float32); the machine's memory is checked at load


class ConfigError(ValueError):
    """A configuration that cannot describe a working model."""


# The switches of GPT-2, BERT and LLaMA: ModelConfig.gpt2/bert/llama and families/gpt2.py, bert.py,
# llama.py (their presets) all read them here.
CLASSIC_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(family="gpt2", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                 positions="learned", causal=True, attention_bias=True, mlp_bias=True,
                 final_norm=True, tie_embeddings=True, norm_eps=1e-5),
    "bert": dict(family="bert", norm="layernorm", norm_placement="post", activation="gelu",
                 positions="learned", causal=False, attention_bias=True, mlp_bias=True,
                 embed_norm=True, final_norm=False, type_vocab_size=2, tie_embeddings=True,
                 norm_eps=1e-12),
    "llama": dict(family="llama", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                  positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                  final_norm=True, tie_embeddings=False, norm_eps=1e-6),
}


@dataclass
class ModelConfig:
    family: str = "gpt2"
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # grouped-query attention; None means n_heads
    d_ff: int = 256
    context_length: int = 128
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    # rmsnorm: the gain multiplies the float32 normalised value, rounded once after (OLMo 2), not the value
    # rounded to the activations' dtype first (LLaMA); the same in a float32 model
    norm_gain_float32: bool = False
    norm_placement: str = "pre"
    activation: str = "gelu_tanh"
    positions: str = "learned"
    rope_theta: float = 10000.0
    causal: bool = True
    attention_kind: str = "softmax"
    sinkhorn_iters: int = 3
    attention_bias: bool = True
    mlp_bias: bool = True
    embed_norm: bool = False  # BERT normalises the embedding sum
    final_norm: bool = True  # GPT-2 ln_f, LLaMA norm; BERT has none (post-LN)
    type_vocab_size: int = 0  # BERT token types
    lm_head: bool = True  # GPT-2/LLaMA unembedding, BERT MLM head
    tie_embeddings: bool = True
    dropout: float = 0.0
    init: str = "default"
    init_std: float = 0.02
    dtype: str = "float32"
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # -- switches for the wider families; every default keeps GPT-2, BERT and LLaMA as they were --
    # Width of one head. HF `head_dim` (Qwen3, Gemma 3, some Mistral). None: d_model // n_heads.
    head_dim: int | None = None
    # Bias of the attention output projection, apart from q/k/v's (`attention_bias`). None: same as
    # attention_bias. Qwen2/2.5: q, k, v biases, none on o_proj. GPT-Neo: out_proj bias only.
    attention_out_bias: bool | None = None
    # x + attn(norm1(x)) + mlp(norm2(x)) instead of two residual steps. GPT-NeoX
    # `use_parallel_residual`, GPT-J. Needs pre-norm.
    parallel_residual: bool = False
    # Share of each head's dims that rotate (the first ones, "rotate half" within them); the rest
    # pass through. GPT-NeoX/Pythia `rotary_pct`, HF `partial_rotary_factor`.
    rotary_fraction: float = 1.0
    # Rotary frequency scaling, HF `rope_scaling` / `rope_parameters`: {"rope_type": "linear",
    # "factor": f} or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"} or {"rope_type": "longrope", "short_factor": [...], "long_factor":
    # [...] (one per rotating frequency), "original_max_position_embeddings", "attention_factor"} (Phi-3:
    # the long factors once a sequence passes the original context, cos and sin scaled by attention_factor).
    # None: plain rotary. Applies to full-attention layers.
    rope_scaling: dict[str, Any] | None = None
    # Rotary base of sliding-window layers, which then get no rope_scaling. Gemma 3
    # `rope_local_base_freq` (rope_parameters["sliding_attention"]). None: same rotary as other layers.
    rope_local_theta: float | None = None
    # Where half-precision q and k rotate (float32 models: the same values either way): "activations" in
    # their dtype, cos and sin rounded to it (LLaMA); "float32" upcast, by float32 cos and sin, rounded once
    # (OLMo, OLMo 2); "float32_rounded" the same with cos and sin rounded to the activations' dtype (Cohere).
    rotary_precision: str = "activations"
    # RMS/LayerNorm (the `norm` kind) over each head's q and k, before rotary. Qwen3, Gemma 3 q_norm/k_norm.
    qk_norm: bool = False
    # A sliding-window layer lets query i see keys j with i - sliding_window < j <= i (the window
    # counts the query itself): HF `sliding_window` (Mistral, Qwen2 use_sliding_window, Gemma 3)
    # and GPT-Neo `window_size` (same mask: tril(ones) xor tril(ones, -window_size)).
    sliding_window: int | None = None
    # Per layer "full_attention" or "sliding_attention", as HF `layer_types` (Gemma 3, Qwen2/3,
    # GPT-Neo `attention_types` expanded: "local" -> sliding). None: every layer slides when
    # sliding_window is set (Mistral), else every layer is full.
    layer_types: list[str] | None = None
    # Multiplier of q . k. None: 1/sqrt(d_head). GPT-Neo: 1.0 (no scaling); Gemma 3:
    # query_pre_attn_scalar ** -0.5.
    attn_scale: float | None = None
    # Token embeddings are multiplied by this (in the embedding dtype). Gemma: sqrt(hidden_size).
    embed_scale: float | None = None
    # Gemma 3's extra norms: attention and MLP outputs are normed before their residual add
    # (post_attention_layernorm, post_feedforward_layernorm); norm2 is then pre_feedforward_layernorm.
    sandwich_norms: bool = False
    # logits = cap * tanh(logits / cap). HF `final_logit_softcapping` (Gemma 2/3; None in most).
    final_logit_softcap: float | None = None
    # Learned position tables have position_offset extra rows and position t reads row t + offset.
    # OPT: 2. RoBERTa: pad_token_id + 1 (HF's rule from input ids, for inputs without padding).
    position_offset: int = 0
    # Unembedding: "linear" (GPT-2, LLaMA, ...) or "mlm" (dense -> GELU -> LayerNorm -> decoder +
    # bias: BERT cls.predictions, RoBERTa lm_head, DistilBERT vocab_transform/vocab_layer_norm/
    # vocab_projector). None: "mlm" for the bert family, else "linear" (configs saved before the field).
    lm_head_kind: str | None = None
    shared_input_norm: bool = False  # parallel_residual with one norm n: x + attn(n(x)) + mlp(n(x)) (GPT-J, Phi-2)
    # The order a parallel block sums in (bfloat16 rounds each sum): "outputs_first" (mlp + attn) + x
    # (GPT-NeoX, GPT-J, Phi, Falcon); "input_first" (x + attn) + mlp (Cohere)
    parallel_sum: str = "outputs_first"
    residual_multiplier: float | None = None  # x + r * sublayer(...) at every residual add (Granite); None: 1
    qk_norm_across_heads: bool = False  # qk_norm over all heads' q (and k) at once, before the split (OLMo 2)
    # scores = cap * tanh(scores / cap) before the mask and softmax. HF `attn_logit_softcapping` (Gemma 2).
    attn_logit_softcap: float | None = None
    # q, k and v each clamped to [-clip_qkv, clip_qkv] right after their projections. HF `clip_qkv` (OLMo).
    clip_qkv: float | None = None
    # Per layer, whether its q and k rotate (rotary positions); false: a "NoPE" layer, no positions at all.
    # HF `no_rope_layers` (SmolLM3: 1 = rotary, 0 = none). None: every layer rotates.
    rotary_layers: list[bool] | None = None
    # -- images (ViT). input_kind "patches": the model reads pixel values [B, C, H, W] of square
    # image_size images, cut by a Conv2d (kernel = stride = patch_size) into one token per patch
    # after a learned [CLS] token; context_length is then 1 + (image_size // patch_size) ** 2.
    # lm_head_kind "classifier" reads the [CLS] position only, and vocab_size is the number of classes.
    input_kind: str = "tokens"
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    pooler_size: int = 0  # ViTModel's pooler (dense + tanh on [CLS]) output width; 0: no pooler
    # -- encoder-decoders (T5, BART, Marian; core/seq2seq.py). is_encoder_decoder: an encoder stack of
    # n_layers bidirectional blocks and a decoder stack of n_decoder_layers causal blocks with
    # cross-attention, sharing the token embedding (causal stays true: the model generates).
    is_encoder_decoder: bool = False
    n_decoder_layers: int | None = None  # None: n_layers
    decoder_start_token_id: int | None = None  # the decoder's first input token (T5: pad, Marian: pad, BART: eos)
    # T5's relative position buckets: a learned [buckets, heads] table in the first layer of each stack,
    # its bias added to every layer's scores (bidirectional in the encoder); 0: none
    relative_buckets: int = 0
    relative_max_distance: int = 128  # T5 relative_attention_max_distance: farther offsets share a bucket
    sinusoidal_layout: str = "interleaved"
    # a fixed bias added to the logits (BART / Marian final_logits_bias; GPT-J's and Phi-2's lm_head.bias), stored with the weights
    final_logits_bias: bool = False
    # the last hidden state is multiplied by this before the unembedding (T5 v1.0: d_model ** -0.5); None: 1
    lm_head_scale: float | None = None
    # -- mixture-of-experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; core/moe.py). num_experts > 0: every
    # block's MLP is a router over num_experts gated MLPs of width d_ff, experts_per_token of them run per
    # token, weighted as router_norm says; 0: the dense MLP.
    num_experts: int = 0
    experts_per_token: int = 2
    router_norm: str = "renormalised"
    # in a half-precision model, the experts' terms weighted by the float32 weights and summed in float32, then
    # rounded once (Mixtral's router keeps them float32); false: weights rounded to the activations' dtype first
    expert_weights_float32: bool = False
    # the training loss adds this times the router's load-balancing loss (transformers' router_aux_loss_coef and
    # load_balancing_loss_func: core.moe.load_balancing_loss); 0: none
    router_aux_loss_coef: float = 0.001
    # Qwen2-MoE's shared expert: a gated MLP of this width every token runs, scaled by sigmoid(a learned
    # Linear(d, 1)) when shared_expert_gate; 0: none
    shared_expert_d_ff: int = 0
    shared_expert_gate: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # fields kept only for round trips

    def __post_init__(self) -> None:
        for name in _FOLLOWERS:
            if getattr(self, name) is None:
                setattr(self, name, self.default_of(name))
        self.validate()

    # -- defaults (what a switch is when nobody sets it) ------------------------------------------
    def default_of(self, name: str) -> Any:
        """Field `name`'s value when not given: its declared default, or for a field that follows
        another (n_kv_heads: n_heads; attention_out_bias: attention_bias; lm_head_kind: "mlm" for
        the bert family, else "linear") the value it follows to in this config."""
        if name in _FOLLOWERS:
            return _FOLLOWERS[name](self)
        f = _FIELDS[name]
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    def at_default(self, name: str) -> bool:
        """Whether field `name` computes what its default computes: equal to default_of, or a value
        that means the same (head_dim d_model // n_heads, attn_scale 1/sqrt(d_head), layer_types all
        of the one kind sliding_window gives every layer without them)."""
        value = getattr(self, name)
        if name == "head_dim":
            return value is None or value * self.n_heads == self.d_model
        if name == "attn_scale":
            return value is None or abs(value * self.d_head ** 0.5 - 1.0) < 1e-12
        if name == "rotary_layers":
            return value is None or all(value)
        if name == "layer_types":
            every = "sliding_attention" if self.sliding_window is not None else "full_attention"
            return value is None or all(t == every for t in value)
        return value == self.default_of(name)

    # -- derived -------------------------------------------------------------------------
    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def is_decoder(self) -> bool:
        return self.causal

    @property
    def positions_from_pad(self) -> bool:
        """RoBERTa's rule (HF create_position_ids_from_input_ids): positions are counted over the ids that
        are not pad_token_id, from pad_token_id + 1 (a learned table, bidirectional, position_offset = pad + 1),
        so a token whose id is pad_token_id is read as padding: the pad id must be no real token's."""
        return (self.positions == "learned" and bool(self.position_offset) and not self.causal
                and self.pad_token_id == self.position_offset - 1)

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        # which families exist is the registry's to say (core.families.family_of), not this module's
        check(isinstance(self.family, str) and self.family != "", f"family must be a name, got {self.family!r}")
        check(self.norm in NORMS, f"unknown norm {self.norm!r}")
        check(self.norm_placement in PLACEMENTS, f"unknown norm placement {self.norm_placement!r}")
        check(self.activation in ACTIVATIONS, f"unknown activation {self.activation!r}")
        check(self.positions in POSITIONS, f"unknown positions {self.positions!r}")
        check(self.rotary_precision in ROTARY_PRECISIONS, f"unknown rotary precision {self.rotary_precision!r}")
        check(self.parallel_sum in PARALLEL_SUMS, f"unknown parallel sum {self.parallel_sum!r}")
        check(self.attention_kind in ATTENTION_KINDS, f"unknown attention kind {self.attention_kind!r}")
        check(self.init in INITS, f"unknown init {self.init!r}")
        check(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}")
        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_real(value: Any) -> bool:  # a finite number (JSON has no separate float type)
            return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context_length",
                     "sinkhorn_iters", "n_decoder_layers", "relative_max_distance"):
            value = getattr(self, name)
            check(is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}")
        for name, most in MAX_SIZES.items():  # before any check that multiplies sizes
            value = getattr(self, name)
            if is_int(value) and value > most:
                raise ConfigError(f"{name} {value:,} is beyond the {most:,} this app supports (no real model "
                                  f"comes near; the config is damaged)")
        check(is_int(self.type_vocab_size) and self.type_vocab_size >= 0,
              f"type_vocab_size must be a non-negative integer, got {self.type_vocab_size!r}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            check(value is None or is_int(value), f"{name} must be an integer or null, got {value!r}")
        for name in ("norm_eps", "rope_theta", "init_std"):
            value = getattr(self, name)
            check(is_real(value) and value > 0, f"{name} must be a positive finite number, got {value!r}")
        check(is_real(self.dropout), f"dropout must be a finite number, got {self.dropout!r}")
        for name in ("causal", "attention_bias", "mlp_bias", "embed_norm", "final_norm", "lm_head", "tie_embeddings"):
            value = getattr(self, name)
            check(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
        check(isinstance(self.extra, dict), f"extra must be a mapping, got {self.extra!r}")
        check(self.context_length <= MAX_CONTEXT,
              f"context_length {self.context_length:,} is beyond the {MAX_CONTEXT:,} tokens this app supports")
        check(self.positions not in ("learned", "sinusoidal") or self.context_length * self.d_model <= MAX_POSITION_TABLE,
              f"a position table of context_length x d_model = {self.context_length:,} x {self.d_model:,} is "
              f"beyond {MAX_POSITION_TABLE:,} elements")
        check(self.head_dim is None or (is_int(self.head_dim) and self.head_dim > 0),
              f"head_dim must be a positive integer or null, got {self.head_dim!r}")
        check(self.head_dim is not None or self.d_model % self.n_heads == 0,
              f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check(self.n_heads % self.n_kv_heads == 0,
              f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for name in ("attention_out_bias", "parallel_residual", "qk_norm", "sandwich_norms"):
            value = getattr(self, name)
            check(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
        check(is_real(self.rotary_fraction) and 0.0 < self.rotary_fraction <= 1.0,
              f"rotary_fraction must be in (0, 1], got {self.rotary_fraction!r}")
        rotary_dims = int(self.d_head * self.rotary_fraction)  # HF: int(head_dim * partial_rotary_factor)
        check(self.positions != "rotary" or (rotary_dims > 0 and rotary_dims % 2 == 0),
              f"rotary positions need an even, non-zero number of rotating dims per head "
              f"(head width {self.d_head} x rotary_fraction {self.rotary_fraction} = {rotary_dims})")
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            check(isinstance(rs, dict), f"rope_scaling must be a mapping or null, got {rs!r}")
            kind = rs.get("rope_type", rs.get("type"))
            check(kind in ROPE_SCALINGS, f"rope_scaling type {kind!r} is not supported "
                                         f"(supported: {', '.join(ROPE_SCALINGS)})")
            needed = {"linear": ("factor",), "longrope": ("original_max_position_embeddings", "attention_factor"),
                      "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}[kind]
            for key in needed:
                check(is_real(rs.get(key)) and rs.get(key) > 0,
                      f"rope_scaling {kind!r} needs a positive number {key!r}, got {rs.get(key)!r}")
            if kind == "llama3":
                check(rs["high_freq_factor"] != rs["low_freq_factor"],
                      "rope_scaling 'llama3' needs high_freq_factor != low_freq_factor")
            for key in ("short_factor", "long_factor") if kind == "longrope" else ():
                factors, n = rs.get(key), int(self.d_head * self.rotary_fraction) // 2
                check(isinstance(factors, list) and len(factors) == n and all(is_real(f) and f > 0 for f in factors),
                      f"rope_scaling 'longrope' needs {key} as a list of {n} positive numbers (one per rotating "
                      f"frequency), got {factors!r}")
        for name in ("rope_local_theta", "attn_scale", "embed_scale", "final_logit_softcap", "lm_head_scale",
                     "attn_logit_softcap", "clip_qkv", "residual_multiplier"):
            value = getattr(self, name)
            check(value is None or (is_real(value) and value > 0),
                  f"{name} must be a positive finite number or null, got {value!r}")
        check(self.sliding_window is None or (is_int(self.sliding_window) and self.sliding_window > 0),
              f"sliding_window must be a positive integer or null, got {self.sliding_window!r}")
        if self.layer_types is not None:
            check(isinstance(self.layer_types, list) and len(self.layer_types) == self.n_layers,
                  f"layer_types must be a list of {self.n_layers} entries (one per layer), got {self.layer_types!r}")
            unknown = sorted({t for t in self.layer_types if t not in LAYER_TYPES}, key=str)
            check(not unknown, f"unknown layer types {unknown!r} (known: {', '.join(LAYER_TYPES)})")
            check("sliding_attention" not in self.layer_types or self.sliding_window is not None,
                  "layer_types has sliding_attention layers but sliding_window is not set")
        if self.rotary_layers is not None:
            check(isinstance(self.rotary_layers, list) and len(self.rotary_layers) == self.n_layers
                  and all(isinstance(r, bool) for r in self.rotary_layers),
                  f"rotary_layers must list true or false for each of the {self.n_layers} layers, got {self.rotary_layers!r}")
            check(self.positions == "rotary", "rotary_layers needs rotary positions")
        check(is_int(self.position_offset) and self.position_offset >= 0,
              f"position_offset must be a non-negative integer, got {self.position_offset!r}")
        check(self.lm_head_kind in LM_HEAD_KINDS, f"unknown lm_head_kind {self.lm_head_kind!r} "
                                                  f"(known: {', '.join(LM_HEAD_KINDS)})")
        check(self.input_kind in INPUT_KINDS, f"unknown input kind {self.input_kind!r} (known: {', '.join(INPUT_KINDS)})")
        for name in ("image_size", "patch_size", "num_channels"):
            value = getattr(self, name)
            check(is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}")
        check(is_int(self.pooler_size) and self.pooler_size >= 0,
              f"pooler_size must be a non-negative integer, got {self.pooler_size!r}")
        if self.input_kind == "patches":
            check(self.image_size % self.patch_size == 0,
                  f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
            patches = (self.image_size // self.patch_size) ** 2
            check(self.context_length == 1 + patches, f"context_length must be 1 + number of patches = "
                                                      f"{1 + patches}, got {self.context_length}")
            check(self.positions == "learned" and not self.causal and not self.tie_embeddings,
                  "patch input needs learned positions, no causal mask and untied embeddings")
        check(self.lm_head_kind != "classifier" or self.input_kind == "patches",
              "the classifier head reads the [CLS] position of patch input only")
        check(not (self.parallel_residual or self.sandwich_norms) or self.norm_placement == "pre",
              "parallel_residual and sandwich_norms need norm_placement 'pre'")
        check(isinstance(self.shared_input_norm, bool),
              f"shared_input_norm must be true or false, got {self.shared_input_norm!r}")
        check(not self.shared_input_norm or self.parallel_residual,
              "shared_input_norm (one input norm read by attention and MLP alike) needs parallel_residual")
        check(isinstance(self.qk_norm_across_heads, bool),
              f"qk_norm_across_heads must be true or false, got {self.qk_norm_across_heads!r}")
        check(not self.qk_norm_across_heads or self.qk_norm, "qk_norm_across_heads needs qk_norm")
        check(self.residual_multiplier is None or (is_real(self.residual_multiplier) and self.residual_multiplier > 0),
              f"residual_multiplier must be a positive finite number or null, got {self.residual_multiplier!r}")
        check(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("is_encoder_decoder", "final_logits_bias"):
            value = getattr(self, name)
            check(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
        check(is_int(self.relative_buckets) and self.relative_buckets >= 0,
              f"relative_buckets must be a non-negative integer, got {self.relative_buckets!r}")
        check(self.sinusoidal_layout in SINUSOIDAL_LAYOUTS, f"unknown sinusoidal layout {self.sinusoidal_layout!r} "
                                                            f"(known: {', '.join(SINUSOIDAL_LAYOUTS)})")
        if self.is_encoder_decoder:
            check(self.causal and self.input_kind == "tokens" and self.lm_head_kind == "linear" and self.lm_head,
                  "an encoder-decoder reads tokens, its decoder is causal and ends in a linear language-model head")
            check(not (self.parallel_residual or self.sandwich_norms or self.type_vocab_size or self.pooler_size
                       or self.sliding_window is not None or self.positions == "rotary"),
                  "an encoder-decoder has no parallel residual, sandwich norms, token types, pooler, sliding "
                  "window or rotary positions here")
            check(self.norm_placement != "output" and self.residual_multiplier is None,
                  "an encoder-decoder has no output-only norms or residual multiplier here")
            check(self.positions != "none" or self.relative_buckets >= 1,  # T5: its only position information
                  f"relative_buckets (relative_attention_num_buckets) must be at least 1 for an encoder-decoder "
                  f"without position embeddings (T5), got {self.relative_buckets}")
            for name in ("decoder_start_token_id", "pad_token_id"):  # rows of the embedding the decoder reads
                value = getattr(self, name)
                check(value is None or 0 <= value < self.vocab_size,
                      f"{name} {value:,} is not a token of the {self.vocab_size:,}-token vocabulary (0 to "
                      f"{self.vocab_size - 1:,})" if value is not None else "")
        else:
            check(self.relative_buckets == 0, "relative position buckets are for encoder-decoders (T5) only")
            # an embedding row (torch's padding_idx rule, which transformers' models refuse it by): -vocab to vocab-1
            check(self.pad_token_id is None or -self.vocab_size <= self.pad_token_id < self.vocab_size,
                  f"pad_token_id {self.pad_token_id!r} is not a token of the {self.vocab_size:,}-token vocabulary "
                  f"(0 to {self.vocab_size - 1:,})")
        for name in ("num_experts", "shared_expert_d_ff"):
            value = getattr(self, name)
            check(is_int(value) and value >= 0, f"{name} must be a non-negative integer, got {value!r}")
        check(isinstance(self.shared_expert_gate, bool), "shared_expert_gate must be true or false")
        if self.num_experts:
            check(isinstance(self.router_aux_loss_coef, (int, float)) and self.router_aux_loss_coef >= 0,
                  f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef!r}")
            check(is_int(self.experts_per_token) and 0 < self.experts_per_token <= self.num_experts,
                  f"experts_per_token must be in 1..num_experts ({self.num_experts}), got {self.experts_per_token!r}")
            check(self.router_norm in ROUTER_NORMS,
                  f"unknown router_norm {self.router_norm!r} (known: {', '.join(ROUTER_NORMS)})")
            check(self.activation in GATED_ACTIVATIONS, f"mixture-of-experts needs gated experts (swiglu or geglu), "
                                                        f"got activation {self.activation!r}")
            check(not self.is_encoder_decoder, "mixture-of-experts is for one-stack models here")
        else:
            check(not (self.shared_expert_d_ff or self.shared_expert_gate),
                  "a shared expert needs num_experts > 0 (it sits beside the routed experts)")
        check(not self.shared_expert_gate or self.shared_expert_d_ff, "shared_expert_gate needs a shared expert "
                                                                      "(shared_expert_d_ff > 0)")
        n = self.parameter_estimate()
        check(n <= MAX_PARAMETERS, f"the config describes about {n:.3g} parameters, beyond the {MAX_PARAMETERS:.3g} "
                                   f"this app supports")

    def parameter_estimate(self) -> int:
        """The number of weights this config describes, by arithmetic (nothing built): embeddings, position
        table, attention and MLP matrices with their biases, norms, heads. Within a few per cent of
        Transformer(cfg).num_parameters(); what a load checks against the machine's memory before building."""
        d, dh, ff = self.d_model, self.d_head, self.d_ff
        q, kv = self.n_heads * dh, self.n_kv_heads * dh
        attn = d * (q + 2 * kv) + q * d + (q + 2 * kv + d) * bool(self.attention_bias)
        mlp = d * ff * (3 if self.activation in GATED_ACTIVATIONS else 2) + (2 * ff + d) * bool(self.mlp_bias)
        if self.num_experts:  # the router, the experts, the shared expert and its gate
            mlp = self.num_experts * (d + mlp) + 3 * d * self.shared_expert_d_ff + d * self.shared_expert_gate
        norms = (2 if self.shared_input_norm else 4) * d + (4 * d if self.sandwich_norms else 0)
        qk_norms = 0 if not self.qk_norm else 2 * (q + kv) if self.qk_norm_across_heads else 4 * dh
        layer = attn + mlp + norms + qk_norms
        embed = self.vocab_size * d if self.input_kind == "tokens" else self.num_channels * self.patch_size ** 2 * d + 2 * d
        positions = (self.context_length + self.position_offset) * d if self.positions == "learned" else 0
        head = self.vocab_size * d if self.lm_head and not (self.tie_embeddings and self.input_kind == "tokens") else 0
        head += (d * d + 3 * d) if self.lm_head_kind == "mlm" else 0
        head += self.vocab_size if self.final_logits_bias else 0
        if self.is_encoder_decoder:  # a decoder stack with cross-attention, its positions and norms
            cross = d * (q + 2 * kv) + q * d + (q + 2 * kv + d) * bool(self.attention_bias) + 2 * d
            layer_count = self.n_layers * layer + self.n_decoder_layers * (layer + cross)
            positions *= 2
            embed += 2 * self.relative_buckets * self.n_heads
        else:
            layer_count = self.n_layers * layer
        return int(embed + positions + self.type_vocab_size * d + layer_count + head + 4 * d
                   + self.pooler_size * (d + 1))

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of this layer (keys i - window < j <= i), or None for full attention."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None:
            return self.sliding_window  # Mistral: every layer slides
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    # -- presets of the three original families (the others: core.families.REGISTRY[name].preset) --
    @classmethod
    def gpt2(cls, **kw: Any) -> "ModelConfig":
        return cls(**{**CLASSIC_PRESETS["gpt2"], **kw})

    @classmethod
    def bert(cls, **kw: Any) -> "ModelConfig":
        return cls(**{**CLASSIC_PRESETS["bert"], **kw})

    @classmethod
    def llama(cls, **kw: Any) -> "ModelConfig":
        return cls(**{**CLASSIC_PRESETS["llama"], **kw})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown config fields: {', '.join(sorted(unknown))}")
        return cls(**d)

    def replace(self, **kw: Any) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
# fields whose default (None) follows another field's value: filled in by __post_init__
_FOLLOWERS: dict[str, Any] = {
    "n_kv_heads": lambda cfg: cfg.n_heads,
    "n_decoder_layers": lambda cfg: cfg.n_layers,
    "attention_out_bias": lambda cfg: cfg.attention_bias,
    "lm_head_kind": lambda cfg: "mlm" if cfg.family == "bert" else "linear",
}

"""ModelConfig: one dataclass describing every model family the app knows.

The three families are presets over the same switches (norm, placement, activation, positions,
attention kind); the model builder in the training panel may mix them freely.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("gpt2", "bert", "llama")
NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("pre", "post")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu")
POSITIONS = ("learned", "sinusoidal", "rotary", "none")
ATTENTION_KINDS = ("softmax", "l2", "sinkhorn")
INITS = ("default", "glorot", "he")
DTYPES = ("float32", "bfloat16", "float16")
# Beyond these a config is damaged or hostile, not a model this app can show: attention maps are
# T x T, and a learned or sinusoidal position table of 1e8 elements is already 400 MB of float32.
MAX_CONTEXT = 1 << 20
MAX_POSITION_TABLE = 100_000_000


class ConfigError(ValueError):
    """A configuration that cannot describe a working model."""


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
    extra: dict[str, Any] = field(default_factory=dict)  # fields kept only for round trips

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        self.validate()

    # -- derived -------------------------------------------------------------------------
    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def is_decoder(self) -> bool:
        return self.causal

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        check(self.family in FAMILIES, f"unknown family {self.family!r} (known: {', '.join(FAMILIES)})")
        check(self.norm in NORMS, f"unknown norm {self.norm!r}")
        check(self.norm_placement in PLACEMENTS, f"unknown norm placement {self.norm_placement!r}")
        check(self.activation in ACTIVATIONS, f"unknown activation {self.activation!r}")
        check(self.positions in POSITIONS, f"unknown positions {self.positions!r}")
        check(self.attention_kind in ATTENTION_KINDS, f"unknown attention kind {self.attention_kind!r}")
        check(self.init in INITS, f"unknown init {self.init!r}")
        check(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}")
        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_real(value: Any) -> bool:  # a finite number (JSON has no separate float type)
            return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context_length",
                     "sinkhorn_iters"):
            value = getattr(self, name)
            check(is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}")
        check(is_int(self.type_vocab_size) and self.type_vocab_size >= 0,
              f"type_vocab_size must be a non-negative integer, got {self.type_vocab_size!r}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
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
        check(self.d_model % self.n_heads == 0,
              f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check(self.n_heads % self.n_kv_heads == 0,
              f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        check(self.positions != "rotary" or self.d_head % 2 == 0, "rotary positions need an even head width")
        check(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")

    # -- presets -------------------------------------------------------------------------
    @classmethod
    def gpt2(cls, **kw: Any) -> "ModelConfig":
        base = dict(family="gpt2", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                    positions="learned", causal=True, attention_bias=True, mlp_bias=True,
                    final_norm=True, tie_embeddings=True, norm_eps=1e-5)
        return cls(**{**base, **kw})

    @classmethod
    def bert(cls, **kw: Any) -> "ModelConfig":
        base = dict(family="bert", norm="layernorm", norm_placement="post", activation="gelu",
                    positions="learned", causal=False, attention_bias=True, mlp_bias=True,
                    embed_norm=True, final_norm=False, type_vocab_size=2, tie_embeddings=True,
                    norm_eps=1e-12)
        return cls(**{**base, **kw})

    @classmethod
    def llama(cls, **kw: Any) -> "ModelConfig":
        base = dict(family="llama", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                    positions="rotary", causal=True, attention_bias=False, mlp_bias=False,
                    final_norm=True, tie_embeddings=False, norm_eps=1e-6)
        return cls(**{**base, **kw})

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

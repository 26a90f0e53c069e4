"""What a family is: the Family record, its weight table, and the conversions the table uses.

A weight table lists, for one config, every Hugging Face tensor with the state-dict name(s) of ours
it holds and how to convert between the two. The same table is read in both directions: loading
walks it theirs -> ours, saving walks it ours -> theirs, so the mapping is written once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import ModelConfig
from ..weights import ModelLoadError  # noqa: F401 (the families raise it; defined with the files it names)


# -- conversions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversion:
    """One Hugging Face tensor <-> our tensor(s), as a pair of inverse functions.

    to_ours(t, cfg) returns a list with one tensor per name in Weight.ours; to_theirs(parts, cfg)
    is its inverse. Only views and torch.cat are used, so loading stays zero-copy where it can and
    the meta skeleton (shape checks before any data is read) can run them.
    """

    name: str
    to_ours: Callable[[torch.Tensor, ModelConfig], list[torch.Tensor]]
    to_theirs: Callable[[list[torch.Tensor], ModelConfig], torch.Tensor]

    def then(self, other: "Conversion") -> "Conversion":
        """Apply self, then other (reading); writing undoes them in the reverse order."""
        return Conversion(
            f"{self.name}+{other.name}",
            lambda t, cfg: [p for q in self.to_ours(t, cfg) for p in other.to_ours(q, cfg)],
            lambda parts, cfg: self.to_theirs([other.to_theirs(parts, cfg)], cfg))


IDENTITY = Conversion("identity", lambda t, cfg: [t], lambda parts, cfg: parts[0])
# GPT-2's Conv1D stores a linear map as [in, out]; ours (nn.Linear) is [out, in].
TRANSPOSE = Conversion("transpose", lambda t, cfg: [t.T], lambda parts, cfg: parts[0].T)


def fused(parts: int | Callable[[ModelConfig], tuple[int, ...]], name: str = "") -> Conversion:
    """Tensors concatenated along the output axis (dim 0 in our layout): `parts` equal ones (GPT-2's
    q|k|v), or parts of the sizes a function of the config gives (Phi-3's q|k|v with fewer key/value
    heads: (n_heads * d_head, n_kv_heads * d_head, n_kv_heads * d_head))."""
    if isinstance(parts, int):
        return Conversion(f"fused{parts}", lambda t, cfg: list(torch.chunk(t, parts, dim=0)),
                          lambda ts, cfg: torch.cat(ts, 0))
    return Conversion(name or "fused", lambda t, cfg: list(torch.split(t, parts(cfg), dim=0)),
                      lambda ts, cfg: torch.cat(ts, 0))


def _reorder_rotating_rows(t: torch.Tensor, cfg: ModelConfig, to_halves: bool) -> torch.Tensor:
    """t's rows (a weight [H * d_head, d] or a bias [H * d_head]) with each head's first r rotating dims
    (r = d_head * rotary_fraction) from pair order (0, 1, 2, 3, ...) to halves order (0, 2, ..., 1, 3, ...),
    or back; the other dims stay where they are."""
    heads, r = t.shape[0] // cfg.d_head, int(cfg.d_head * cfg.rotary_fraction)
    x = t.reshape(heads, cfg.d_head, -1)
    order = (heads, r // 2, 2, -1) if to_halves else (heads, 2, r // 2, -1)
    rot = x[:, :r].reshape(order).transpose(1, 2).reshape(heads, r, -1)
    return torch.cat([rot, x[:, r:]], 1).reshape(t.shape)


# q_proj / k_proj rows of a family that rotates interleaved pairs (dims 2i, 2i + 1: GPT-J, Cohere) <-> the
# halves (i, i + r/2) the model rotates with the same frequency for pair i. q and k move together, so every
# score q . k is the same sum (transformers' convert_llama_weights_to_hf permutes Meta's checkpoints so);
# only the recorded attn.q / attn.k list each head's rotating dims in this order.
INTERLEAVED_ROTARY = Conversion("interleaved rotary", lambda t, cfg: [_reorder_rotating_rows(t, cfg, True)],
                                lambda parts, cfg: _reorder_rotating_rows(parts[0], cfg, False))


def qkv_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    """The rows of q, k and v in a fused q|k|v projection (grouped-query attention: k and v are smaller)."""
    return cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head


# -- the weight table ------------------------------------------------------------------------


@dataclass(frozen=True)
class Weight:
    """One Hugging Face tensor and the tensor(s) of ours it holds."""

    theirs: str  # relative to the family's base-model prefix ("transformer.", "bert.", "model.")
    ours: tuple[str, ...]
    convert: Conversion = IDENTITY
    optional: bool = False  # a folder may lack it without being refused
    aliases: tuple[str, ...] = ()  # older names of the same tensor, accepted when reading
    outside_prefix: bool = False  # heads kept beside the base model (lm_head.*, cls.*)
    # a second copy of a tensor read before (an untied BART's encoder.embed_tokens beside shared): refused
    # when it holds other values, since ours keeps one
    same_as_before: bool = False


def weight(theirs: str, ours: str | tuple[str, ...], convert: Conversion = IDENTITY, **kw: Any) -> Weight:
    return Weight(theirs, (ours,) if isinstance(ours, str) else tuple(ours), convert, **kw)


def weights_and_biases(theirs: str, ours: str, names: tuple[tuple[str, str], ...]) -> list[Weight]:
    """The .weight then the .bias of each (their name, our name) pair, under the prefixes `theirs` and `ours`:
    a LayerNorm's or a biased Linear's two tensors."""
    return [weight(f"{theirs}{t}.{x}", f"{ours}{o}.{x}") for t, o in names for x in ("weight", "bias")]


def head_weights(cfg: ModelConfig, bias: bool = False) -> list[Weight]:
    """A causal LM's unembedding beside the base model: lm_head.weight unless tied to the embedding, and
    lm_head.bias where the family's head has one (GPT-J, Phi); nothing without the head."""
    if not cfg.lm_head:
        return []
    table = [] if cfg.tie_embeddings else [weight("lm_head.weight", "lm_head.weight", outside_prefix=True)]
    if bias:
        table.append(weight("lm_head.bias", "lm_bias", outside_prefix=True))
    return table


# -- the family record -----------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's "model_type", the registry key
    title: str  # what the Model panel shows
    decoder: bool  # causal language model (else a bidirectional encoder)
    architectures: tuple[str, str]  # Hugging Face class names (without, with the LM head)
    prefixes: tuple[str, str]  # weight-name prefix of the base model (without, with the LM head)
    probe: str  # a tensor every checkpoint of the family has, relative to the prefix
    config_from_hf: Callable[[dict, Path], ModelConfig]  # config.json (Hugging Face fields) -> ours
    config_to_hf: Callable[[ModelConfig], dict]  # ours -> the family's Hugging Face fields
    structural: tuple[str, ...]  # Hugging Face fields that fix the architecture (cross-checked)
    weights: Callable[[ModelConfig], list[Weight]]  # the ONE weight-name table, for a config
    preset: Callable[..., ModelConfig]  # the family's switches, overridable (training, tests)
    # The ModelConfig switches its transformers class supports, each with the values it supports
    # (a tuple, ANY, or a Where test); every other switch must stay at its default (see
    # hf_differences). A switch added to ModelConfig is therefore "not what transformers computes"
    # for every family until a family declares it here.
    switches: dict[str, Any]
    trainable: bool = True  # the training panel and `train` can build and train it here
    # what the class also fixes across fields (OPT: a final norm exactly with pre-LN): one line per problem
    requires: Callable[[ModelConfig], list[str]] | None = None
    encoder_decoder: bool = False  # an encoder and a decoder with cross-attention (core/seq2seq.py)
    moe: bool = False  # a mixture-of-experts: each block's MLP routes tokens to experts (core/moe.py)

    def hf_differences(self, cfg: ModelConfig) -> list[str]:
        return hf_differences(self, cfg)

    def hf_compatible(self, cfg: ModelConfig) -> bool:
        """Whether the family's transformers class computes this config (else it is saved with our own
        tensor names: under the class's names transformers would load it and compute something else)."""
        return not hf_differences(self, cfg)

    def architecture(self, cfg: ModelConfig) -> str:
        return self.architectures[bool(cfg.lm_head)]

    def prefix(self, cfg: ModelConfig) -> str:
        """The prefix this app writes: the one the Hugging Face class of `architecture` uses."""
        return self.prefixes[bool(cfg.lm_head)]

    def has_lm_head(self, d: dict) -> bool:
        """From config.json's "architectures": only the headless class listed means no head."""
        archs = d.get("architectures") or []
        return not (archs and all(a == self.architectures[0] for a in archs))

    def detect_prefix(self, cfg: ModelConfig, names: set[str]) -> str:
        """The prefix a folder's tensors use (the headless and the LM-head classes differ by it)."""
        for prefix in dict.fromkeys(self.prefixes):
            if prefix + self.probe in names:
                return prefix
        return self.prefix(cfg)


# -- what the transformers class computes ------------------------------------------------------


class _Any:
    def __repr__(self) -> str:
        return "any value"


ANY = _Any()  # a declared switch the class reads from its config.json, whatever its value


@dataclass(frozen=True)
class Where:
    """A declared switch's supported values as a test (e.g. a positive number of token types)."""
    test: Callable[[Any], bool]
    says: str

    def __repr__(self) -> str:
        return self.says


POSITIVE = Where(lambda v: v > 0, "a positive value")

# ModelConfig fields that are not switches: sizes and numbers every family's class holds as they are
# (widths, depth, vocabulary, context, eps, dropout, dtype, token ids, with or without the head, tied
# or not), and fields that change nothing unless a switch is on (rope_theta without rotary positions,
# sinkhorn_iters without Sinkhorn attention, the image sizes without patch input). Every other field
# is a switch, at its default unless the family declares it: a field added to ModelConfig is a switch
# until it is listed here with its reason.
NOT_SWITCHES = frozenset({
    "family", "vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "context_length", "norm_eps",
    "rope_theta", "sinkhorn_iters", "lm_head", "tie_embeddings", "dropout", "init", "init_std", "dtype",
    "pad_token_id", "bos_token_id", "eos_token_id", "image_size", "patch_size", "num_channels", "extra",
    # an encoder-decoder's decoder depth, its start token, and T5's farthest distinct offset: sizes and ids
    "n_decoder_layers", "decoder_start_token_id", "relative_max_distance",
    # how many experts a token runs: a count, and nothing without num_experts (a switch)
    "experts_per_token",
    # the weight of the router's load-balancing loss in training: it changes no forward
    "router_aux_loss_coef"})


def _allows(allowed: Any, value: Any) -> bool:
    if allowed is ANY:
        return True
    if isinstance(allowed, Where):
        return allowed.test(value)
    return value in allowed


def hf_differences(family: Family, cfg: ModelConfig) -> list[str]:
    """What keeps `family`'s transformers class from computing `cfg`, one line per field ([]: it computes
    exactly this model). A switch the family declares must take one of its declared values; every other
    switch must be at its default (ModelConfig.at_default); then the family's own cross-field rules."""
    cls = family.architectures[1]
    problems = []
    for f in dataclasses.fields(ModelConfig):
        name = f.name
        if name in NOT_SWITCHES:
            continue
        value = getattr(cfg, name)
        allowed = family.switches.get(name)
        if allowed is None:
            if not cfg.at_default(name):
                problems.append(f"{name} {value!r}: {cls} has no such switch (only {cfg.default_of(name)!r})")
        elif not _allows(allowed, value):
            problems.append(f"{name} {value!r}: {cls} supports {allowed!r}")
    return problems + (family.requires(cfg) if family.requires else [])


# -- shared config helpers -------------------------------------------------------------------

HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                  "gelu": "gelu", "relu": "relu", "silu": "swiglu"}
UNGATED_ACTIVATIONS = {k: v for k, v in HF_ACTIVATIONS.items() if v != "swiglu"}  # silu without a gate: refused
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def activation_from_hf(d: dict, path: Path, key: str, default: str, known: dict[str, str] = HF_ACTIVATIONS) -> str:
    """Our activation for config.json's d[key] (`default` when absent), or a ModelLoadError naming it."""
    name = d.get(key, default)
    if name not in known:
        raise ModelLoadError(path, f"unsupported {key} {name!r}")
    return known[name]


def heads_fill_width(cfg: ModelConfig, title: str, heads_key: str = "num_attention_heads") -> list[str]:
    """The problem, if any, for a family whose heads are hidden_size / heads wide (no head_dim of its own)."""
    if cfg.head_dim is not None and cfg.head_dim * cfg.n_heads != cfg.d_model:
        return [f"head_dim {cfg.head_dim}: {title}'s heads are hidden_size / {heads_key} wide"]
    return []


def hf_dtype(d: dict) -> str:
    """The dtype a config.json records (new "dtype" or old "torch_dtype"); float32 if unknown."""
    return _TORCH_DTYPES.get(str(d.get("dtype") or d.get("torch_dtype") or "float32"), "float32")


def required(d: dict, path: Path) -> Callable[[str], Any]:
    """need(key): d[key], or a ModelLoadError naming the missing field."""
    def need(key: str) -> Any:
        if key not in d:
            raise ModelLoadError(path, f"missing field {key!r}")
        return d[key]
    return need


def real(x: Any) -> Any:
    """An int as a float; anything else as it is, for ModelConfig.validate to refuse by name."""
    return float(x) if isinstance(x, int) and not isinstance(x, bool) else x


def preset_of(base: dict[str, Any]) -> Callable[..., ModelConfig]:
    """A preset: ModelConfig with the family's switches, any of them overridden by keyword."""
    def preset(**kw: Any) -> ModelConfig:
        return ModelConfig(**{**base, **kw})
    return preset

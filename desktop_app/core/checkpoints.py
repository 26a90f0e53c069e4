"""Model folders in the Hugging Face layout: config.json + *.safetensors (+ index) + tokenizer.json.

Reads GPT2Model/GPT2LMHeadModel, BertModel/BertForMaskedLM and LlamaForCausalLM checkpoints by
mapping their weight names onto ours; writes the same names back so `transformers` loads what we
save. Weights are read only through safetensors (never pickle) and memory-mapped where possible.
Every problem is one ModelLoadError naming the file and what is wrong with it.
"""
from __future__ import annotations

import json
import mmap
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import ConfigError, ModelConfig
from .files import atomic_write_dir
from .model import Transformer, sinusoidal_table
from .tokenizer import Tokenizer, TokenizerError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
NATIVE_KEY = "transformer_explorer"  # our full ModelConfig, kept beside the Hugging Face fields


class ModelLoadError(Exception):
    """A model folder (or one file in it) that cannot be used, and why."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass
class LoadedModel:
    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer | None
    path: Path | None
    name: str


# -- configs ---------------------------------------------------------------------------------

_HF_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "gelu": "gelu", "relu": "relu", "silu": "swiglu"}
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    """ModelConfig from a config.json dictionary (ours or a Hugging Face one)."""
    def need(key: str):
        if key not in d:
            raise ModelLoadError(path, f"missing field {key!r}")
        return d[key]

    try:
        if NATIVE_KEY in d:
            if not isinstance(d[NATIVE_KEY], dict):
                raise ModelLoadError(path, f"the {NATIVE_KEY!r} block is not a JSON object")
            cfg = ModelConfig.from_dict(d[NATIVE_KEY])
            _check_native_agrees(cfg, d, path)
            return cfg
        mt = d.get("model_type")
        dtype = _TORCH_DTYPES.get(str(d.get("dtype") or d.get("torch_dtype") or "float32"), "float32")
        if mt == "gpt2":
            act = _HF_ACT.get(d.get("activation_function", "gelu_new"))
            if act is None:
                raise ModelLoadError(path, f"unsupported activation_function {d['activation_function']!r}")
            n_embd = need("n_embd")
            return ModelConfig.gpt2(
                vocab_size=need("vocab_size"), d_model=n_embd, n_layers=need("n_layer"), n_heads=need("n_head"),
                d_ff=d.get("n_inner") or 4 * n_embd, context_length=need("n_positions"), activation=act,
                norm_eps=d.get("layer_norm_epsilon", 1e-5), tie_embeddings=d.get("tie_word_embeddings", True),
                lm_head=_has_lm_head(d, "GPT2Model"), dtype=dtype,
                bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"))
        if mt == "bert":
            if d.get("position_embedding_type", "absolute") != "absolute":
                raise ModelLoadError(path, f"unsupported position_embedding_type {d['position_embedding_type']!r}")
            if d.get("is_decoder"):
                raise ModelLoadError(path, "BERT as a decoder (is_decoder=true) is not supported")
            act = _HF_ACT.get(d.get("hidden_act", "gelu"))
            if act not in ("gelu", "gelu_tanh", "relu"):
                raise ModelLoadError(path, f"unsupported hidden_act {d.get('hidden_act')!r}")
            return ModelConfig.bert(
                vocab_size=need("vocab_size"), d_model=need("hidden_size"), n_layers=need("num_hidden_layers"),
                n_heads=need("num_attention_heads"), d_ff=need("intermediate_size"),
                context_length=need("max_position_embeddings"), activation=act,
                type_vocab_size=d.get("type_vocab_size", 2), norm_eps=d.get("layer_norm_eps", 1e-12),
                lm_head=_has_lm_head(d, "BertModel"), tie_embeddings=d.get("tie_word_embeddings", True),
                dtype=dtype, pad_token_id=d.get("pad_token_id"))
        if mt == "llama":
            if d.get("hidden_act", "silu") != "silu":
                raise ModelLoadError(path, f"unsupported hidden_act {d.get('hidden_act')!r}")
            rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
            if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
                raise ModelLoadError(path, f"unsupported rope scaling {rope!r}")
            hidden, heads = need("hidden_size"), need("num_attention_heads")
            if d.get("head_dim") not in (None, hidden // heads):
                raise ModelLoadError(path, "head_dim different from hidden_size / num_attention_heads is not supported")
            eos = d.get("eos_token_id")
            return ModelConfig.llama(
                vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"), n_heads=heads,
                n_kv_heads=d.get("num_key_value_heads") or heads, d_ff=need("intermediate_size"),
                context_length=d.get("max_position_embeddings", 2048), norm_eps=d.get("rms_norm_eps", 1e-6),
                rope_theta=_real(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
                attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
                tie_embeddings=bool(d.get("tie_word_embeddings", False)), dtype=dtype,
                bos_token_id=d.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos)
        if mt is None:
            raise ModelLoadError(path, "no 'model_type' field: cannot tell which architecture this is")
        raise ModelLoadError(path, f"unknown model_type {mt!r} (supported: gpt2, bert, llama)")
    except ConfigError as exc:
        raise ModelLoadError(path, f"invalid configuration: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(path, f"invalid value: {exc}") from exc


# The Hugging Face fields that fix the architecture: other tools read these, we read our block, so
# the two must describe the same model (an edit to one alone is refused, not silently ignored).
_STRUCTURAL = ("model_type", "vocab_size", "tie_word_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
               "n_positions", "activation_function", "layer_norm_epsilon", "hidden_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "intermediate_size", "max_position_embeddings",
               "hidden_act", "type_vocab_size", "layer_norm_eps", "rms_norm_eps", "rope_theta")


def _check_native_agrees(cfg: ModelConfig, d: dict, path: Path) -> None:
    expected = config_to_hf(cfg)
    for key in _STRUCTURAL:
        if key in d and key in expected and d[key] != expected[key]:
            raise ModelLoadError(path, f"the Hugging Face field {key!r} is {d[key]!r} but the {NATIVE_KEY!r} block "
                                       f"implies {expected[key]!r}; the two must describe the same model")


def _real(x):
    """An int as a float; anything else as it is, for ModelConfig.validate to refuse by name."""
    return float(x) if isinstance(x, int) and not isinstance(x, bool) else x


def _has_lm_head(d: dict, base_arch: str) -> bool:
    archs = d.get("architectures") or []
    return not (archs and all(a == base_arch for a in archs))


def config_to_hf(cfg: ModelConfig) -> dict:
    """A config.json that `transformers` understands, with our full config alongside."""
    common = {"vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings, "dtype": cfg.dtype}
    if cfg.family == "gpt2":
        d = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel" if cfg.lm_head else "GPT2Model"],
             "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
             "n_positions": cfg.context_length, "activation_function": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
             "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
             "attn_pdrop": cfg.dropout, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
    elif cfg.family == "bert":
        d = {"model_type": "bert", "architectures": ["BertForMaskedLM" if cfg.lm_head else "BertModel"],
             "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
             "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.context_length,
             "hidden_act": {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation),
             "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.norm_eps,
             "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
             "pad_token_id": cfg.pad_token_id if cfg.pad_token_id is not None else 0}
    else:
        d = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.d_model,
             "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
             "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
             "max_position_embeddings": cfg.context_length, "rms_norm_eps": cfg.norm_eps,
             "rope_theta": cfg.rope_theta, "hidden_act": "silu", "attention_bias": cfg.attention_bias,
             "mlp_bias": cfg.mlp_bias, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
    return {**common, **d, NATIVE_KEY: cfg.to_dict()}


# -- weight names ----------------------------------------------------------------------------
# Each family maps our state-dict names to Hugging Face's. GPT-2 stores Conv1D weights transposed
# and q, k, v fused, so its mapping is written as functions in both directions.


def _hf_prefix(cfg: ModelConfig) -> str:
    if cfg.family == "gpt2":
        return "transformer." if cfg.lm_head else ""
    if cfg.family == "bert":
        return "bert." if cfg.lm_head else ""
    return "model."


def hf_compatible(cfg: ModelConfig) -> bool:
    """Whether the family's Hugging Face architecture can hold this config's weights.

    The training panel's builder mixes switches freely (e.g. GPT-2 with rotary positions or RMSNorm,
    BERT without token types or with a final norm); such models are saved with our own tensor names
    (NATIVE_PROBE present) so they still round-trip through model folders.
    """
    same = cfg.n_kv_heads == cfg.n_heads and not (cfg.family != "bert" and cfg.embed_norm)
    if cfg.family == "gpt2":
        return (same and cfg.norm == "layernorm" and cfg.positions == "learned" and cfg.norm_placement == "pre"
                and cfg.activation != "swiglu" and cfg.attention_bias and cfg.mlp_bias and cfg.final_norm
                and not cfg.type_vocab_size)
    if cfg.family == "bert":
        return (same and cfg.norm == "layernorm" and cfg.positions == "learned" and cfg.norm_placement == "post"
                and cfg.activation != "swiglu" and cfg.attention_bias and cfg.mlp_bias and not cfg.final_norm
                and cfg.embed_norm and cfg.type_vocab_size > 0)
    return (cfg.norm == "rmsnorm" and cfg.positions == "rotary" and cfg.norm_placement == "pre"
            and cfg.activation == "swiglu" and cfg.final_norm and not cfg.type_vocab_size and not cfg.embed_norm)


NATIVE_PROBE = "tok_embed.weight"  # present only in folders saved with our own tensor names


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    cfg, sd = model.cfg, model.state_dict()
    if not hf_compatible(cfg):
        tied = cfg.lm_head and cfg.tie_embeddings
        return {k: v.detach().contiguous() for k, v in sd.items() if not (tied and k == "lm_head.weight")}
    p = _hf_prefix(cfg)
    out: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        out[name] = t.detach().contiguous()

    if cfg.family == "gpt2":
        put(p + "wte.weight", sd["tok_embed.weight"])
        put(p + "wpe.weight", sd["pos_embed.weight"])
        for i in range(cfg.n_layers):
            b, h = f"blocks.{i}.", f"{p}h.{i}."
            for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
                put(h + theirs + ".weight", sd[b + ours + ".weight"])
                put(h + theirs + ".bias", sd[b + ours + ".bias"])
            put(h + "attn.c_attn.weight", torch.cat([sd[b + f"attn.{x}.weight"] for x in "qkv"], 0).T)
            put(h + "attn.c_attn.bias", torch.cat([sd[b + f"attn.{x}.bias"] for x in "qkv"], 0))
            put(h + "attn.c_proj.weight", sd[b + "attn.o.weight"].T)
            put(h + "attn.c_proj.bias", sd[b + "attn.o.bias"])
            put(h + "mlp.c_fc.weight", sd[b + "mlp.up.weight"].T)
            put(h + "mlp.c_fc.bias", sd[b + "mlp.up.bias"])
            put(h + "mlp.c_proj.weight", sd[b + "mlp.down.weight"].T)
            put(h + "mlp.c_proj.bias", sd[b + "mlp.down.bias"])
        put(p + "ln_f.weight", sd["final_norm.weight"])
        put(p + "ln_f.bias", sd["final_norm.bias"])
        if cfg.lm_head and not cfg.tie_embeddings:
            put("lm_head.weight", sd["lm_head.weight"])
        return out
    for ours, theirs in _simple_names(cfg).items():
        if ours in sd:
            put(theirs, sd[ours])
    return out


def _simple_names(cfg: ModelConfig) -> dict[str, str]:
    """ours -> theirs for the families whose tensors map one to one (BERT, LLaMA)."""
    p = _hf_prefix(cfg)
    m: dict[str, str] = {}
    if cfg.family == "bert":
        e = p + "embeddings."
        m.update({"tok_embed.weight": e + "word_embeddings.weight", "pos_embed.weight": e + "position_embeddings.weight",
                  "type_embed.weight": e + "token_type_embeddings.weight",
                  "embed_norm.weight": e + "LayerNorm.weight", "embed_norm.bias": e + "LayerNorm.bias"})
        for i in range(cfg.n_layers):
            b, h = f"blocks.{i}.", f"{p}encoder.layer.{i}."
            for ours, theirs in (("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                                 ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                                 ("norm1", "attention.output.LayerNorm"), ("mlp.up", "intermediate.dense"),
                                 ("mlp.down", "output.dense"), ("norm2", "output.LayerNorm")):
                m[b + ours + ".weight"] = h + theirs + ".weight"
                m[b + ours + ".bias"] = h + theirs + ".bias"
        if cfg.lm_head:
            c = "cls.predictions."
            m.update({"mlm_dense.weight": c + "transform.dense.weight", "mlm_dense.bias": c + "transform.dense.bias",
                      "mlm_norm.weight": c + "transform.LayerNorm.weight", "mlm_norm.bias": c + "transform.LayerNorm.bias",
                      "lm_bias": c + "bias"})
            if not cfg.tie_embeddings:
                m["lm_head.weight"] = c + "decoder.weight"
        return m
    # llama
    m["tok_embed.weight"] = p + "embed_tokens.weight"
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"{p}layers.{i}."
        for ours, theirs in (("attn.q", "self_attn.q_proj"), ("attn.k", "self_attn.k_proj"),
                             ("attn.v", "self_attn.v_proj"), ("attn.o", "self_attn.o_proj"),
                             ("mlp.gate", "mlp.gate_proj"), ("mlp.up", "mlp.up_proj"), ("mlp.down", "mlp.down_proj")):
            m[b + ours + ".weight"] = h + theirs + ".weight"
            m[b + ours + ".bias"] = h + theirs + ".bias"
        m[b + "norm1.weight"] = h + "input_layernorm.weight"
        m[b + "norm2.weight"] = h + "post_attention_layernorm.weight"
    m["final_norm.weight"] = p + "norm.weight"
    if cfg.lm_head and not cfg.tie_embeddings:
        m["lm_head.weight"] = "lm_head.weight"
    return m


def _from_hf(cfg: ModelConfig, get: Callable[[str], torch.Tensor], names: set[str],
             file_of: Callable[[str], Path]) -> dict[str, torch.Tensor]:
    """Our state dict from a reader of Hugging Face tensors (names = what the files hold)."""
    if NATIVE_PROBE in names:  # saved with our own names (a config Hugging Face cannot express)
        return {n: get(n) for n in names}
    prefix = _detect_prefix(cfg, names)

    def take(name: str) -> torch.Tensor:
        full = prefix + name
        if full not in names:
            raise ModelLoadError(file_of(full), f"missing tensor {full!r}")
        return get(full)

    sd: dict[str, torch.Tensor] = {}
    if cfg.family == "gpt2":
        d = cfg.d_model
        sd["tok_embed.weight"] = take("wte.weight")
        sd["pos_embed.weight"] = take("wpe.weight")
        for i in range(cfg.n_layers):
            b, h = f"blocks.{i}.", f"h.{i}."
            for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
                sd[b + ours + ".weight"] = take(h + theirs + ".weight")
                sd[b + ours + ".bias"] = take(h + theirs + ".bias")
            w, bias = take(h + "attn.c_attn.weight"), take(h + "attn.c_attn.bias")
            _check_shape(file_of(prefix + h + "attn.c_attn.weight"), prefix + h + "attn.c_attn.weight", w, (d, 3 * d))
            for j, x in enumerate("qkv"):
                sd[b + f"attn.{x}.weight"] = w[:, j * d:(j + 1) * d].T
                sd[b + f"attn.{x}.bias"] = bias[j * d:(j + 1) * d]
            sd[b + "attn.o.weight"] = take(h + "attn.c_proj.weight").T
            sd[b + "attn.o.bias"] = take(h + "attn.c_proj.bias")
            sd[b + "mlp.up.weight"] = take(h + "mlp.c_fc.weight").T
            sd[b + "mlp.up.bias"] = take(h + "mlp.c_fc.bias")
            sd[b + "mlp.down.weight"] = take(h + "mlp.c_proj.weight").T
            sd[b + "mlp.down.bias"] = take(h + "mlp.c_proj.bias")
        sd["final_norm.weight"] = take("ln_f.weight")
        sd["final_norm.bias"] = take("ln_f.bias")
        if cfg.lm_head and not cfg.tie_embeddings:
            prefix = ""
            sd["lm_head.weight"] = take("lm_head.weight")
        return sd
    full_prefix = _hf_prefix(cfg)
    for ours, theirs in _simple_names(cfg).items():
        local = theirs[len(full_prefix):] if theirs.startswith(full_prefix) else theirs
        candidate = (prefix + local) if theirs.startswith(full_prefix) else theirs
        if candidate not in names:
            alt = candidate.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
            if alt in names:
                candidate = alt
            elif ours.endswith(".bias") and not _bias_expected(cfg, ours):
                continue
            elif ours == "lm_head.weight" and cfg.family == "bert":
                continue
            else:
                raise ModelLoadError(file_of(candidate), f"missing tensor {candidate!r}")
        sd[ours] = get(candidate)
    return sd


def _bias_expected(cfg: ModelConfig, ours: str) -> bool:
    if cfg.family == "llama":
        return cfg.attention_bias if ".attn." in ours else cfg.mlp_bias
    return True


def _detect_prefix(cfg: ModelConfig, names: set[str]) -> str:
    """GPT2Model vs GPT2LMHeadModel (and BertModel vs BertForMaskedLM) differ only by a prefix."""
    probe = {"gpt2": "wte.weight", "bert": "embeddings.word_embeddings.weight", "llama": "embed_tokens.weight"}[cfg.family]
    for prefix in ("", "transformer.", "bert.", "model."):
        if prefix + probe in names:
            return prefix
    return _hf_prefix(cfg)


def _check_shape(path: Path, name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ModelLoadError(path, f"tensor {name!r} has shape {list(t.shape)} but the config implies {list(expected)}")


# -- reading ---------------------------------------------------------------------------------


def read_config(folder: Path) -> ModelConfig:
    path = folder / CONFIG
    if not path.is_file():
        raise ModelLoadError(folder, f"not a model folder: no {CONFIG}")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelLoadError(path, f"not UTF-8 text ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(path, f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    except RecursionError:
        raise ModelLoadError(path, "malformed config: JSON nested too deeply") from None
    if not isinstance(d, dict):
        raise ModelLoadError(path, "malformed config: expected a JSON object")
    return config_from_hf(d, path)


def _weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from model.safetensors or the sharded index."""
    single, index = folder / WEIGHTS, folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ModelLoadError(index, f"malformed index ({exc})") from exc
        except RecursionError:
            raise ModelLoadError(index, "malformed index: JSON nested too deeply") from None
        files = {}
        for name, fname in weight_map.items():
            f = _shard_path(folder, index, fname)
            if not f.is_file():
                raise ModelLoadError(f, f"shard listed in {INDEX} is missing")
            files[name] = f
        return files
    if single.is_file():
        return {name: single for name in _safetensors_names(single)}
    others = sorted(p.name for p in folder.glob("*.safetensors"))
    if len(others) == 1:
        f = folder / others[0]
        return {name: f for name in _safetensors_names(f)}
    if any((folder / n).exists() for n in ("pytorch_model.bin", "model.pt", "model.ckpt")):
        raise ModelLoadError(folder, f"only pickle weights found (e.g. pytorch_model.bin); this app loads "
                                     f"{WEIGHTS} only and never unpickles. Convert the checkpoint to safetensors.")
    raise ModelLoadError(folder, f"no weights: expected {WEIGHTS} or {INDEX}")


def _shard_path(folder: Path, index: Path, fname: str) -> Path:
    """The shard `fname` names, refused unless it lies inside the model folder.

    An index is data from wherever the model came from: an absolute path, '..' or a link leading out
    would read any file on the machine. One exception: a Hugging Face cache snapshot
    (models--NAME/snapshots/REV/) holds its files as links into the same repository's blobs/ folder.
    """
    rel = Path(fname)
    if not fname or rel.is_absolute() or rel.drive or ".." in rel.parts:
        raise ModelLoadError(index, f"shard path {fname!r} leaves the model folder; refused")
    f = folder / rel
    real, root = f.resolve(), folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        allowed.append(root.parent.parent / "blobs")
    if not any(real.is_relative_to(a) for a in allowed):
        raise ModelLoadError(index, f"shard path {fname!r} resolves to {real}, outside the model folder; refused")
    return f


def _safetensors_names(f: Path) -> list[str]:
    try:
        with safe_open(str(f), framework="pt") as st:
            return list(st.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc


class _MetaSkeleton(torch.overrides.TorchFunctionMode):
    """Build and reshape the meta skeleton without Python meta kernels: meta tensors hold no
    values, and those kernels (random init in nn.Embedding/nn.Linear constructors, torch.cat)
    import torch._dynamo on first use, seconds at start-up. Skips the init, computes cat's shape.
    Modes are per thread, so models built elsewhere meanwhile are not affected."""

    SKIP = {torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.kaiming_uniform_,
            torch.nn.init.trunc_normal_, torch.Tensor.normal_, torch.Tensor.uniform_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIP:
            return args[0] if args else kwargs["tensor"]
        if func is torch.cat and args and all(t.is_meta for t in args[0]):
            parts, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim", 0))
            shape = list(parts[0].shape)
            shape[dim] = sum(t.shape[dim] for t in parts)
            return torch.empty(shape, dtype=parts[0].dtype, device="meta")
        return func(*args, **kwargs)


def load_model_folder(path: str | Path, device: str | torch.device = "cpu",
                      dtype: str | torch.dtype | None = None, for_training: bool = False) -> LoadedModel:
    """Load a model folder; raises ModelLoadError naming the file and the problem.

    Weights stay memory-mapped views of the files unless `for_training`: then every parameter gets its
    own contiguous copy. GPT-2's q, k, v and projections are transposed slices of its Conv1D tensors,
    and a strided weight takes another matmul path than a fresh model's, so a resumed run drifted from
    an uninterrupted one (~3e-5 in 20 steps); a copy also never maps the files a trainer rewrites.
    """
    from .devices import resolve_dtype

    folder = Path(path)
    if not folder.exists() and folder.with_name(folder.name + ".old").is_dir():
        folder = folder.with_name(folder.name + ".old")  # an interrupted atomic_write_dir
    if not folder.exists():
        raise ModelLoadError(folder, "no such folder")
    if not folder.is_dir():
        raise ModelLoadError(folder, "not a folder (open the folder that holds config.json)")
    cfg = read_config(folder)
    files = _weight_files(folder)
    _check_layer_count(cfg, files)
    handles: dict[Path, object] = {}
    used: list[str] = []

    def get(name: str) -> torch.Tensor:
        f = files[name]
        used.append(name)
        try:
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            return handles[f].get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f, f"cannot read tensor {name!r}: corrupt or truncated ({exc})") from exc

    with torch.device("meta"), _MetaSkeleton():
        model = Transformer(cfg, init_weights=False)
    _check_shapes(model, files)
    sd = _from_hf(cfg, get, set(files), lambda n: files.get(n, folder / WEIGHTS))
    # the tensors the model takes: an unused extra (e.g. a mask buffer some exporters keep) is not refused
    _check_finite({name: files[name] for name in used})
    target_dtype = resolve_dtype(dtype) if dtype is not None else resolve_dtype(cfg.dtype)
    if dtype is not None:  # only the recorded dtype changes; the modules need nothing else
        cfg = model.cfg = cfg.replace(dtype={v: k for k, v in _dtype_names().items()}[target_dtype])
    expected = {k: v for k, v in model.state_dict().items()}
    for name, t in sd.items():
        want = expected.get(name)
        if want is None:
            continue
        if tuple(t.shape) != tuple(want.shape):
            hf = _hf_name_for(cfg, name)
            raise ModelLoadError(files.get(hf, folder / WEIGHTS),
                                 f"tensor {hf!r} has shape {list(t.shape)} but the config implies {list(want.shape)}")
    if cfg.lm_head and cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing = set(expected) - set(sd) - ({"lm_head.weight"} if cfg.lm_head and cfg.tie_embeddings else set())
    if missing:
        raise ModelLoadError(folder / WEIGHTS, f"missing tensors for: {', '.join(sorted(missing)[:5])}")
    if for_training:
        sd = {k: v.to(device=device, dtype=target_dtype, memory_format=torch.contiguous_format, copy=True)
              for k, v in sd.items()}
    else:
        sd = {k: v.to(device=device, dtype=target_dtype) for k, v in sd.items()}
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.lm_head and cfg.tie_embeddings:
        model.lm_head.weight = model.tok_embed.weight
    if cfg.positions == "sinusoidal":
        model.pos_table = sinusoidal_table(cfg.context_length, cfg.d_model).to(device)
    model.eval()

    tokenizer = None
    tok_path = folder / TOKENIZER
    if tok_path.is_file():
        try:
            tokenizer = Tokenizer.from_file(tok_path)
        except TokenizerError as exc:
            raise ModelLoadError(tok_path, f"broken tokenizer: {exc.args[0].split(': ', 1)[-1]}") from exc
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, path=Path(path), name=Path(path).name)


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:h|layer|layers|blocks)\.(\d+)\.")  # GPT-2, BERT, LLaMA, ours


def _check_layer_count(cfg: ModelConfig, files: dict[str, Path]) -> None:
    """Weights for more layers than the config has would be dropped without a word: refuse them."""
    extra = sorted((int(m.group(1)), name) for name in files
                   if (m := _LAYER_INDEX.search(name)) and int(m.group(1)) >= cfg.n_layers)
    if extra:
        layers = sorted({i for i, _ in extra})
        raise ModelLoadError(files[extra[0][1]], f"holds weights for layer(s) {', '.join(map(str, layers[:8]))}"
                                                 f"{' ...' if len(layers) > 8 else ''} but {CONFIG} has n_layers="
                                                 f"{cfg.n_layers}: {len(extra)} tensors (e.g. {extra[0][1]!r}) "
                                                 f"would be dropped")


# safetensors float dtype -> (same-width unsigned integer, exponent bits): a value is NaN or infinite
# exactly when all its exponent bits are set, in each of these formats.
_EXPONENT = {"F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80), "F32": (np.uint32, 0x7F800000),
             "F64": (np.uint64, 0x7FF0000000000000)}
_FINITE_CHUNK = 4 << 20  # bytes per look: bounds the resident pages and the scratch buffer


def _check_finite(files: dict[str, Path]) -> None:
    """Refuse a tensor holding NaN or infinity (damaged bytes, a diverged save), naming it.

    Reads the files through a read-only map, a chunk at a time, without copying them, and releases
    each chunk's pages once looked at, so the resident set does not grow by the file's size. Mapping
    the pages in is most of the cost (~0.1 s for GPT-2 small's 500 MB; more threads did not help).
    numpy rather than torch: torch's threads spin against each other on a busy machine, 5-10x slower.
    """
    by_file: dict[Path, set[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, set()).add(name)
    scratch = np.empty(_FINITE_CHUNK, dtype=np.uint8)
    for f, names in by_file.items():
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc
        spans = sorted((info["data_offsets"], name, info["dtype"]) for name, info in header.items()
                       if name in names and info.get("dtype") in _EXPONENT)
        try:
            for (begin, end), name, dt in spans:
                uint, mask = _EXPONENT[dt]
                for off in range(8 + n + begin, 8 + n + end, _FINITE_CHUNK):
                    size = min(8 + n + end - off, _FINITE_CHUNK)
                    bits = np.frombuffer(mm, dtype=uint, count=size // np.dtype(uint).itemsize, offset=off)
                    bad = np.bitwise_and(bits, mask, out=scratch.view(uint)[:len(bits)]).max() == mask
                    del bits  # no view may outlive the map
                    if bad:
                        raise ModelLoadError(f, f"tensor {name!r} holds NaN or infinite values: the file is "
                                                f"damaged (or was saved from a diverged run)")
                    if hasattr(mm, "madvise"):
                        page = off - off % mmap.PAGESIZE
                        mm.madvise(mmap.MADV_DONTNEED, page, off + size - page)
        finally:
            mm.close()


def _check_shapes(meta_model: Transformer, files: dict[str, Path]) -> None:
    """Compare every tensor's stored shape (header only, no data read) with what the config implies."""
    cfg = meta_model.cfg
    with _MetaSkeleton():
        expected = to_hf_state_dict(meta_model)
    ours_prefix = _hf_prefix(cfg)
    theirs_prefix = _detect_prefix(cfg, set(files))
    by_file: dict[Path, list[tuple[str, list[int]]]] = {}
    for name, want in expected.items():
        stored = theirs_prefix + name[len(ours_prefix):] if name.startswith(ours_prefix) else name
        if stored in files:  # missing tensors are reported by _from_hf with their name
            by_file.setdefault(files[stored], []).append((stored, list(want.shape)))
    for f, wanted in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes = [(stored, list(st.get_slice(stored).get_shape()), want) for stored, want in wanted]
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc
        for stored, shape, want in shapes:
            if shape != want:
                raise ModelLoadError(f, f"tensor {stored!r} has shape {shape} but the config implies {want}")


def _dtype_names() -> dict[str, torch.dtype]:
    from .devices import DTYPES
    return DTYPES


def _hf_name_for(cfg: ModelConfig, ours: str) -> str:
    if cfg.family == "gpt2":
        return ours
    return _simple_names(cfg).get(ours, ours)


# -- writing ---------------------------------------------------------------------------------


def save_model_folder(model: Transformer, path: str | Path, tokenizer: Tokenizer | None = None,
                      extra_files: dict[str, bytes] | None = None) -> None:
    """Write config.json + model.safetensors (+ tokenizer.json, + extra files) atomically."""
    cfg = model.cfg

    def fill(tmp: Path) -> None:
        cfg_dict = config_to_hf(cfg.replace(dtype={v: k for k, v in _dtype_names().items()}.get(model.dtype, "float32")))
        (tmp / CONFIG).write_text(json.dumps(cfg_dict, indent=2), encoding="utf-8")
        tensors = {k: v.to("cpu") for k, v in to_hf_state_dict(model).items()}
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        if tokenizer is not None:
            (tmp / TOKENIZER).write_text(tokenizer.to_str(), encoding="utf-8")
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)

    atomic_write_dir(Path(path), fill)


def new_model(cfg: ModelConfig, seed: int | None = None) -> Transformer:
    if seed is not None:
        torch.manual_seed(seed)
    return Transformer(cfg).to(dtype=_dtype_names()[cfg.dtype])

"""GGUF files as llama.cpp, Ollama and LM Studio keep them: read with the format's own `gguf` reader
(memory-mapped), mapped to the app's families, dequantized tensor by tensor into the compute dtype.

The metadata becomes the config.json fields the family already reads (family.config_from_hf), and
each tensor's llama.cpp name (blk.0.attn_q.weight) the Hugging Face name of the family's weight table
(gguf's own TensorNameMap), so the model is built by the same code as a model folder
(checkpoints.assemble_model): shape checks before any data is read, one ModelLoadError per problem.
Two of llama.cpp's conversions are undone exactly as transformers' GGUF loader does: the row order of
q and k for LLaMA-style rotary (ARCH.permuted_qk), and Gemma's norms stored as 1 + w (ARCH.norm_shift).
"""
from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import torch

from ..checkpoints import LoadedModel, assemble_model, config_from_hf, expected_shapes, range_problem, resident_fits
from ..config import MAX_SIZES
from ..devices import MemoryEstimateError, check_memory, choose_compute_dtype, dtype_name, resolve_dtype
from ..families import REGISTRY, family_of
from ..generation_rules import GenerationRules
from ..model import rotary_inv_freq
from ..weights import ModelLoadError
from .gguf_tokenizer import tokenizer_from_gguf

# the tensor types read here: the float types and the quantizations gguf.quants dequantizes in numpy
READABLE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                  "Q6_K")
FLOAT_TYPES = ("F32", "F16", "BF16")
MAX_ELEMENTS = 1 << 40  # per tensor: beyond any real model's (a 405B model's largest holds ~2**31)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# (low_freq_factor, high_freq_factor, original_max_position_embeddings) of Llama 3.1, 3.2 and 3.3
LLAMA3_ROPE_CANDIDATES = ((1.0, 4.0, 8192),)


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture (general.architecture) read as one of the app's families."""
    gguf: str  # llama.cpp's architecture name
    family: str  # the app's model_type (core/families)
    permuted_qk: bool = False  # llama.cpp permutes q/k rows for its rotary layout (its LLaMA converter)
    norm_shift: float = 0.0  # llama.cpp stores the family's norm weights as w + shift (Gemma's 1 + w)
    # the family's further config.json fields from the metadata (meta(key, default) reads "{arch}.key")
    fields: Callable[[Callable[..., Any]], dict] | None = None
    name_hint: str = ""  # this entry only when general.name contains it (llama.cpp writes Mistral as llama)
    moe: bool = False  # this entry only for files with (without) {arch}.expert_count (llama.cpp writes Mixtral as llama)


def _gemma3_fields(meta: Callable[..., Any]) -> dict:
    # llama.cpp: 1/sqrt(head_dim) scores (query_pre_attn_scalar = key_length), every 6th layer full
    # (set_swa_pattern(6)), sliding layers on base 10000; what transformers' Gemma 3 GGUF loader assumes too
    return {"query_pre_attn_scalar": meta("attention.key_length", 256), "sliding_window_pattern": 6,
            "sliding_window": meta("attention.sliding_window", 4096), "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": meta("final_logit_softcapping", None)}


def _gemma2_fields(meta: Callable[..., Any]) -> dict:
    # llama.cpp writes both soft-caps and the window; its scores are scaled by 1/sqrt(key_length) (the
    # 2B and 9B models' query_pre_attn_scalar; transformers' Gemma 2 GGUF loader keeps Gemma2Config's 256)
    return {"query_pre_attn_scalar": meta("attention.key_length", 256),
            "sliding_window": meta("attention.sliding_window", 4096),
            "attn_logit_softcapping": meta("attn_logit_softcapping", 50.0),
            "final_logit_softcapping": meta("final_logit_softcapping", 30.0)}


def _moe_fields(norm_topk_prob: bool) -> Callable[[Callable[..., Any]], dict]:
    """Qwen2-MoE and Qwen3-MoE: the experts from the metadata; whether the chosen experts' weights are
    renormalised is llama.cpp's per architecture (Qwen2-MoE: no, Qwen3-MoE: yes), not in the file."""
    def fields(meta: Callable[..., Any]) -> dict:
        return {"num_experts": meta("expert_count"), "num_experts_per_tok": meta("expert_used_count"),
                "moe_intermediate_size": meta("expert_feed_forward_length"),
                "shared_expert_intermediate_size": meta("expert_shared_feed_forward_length", 0),
                "norm_topk_prob": norm_topk_prob}
    return fields


def _mixtral_fields(meta: Callable[..., Any]) -> dict:
    # llama.cpp's convert (MixtralModel is its LlamaModel) writes the experts' count and how many each token
    # uses; their width is feed_forward_length, the router's probabilities renormalised over the chosen
    return {"num_local_experts": meta("expert_count"), "num_experts_per_tok": meta("expert_used_count")}


# The mapping table, one line per architecture; an entry counts only where its family is registered.
# (Phi-3's fused attn_qkv / ffn_up map to its own qkv_proj / gate_up_proj through gguf's TensorNameMap.)
ALL_ARCHS = (
    Arch("llama", "mixtral", permuted_qk=True, fields=_mixtral_fields, moe=True),
    Arch("llama", "mistral", permuted_qk=True, name_hint="mistral"),
    Arch("llama", "llama", permuted_qk=True),
    Arch("qwen2", "qwen2"),
    Arch("qwen3", "qwen3"),
    Arch("gemma2", "gemma2", norm_shift=1.0, fields=_gemma2_fields),
    Arch("gemma3", "gemma3_text", norm_shift=1.0, fields=_gemma3_fields),
    Arch("phi3", "phi3"),
    Arch("qwen2moe", "qwen2_moe", fields=_moe_fields(False), moe=True),
    Arch("qwen3moe", "qwen3_moe", fields=_moe_fields(True), moe=True),
)
# one expert's tensor inside llama.cpp's stacked [experts, ...] one: "blk.0.ffn_up_exps.weight@3"
EXPERT_AT = "@"
ARCHS = tuple(a for a in ALL_ARCHS if a.family in REGISTRY)


def arch_for_family(model_type: str) -> Arch | None:
    """The entry that writes a family as GGUF (gguf_export), or None."""
    return next((a for a in ARCHS if a.family == model_type), None)


class GGUFDamage(ValueError):
    pass


# the fewest bytes one entry of the header can take: a tensor's (name length u64, n_dims u32, one dimension
# u64, type u32, offset u64) and a metadata entry's (key length u64, value type u32, a one-byte value)
MIN_TENSOR_INFO_BYTES, MIN_KV_BYTES = 32, 13


def _check_counts(path: Path, head: bytes, file_size: int) -> None:
    """The header's tensor and metadata counts against the file's size, before the reader loops over them:
    a damaged count is named (the reader ran off the end with "IndexError: index 0 is out of bounds")."""
    order = "little" if int.from_bytes(head[4:8], "little") & 0xFFFF else "big"  # gguf's own byte-order test
    n_tensors, n_kv = int.from_bytes(head[8:16], order), int.from_bytes(head[16:24], order)
    if n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES > file_size - 24:
        raise ModelLoadError(path, f"its header claims {n_tensors:,} tensors and {n_kv:,} metadata entries, more "
                                   f"than its {file_size:,} bytes can hold: truncated or damaged")


_VALUE_TYPES = frozenset(t.value for t in gguf.GGUFValueType)
_ITEMSIZE: dict = {}  # numpy dtype -> its bytes (the reader's every read is checked: kept cheap)


class _CheckedReader(gguf.GGUFReader):
    """gguf.GGUFReader, with every tensor's header checked before the reader maps it: a known type,
    at most 4 dimensions, a size no real model has, its bytes inside the file. The reader would
    otherwise overflow on a huge dimension (numpy's product wraps) or fail with a bare numpy error."""

    def __init__(self, path: Path) -> None:
        self.file_size = path.stat().st_size
        # where the reader is, for a message: the last entry read, the metadata key whose value is being read
        self._reading, self._after, self._tensor_no = "the metadata", "", 0
        self._key, self._value_of, self._depth = b"", "", 0
        try:
            super().__init__(path, "r")
        except GGUFDamage:
            raise
        except (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError) as exc:
            raise GGUFDamage(f"{self._where()} is damaged ({exc})") from None

    def _where(self) -> str:
        """What the reader was reading: "the metadata entry after 'general.name'", "the tensor table's entry 3
        (after 'blk.0.attn_q.weight')"."""
        if self._reading == "the metadata":
            if self._value_of:
                return f"metadata {self._value_of!r}"
            return f"the metadata entry after {self._after!r}" if self._after else "the first metadata entry"
        return f"the tensor table's entry {self._tensor_no}" + (f" (after {self._after!r})" if self._after else "")

    # the reader reads every part through _get: a length or count that runs past the end of the file is named
    # here (it sliced a short array: "IndexError: index 0 is out of bounds", or numpy's view error)
    def _get(self, offset: int, dtype, count: int = 1, override_order=None):
        itemsize = _ITEMSIZE.get(dtype) or _ITEMSIZE.setdefault(dtype, np.dtype(dtype).itemsize)
        end = int(offset) + itemsize * int(count)
        if end > self.file_size:
            raise GGUFDamage(f"{self._where()} runs past the end of the file (bytes {int(offset):,}-{end:,} of "
                             f"{self.file_size:,}): truncated or damaged")
        return super()._get(offset, dtype, count, override_order)

    def _get_str(self, offset: int):
        size = self._get(offset, np.uint64)
        length = int(size[0])
        if int(offset) + 8 + length > self.file_size:
            raise GGUFDamage(f"{self._where()}: a string at byte {offset:,} claims {length:,} bytes, past the end "
                             f"of the file ({self.file_size:,} bytes): truncated or damaged")
        text = super()._get(offset + 8, np.uint8, length)
        if not self._depth:  # a key (or a tensor's name): the value read next is its
            self._key = text
        return size, text

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if self._depth:  # an array's item (its type was the first item's: the reader's own error otherwise)
            return super()._get_field_parts(orig_offs, raw_type)
        if int(raw_type) not in _VALUE_TYPES:
            raise GGUFDamage(f"{self._where()} has an unknown value type {int(raw_type)}: damaged")
        self._value_of = bytes(self._key).decode("utf-8", "replace")
        self._depth = 1
        try:
            return super()._get_field_parts(orig_offs, raw_type)
        finally:
            self._depth = 0

    def _push_field(self, field, skip_sum: bool = False) -> int:
        self._after, self._value_of = (field.name if not field.name.startswith("GGUF.") else ""), ""
        return super()._push_field(field, skip_sum)

    def _build_tensor_info(self, offs: int, count: int):
        self._reading, self._after = "the tensor table", ""
        return super()._build_tensor_info(offs, count)

    def _get_tensor_info_field(self, orig_offs: int):
        self._tensor_no += 1
        field = super()._get_tensor_info_field(orig_offs)
        self._after = field.name
        return field

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        for f in fields:
            _check_tensor_header(f, start_offs, self.file_size)
        super()._build_tensors(start_offs, fields)


def _check_tensor_header(f, data_start: int, file_size: int) -> None:
    _, name_data, n_dims, dims, raw_type, offset = f.parts
    name = bytes(name_data).decode("utf-8", "replace")
    try:
        qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
    except ValueError:
        raise GGUFDamage(f"tensor {name!r} has unknown type {int(raw_type[0])}") from None
    shape = [int(d) for d in dims]
    if not 1 <= int(n_dims[0]) <= MAX_DIMS or any(d < 1 for d in shape):
        raise GGUFDamage(f"tensor {name!r} has invalid dimensions {shape}")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise GGUFDamage(f"tensor {name!r} claims {count:,} values (dimensions {shape}), beyond any model")
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if shape[0] % block:
        raise GGUFDamage(f"tensor {name!r}: a row of {shape[0]} values is not whole {qtype.name} blocks of {block}")
    begin = data_start + int(offset[0])
    end = begin + count // block * type_size
    if end > file_size:
        raise GGUFDamage(f"tensor {name!r} lies at bytes {begin:,}-{end:,}, past the end of the file "
                         f"({file_size:,} bytes): truncated or damaged")


@dataclass
class GGUFSummary:
    """What the Model panel and `info` say about a GGUF file beyond its config."""
    architecture: str
    model_name: str  # general.name ("" when absent)
    file_type: str  # general.file_type, as llama.cpp names it (MOSTLY_Q4_K_M), "" when absent
    types: dict[str, Counter] = field(default_factory=dict)  # tensor kind -> Counter of tensor types
    chat_template: str | None = None

    @property
    def dequantized(self) -> bool:
        """Whether any weight was stored quantized (what is shown is then a dequantized model)."""
        return any(t not in FLOAT_TYPES for kinds in self.types.values() for t in kinds)

    def quantization_lines(self) -> list[str]:
        """'attention: Q4_K x 8, Q6_K x 2' per tensor kind."""
        return [f"{kind}: " + ", ".join(f"{t} x {n}" for t, n in counts.most_common())
                for kind, counts in self.types.items()]


def tensor_kind(name: str) -> str:
    """A llama.cpp tensor name's kind, for the quantization summary."""
    leaf = name.split(".")[-2] if name.count(".") >= 1 else name
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output.") or name == "output":
        return "output"
    if "norm" in leaf:
        return "norms"
    if leaf.startswith("attn"):
        return "attention"
    if leaf.startswith("ffn"):
        return "MLP"
    return "other"


class GGUFFile:
    """An open GGUF file: its metadata, the app's config for it, and its tensors by Hugging Face name."""

    def __init__(self, path: str | Path) -> None:
        self.path = path = Path(path)
        if not path.exists():
            raise ModelLoadError(path, "no such file")
        if not path.is_file():
            raise ModelLoadError(path, "not a file")
        if path.stat().st_size < 24:
            raise ModelLoadError(path, "not a GGUF file: shorter than its header")
        with open(path, "rb") as fh:
            head = fh.read(24)
        if head[:4] != b"GGUF":
            raise ModelLoadError(path, "not a GGUF file (no GGUF magic at its start)")
        _check_counts(path, head, path.stat().st_size)
        try:
            self.reader = _CheckedReader(path)
        except GGUFDamage as exc:
            raise ModelLoadError(path, str(exc)) from None
        except MemoryError:
            raise ModelLoadError(path, "not a readable GGUF file: its header asks for more memory than there is "
                                       "(truncated or damaged)") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch_name = self.meta("general.architecture", None)
        if self.arch_name is None:
            raise ModelLoadError(path, "no general.architecture in its metadata: cannot tell which model this is")
        model_name = str(self.meta("general.name", "") or "")
        moe = bool(self.meta(f"{self.arch_name}.expert_count", 0))
        candidates = [a for a in ARCHS if a.gguf == self.arch_name and a.moe == moe
                      and (not a.name_hint or a.name_hint in model_name.lower())]
        if not candidates:
            known = sorted({a.gguf for a in ARCHS})
            raise ModelLoadError(path, f"GGUF architecture {self.arch_name!r} is not supported (supported: "
                                       f"{', '.join(known)})")
        self.arch = candidates[0]
        for t in self.reader.tensors:
            if t.tensor_type.name not in READABLE_TYPES:
                raise ModelLoadError(path, f"tensor {t.name!r} is of type {t.tensor_type.name}, which this app does "
                                           f"not dequantize (it reads {', '.join(READABLE_TYPES)})")
        ftype = self.meta("general.file_type", None)
        try:
            file_type = gguf.LlamaFileType(ftype).name if ftype is not None else ""
        except ValueError:
            file_type = str(ftype)
        kinds: dict[str, Counter] = {}
        for t in self.reader.tensors:
            kinds.setdefault(tensor_kind(t.name), Counter())[t.tensor_type.name] += 1
        self.summary = GGUFSummary(self.arch_name, model_name, file_type, kinds,
                                   self.meta("tokenizer.chat_template", None))

    def meta(self, key: str, default: Any = ...) -> Any:
        f = self.reader.fields.get(key)
        if f is None:
            if default is ...:
                raise ModelLoadError(self.path, f"missing metadata {key!r}")
            return default
        try:
            return f.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise ModelLoadError(self.path, f"metadata {key!r} is damaged ({exc})") from None

    def arch_meta(self, key: str, default: Any = ...) -> Any:
        return self.meta(f"{self.arch_name}.{key}", default)

    # -- config --------------------------------------------------------------------------------

    def hf_config(self) -> dict:
        """The config.json fields of the family (transformers' names) that the metadata gives."""
        m = self.arch_meta
        family = REGISTRY[self.arch.family]
        hidden, heads = m("embedding_length"), m("attention.head_count")
        n_layers = m("block_count")
        if isinstance(n_layers, int) and n_layers > MAX_SIZES["n_layers"]:
            raise ModelLoadError(self.path, f"{self.arch_name}.block_count {n_layers:,} is beyond the "
                                            f"{MAX_SIZES['n_layers']:,} layers this app supports (damaged metadata)")
        vocab = m("vocab_size", None)
        if vocab is None:
            tokens = self.reader.fields.get("tokenizer.ggml.tokens")
            vocab = len(tokens.data) if tokens is not None else self._embedding_rows()
        d = {"model_type": family.model_type, "architectures": [family.architectures[1]],
             "hidden_size": hidden, "num_hidden_layers": n_layers, "num_attention_heads": heads,
             "num_key_value_heads": m("attention.head_count_kv", heads), "intermediate_size": m("feed_forward_length"),
             "rms_norm_eps": m("attention.layer_norm_rms_epsilon", 1e-6), "rope_theta": m("rope.freq_base", 10000.0),
             "max_position_embeddings": m("context_length", 2048), "vocab_size": vocab,
             # llama.cpp writes the output projection only when it is not the embedding matrix
             "tie_word_embeddings": "output.weight" not in self.tensors,
             "attention_bias": "blk.0.attn_q.bias" in self.tensors, "dtype": "float32",
             # llama.cpp windows attention only where the metadata says so (no family default window)
             "sliding_window": m("attention.sliding_window", None),
             "bos_token_id": self.meta("tokenizer.ggml.bos_token_id", None),
             "eos_token_id": self.meta("tokenizer.ggml.eos_token_id", None),
             "pad_token_id": self.meta("tokenizer.ggml.padding_token_id", None)}
        head_dim = m("attention.key_length", None)
        if head_dim is None and self.arch.permuted_qk:
            head_dim = m("rope.dimension_count", None)  # LLaMA: the rotary width is the head width
        if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
            head_dim = hidden // heads
        d["head_dim"] = head_dim
        scaling = m("rope.scaling.type", None)
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise ModelLoadError(self.path, f"rotary scaling {scaling!r} is not supported here (only linear)")
            d["rope_scaling"] = {"rope_type": "linear", "factor": float(m("rope.scaling.factor"))}
        if "rope_freqs.weight" in self.tensors:
            d["rope_scaling"] = self._llama3_scaling(d["rope_theta"], m("rope.dimension_count", head_dim))
        if self.arch.fields is not None:
            d.update(self.arch.fields(m))
        return d

    def _llama3_scaling(self, theta: float, dims: int) -> dict:
        """The "llama3" rotary scaling (Llama 3.1 and later) that llama.cpp's converter wrote as per-frequency
        divisors (rope_freqs): Meta's published parameters with the file's largest divisor as the factor,
        kept only when they give the file's divisors exactly. (transformers' GGUF loader drops rope_freqs
        and computes unscaled rotary; llama.cpp divides by them, as this does.)"""
        t = self.tensors["rope_freqs.weight"]
        if t.tensor_type.name != "F32" or int(t.n_elements) != dims // 2:
            raise ModelLoadError(self.path, f"rope_freqs.weight must hold {dims // 2} F32 divisors, one per rotary "
                                            f"frequency")
        divisors = torch.from_numpy(np.array(t.data, dtype=np.float32)).reshape(-1)
        plain = rotary_inv_freq(dims, theta)
        for low, high, original in LLAMA3_ROPE_CANDIDATES:
            scaling = {"rope_type": "llama3", "factor": float(divisors.max()), "low_freq_factor": low,
                       "high_freq_factor": high, "original_max_position_embeddings": original}
            if torch.allclose(plain / rotary_inv_freq(dims, theta, scaling), divisors, rtol=1e-4):
                return scaling
        raise ModelLoadError(self.path, "rope_freqs.weight holds per-frequency rotary divisors that are not Llama 3's "
                                        "scaling with its published parameters; not read here")

    def _embedding_rows(self) -> int | None:
        t = self.tensors.get("token_embd.weight")
        return int(t.shape[-1]) if t is not None else None

    def config(self):
        return config_from_hf(self.hf_config(), self.path)

    # -- tensors -------------------------------------------------------------------------------

    def check_block_count(self, cfg) -> None:
        """Tensors of blocks beyond the metadata's block_count would be dropped without a word: refused, as
        a model folder's weights for more layers than its config.json has are (checkpoints._check_layer_count)."""
        import re

        extra = sorted({int(m[1]) for name in self.tensors if (m := re.match(r"blk\.([0-9]+)\.", name))
                        and int(m[1]) >= cfg.n_layers})
        if extra:
            shown = ", ".join(map(str, extra[:8])) + (" ..." if len(extra) > 8 else "")
            raise ModelLoadError(self.path, f"holds tensors of block(s) {shown} but its metadata "
                                            f"{self.arch_name}.block_count is {cfg.n_layers}: they would be dropped")

    def hf_names(self, cfg) -> dict[str, str]:
        """Hugging Face name (as the family's table spells it) -> the llama.cpp tensor holding it."""
        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self.arch.gguf]
        names = gguf.get_tensor_name_map(arch, cfg.n_layers)
        family = family_of(cfg)
        prefix = family.prefix(cfg)
        out = {}
        for entry in family.weights(cfg):
            hf = entry.theirs if entry.outside_prefix else prefix + entry.theirs
            base, _, suffix = hf.rpartition(".")
            mapped = names.get_name(base)
            if mapped is not None and f"{mapped}.{suffix}" in self.tensors:
                out[hf] = f"{mapped}.{suffix}"
            elif (expert := split_expert(base)) is not None:  # llama.cpp stacks the experts of a layer
                merged, e = expert
                mapped = names.get_name(merged)
                if mapped is not None and f"{mapped}.{suffix}" in self.tensors:
                    out[hf] = f"{mapped}.{suffix}{EXPERT_AT}{e}"
        return out

    def shape(self, gguf_name: str) -> list[int]:
        """A tensor's shape as torch writes it (ggml lists the fastest dimension first); one expert's
        of a stacked tensor; Qwen2-MoE's shared-expert gate [d] as its Linear's [1, d]."""
        name, _, expert = gguf_name.partition(EXPERT_AT)
        shape = [int(d) for d in reversed(self.tensors[name].shape)]
        if expert:
            return shape[1:]
        return [1, *shape] if name.split(".")[-2] == "ffn_gate_inp_shexp" and len(shape) == 1 else shape

    def values(self, gguf_name: str, cfg, dtype: torch.dtype) -> torch.Tensor:
        """One tensor dequantized (in float32, this tensor only), with llama.cpp's conversions undone,
        in `dtype`; NaN or infinite values, or values beyond `dtype`'s range, are refused by name."""
        name, _, expert = gguf_name.partition(EXPERT_AT)
        t = self.tensors[name]
        data = t.data[int(expert)] if expert else t.data  # one expert's rows of a stacked tensor
        try:
            arr = dequantize_rows(data, t.tensor_type)
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise ModelLoadError(self.path, f"cannot dequantize tensor {gguf_name!r} ({t.tensor_type.name}): "
                                            f"{exc}") from None
        arr = np.asarray(arr, dtype=np.float32).reshape(self.shape(gguf_name))
        leaf = gguf_name.split(".")[-2]
        if self.arch.permuted_qk and leaf in ("attn_q", "attn_k"):
            arr = unpermute_rows(arr, cfg.n_heads if leaf == "attn_q" else cfg.n_kv_heads)
        if self.arch.norm_shift and gguf_name.endswith("norm.weight"):
            arr = arr - np.float32(self.arch.norm_shift)
        arr = np.ascontiguousarray(arr)
        # the values as cast, checked as a model folder's are: NaN, or beyond the range of `dtype`
        if problem := range_problem(gguf_name, arr.view(np.int32), "F32", dtype):
            raise ModelLoadError(self.path, problem)
        if not arr.flags.writeable:  # a float tensor is still a view of the read-only map: this is its copy
            arr = arr.copy()
        return torch.from_numpy(arr).to(dtype)


DEQUANTIZE_CHUNK = 1 << 22  # values per piece dequantized by one thread (16 MB of float32)


def dequantize_rows(data: np.ndarray, qtype, threads: int | None = None) -> np.ndarray:
    """gguf.quants.dequantize, in pieces of whole rows for a large tensor (each row is whole blocks, so
    pieces are independent): its float32 temporaries (about three times what it dequantizes) then take a
    piece's size, not the tensor's (a 128k x 4096 embedding: 6 GB less), and the pieces run on several
    threads (numpy releases the GIL in its array work; on this 2-core shared machine no faster, 0.9x)."""
    rows = data.shape[0] if data.ndim > 1 else 1
    per_row = data.size // rows * (np.dtype(data.dtype).itemsize)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    values_per_row = per_row // size * block if data.dtype == np.uint8 else data.size // rows
    step = max(1, DEQUANTIZE_CHUNK // max(values_per_row, 1))
    threads = threads or min(8, os.cpu_count() or 1)
    if data.ndim < 2 or rows <= step or threads < 2:
        return gguf.quants.dequantize(data, qtype)
    from concurrent.futures import ThreadPoolExecutor

    out = np.empty((*data.shape[:-1], values_per_row), dtype=np.float32)
    flat_in, flat_out = data.reshape(rows, -1), out.reshape(rows, -1)

    def piece(start: int) -> None:
        flat_out[start:start + step] = gguf.quants.dequantize(flat_in[start:start + step], qtype)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(piece, range(0, rows, step)))
    return out


def split_expert(base: str) -> tuple[str, int] | None:
    """'model.layers.0.mlp.experts.3.up_proj' -> ('model.layers.0.mlp.experts.up_proj', 3): one expert's
    Hugging Face name and the stacked one gguf's TensorNameMap knows; None for any other name."""
    parts = base.split(".")
    for i in range(len(parts) - 2):
        if parts[i] == "experts" and parts[i + 1].isdigit():
            return ".".join(parts[:i + 1] + parts[i + 2:]), int(parts[i + 1])
    return None


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for its rotary (convert_hf_to_gguf LlamaModel.permute): within each
    head, the two rotated halves interleaved."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of permute_rows (transformers' LlamaTensorProcessor._reverse_permute_weights)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _stored_dtype(f: GGUFFile, names: dict[str, str]) -> torch.dtype:
    """The dtype the weights are stored in when they are all one float type; float32 (the dequantized
    values' own precision) for quantized or mixed files."""
    stored = [f.tensors[g.partition(EXPERT_AT)[0]] for g in names.values()]
    types = {t.tensor_type.name for t in stored if len(t.shape) > 1}
    return {frozenset({"F16"}): torch.float16, frozenset({"BF16"}): torch.bfloat16}.get(frozenset(types),
                                                                                       torch.float32)


def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
              for_training: bool = False, streamed: bool | None = None) -> LoadedModel:
    """A GGUF file as a LoadedModel; raises ModelLoadError naming the file and the problem. A model whose
    dequantized weights exceed the free memory (or any, with streamed=True) is dequantized layer by layer
    while each computes (core/streamed.py)."""
    f = GGUFFile(path)
    cfg = f.config()
    f.check_block_count(cfg)
    names = f.hf_names(cfg)
    stored = _stored_dtype(f, names)
    # the compute dtype first, so each tensor is dequantized straight into it
    if dtype == "auto":
        choice = choose_compute_dtype(stored, device, cfg.parameter_estimate())
        target, reason = choice.dtype, choice.reason
    else:
        target, reason = (resolve_dtype(dtype) if dtype is not None else stored), ""
    if f.summary.dequantized and dtype in (None, "auto"):
        reason = f"{dtype_name(target)}: dequantized from the file's {f.summary.file_type or 'quantized types'}"
    if streamed is None:
        try:
            check_memory(cfg.parameter_estimate() * target.itemsize, "the model it describes", "for its weights",
                         device)
            streamed = False
        except MemoryEstimateError as exc:
            streamed = not for_training and resident_fits(cfg, target.itemsize, device)
            if not streamed:
                raise ModelLoadError(f.path, str(exc)) from None
    by_hf = names

    def get(hf_name: str) -> torch.Tensor:
        return f.values(by_hf[hf_name], cfg, target)

    def check_shapes(meta_model) -> None:
        for hf, want in expected_shapes(meta_model, set(by_hf)).items():
            if hf in by_hf and f.shape(by_hf[hf]) != want:
                raise ModelLoadError(f.path, f"tensor {by_hf[hf]!r} has shape {f.shape(by_hf[hf])} but the metadata "
                                             f"implies {want}")

    model, cfg, _, _ = assemble_model(cfg, get, set(by_hf), lambda n: f.path, f.path, check_shapes, lambda _into: None,
                                      device=device, dtype=target, for_training=for_training, stored_dtype=stored,
                                      block_reader=(lambda: (get, lambda: None)) if streamed else None)
    if streamed:
        reason = "; ".join(filter(None, (reason, "larger than the free memory: each layer is dequantized while it "
                                                 "computes")))
    tokenizer, tokenizer_missing = tokenizer_from_gguf(f)
    eos = cfg.eos_token_id
    # an Ollama blob is named by its digest: its own general.name says more
    name = f.path.name if f.path.suffix.lower() == ".gguf" else (f.summary.model_name or f.path.name)
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, path=f.path, name=name,
                       tokenizer_missing=tokenizer_missing, stored_dtype=stored, dtype_reason=reason,
                       generation=GenerationRules(eos_ids=(eos,) if eos is not None else (),
                                                  source="the GGUF metadata"),
                       gguf=f.summary)

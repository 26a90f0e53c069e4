"""Writing a loaded model as a GGUF file (llama.cpp's layout) with gguf.GGUFWriter, so a model trained
or edited here opens in llama.cpp, Ollama and LM Studio.

The inverse of gguf_file: the family's Hugging Face tensors (checkpoints.to_hf_state_dict) under
llama.cpp's names, q/k rows permuted and Gemma's norms shifted as llama.cpp's converter does, the
metadata the reader turns back into the config. The file is read back before it replaces anything:
a config GGUF cannot express (its metadata gives another model) is refused, naming the fields.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch

from ..checkpoints import hf_compatible, to_hf_state_dict
from ..files import atomic_write_file
from ..weights import ModelLoadError
from ..model import rotary_inv_freq
from .gguf_file import ARCHS, LLAMA3_ROPE_CANDIDATES, GGUFFile, arch_for_family, permute_rows, split_expert
from .gguf_tokenizer import tokenizer_metadata

EXPORT_TYPES = ("f16", "bf16", "q8_0", "f32")


class ExportError(ValueError):
    """A model this export cannot write (one line)."""


def _gguf_type(kind: str):
    return {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
            "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]


def _file_type(kind: str):
    return {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]


def save_gguf(model, path: str | Path, tokenizer=None, kind: str = "f16", name: str = "",
              on_note: Callable[[str], None] | None = None) -> None:
    """Write `model` (a Transformer of a family with a GGUF architecture) to `path` as a GGUF file of
    `kind` (f16, bf16, q8_0: the matrices; vectors stay F32 as llama.cpp keeps them), atomically
    (a temporary sibling renamed into place once read back). A tokenizer GGUF cannot hold (WordPiece, a
    character vocabulary) is left out, and `on_note` says so. Raises ExportError."""
    cfg = model.cfg
    arch = arch_for_family(cfg.family)
    if arch is None:
        raise ExportError(f"family {cfg.family!r} has no GGUF architecture here (GGUF export writes: "
                          f"{', '.join(sorted({a.family for a in ARCHS}))})")
    if not hf_compatible(cfg):
        raise ExportError(f"this {cfg.family} model uses switches its Hugging Face class lacks, so llama.cpp "
                          f"would compute another model")
    if kind not in EXPORT_TYPES:
        raise ExportError(f"unknown GGUF type {kind!r} (choose one of {', '.join(EXPORT_TYPES)})")
    path = Path(path)
    w = gguf.GGUFWriter(None, arch.gguf)
    _write_metadata(w, cfg, arch, name or path.stem, kind)
    if tokenizer is not None:
        fields = tokenizer_metadata(tokenizer, cfg.vocab_size)
        if fields is not None:
            _write_fields(w, fields)
        elif on_note is not None:
            on_note("the tokenizer has no GGUF form (GGUF holds byte-level or SentencePiece-style BPE): the file has "
                    "no vocabulary, and llama.cpp needs one to read text")
    _add_tensors(w, model, arch, kind)

    def fill(f) -> None:
        # the writer streams into the temporary file (it would otherwise open the final path itself)
        w.fout, w.state, w.path = [f], gguf.gguf_writer.WriterState.EMPTY, Path(f.name)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.fout = None
        f.flush()
        _check_round_trip(Path(f.name), cfg, path)  # before it replaces anything

    atomic_write_file(path, fill)


def _write_metadata(w, cfg, arch, name: str, kind: str) -> None:
    a = arch.gguf
    w.add_name(name if arch.name_hint in name.lower() else f"{arch.name_hint} {name}".strip())
    w.add_file_type(int(_file_type(kind)))
    w.add_quantization_version(2)
    w.add_uint32(f"{a}.context_length", cfg.context_length)
    w.add_uint32(f"{a}.embedding_length", cfg.d_model)
    w.add_uint32(f"{a}.block_count", cfg.n_layers)
    w.add_uint32(f"{a}.feed_forward_length", cfg.d_ff)
    w.add_uint32(f"{a}.attention.head_count", cfg.n_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", cfg.n_kv_heads)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    w.add_float32(f"{a}.rope.freq_base", cfg.rope_theta)
    w.add_uint32(f"{a}.attention.key_length", cfg.d_head)
    w.add_uint32(f"{a}.attention.value_length", cfg.d_head)
    w.add_uint32(f"{a}.rope.dimension_count", cfg.d_head)
    w.add_uint32(f"{a}.vocab_size", cfg.vocab_size)
    kind_of_scaling = (cfg.rope_scaling or {}).get("rope_type")
    if kind_of_scaling not in (None, "linear", "llama3"):
        raise ExportError(f"rotary scaling {kind_of_scaling!r} is not written to GGUF here (linear and llama3 are)")
    if kind_of_scaling == "llama3":  # llama.cpp's form: per-frequency divisors (rope_freqs, _add_tensors)
        if tuple(cfg.rope_scaling[k] for k in ("low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings")) not in LLAMA3_ROPE_CANDIDATES:
            raise ExportError("llama3 rotary scaling other than Llama 3's published parameters is not written to "
                              "GGUF here (the reader could not tell them from its divisors)")
    elif kind_of_scaling == "linear":
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", float(cfg.rope_scaling["factor"]))
    if cfg.sliding_window is not None and arch.fields is not None:
        w.add_uint32(f"{a}.attention.sliding_window", cfg.sliding_window)
    if cfg.num_experts:  # Qwen2-MoE, Qwen3-MoE, Mixtral (gguf_file._moe_fields, _mixtral_fields read them back)
        w.add_uint32(f"{a}.expert_count", cfg.num_experts)
        w.add_uint32(f"{a}.expert_used_count", cfg.experts_per_token)
        w.add_uint32(f"{a}.expert_feed_forward_length", cfg.d_ff)
        if cfg.shared_expert_d_ff:
            w.add_uint32(f"{a}.expert_shared_feed_forward_length", cfg.shared_expert_d_ff)
    if cfg.attn_logit_softcap is not None:
        w.add_float32(f"{a}.attn_logit_softcapping", cfg.attn_logit_softcap)
    if cfg.final_logit_softcap is not None:
        w.add_float32(f"{a}.final_logit_softcapping", cfg.final_logit_softcap)
    for key, value in (("bos_token_id", cfg.bos_token_id), ("eos_token_id", cfg.eos_token_id),
                       ("padding_token_id", cfg.pad_token_id)):
        if value is not None:
            w.add_uint32(f"tokenizer.ggml.{key}", int(value))


def _write_fields(w, fields: dict) -> None:
    for key, value in fields.items():
        if key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"):
            if key in w.kv_data[0]:
                continue  # the model's own ids, written with the metadata
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)


def _add_tensors(w, model, arch, kind: str) -> None:
    cfg = model.cfg
    if (cfg.rope_scaling or {}).get("rope_type") == "llama3":
        dims = cfg.d_head  # the LLaMA-like families rotate whole heads
        plain = rotary_inv_freq(dims, cfg.rope_theta)
        w.add_tensor("rope_freqs.weight", (plain / rotary_inv_freq(dims, cfg.rope_theta, cfg.rope_scaling)).numpy())
    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch.gguf], cfg.n_layers)
    experts: dict[str, dict[int, np.ndarray]] = {}  # llama.cpp's stacked name -> expert -> its tensor
    tensors: list[tuple[str, np.ndarray]] = []
    for hf, t in to_hf_state_dict(model).items():
        base, _, suffix = hf.rpartition(".")
        mapped = names.get_name(base)
        arr = t.detach().to("cpu", torch.float32).numpy()
        if mapped is None and (expert := split_expert(base)) is not None:
            merged = names.get_name(expert[0])
            if merged is not None:
                experts.setdefault(f"{merged}.{suffix}", {})[expert[1]] = arr
                continue
        if mapped is None:
            raise ExportError(f"tensor {hf!r} has no llama.cpp name for architecture {arch.gguf!r}")
        if mapped.endswith("ffn_gate_inp_shexp") and arr.shape[0] == 1:
            arr = arr[0]  # llama.cpp keeps Qwen2-MoE's shared-expert gate as a vector
        tensors.append((f"{mapped}.{suffix}", arr))
    tensors += [(gname, np.stack([by[e] for e in sorted(by)])) for gname, by in experts.items()]
    for gname, arr in tensors:
        mapped = gname.rpartition(".")[0]
        leaf = mapped.split(".")[-1]
        if arch.permuted_qk and leaf in ("attn_q", "attn_k"):
            arr = permute_rows(arr, cfg.n_heads if leaf == "attn_q" else cfg.n_kv_heads)
        if arch.norm_shift and gname.endswith("norm.weight"):
            arr = arr + np.float32(arch.norm_shift)
        qtype = _gguf_type(kind)
        if arr.ndim < 2:  # norms and biases stay F32, as llama.cpp keeps them
            qtype = gguf.GGMLQuantizationType.F32
        elif qtype == gguf.GGMLQuantizationType.Q8_0 and arr.shape[-1] % 32:
            qtype = gguf.GGMLQuantizationType.F16  # rows not whole Q8_0 blocks: llama.cpp's fallback too
        data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype)
        w.add_tensor(gname, data, raw_dtype=qtype)


# fields a GGUF does not carry (the reader gives its defaults): the dtype is chosen when opened
_NOT_IN_GGUF = ("dtype", "pad_token_id")


def _same(a, b) -> bool:
    """Equal, floats to float32's precision (GGUF stores them in 32 bits)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _check_round_trip(tmp: Path, cfg, final: Path) -> None:
    """The written file must read back as the same model: refuse what the metadata cannot express."""
    try:
        theirs = GGUFFile(tmp).config()
    except ModelLoadError as exc:
        raise ExportError(f"{final}: the written GGUF does not read back ({exc.problem})") from None
    ours, back = cfg.to_dict(), theirs.to_dict()
    # a model without its own bos/eos ids takes the tokenizer's (GGUF keeps one set for both)
    differ = [k for k in ours if k not in _NOT_IN_GGUF and not _same(ours[k], back.get(k))
              and not (k in ("bos_token_id", "eos_token_id") and ours[k] is None)]
    if differ:
        shown = ", ".join(f"{k} {ours[k]!r} (GGUF gives {back.get(k)!r})" for k in differ[:4])
        raise ExportError(f"GGUF cannot express this {cfg.family} model: {shown}")

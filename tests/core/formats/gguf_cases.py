"""Tiny random models of each family the GGUF reader maps, written as GGUF files by the `gguf` library,
and the logits transformers' own GGUF loader gives for them (the reference)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

transformers = __import__("transformers")
import gguf  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.formats import load_model_file  # noqa: E402
from desktop_app.core.formats.gguf_export import save_gguf  # noqa: E402

# widths of 256 so every matrix row is whole K-quant blocks (256 values)
SIZES = dict(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2, max_position_embeddings=64)
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SIZES, num_attention_heads=4, num_key_value_heads=2)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZES, num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZES, num_attention_heads=4, num_key_value_heads=2)),
    # head_dim 128: transformers' Qwen3 GGUF config reads no head width and takes Qwen3Config's 128
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SIZES, num_attention_heads=2, num_key_value_heads=1, head_dim=128)),
    # head_dim 256 = query_pre_attn_scalar: what transformers' Gemma 3 GGUF config assumes (its defaults)
    "gemma3_text": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SIZES, num_attention_heads=1, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=4)),
    # head_dim 256 = query_pre_attn_scalar and the soft-caps Gemma2Config's defaults: what transformers'
    # Gemma 2 GGUF config assumes (it reads the window and head width only)
    "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SIZES, num_attention_heads=1, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4)),
    # q|k|v and gate|up fused (llama.cpp's attn_qkv and ffn_up)
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZES, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # mixtures of experts, stacked per layer in llama.cpp's files (ffn_*_exps); the experts' widths are what
    # transformers' GGUF config assumes (it reads neither: Qwen2MoeConfig's 1408 and 5632, Qwen3MoeConfig's 768)
    "qwen2_moe": lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **SIZES, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=1408, shared_expert_intermediate_size=5632, norm_topk_prob=False)),
    "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **SIZES, num_attention_heads=2, num_key_value_heads=1, head_dim=128, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=768, norm_topk_prob=True)),
}
MOE = ("qwen2_moe", "qwen3_moe")
WRITTEN = ("F32", "F16", "BF16", "Q8_0")  # what save_gguf (the app's export) writes
QUANTIZED_BY_GGUF = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")  # gguf.quants.quantize writes these in numpy
# K-quants gguf cannot write: random blocks with sane scales (byte offset of each float16 scale field)
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def hf_folder(family: str, folder: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    # non-trivial norms, so that a norm stored as 1 + w (Gemma) or misplaced shows in the logits
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def write_gguf(family: str, tmp: Path, qtype: str, seed: int = 0) -> Path:
    """A GGUF of a random `family` model with its matrices in `qtype`."""
    src = tmp / f"{family}-F32.gguf"
    if not src.exists():
        loaded = load_model_folder(hf_folder(family, tmp / f"{family}-hf", seed))
        save_gguf(loaded.model, src, kind="f32", name=f"tiny {family}")
    if qtype == "F32":
        return src
    out = tmp / f"{family}-{qtype}.gguf"
    if qtype in WRITTEN:
        save_gguf(load_model_file(src, dtype="float32").model, out, kind=qtype.lower(), name=f"tiny {family}")
    else:
        requantize(src, out, qtype, seed)
    return out


def requantize(src: Path, dst: Path, qtype: str, seed: int = 0) -> None:
    """`src` again with every matrix in `qtype` (norms and biases stay F32): quantized by gguf where it
    can, else random blocks whose scales are set to small finite values."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub)
    q = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[q]
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        values = np.array(t.data, dtype=np.float32)
        if values.ndim < 2 or values.shape[-1] % block:
            w.add_tensor(t.name, values)
            continue
        if qtype in K_SCALES:
            data = rng.integers(0, 256, (values.shape[0], values.shape[1] // block * size), dtype=np.uint8)
            blocks = data.reshape(-1, size)
            for at in K_SCALES[qtype]:
                blocks[:, at:at + 2] = np.frombuffer(np.float16(2e-3).tobytes(), np.uint8)
        else:
            data = gguf.quants.quantize(values, q)
        w.add_tensor(t.name, data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# config fields transformers' GGUF loader takes from the class defaults that do not fit a tiny model
# (Phi3Config's pad id 32000 is past this vocabulary; the padding row does not change the logits)
THEIR_OVERRIDES = {"phi3": {"pad_token_id": 0}}


def transformers_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    arch = gguf.GGUFReader(path).fields["general.architecture"].contents()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                              **THEIR_OVERRIDES.get(arch, {}))
    with torch.no_grad():
        return model(ids).logits


def our_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    loaded = load_model_file(path, dtype="float32")
    with torch.no_grad():
        return loaded.model(ids).logits


def refused(path, peak_limit: int = 64 << 20) -> str:
    """load_model_file's one-line refusal of `path` (it names the file), made within `peak_limit` bytes of
    Python allocations (tracemalloc): a lying header is refused before anything large is read."""
    import tracemalloc

    import pytest

    from desktop_app.core.checkpoints import ModelLoadError

    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError) as info:
            load_model_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert peak < peak_limit, f"{peak:,} bytes allocated before the refusal"
    return message

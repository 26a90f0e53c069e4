"""GGUF files of every family the reader maps, in every tensor type it reads, against transformers'
own GGUF loader on the same file: 1e-4 for the float types, 1e-3 relative for the quantized ones (both
sides dequantize the same bits). The F32 file also matches the model it was written from."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import torch  # noqa: E402
from gguf_cases import (FAMILIES, K_SCALES, MOE, QUANTIZED_BY_GGUF, WRITTEN, hf_folder, our_logits,  # noqa: E402
                        transformers_logits, write_gguf)

from desktop_app.core.formats import load_model_file  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ALL_TYPES = WRITTEN + QUANTIZED_BY_GGUF + tuple(K_SCALES)
# every type on LLaMA (q/k rows permuted); every family at F32 and Q4_K, Gemma 3 (norms stored as 1 + w)
# at BF16, Q8_0 and Q6_K too; every family in every type with -m slow
# a mixture of experts (~30 s a case: transformers' default expert widths) at F32 by default, Qwen3-MoE only;
# no K-quants for them (the 1408-wide experts are not whole K-quant blocks, and the random K-quant blocks
# here are written for matrices, not stacked experts)
FAST = {("llama", t) for t in ALL_TYPES} | {(f, t) for f in FAMILIES if f not in MOE for t in ("F32", "Q4_K")} | {
    ("gemma3_text", "BF16"), ("gemma3_text", "Q8_0"), ("gemma3_text", "Q6_K"), ("qwen3_moe", "F32")}
CASES = [pytest.param(f, t, marks=() if (f, t) in FAST else pytest.mark.slow) for f in FAMILIES for t in ALL_TYPES
         if not (f in MOE and t in K_SCALES)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


@pytest.mark.parametrize("family,qtype", CASES)
def test_logits_match_transformers_gguf_loader(family, qtype, folder):
    path = write_gguf(family, folder, qtype)
    ids = torch.randint(3, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    ours, theirs = our_logits(path, ids), transformers_logits(path, ids)
    scale = theirs.abs().max().item()
    assert scale > 0.1  # a real spread of logits, not a degenerate model
    err = (ours - theirs).abs().max().item()
    if qtype in ("F32", "F16", "BF16"):
        assert err <= 1e-4, f"{family} {qtype}: max |ours - transformers| = {err:.3g}"
    else:
        assert err <= 1e-3 * scale, f"{family} {qtype}: max |ours - transformers| = {err:.3g} of {scale:.3g}"
    loaded = load_model_file(path, dtype="float32")
    assert loaded.config.family == family
    assert loaded.gguf.dequantized == (qtype not in ("F32", "F16", "BF16"))
    # the summary the Model panel and `info` show: gate, up, down per layer (Phi-3: gate|up fused; a mixture
    # of experts: its stacked experts, router and shared expert)
    matrices = {"phi3": 4, "qwen2_moe": 14, "qwen3_moe": 8}.get(family, 6)
    assert loaded.gguf.types["MLP"][qtype] == matrices


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow if f in MOE else ()) for f in FAMILIES])
def test_f32_file_matches_the_model_it_was_written_from(family, folder):
    path = write_gguf(family, folder, "F32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder / f"{family}-hf", dtype=torch.float32)
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (our_logits(path, ids) - reference).abs().max().item() <= 1e-4



def test_llama3_rotary_scaling_travels_as_rope_freqs(tmp_path):
    """Llama 3.1's "llama3" rotary scaling: llama.cpp keeps it as per-frequency divisors (rope_freqs.weight),
    which transformers' GGUF loader drops; read back here as the scaling, the file gives the logits of the
    model it was written from, and ignoring the divisors would not."""
    from desktop_app.core.formats.gguf_export import save_gguf

    torch.manual_seed(0)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, rope_theta=500000.0, rope_scaling=dict(scaling)))
    with torch.no_grad():  # sharp attention, so that positions (and their rotary frequencies) matter
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "llama3.gguf"
    save_gguf(load_model_file(tmp_path / "hf").model, path, kind="f32")
    loaded = load_model_file(path, dtype="float32")
    assert {k: loaded.config.rope_scaling[k] for k in scaling} == scaling
    ids = torch.randint(3, 128, (1, 60), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = hf(ids).logits
    ours = (our_logits(path, ids) - reference).abs().max().item()
    unscaled = (transformers_logits(path, ids) - reference).abs().max().item()
    assert ours <= 1e-4 and unscaled > 100 * max(ours, 1e-6), (ours, unscaled)  # the divisors matter


def test_tensors_are_dequantized_one_at_a_time(folder):
    """Never the whole model in float32: while a Q8_0 file loads into bfloat16, the float32 buffers alive
    at once (numpy's, which tracemalloc sees) stay within a few of one tensor's, far below the model's
    float32 size."""
    import tracemalloc

    path = write_gguf("llama", folder, "Q8_0")
    loaded = load_model_file(path, dtype="bfloat16")
    whole = sum(p.numel() for p in loaded.model.parameters()) * 4
    largest = max(p.numel() for p in loaded.model.parameters()) * 4
    tracemalloc.start()
    try:
        loaded = load_model_file(path, dtype="bfloat16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loaded.model.dtype == torch.bfloat16
    # (gguf's dequantization holds a few float32 temporaries of the tensor it works on)
    assert peak < 4 * largest and peak < whole / 3, (peak, largest, whole)


# every quantized type read here but Q5_0 and Q5_1, which transformers' torch kernels do not implement
@pytest.mark.parametrize("qtype", [t for t in ALL_TYPES if t not in ("F32", "F16", "BF16", "Q5_0", "Q5_1")])
def test_dequantization_matches_transformers_own_kernels(qtype):
    """The dequantized values (gguf.quants, which the reader uses, as transformers' GGUF loader does for
    these architectures) against transformers' own torch implementation of each block format
    (integrations/gguf/dequant.py), on random blocks: an independent reference, for the K-quants gguf
    cannot write too."""
    import gguf
    import numpy as np
    from transformers.integrations.gguf.dequant import dequantize as transformers_dequantize

    q = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[q]
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (64, size), dtype=np.uint8)
    scales = K_SCALES.get(qtype, (0,) if qtype in ("Q8_0", "Q4_0", "Q5_0") else (0, 2))  # the float16 fields
    for at in scales:
        blocks[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    ours = torch.from_numpy(gguf.quants.dequantize(blocks.reshape(1, -1), q).reshape(-1))
    theirs = transformers_dequantize(torch.from_numpy(blocks.reshape(1, -1)), int(q), torch.float32).reshape(-1)
    assert ours.shape == theirs.shape == (64 * block,)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7) and ours.abs().max() > 0


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K", "Q6_K"])
def test_dequantizing_in_pieces_on_threads_gives_the_same_values(qtype, monkeypatch):
    """A large tensor is dequantized in pieces of rows on several threads: the same values as at once."""
    import gguf
    import numpy as np

    from desktop_app.core.formats import gguf_file

    q = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[q]
    rng = np.random.default_rng(0)
    if qtype == "F16":
        data = rng.standard_normal((37, 512)).astype(np.float16)
    else:
        data = rng.integers(0, 256, (37, 512 // block * size), dtype=np.uint8)
        for at in K_SCALES.get(qtype, (0,)):
            data.reshape(-1, size)[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    monkeypatch.setattr(gguf_file, "DEQUANTIZE_CHUNK", 512 * 5)  # pieces of 5 rows, the last one short
    pieces = gguf_file.dequantize_rows(data, q, threads=3)
    whole = gguf.quants.dequantize(data, q)
    assert pieces.shape == whole.shape == (37, 512) and np.array_equal(pieces, whole)

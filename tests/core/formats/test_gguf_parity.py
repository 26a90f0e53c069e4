"""GGUF files of every family the reader maps, in every tensor type it reads, against transformers'
own GGUF loader on the same file: 1e-4 for the float types, 1e-3 relative for the quantized ones (both
sides dequantize the same bits). The F32 file also matches the model it was written from."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import torch  # noqa: E402
from gguf_cases import (FAMILIES, K_SCALES, QUANTIZED_BY_GGUF, WRITTEN, hf_folder, our_logits,  # noqa: E402
                        transformers_logits, write_gguf)

from desktop_app.core.formats import load_model_file  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ALL_TYPES = WRITTEN + QUANTIZED_BY_GGUF + tuple(K_SCALES)
# every type on LLaMA (q/k rows permuted); every family at F32, Q8_0 and Q4_K, Gemma 3 (norms stored as
# 1 + w) at BF16 and Q6_K too; every family in every type with -m slow
FAST = {("llama", t) for t in ALL_TYPES} | {(f, t) for f in FAMILIES for t in ("F32", "Q8_0", "Q4_K")} | {
    ("gemma3_text", "BF16"), ("gemma3_text", "Q6_K")}
CASES = [pytest.param(f, t, marks=() if (f, t) in FAST else pytest.mark.slow) for f in FAMILIES for t in ALL_TYPES]


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
    assert loaded.gguf.types["MLP"] == {qtype: 6}  # the summary the Model panel and `info` show


@pytest.mark.parametrize("family", list(FAMILIES))
def test_f32_file_matches_the_model_it_was_written_from(family, folder):
    path = write_gguf(family, folder, "F32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder / f"{family}-hf", dtype=torch.float32)
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (our_logits(path, ids) - reference).abs().max().item() <= 1e-4


"""Damaged GGUF files are refused in one line naming the file and the problem, before any large
allocation: truncated, a tensor's offset past the end, an unknown type, a huge dimension, NaN
values, a type or architecture this app does not read, not a GGUF at all."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from gguf_cases import write_gguf  # noqa: E402

from desktop_app.core.checkpoints import ModelLoadError  # noqa: E402
from desktop_app.core.formats import load_model_file  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_gguf("llama", tmp_path_factory.mktemp("good"), "Q8_0")


def damaged(good, tmp_path, patch) -> str:
    data = bytearray(good.read_bytes())
    reader = gguf.GGUFReader(good)
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    starts, at = {}, tensor.field.offset
    for name, part in zip(("name_len", "name", "n_dims", "dims", "type", "offset"), tensor.field.parts):
        starts[name] = at
        at += part.nbytes
    data = patch(data, starts, tensor, reader)
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    return path


def refused(path) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError) as info:
            load_model_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert peak < 64 << 20, f"{peak:,} bytes allocated before the refusal"
    return message


def test_truncated_in_the_tensor_data(good, tmp_path):
    path = damaged(good, tmp_path, lambda d, s, t, r: d[:len(d) * 2 // 3])
    assert "past the end of the file" in refused(path)


def test_truncated_in_the_metadata(good, tmp_path):
    path = damaged(good, tmp_path, lambda d, s, t, r: d[:300])
    assert "truncated or damaged" in refused(path)


def test_tensor_offset_past_the_end(good, tmp_path):
    def patch(d, s, t, r):
        d[s["offset"]:s["offset"] + 8] = (len(d) * 4).to_bytes(8, "little")
        return d
    message = refused(damaged(good, tmp_path, patch))
    assert "'blk.0.attn_q.weight'" in message and "past the end of the file" in message


def test_unknown_tensor_type(good, tmp_path):
    def patch(d, s, t, r):
        d[s["type"]:s["type"] + 4] = (999).to_bytes(4, "little")
        return d
    assert "'blk.0.attn_q.weight' has unknown type 999" in refused(damaged(good, tmp_path, patch))


def test_huge_dimension(good, tmp_path):
    def patch(d, s, t, r):
        d[s["dims"] + 8:s["dims"] + 16] = (1 << 50).to_bytes(8, "little")
        return d
    message = refused(damaged(good, tmp_path, patch))
    assert "'blk.0.attn_q.weight' claims" in message and "beyond any model" in message


def test_nan_values(tmp_path):
    path = write_gguf("llama", tmp_path, "F32")
    reader = gguf.GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    data = bytearray(path.read_bytes())
    data[tensor.data_offset:tensor.data_offset + 4] = np.float32(np.nan).tobytes()
    del reader
    path.write_bytes(bytes(data))
    assert "'blk.1.ffn_up.weight' holds NaN or infinite values" in refused(path)


def test_a_type_not_read_here(good, tmp_path):
    def patch(d, s, t, r):  # IQ2_XXS: a real ggml type this app does not dequantize (the sizes then mismatch too)
        d[s["type"]:s["type"] + 4] = int(gguf.GGMLQuantizationType.IQ2_XXS).to_bytes(4, "little")
        return d
    message = refused(damaged(good, tmp_path, patch))
    assert "IQ2_XXS" in message


def test_an_architecture_not_mapped(tmp_path):
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(path, "bert")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "GGUF architecture 'bert' is not supported (supported: " in refused(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "not a GGUF file" in refused(path)
    assert "no such file" in refused(tmp_path / "missing.gguf")

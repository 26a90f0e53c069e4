"""Damaged GGUF files are refused in one line naming the file and the problem, before any large
allocation: truncated, a tensor's offset past the end, an unknown type, a huge dimension, NaN
values, a type or architecture this app does not read, not a GGUF at all."""
from __future__ import annotations


import numpy as np
import torch
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from gguf_cases import refused, write_gguf  # noqa: E402

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


# -- values beyond the compute dtype's range: refused as a model folder's are (checkpoints.range_problem) --


def with_value(path, tmp_path, tensor_name: str, at: int, raw: bytes):
    """A copy of GGUF `path` with bytes `raw` written at byte `at` of tensor `tensor_name`'s data."""
    reader = gguf.GGUFReader(path)
    start = next(t for t in reader.tensors if t.name == tensor_name).data_offset
    del reader
    data = bytearray(path.read_bytes())
    data[start + at:start + at + len(raw)] = raw
    out = tmp_path / f"patched-{path.name}"
    out.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="module")
def f32_llama(tmp_path_factory):
    return write_gguf("llama", tmp_path_factory.mktemp("f32"), "F32")


@pytest.mark.parametrize("value", [1e5, -1e5])
def test_a_float32_value_beyond_float16s_range_is_refused_naming_the_file_and_tensor(f32_llama, tmp_path, capsys,
                                                                                      value):
    """Cast to float16 it would become infinity without a word: one line instead; float32 loads it as it is."""
    from desktop_app.cli import main

    path = with_value(f32_llama, tmp_path, "blk.1.ffn_up.weight", 0, np.float32(value).tobytes())
    with pytest.raises(ModelLoadError) as info:
        load_model_file(path, dtype="float16")
    message = str(info.value)
    assert info.value.path == path and "\n" not in message and message.startswith(str(path)), message
    assert "tensor 'blk.1.ffn_up.weight' holds values beyond float16's range" in message
    assert "they would become infinite" in message
    assert load_model_file(path, dtype="float32").model.blocks[1].mlp.up.weight[0, 0] == value
    assert main(["info", str(path), "--dtype", "float16"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'blk.1.ffn_up.weight'" in err and "Traceback" not in err, err


# The smallest float32 each cast makes infinite: half a unit above the dtype's largest value (whose last
# mantissa bit is odd, so round-to-nearest-even takes the tie up).
FIRST_OVERFLOWING = {"bfloat16": 2.0**128 - 2.0**119,  # bfloat16's largest 2**128 - 2**120
                     "float16": 2.0**16 - 2.0**4}       # float16's largest 65504 = 2**16 - 2**5


@pytest.mark.parametrize("dtype", list(FIRST_OVERFLOWING))
def test_the_range_edge_is_where_torchs_cast_overflows(f32_llama, tmp_path, dtype):
    """The float32 just below the first one the cast makes infinite loads as the cast gives it; that one is
    refused (both signs)."""
    into = getattr(torch, dtype)
    over = torch.tensor(FIRST_OVERFLOWING[dtype], dtype=torch.float32)
    edge = torch.nextafter(over, torch.tensor(0.0))
    assert torch.isfinite(edge.to(into)) and torch.isinf(over.to(into))
    for value, refused_here in [(edge, False), (-edge, False), (over, True), (-over, True)]:
        path = with_value(f32_llama, tmp_path, "blk.0.ffn_down.weight", 4 * 7, value.numpy().tobytes())
        if refused_here:
            with pytest.raises(ModelLoadError, match=f"'blk.0.ffn_down.weight' holds values beyond {dtype}'s range"):
                load_model_file(path, dtype=dtype)
        else:
            w = load_model_file(path, dtype=dtype).model.blocks[0].mlp.down.weight
            assert w[0, 7] == value.to(into)


def test_a_quantized_block_whose_values_exceed_float16_is_refused(tmp_path):
    """Q8_0 values are a float16 scale times -127..127: a large scale is finite in the file and beyond
    float16 once dequantized. Checked on the dequantized values, before the cast."""
    path = write_gguf("llama", tmp_path, "Q8_0")
    big = with_value(path, tmp_path, "blk.0.attn_output.weight", 0, np.float16(60000).tobytes())
    with pytest.raises(ModelLoadError, match="'blk.0.attn_output.weight' holds values beyond float16's range"):
        load_model_file(big, dtype="float16")
    assert torch.isfinite(load_model_file(big, dtype="float32").model.blocks[0].attn.o.weight).all()

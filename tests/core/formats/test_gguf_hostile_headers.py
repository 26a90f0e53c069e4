"""GGUF headers that lie (edges7): counts of tensors or metadata entries that the file could not hold are named
before the reader loops over them (it ran off the end: "IndexError: index 0 is out of bounds"), and tensors of
blocks beyond the metadata's block_count are refused as a model folder's extra layers are (they were dropped
without a word: a 2-block file whose block_count said 1 opened as a 1-block model)."""
from __future__ import annotations


import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from gguf_cases import refused, write_gguf  # noqa: E402

from desktop_app.core.formats import load_model_file  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_gguf("llama", tmp_path_factory.mktemp("good"), "F32")


def _patched(good, tmp_path, at: int, raw: bytes):
    data = bytearray(good.read_bytes())
    data[at:at + len(raw)] = raw
    path = tmp_path / "lying.gguf"
    path.write_bytes(bytes(data))
    return path


def _value_offset(good, key: str) -> int:
    """Where metadata `key`'s value starts (after its key length, key and type)."""
    field = gguf.GGUFReader(good).fields[key]
    return field.offset + sum(p.nbytes for p in field.parts[:3])




@pytest.mark.parametrize("at,what", [(8, "tensors"), (16, "metadata entries")])
@pytest.mark.parametrize("count", [1 << 62, 10**6])
def test_a_count_the_file_cannot_hold_is_named(good, tmp_path, at, what, count):
    message = refused(_patched(good, tmp_path, at, count.to_bytes(8, "little")), peak_limit=16 << 20)
    assert f"{count:,} {what}" in message and "more than its" in message and "truncated or damaged" in message


def test_the_true_counts_pass_the_check(good):
    assert load_model_file(good).config.n_layers == 2


def test_tensors_of_blocks_beyond_block_count_are_refused(good, tmp_path):
    path = _patched(good, tmp_path, _value_offset(good, "llama.block_count"), (1).to_bytes(4, "little"))
    assert refused(path, peak_limit=16 << 20).endswith("holds tensors of block(s) 1 but its metadata llama.block_count is 1: they would "
                                   "be dropped")


def _tensor_name_offset(good, name: str) -> int:
    return next(t.field.offset for t in gguf.GGUFReader(good).tensors if t.name == name)


@pytest.mark.parametrize("where,expected", [
    ("key", "the metadata entry after 'general.architecture': a string at byte {at:,} claims {n:,} bytes"),
    ("value", "metadata 'general.name': a string at byte {at:,} claims {n:,} bytes"),
    ("tensor", "the tensor table's entry 2 (after 'token_embd.weight'): a string at byte {at:,} claims {n:,} bytes"),
])
@pytest.mark.parametrize("length", [10**9, 2**63, 2**64 - 1])
def test_a_string_length_past_the_end_names_what_it_is_in(good, tmp_path, where, expected, length):
    """A damaged string length (a metadata key, its value, a tensor's name) was "not a readable GGUF file:
    truncated or damaged (IndexError: index 0 is out of bounds for axis 0 with size 0)": numpy's words, and no
    word of where. Now one plain line: which entry, which bytes, the file's size."""
    field = gguf.GGUFReader(good).fields
    at = {"key": field["general.name"].offset, "value": _value_offset(good, "general.name"),
          "tensor": _tensor_name_offset(good, gguf.GGUFReader(good).tensors[1].name)}[where]
    assert gguf.GGUFReader(good).tensors[0].name == "token_embd.weight"
    message = refused(_patched(good, tmp_path, at, length.to_bytes(8, "little")), peak_limit=16 << 20)
    size = good.stat().st_size
    assert message.endswith(expected.format(at=at, n=length) + f", past the end of the file ({size:,} bytes): "
                            "truncated or damaged"), message
    assert "Error" not in message


def test_a_string_length_too_short_is_damage_in_plain_words(good, tmp_path):
    """A tensor name's length of 3 (the name is longer): the reader reads the name's bytes as its dimensions."""
    at = _tensor_name_offset(good, "token_embd.weight")
    message = refused(_patched(good, tmp_path, at, (3).to_bytes(8, "little")), peak_limit=16 << 20)
    assert "the tensor table's entry 1" in message and "truncated or damaged" in message, message
    assert "Error" not in message and "dtype" not in message

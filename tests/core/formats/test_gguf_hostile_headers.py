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

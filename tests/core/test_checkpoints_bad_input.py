"""Every kind of bad model folder raises ModelLoadError naming the file and the problem."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from desktop_app.core.checkpoints import (CONFIG, TOKENIZER, WEIGHTS, ModelLoadError, load_model_folder,
                                          save_model_folder)
from desktop_app.core.config import ModelConfig
from desktop_app.core.model import Transformer
from desktop_app.core.tokenizer import char_tokenizer


@pytest.fixture
def good(tmp_path) -> Path:
    torch.manual_seed(0)
    folder = tmp_path / "good"
    save_model_folder(Transformer(ModelConfig.gpt2(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                                                   context_length=16)),
                      folder, tokenizer=char_tokenizer("abcdefghij "))
    return folder


def _raises(folder: Path, file_name: str | None, *words: str) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        load_model_folder(folder)
    err = info.value
    expected_path = folder / file_name if file_name else folder
    assert err.path == expected_path, str(err)
    assert str(expected_path) in str(err)
    for w in words:
        assert w in str(err).lower(), str(err)
    return err


def test_good_folder_loads_with_tokenizer(good):
    loaded = load_model_folder(good)
    assert loaded.tokenizer is not None and loaded.config.n_layers == 2


def test_truncated_safetensors(good):
    f = good / WEIGHTS
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    _raises(good, WEIGHTS, "truncated")


def test_corrupt_safetensors_header(good):
    f = good / WEIGHTS
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + f.read_bytes()[100:])
    _raises(good, WEIGHTS, "corrupt")


def test_missing_config(good):
    (good / CONFIG).unlink()
    _raises(good, None, "no config.json")


def test_malformed_config(good):
    (good / CONFIG).write_text('{"model_type": "gpt2", ', encoding="utf-8")
    _raises(good, CONFIG, "malformed json", "line")


def test_unknown_model_type(good):
    d = json.loads((good / CONFIG).read_text())
    d.pop("transformer_explorer")
    d["model_type"] = "mamba"
    (good / CONFIG).write_text(json.dumps(d))
    _raises(good, CONFIG, "unknown model_type 'mamba'")


def test_tensor_with_wrong_shape(good):
    d = json.loads((good / CONFIG).read_text())
    d["transformer_explorer"]["d_ff"] = d["n_inner"] = 48  # the file's MLP weights are 32 wide
    (good / CONFIG).write_text(json.dumps(d))
    err = _raises(good, WEIGHTS, "shape", "mlp.c_fc")
    assert "[16, 32]" in str(err) or "[32, 16]" in str(err)


def test_missing_tensor(good):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(good / WEIGHTS))
    del tensors["transformer.h.1.ln_2.weight"]
    save_file(tensors, str(good / WEIGHTS))
    _raises(good, WEIGHTS, "missing tensor", "transformer.h.1.ln_2.weight")


def test_broken_tokenizer(good):
    (good / TOKENIZER).write_text('{"version": "1.0", "model": {"type": "Nope"}}', encoding="utf-8")
    _raises(good, TOKENIZER, "tokenizer")


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    _raises(tmp_path, None, "not a model folder")


def test_path_that_is_a_file(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("hi")
    _raises(f, None, "not a folder")


def test_pickle_only_folder_is_refused(good):
    (good / WEIGHTS).unlink()
    (good / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    _raises(good, None, "pickle")


def test_no_tokenizer_still_loads(good):
    (good / TOKENIZER).unlink()
    assert load_model_folder(good).tokenizer is None


def test_interrupted_folder_swap_falls_back_to_old(good):
    old = good.with_name(good.name + ".old")
    good.rename(old)  # as if killed between the two renames of atomic_write_dir
    assert load_model_folder(good).config.n_layers == 2


def _shard(folder: Path) -> None:
    """Split model.safetensors into two shards with an index, as large Hugging Face checkpoints are."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / WEIGHTS))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[half:]}, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {n: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors")
                  for i, n in enumerate(names)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / WEIGHTS).unlink()


def test_sharded_checkpoint_loads(good):
    ref = load_model_folder(good).model  # from the single file, before sharding
    _shard(good)
    sharded = load_model_folder(good).model
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, sharded(ids).logits)


def test_malformed_shard_index(good):
    _shard(good)
    index = good / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(good)
    assert err.value.path == index and "malformed index" in str(err.value)


def test_missing_shard(good):
    _shard(good)
    (good / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(good)
    assert err.value.path == good / "model-00002-of-00002.safetensors" and "missing" in str(err.value)


def test_bfloat16_load(good):
    loaded = load_model_folder(good, dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    with torch.no_grad():
        out = loaded.model(torch.tensor([[1, 2, 3]])).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_a_shard_index_of_gigabytes_is_refused_unread(good):
    """model.safetensors.index.json was read whole (json.loads of read_text): it goes through files.read_json,
    strict and capped, as config.json does."""
    import tracemalloc

    _shard(good)
    index = good / "model.safetensors.index.json"
    with open(index, "r+b") as fh:
        fh.truncate(2 << 30)  # sparse
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError) as err:
            load_model_folder(good)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (f"{index}: malformed index: is 2,147,483,648 bytes, not a settings file (at most "
                              "16,777,216 are read)") and peak < 64 << 20, (str(err.value), peak)

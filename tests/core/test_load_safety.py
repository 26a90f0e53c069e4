"""Loading refuses what would silently give wrong results or read outside the model folder.

Damaged weights (NaN or infinity), configs whose two descriptions disagree or that drop layers, values
of the wrong type or out of range, and sharded indexes pointing out of the folder: each is one
ModelLoadError naming the file and the problem, and one line from the CLI.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from desktop_app.cli import main
from desktop_app.core.checkpoints import CONFIG, INDEX, WEIGHTS, ModelLoadError, load_model_folder, save_model_folder
from desktop_app.core.config import ConfigError, ModelConfig
from desktop_app.core.model import Transformer
from desktop_app.core.tokenizer import char_tokenizer

REPO = Path(__file__).resolve().parents[2]


def _gpt2_folder(folder: Path) -> Path:
    torch.manual_seed(0)
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=32, n_heads=2, n_layers=2, d_ff=64, context_length=32)
    save_model_folder(Transformer(cfg), folder, tokenizer=char_tokenizer("abcdefghij "))
    return folder


@pytest.fixture
def good(tmp_path) -> Path:
    return _gpt2_folder(tmp_path / "good")


@pytest.fixture
def llama(tmp_path) -> Path:
    torch.manual_seed(0)
    cfg = ModelConfig.llama(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=64,
                            context_length=32)
    save_model_folder(Transformer(cfg), tmp_path / "llama")
    return tmp_path / "llama"


def _refused(folder: Path, file_name: str, *words: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model_folder(folder)
    msg = str(info.value)
    assert info.value.path == folder / file_name, msg
    assert str(folder / file_name) in msg
    for w in words:
        assert w in msg, msg
    return msg


def _edit_config(folder: Path, edit) -> None:
    d = json.loads((folder / CONFIG).read_text())
    edit(d)
    (folder / CONFIG).write_text(json.dumps(d))  # json.dumps writes NaN as NaN, which json.loads reads back


def _hf_only(d: dict) -> None:
    d.pop("transformer_explorer")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


# -- damaged weights -----------------------------------------------------------------------------


def _damage_middle(folder: Path) -> str:
    """4 KiB of random bytes over the middle of the tensor data (the header intact); the name of the
    tensor holding the first damaged value."""
    f = folder / WEIGHTS
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data_len = max(info["data_offsets"][1] for k, info in header.items() if k != "__metadata__")
    pos = (data_len // 2) // 4 * 4  # an element boundary: every tensor here is float32
    junk = bytearray(random.Random(0).randbytes(4096))
    junk[:4] = b"\xff\xff\xff\xff"  # a NaN in float32, so the first damaged element is surely not finite
    with open(f, "r+b") as fh:
        fh.seek(8 + n + pos)
        fh.write(junk)
    return next(k for k, info in header.items()
                if k != "__metadata__" and info["data_offsets"][0] <= pos < info["data_offsets"][1])


def test_random_bytes_in_the_weights_are_refused_naming_the_tensor(good):
    name = _damage_middle(good)
    msg = _refused(good, WEIGHTS, repr(name), "NaN or infinite")
    assert msg.count("\n") == 0


def test_generate_on_damaged_weights_is_one_line_and_fails(good):
    name = _damage_middle(good)
    r = subprocess.run([sys.executable, "-m", "desktop_app", "generate", str(good), "--prompt-ids", "1,2,3",
                        "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0
    assert r.stdout == ""  # no JSON with "probs": [NaN]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(good / WEIGHTS) in lines[0] and repr(name) in lines[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_an_infinite_value_is_refused_in_every_float_dtype(good, dtype):
    tensors = {k: v.to(dtype) for k, v in load_file(str(good / WEIGHTS)).items()}
    tensors["transformer.h.1.mlp.c_proj.weight"][3, 5] = float("-inf")
    save_file(tensors, str(good / WEIGHTS))
    _refused(good, WEIGHTS, "'transformer.h.1.mlp.c_proj.weight'", "NaN or infinite")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -float("nan")])
def test_nan_and_infinity_of_either_sign_are_refused_in_every_float_dtype(good, dtype, value):
    tensors = {k: v.to(dtype) for k, v in load_file(str(good / WEIGHTS)).items()}
    tensors["transformer.h.1.mlp.c_proj.weight"][-1, -1] = value  # the last element: the check reads to the end
    save_file(tensors, str(good / WEIGHTS))
    _refused(good, WEIGHTS, "'transformer.h.1.mlp.c_proj.weight'", "NaN or infinite")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_largest_finite_values_of_either_sign_load_in_every_float_dtype(good, dtype):
    """The check compares the stored bits with the exponent's (as signed and unsigned integers): the
    values just below infinity, positive and negative, are the edge it must not cross. float64 is computed
    in float32: its edge is float32's largest (beyond, tests/core/test_checkpoints_dtype.py)."""
    largest = torch.finfo(dtype if dtype != torch.float64 else torch.float32).max
    tensors = {k: v.to(dtype) for k, v in load_file(str(good / WEIGHTS)).items()}
    w = tensors["transformer.h.1.mlp.c_proj.weight"]
    w[0, :] = largest
    w[1, :] = -largest
    save_file(tensors, str(good / WEIGHTS))
    loaded = load_model_folder(good).model.blocks[1].mlp.down.weight.detach()  # not refused
    assert loaded.max() == largest and loaded.min() == -largest


def test_huge_finite_weights_whose_sum_overflows_still_load(good):
    """Finite values whose sum overflows float32 are no reason to refuse the file."""
    tensors = load_file(str(good / WEIGHTS))
    w = tensors["transformer.h.1.mlp.c_proj.weight"]
    w[:] = 3e38  # finite, the largest float32 is 3.4e38
    save_file(tensors, str(good / WEIGHTS))
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.add.reduce(w.numpy().ravel()))
    assert float(load_model_folder(good).model.blocks[1].mlp.down.weight.detach().max()) == pytest.approx(3e38)


def test_a_sharded_checkpoint_names_the_damaged_shard(good):
    tensors = load_file(str(good / WEIGHTS))
    names = sorted(tensors)
    tensors["transformer.wte.weight"][0, 0] = float("nan")
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(good / fname))
    (good / INDEX).write_text(json.dumps({"weight_map": {n: f for f, part in shards.items() for n in part}}))
    (good / WEIGHTS).unlink()
    shard = next(f for f, part in shards.items() if "transformer.wte.weight" in part)
    _refused(good, shard, "'transformer.wte.weight'")


# -- configs -------------------------------------------------------------------------------------


def test_a_config_with_fewer_layers_than_the_weights_names_the_extra_weights(good):
    _edit_config(good, lambda d: (_hf_only(d), d.update(n_layer=1)))
    _refused(good, WEIGHTS, "layer(s) 1", "n_layers=1", "'transformer.h.1.")


def test_our_config_block_with_fewer_layers_than_the_weights_is_refused(good):
    def edit(d):
        d["n_layer"] = d["transformer_explorer"]["n_layers"] = 1
    _edit_config(good, edit)
    _refused(good, WEIGHTS, "layer(s) 1", "'transformer.h.1.")


def test_our_block_disagreeing_with_the_hugging_face_fields_is_refused(good):
    _edit_config(good, lambda d: d.update(n_layer=3))  # what another tool would read; our block says 2
    _refused(good, CONFIG, "'n_layer' is 3", "implies 2")


def test_our_block_disagreeing_with_the_model_type_is_refused(good):
    _edit_config(good, lambda d: d.update(model_type="llama"))
    _refused(good, CONFIG, "'model_type' is 'llama'", "implies 'gpt2'")


@pytest.mark.parametrize("where", ["block", "hf"])
def test_a_norm_eps_that_is_not_a_number_is_refused(good, capsys, where):
    def edit(d):
        if where == "block":
            d["transformer_explorer"]["norm_eps"] = d["layer_norm_epsilon"] = "abc"
        else:
            _hf_only(d)
            d["layer_norm_epsilon"] = "abc"
    _edit_config(good, edit)
    _refused(good, CONFIG, "norm_eps", "'abc'")
    code, err = _cli(capsys, "info", str(good))
    assert code != 0 and err.count("\n") == 1 and "norm_eps" in err and str(good / CONFIG) in err


def test_a_nan_norm_eps_is_refused(good):
    _edit_config(good, lambda d: (_hf_only(d), d.update(layer_norm_epsilon=float("nan"))))
    assert "NaN" in (good / CONFIG).read_text()
    _refused(good, CONFIG, "norm_eps must be a positive finite number", "nan")


@pytest.mark.parametrize("theta", [-10000.0, 0, "1e4"])
def test_a_rope_theta_that_is_not_positive_is_refused(llama, theta):
    _edit_config(llama, lambda d: (_hf_only(d), d.update(rope_theta=theta)))
    _refused(llama, CONFIG, "rope_theta must be a positive finite number", repr(theta))


@pytest.fixture
def sinusoidal(tmp_path) -> Path:
    """Sinusoidal positions: a table of context_length x d_model computed (allocated) at load, not stored."""
    torch.manual_seed(0)
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=128, n_heads=2, n_layers=1, d_ff=64, context_length=32,
                           positions="sinusoidal")
    save_model_folder(Transformer(cfg), tmp_path / "sin")
    return tmp_path / "sin"


def _context(n: int):
    def edit(d):
        d["transformer_explorer"]["context_length"] = d["n_positions"] = n
    return edit


def test_a_context_of_a_billion_is_refused_before_allocating(sinusoidal):
    _edit_config(sinusoidal, _context(10 ** 9))  # 512 GB of table
    _refused(sinusoidal, CONFIG, "context_length 1,000,000,000 is beyond")


def test_a_position_table_too_big_to_allocate_is_refused(sinusoidal):
    _edit_config(sinusoidal, _context(1_000_000))  # 512 MB of table for a 100 kB model
    _refused(sinusoidal, CONFIG, "position table", "1,000,000 x 128")
    _edit_config(sinusoidal, _context(1024))
    assert load_model_folder(sinusoidal).model.pos_table.shape == (1024, 128)


def test_a_deeply_nested_config_is_refused(good):
    depth = 200_000
    (good / CONFIG).write_text('{"model_type": ' + "[" * depth + "]" * depth + "}")
    _refused(good, CONFIG, "nested too deeply")


@pytest.mark.parametrize("field, value, words", [
    ("n_kv_heads", 2.0, "n_kv_heads must be a positive integer"),
    ("n_heads", True, "n_heads must be a positive integer"),
    ("causal", "yes", "causal must be true or false"),
    ("dropout", float("inf"), "dropout must be a finite number"),
    ("eos_token_id", "2", "eos_token_id must be an integer or null"),
])
def test_numbers_and_flags_of_the_wrong_type_are_refused(field, value, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.gpt2(**{field: value})


# -- shard paths ---------------------------------------------------------------------------------


def _shard_to(folder: Path, outside_name: str) -> None:
    """Two shards: the first inside the folder, the second named in the index as `outside_name`."""
    tensors = load_file(str(folder / WEIGHTS))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, str(folder / "model-1.safetensors"))
    second = {n: tensors[n] for n in names[half:]}
    target = Path(outside_name) if os.path.isabs(outside_name) else folder / outside_name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        save_file(second, str(target))
    weight_map = {n: ("model-1.safetensors" if i < half else outside_name) for i, n in enumerate(names)}
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    (folder / WEIGHTS).unlink()


def test_an_absolute_shard_path_is_refused(good, tmp_path):
    outside = str(tmp_path / "elsewhere" / "model-2.safetensors")
    _shard_to(good, outside)
    assert Path(outside).is_file()
    _refused(good, INDEX, repr(outside), "leaves the model folder")


def test_a_dotdot_shard_path_is_refused(good, tmp_path):
    _shard_to(good, "../model-2.safetensors")
    assert (tmp_path / "model-2.safetensors").is_file()
    _refused(good, INDEX, "'../model-2.safetensors'", "leaves the model folder")


def test_a_shard_linked_outside_the_folder_is_refused(good, tmp_path):
    outside = tmp_path / "model-2.safetensors"
    _shard_to(good, str(outside))  # writes the file outside ...
    (good / "model-2.safetensors").symlink_to(outside)  # ... and names it through a link inside
    index = json.loads((good / INDEX).read_text())
    index["weight_map"] = {n: Path(f).name for n, f in index["weight_map"].items()}
    (good / INDEX).write_text(json.dumps(index))
    _refused(good, INDEX, "'model-2.safetensors'", "outside the model folder", str(outside))


def test_shards_inside_the_folder_still_load(good):
    ref = load_model_folder(good).model
    _shard_to(good, "weights/model-2.safetensors")
    loaded = load_model_folder(good).model
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, loaded(ids).logits)


def test_a_hugging_face_cache_snapshot_with_links_into_blobs_loads(tmp_path):
    """models--NAME/snapshots/REV/ holds links to ../../blobs/HASH: the cache's own layout, accepted."""
    src = _gpt2_folder(tmp_path / "src")
    repo = tmp_path / "hub" / "models--someone--tiny"
    snap = repo / "snapshots" / ("0123abc" * 6)[:40]
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    tensors = load_file(str(src / WEIGHTS))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    for i, (fname, part) in enumerate(shards.items()):
        save_file({n: tensors[n] for n in part}, str(repo / "blobs" / f"hash{i}"))
        (snap / fname).symlink_to(Path("../../blobs") / f"hash{i}")
    (snap / INDEX).write_text(json.dumps({"weight_map": {n: f for f, part in shards.items() for n in part}}))
    (snap / CONFIG).write_text((src / CONFIG).read_text())
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(load_model_folder(snap).model(ids).logits, load_model_folder(src).model(ids).logits)


# -- files linked out of a plain folder: the shard index's rule, for the files named directly ------


@pytest.mark.parametrize("name", [WEIGHTS, CONFIG, "tokenizer.json"])
def test_a_file_linked_outside_the_folder_is_refused_like_a_shard(good, tmp_path, name):
    """model.safetensors (config.json, tokenizer.json) linking outside the folder was followed, though
    the same link named by a shard index is refused."""
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (good / name).rename(outside)
    (good / name).symlink_to(outside)
    msg = _refused(good, name, f"a link to {outside}, outside the model folder; refused")
    assert "\n" not in msg


def test_the_only_safetensors_file_linked_outside_is_refused(good, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (good / WEIGHTS).rename(outside)
    (good / "weights.safetensors").symlink_to(outside)
    _refused(good, "weights.safetensors", "outside the model folder")


def test_links_inside_the_folder_still_load(good):
    ref = load_model_folder(good).model
    (good / "store").mkdir()
    for name in (WEIGHTS, CONFIG):
        (good / name).rename(good / "store" / name)
        (good / name).symlink_to(Path("store") / name)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, load_model_folder(good).model(ids).logits)

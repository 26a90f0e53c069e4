"""Half-precision checkpoints open in their stored dtype (memory-mapped, no float32 copy) unless a
dtype is asked for; sharded ones too. The memory this saves is measured by `bench memory`."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from desktop_app.cli import main
from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, to_hf_state_dict

transformers = pytest.importorskip("transformers")


def llama(dtype: torch.dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def stored_tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def set_config_dtype(folder, value):
    d = json.loads((folder / "config.json").read_text())
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    if value is not None:
        d["dtype"] = value
    (folder / "config.json").write_text(json.dumps(d))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("label", [None, "float32"])  # config.json without a dtype, or one that disagrees
def test_half_precision_opens_in_its_stored_dtype(tmp_path, dtype, label):
    llama(dtype).save_pretrained(tmp_path, max_shard_size="20KB")  # sharded: several files and an index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    set_config_dtype(tmp_path, label)
    loaded = load_model_folder(tmp_path)
    assert loaded.model.dtype == dtype and loaded.config.dtype == str(dtype).replace("torch.", "")
    stored = stored_tensors(tmp_path)
    assert torch.equal(loaded.model.tok_embed.weight, stored["model.embed_tokens.weight"])
    assert torch.equal(loaded.model.blocks[1].mlp.up.weight, stored["model.layers.1.mlp.up_proj.weight"])
    assert all(p.dtype == dtype for p in loaded.model.parameters())


def test_a_dtype_asked_for_is_given(tmp_path):
    llama(torch.bfloat16).save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path, dtype="float32")
    assert loaded.model.dtype == torch.float32 and loaded.config.dtype == "float32"
    stored = stored_tensors(tmp_path)["model.embed_tokens.weight"]
    assert torch.equal(loaded.model.tok_embed.weight, stored.float())


def test_mixed_stored_dtypes_follow_the_config(tmp_path):
    model = llama(torch.float32)
    model.model.norm.to(torch.bfloat16)  # one tensor in another dtype
    model.save_pretrained(tmp_path)
    set_config_dtype(tmp_path, "float32")
    loaded = load_model_folder(tmp_path)
    assert loaded.model.dtype == torch.float32 and loaded.model.final_norm.weight.dtype == torch.float32


# -- float64 checkpoints: computed in float32 ---------------------------------------------------------


def test_a_float64_checkpoint_loads_as_transformers_float32_cast(tmp_path):
    model = llama(torch.float64)
    model.save_pretrained(tmp_path)
    assert {t.dtype for t in stored_tensors(tmp_path).values()} == {torch.float64}
    loaded = load_model_folder(tmp_path)
    assert loaded.model.dtype == torch.float32
    theirs = model.to(torch.float32).state_dict()
    ours = to_hf_state_dict(loaded.model)
    assert set(ours) <= set(theirs) and len(ours) > 10
    for name, t in ours.items():
        assert torch.equal(t, theirs[name]), name


@pytest.mark.parametrize("value", [1e39, -1e39])
def test_a_float64_weight_beyond_float32s_range_is_refused_naming_the_file_and_tensor(tmp_path, capsys, value):
    """Cast to float32 it would become infinity without a word: one line instead, before the model is built."""
    model = llama(torch.float64)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] = value
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_model_folder(tmp_path)
    msg = str(info.value)
    assert info.value.path == tmp_path / "model.safetensors"
    assert str(tmp_path / "model.safetensors") in msg and "'model.layers.1.mlp.down_proj.weight'" in msg
    assert "float32" in msg and "range" in msg and "\n" not in msg, msg
    capsys.readouterr()  # transformers' progress bar from the save
    assert main(["info", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'model.layers.1.mlp.down_proj.weight'" in err and "Traceback" not in err


# The smallest float64 each cast makes infinite. Round to nearest, ties to even: half a unit above the
# largest value (whose last mantissa bit is odd, so the tie goes up). torch casts float64 to the half dtypes
# through float32, two roundings: half a float32 unit below that midpoint already rounds up to it.
FIRST_OVERFLOWING = {"float32": 2.0**128 - 2.0**103,                    # float32's largest 2**128 - 2**104
                     "bfloat16": (2.0**128 - 2.0**119) - 2.0**103,      # bfloat16's largest 2**128 - 2**120
                     "float16": (2.0**16 - 2.0**4) - 2.0**-9}           # float16's largest 65504 = 2**16 - 2**5


@pytest.mark.parametrize("dtype", list(FIRST_OVERFLOWING))
def test_the_range_edge_is_where_torchs_cast_overflows(tmp_path, dtype):
    """The float64 just below the first one the cast makes infinite loads as the cast gives it; that one is
    refused (both signs)."""
    into = getattr(torch, dtype)
    over = torch.tensor(FIRST_OVERFLOWING[dtype], dtype=torch.float64)
    edge = torch.nextafter(over, torch.tensor(0.0, dtype=torch.float64))
    assert torch.isfinite(edge.to(into)) and torch.isinf(over.to(into))
    for value, refused in [(edge, False), (-edge, False), (over, True), (-over, True)]:
        model = llama(torch.float64)
        with torch.no_grad():
            model.model.layers[0].self_attn.o_proj.weight[0, 0] = value
        model.save_pretrained(tmp_path)
        if refused:
            with pytest.raises(ModelLoadError, match="o_proj.weight.*range"):
                load_model_folder(tmp_path, dtype=dtype)
        else:
            w = load_model_folder(tmp_path, dtype=dtype).model.blocks[0].attn.o.weight
            assert w[0, 0] == value.to(into)

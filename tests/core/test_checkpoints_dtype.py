"""Half-precision checkpoints open in their stored dtype (memory-mapped, no float32 copy) unless a
dtype is asked for; sharded ones too. The memory this saves is measured by `bench memory`."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from desktop_app.core.checkpoints import load_model_folder

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

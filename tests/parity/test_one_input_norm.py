"""Phi, Cohere and Falcon (one LayerNorm before a parallel attention and MLP) read that norm as the block's
shared_input_norm, as GPT-J: no second norm exists to drift from the first, the tensor is written back as it
was read, and a folder saved before (its block said shared_input_norm false and held the norm once) loads."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.cohere import cohere  # noqa: E402
from family_cases.falcon import falcon  # noqa: E402
from family_cases.phi import phi  # noqa: E402

from desktop_app.core.checkpoints import NATIVE_KEY, load_model_folder, save_model_folder  # noqa: E402

ONE_NORM = {"phi": phi(), "cohere": cohere(), "falcon": falcon(),
            "falcon-new-architecture-one-norm": falcon(new_decoder_architecture=True, num_kv_heads=2,
                                                       num_ln_in_parallel_attn=1)}


@pytest.mark.parametrize("case", ONE_NORM)
def test_the_one_norm_is_the_shared_input_norm_and_is_written_back_as_read(case, tmp_path):
    hf = ONE_NORM[case]()
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    assert loaded.config.shared_input_norm
    assert not any(name.startswith("blocks.0.norm2") for name in loaded.model.state_dict())
    save_model_folder(loaded.model, tmp_path / "ours")
    again = type(hf).from_pretrained(tmp_path / "ours")
    theirs, back = hf.state_dict(), again.state_dict()
    assert theirs.keys() == back.keys()
    assert [k for k in theirs if not torch.equal(theirs[k], back[k])] == []


@pytest.mark.parametrize("case", ONE_NORM)
def test_a_folder_saved_before_shared_input_norm_still_loads(case, tmp_path):
    ONE_NORM[case]().save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    save_model_folder(loaded.model, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    # what the block said then: two norms (the same tensor read into both), Falcon's count in its extra
    config[NATIVE_KEY]["shared_input_norm"] = False
    if loaded.config.family == "falcon":
        config[NATIVE_KEY]["extra"]["falcon_norms"] = 1
    (tmp_path / "ours" / "config.json").write_text(json.dumps(config))
    before = load_model_folder(tmp_path / "ours")
    assert before.config == loaded.config
    ids = torch.tensor([[5, 9, 2, 41, 7]])
    assert torch.equal(before.model(ids).logits, loaded.model(ids).logits)

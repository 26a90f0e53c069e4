"""Every model the training panel's builder can describe survives a checkpoint round trip."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import hf_compatible, load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig

MIXES = [
    ModelConfig.gpt2(positions="rotary"), ModelConfig.gpt2(norm="rmsnorm", activation="swiglu"),
    ModelConfig.gpt2(positions="sinusoidal", norm_placement="post", attention_kind="l2"),
    ModelConfig.bert(type_vocab_size=0), ModelConfig.bert(norm_placement="pre", final_norm=True),
    ModelConfig.llama(positions="learned", norm="layernorm"), ModelConfig.gpt2(positions="none", tie_embeddings=False),
]


@pytest.mark.parametrize("cfg", MIXES, ids=lambda c: f"{c.family}-{c.positions}-{c.norm}-{c.norm_placement}")
def test_mixed_configurations_round_trip(cfg, tmp_path):
    assert not hf_compatible(cfg)
    model = new_model(cfg, seed=0).eval()
    save_model_folder(model, tmp_path / "m")
    loaded = load_model_folder(tmp_path / "m")
    assert loaded.config == cfg
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded.model(ids).logits)


def test_family_presets_stay_in_the_hugging_face_layout():
    for cfg in (ModelConfig.gpt2(), ModelConfig.bert(), ModelConfig.llama(), ModelConfig.gpt2(activation="relu")):
        assert hf_compatible(cfg)

"""ViT parity against `transformers` (test-only reference): folders Hugging Face writes open here with
the same logits (1e-4), every attention pattern over [CLS] + patches (1e-5) and hidden states; a ViT
saved here (perturbed first, so the round trip cannot pass by re-reading Hugging Face's own file)
opens with `from_pretrained` with the same outputs. The image counterpart of family_parity.py."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.vit import tiny_config, vivid  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, save_model_folder  # noqa: E402


def check_vit(make_hf, tmp_path, seed: int = 0):
    return check_family(lambda: vivid(make_hf()), tmp_path, seed=seed)


@pytest.mark.parametrize("image_size, patch_size, channels", [(24, 4, 1), (16, 16, 3)])  # (32, 8, 3): family_cases/vit.py
def test_vit_for_image_classification(tmp_path, image_size, patch_size, channels):
    loaded = check_vit(lambda: transformers.ViTForImageClassification(
        tiny_config(image_size, patch_size, channels)), tmp_path)
    cfg = loaded.config
    assert (cfg.family, cfg.vocab_size, cfg.context_length) == ("vit", 5, 1 + (image_size // patch_size) ** 2)


@pytest.mark.parametrize("pooler", [True, False])
def test_vit_model_with_and_without_pooler(tmp_path, pooler):
    loaded = check_vit(lambda: transformers.ViTModel(tiny_config(), add_pooling_layer=pooler), tmp_path)
    assert bool(loaded.config.pooler_size) == pooler and not loaded.config.lm_head


def test_vit_without_qkv_bias_and_with_tanh_gelu(tmp_path):
    check_vit(lambda: transformers.ViTForImageClassification(tiny_config(qkv_bias=False, hidden_act="gelu_new")),
              tmp_path)


def test_label_names_survive_a_round_trip(tmp_path):
    hf = transformers.ViTForImageClassification(tiny_config(num_labels=3, id2label={0: "cat", 1: "dog", 2: "owl"}))
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    save_model_folder(loaded.model, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["id2label"] == {"0": "cat", "1": "dog", "2": "owl"}
    assert transformers.ViTForImageClassification.from_pretrained(tmp_path / "ours").config.id2label[2] == "owl"


def test_wrong_image_shape_is_refused_by_name(tmp_path):
    transformers.ViTForImageClassification(tiny_config()).save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    with pytest.raises(ValueError, match=r"this model reads \[batch, 3, 32, 32\]"):
        loaded.model(torch.zeros(1, 3, 24, 24))


def test_unsupported_vit_folders_are_refused_by_name(tmp_path):
    transformers.ViTForImageClassification(tiny_config()).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    d = json.loads(path.read_text())
    for change, message in [({"architectures": ["ViTForMaskedImageModeling"]}, "unsupported ViT architecture"),
                            ({"image_size": [32, 16]}, "only square sizes"),
                            ({"image_size": 30}, "not a multiple of patch_size")]:
        path.write_text(json.dumps({**d, **change}))
        with pytest.raises(ModelLoadError, match=message) as err:
            load_model_folder(tmp_path / "hf")
        assert str(path) in str(err.value)

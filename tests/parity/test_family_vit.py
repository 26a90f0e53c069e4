"""ViT parity against `transformers` (test-only reference): folders Hugging Face writes open here with
the same logits (1e-4), every attention pattern over [CLS] + patches (1e-5) and hidden states; a ViT
saved here (perturbed first, so the round trip cannot pass by re-reading Hugging Face's own file)
opens with `from_pretrained` with the same outputs. The image counterpart of family_parity.py."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, save_model_folder  # noqa: E402
from desktop_app.core.trace import Trace  # noqa: E402

LOGITS_TOL = 1e-4
PATTERN_TOL = 1e-5


def tiny_config(image_size=32, patch_size=8, num_channels=3, num_labels=5, **kw):
    return transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  image_size=image_size, patch_size=patch_size, num_channels=num_channels,
                                  num_labels=num_labels, **kw)


def hf_outputs(hf, pixels: torch.Tensor):
    hf.eval()
    hf.config._attn_implementation = "eager"  # probabilities are only returned by the eager path
    with torch.no_grad():
        return hf(pixel_values=pixels, output_hidden_states=True, output_attentions=True)


def compare(loaded, hf_out, pixels: torch.Tensor, what: str) -> None:
    """Our forward pass on the same pixels: hidden states, every pattern, logits (and the pooler)."""
    trace = Trace()
    with torch.no_grad():
        out = loaded.model(pixels, trace=trace)
    n_patches = (loaded.config.image_size // loaded.config.patch_size) ** 2
    hidden = trace.hidden_states()
    assert len(hidden) == len(hf_out.hidden_states), what
    for i, (a, b) in enumerate(zip(hidden[:-1], hf_out.hidden_states[:-1])):
        assert (a - b).abs().max().item() < LOGITS_TOL, f"{what} hidden state {i}"
    assert len(hf_out.attentions) == loaded.config.n_layers
    for layer, pattern in enumerate(hf_out.attentions):
        ours = trace.pattern(layer)
        assert ours.shape == pattern.shape == (pixels.shape[0], loaded.config.n_heads, 1 + n_patches, 1 + n_patches)
        err = (ours - pattern).abs().max().item()
        assert err < PATTERN_TOL, f"{what} attention pattern of layer {layer}: {err:.2e}"
    if getattr(hf_out, "logits", None) is not None:
        assert out.logits.shape == hf_out.logits.shape
        err = (out.logits - hf_out.logits).abs().max().item()
        assert err < LOGITS_TOL, f"{what} logits: {err:.2e}"
    else:
        assert out.logits is None
        err = (trace.hidden_states()[-1] - hf_out.last_hidden_state).abs().max().item()
        assert err < LOGITS_TOL, f"{what} last hidden state: {err:.2e}"
        if hf_out.pooler_output is not None:
            err = (trace["pooler"] - hf_out.pooler_output).abs().max().item()
            assert err < LOGITS_TOL, f"{what} pooler: {err:.2e}"
        else:
            assert "pooler" not in trace


def check_vit(make_hf, tmp_path, seed: int = 0):
    torch.manual_seed(seed)
    hf = make_hf()
    with torch.no_grad():  # a randomly initialised [CLS] and positions are near zero: make them count
        for name, p in hf.named_parameters():
            if "cls_token" in name or "position_embeddings" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    c = hf.config
    pixels = torch.randn(2, c.num_channels, c.image_size, c.image_size)
    compare(loaded, hf_outputs(hf, pixels), pixels, "from transformers:")

    with torch.no_grad():  # perturb, save here, open in transformers again
        for p in loaded.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model_folder(loaded.model, tmp_path / "ours")
    hf2 = type(hf).from_pretrained(tmp_path / "ours", **({} if hasattr(hf, "classifier") else
                                                          {"add_pooling_layer": hf.pooler is not None}))
    compare(loaded, hf_outputs(hf2, pixels), pixels, "saved here:")
    assert load_model_folder(tmp_path / "ours").config == loaded.config
    return loaded


@pytest.mark.parametrize("image_size, patch_size, channels", [(32, 8, 3), (24, 4, 1), (16, 16, 3)])
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

"""The lectures' three ViT figures and image preprocessing (desktop_app/core/vit.py), on known answers."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from desktop_app.core.checkpoints import new_model
from desktop_app.core.families import REGISTRY
from desktop_app.core.vit import (ImageInputError, ImageSettings, attention_distance_of_trace, image_settings,
                                  mean_attention_distance, patch_distances, patch_embedding_filters,
                                  position_similarity, preprocess_image)


def tiny_vit(**kw):
    cfg = REGISTRY["vit"].preset(d_model=16, n_layers=2, n_heads=2, d_ff=32, image_size=12, patch_size=4,
                                 vocab_size=3, **kw)
    return new_model(cfg, seed=0)


def test_patch_distances_between_centres():
    d = patch_distances(2, 16)
    assert d.shape == (4, 4)
    assert d[0, 1] == 16 and d[0, 2] == 16 and d[0, 3] == pytest.approx(16 * math.sqrt(2)) and d[3, 3] == 0


def test_mean_attention_distance_known_answers():
    n = 4  # a 2 x 2 grid of 16-pixel patches, plus [CLS]
    uniform = np.zeros((1, 5, 5))
    uniform[0, :, 1:] = 0.2
    uniform[0, :, 0] = 0.2  # weight on [CLS] is dropped and the row renormalised: uniform over patches
    # every patch sees itself at 0, two neighbours at 16 and the diagonal at 16 sqrt 2
    expected_uniform = (0 + 16 + 16 + 16 * math.sqrt(2)) / n
    on_self = np.zeros((1, 5, 5))
    on_self[0, np.arange(5), np.arange(5)] = 1.0
    # query 0 -> patch 3 (diagonal), 1 -> 2 (diagonal), 2 -> 0 (vertical), 3 -> 2 (horizontal)
    chosen = np.zeros((1, 5, 5))
    chosen[0, 0, 1] = 1.0
    for q, k in [(0, 3), (1, 2), (2, 0), (3, 2)]:
        chosen[0, 1 + q, 1 + k] = 1.0
    expected_chosen = (2 * 16 * math.sqrt(2) + 16 + 16) / 4
    heads = np.concatenate([uniform, on_self, chosen])  # one layer, three heads
    out = mean_attention_distance([heads, heads[::-1]], grid=2, patch_size=16)
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out[0], [expected_uniform, 0.0, expected_chosen])
    np.testing.assert_allclose(out[1], [expected_chosen, 0.0, expected_uniform])
    batched = mean_attention_distance([np.stack([heads, heads[::-1]])], grid=2, patch_size=16)
    np.testing.assert_allclose(batched[0], (out[0] + out[1]) / 2)


def test_mean_attention_distance_refuses_a_pattern_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"2 x 2 grid plus \[CLS\]"):
        mean_attention_distance([np.zeros((1, 4, 4))], grid=2, patch_size=16)


def test_attention_distance_of_a_traced_image_is_within_the_image():
    model = tiny_vit()
    _, trace = model.run_with_trace(torch.randn(1, 3, 12, 12), names=["blocks.*.attn.pattern"])
    out = attention_distance_of_trace(trace, model.cfg)
    assert out.shape == (2, 2)
    assert (out > 0).all() and (out < patch_distances(3, 4).max()).all()


def test_position_similarity_grid_is_symmetric_with_ones_on_the_diagonal():
    model = tiny_vit()
    with torch.no_grad():
        model.pos_embed.weight.normal_()
    s = position_similarity(model)
    assert s.shape == (3, 3, 3, 3)
    np.testing.assert_allclose(s, s.transpose(2, 3, 0, 1), atol=1e-6)
    np.testing.assert_allclose([s[i, j, i, j] for i in range(3) for j in range(3)], 1.0, atol=1e-6)
    pos = model.pos_embed.weight.detach()[1:]
    cos = torch.nn.functional.cosine_similarity(pos[1], pos[5], dim=0).item()  # patch (0, 1) vs (1, 2)
    assert s[0, 1, 1, 2] == pytest.approx(cos, abs=1e-6)


def test_patch_embedding_filters_are_the_conv_weights_scaled_per_filter():
    model = tiny_vit()
    f = patch_embedding_filters(model)
    assert f.shape == (16, 4, 4, 3)
    assert f.min(axis=(1, 2, 3)).max() == 0 and f.max(axis=(1, 2, 3)).min() == pytest.approx(1)
    w = model.patch_embed.weight.detach()[5].permute(1, 2, 0).numpy()  # filter 5 as [P, P, C]
    np.testing.assert_allclose(f[5], (w - w.min()) / (w.max() - w.min()), atol=1e-6)
    pcs = patch_embedding_filters(model, principal_components=4)
    assert pcs.shape == (4, 4, 4, 3) and pcs.min() >= 0 and pcs.max() <= 1


def test_figures_refuse_a_text_model():
    with pytest.raises(ValueError, match="not a vision model"):
        position_similarity(new_model(REGISTRY["gpt2"].preset(d_model=16, n_layers=1, n_heads=2), seed=0))


def test_preprocess_normalises_without_resizing_at_the_model_size():
    image = np.zeros((2, 2, 3), dtype=np.uint8)
    image[0, 0] = 255
    image[1, 1] = (51, 102, 204)
    px = preprocess_image(image, ImageSettings(2, 2))
    assert px.shape == (3, 2, 2) and px.dtype == np.float32
    np.testing.assert_allclose(px[:, 0, 0], 1.0)  # (1 - 0.5) / 0.5
    np.testing.assert_allclose(px[:, 0, 1], -1.0)
    np.testing.assert_allclose(px[:, 1, 1], [0.2 * 2 - 1, 0.4 * 2 - 1, 0.8 * 2 - 1], atol=1e-6)


def test_preprocess_resizes_bilinear_with_antialiasing_like_pil():
    # halving a 2 x 2 image: PIL's antialiased bilinear filter averages the four pixels
    image = np.array([[10, 20], [30, 41]], dtype=np.uint8)
    px = preprocess_image(image, ImageSettings(1, 1, do_normalize=False, do_rescale=False), channels=1)
    assert px.shape == (1, 1, 1) and px[0, 0, 0] == round((10 + 20 + 30 + 41) / 4)
    grey = preprocess_image(np.full((7, 5), 128, np.uint8), ImageSettings(4, 4, do_normalize=False))
    assert grey.shape == (3, 4, 4)
    np.testing.assert_allclose(grey, 128 / 255, atol=1e-6)  # a constant image stays constant, grey -> 3 channels


def test_preprocess_refuses_bad_images():
    with pytest.raises(ImageInputError, match="expected uint8"):
        preprocess_image(np.zeros((4, 4, 3), np.float32), ImageSettings(4, 4))
    with pytest.raises(ImageInputError, match="expected H x W"):
        preprocess_image(np.zeros((4, 4, 2), np.uint8), ImageSettings(4, 4))
    with pytest.raises(ImageInputError, match="colour image for a model of 1 channel"):
        preprocess_image(np.zeros((4, 4, 3), np.uint8), ImageSettings(4, 4), channels=1)


def test_image_settings_from_preprocessor_config(tmp_path):
    cfg = tiny_vit().cfg
    assert image_settings(tmp_path, cfg) == ImageSettings(12, 12)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225], "image_processor_type": "ViTImageProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"height": 12, "width": 12}}))
    s = image_settings(tmp_path, cfg)
    assert (s.height, s.width, s.resample, s.image_mean[0], s.image_std[2]) == (12, 12, "bicubic", 0.485, 0.225)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"resample": 5}))
    with pytest.raises(ImageInputError, match="preprocessor_config.json: resample 5 is not supported"):
        image_settings(tmp_path, cfg)


def test_a_one_channel_model_gets_one_mean_and_std_per_channel(tmp_path):
    """ViTImageProcessor's defaults carry three values (an RGB model's); a grey model without a
    preprocessor_config.json, or with one that leaves the mean and std out, gets one of each."""
    cfg = tiny_vit().cfg.replace(num_channels=1)
    assert image_settings(tmp_path, cfg).image_mean == (0.5,) and image_settings(tmp_path, cfg).image_std == (0.5,)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 12, "width": 12}}))
    assert image_settings(tmp_path, cfg).image_mean == (0.5,)
    pixels = preprocess_image(np.full((12, 12), 255, np.uint8), image_settings(tmp_path, cfg), channels=1)
    assert pixels.shape == (1, 12, 12) and np.allclose(pixels, 1.0)  # (1 - 0.5) / 0.5


def test_a_preprocessor_config_beyond_read_jsons_cap_is_refused_unread(tmp_path):
    """preprocessor_config.json was read whole (read_text, then json.loads): a 20 MB one was read, then called
    malformed. It goes through files.read_json's cap (16 MB): one line naming the file and its size, unread; a
    key given twice keeps its last value, as before (and as transformers reads it)."""
    import tracemalloc

    cfg = tiny_vit().cfg
    path = tmp_path / "preprocessor_config.json"
    path.write_text('{"resample": 5, "resample": 3}')
    assert image_settings(tmp_path, cfg).resample == "bicubic"
    with open(path, "wb") as fh:
        fh.truncate(20 << 20)  # sparse
    tracemalloc.start()
    try:
        with pytest.raises(ImageInputError) as err:
            image_settings(tmp_path, cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == f"{path}: is 20,971,520 bytes, not a settings file (at most 16,777,216 are read)"
    assert peak < 8 << 20, peak

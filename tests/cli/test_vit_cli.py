"""`python -m desktop_app info` and `trace --image` on a transformers-made ViT folder."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
# interpreter start-ups on a busy 2-core machine: ~85 s for the module; run with -m slow
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=5))
    hf.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225], "image_processor_type": "ViTImageProcessor", "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": 32, "width": 32}}))
    return folder, hf


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True, text=True,
                          env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"}, timeout=120)


def _image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)


def _hf_reference(hf, pixels: np.ndarray):
    hf.eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        return hf(pixel_values=torch.from_numpy(pixels)[None], output_hidden_states=True, output_attentions=True)


def test_info_names_the_image_geometry(vit_dir):
    folder, hf = vit_dir
    out = _cli("info", str(folder))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["family"] == "vit" and info["vocab_size"] == 5 and info["context_length"] == 17
    assert (info["image_size"], info["patch_size"], info["num_channels"], info["patches"]) == (32, 8, 3, 16)
    assert info["parameters"] == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("suffix", [".npy", ".png"])
def test_trace_image_writes_the_text_keys_and_matches_transformers(vit_dir, tmp_path, suffix):
    from desktop_app.core.vit import ImageSettings, preprocess_image

    folder, hf = vit_dir
    image = _image()
    path = tmp_path / f"picture{suffix}"
    if suffix == ".npy":
        np.save(path, image)
    else:  # PNG is lossless: Qt must hand back exactly these pixels
        from PySide6.QtGui import QImage
        h, w, _ = image.shape
        QImage(image.tobytes(), w, h, 3 * w, QImage.Format.Format_RGB888).save(str(path))
    out_file = tmp_path / "t.npz"
    r = _cli("trace", str(folder), "--image", str(path), "--out", str(out_file))
    assert r.returncode == 0, r.stderr
    z = np.load(out_file)
    settings = ImageSettings(32, 32, image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
    np.testing.assert_allclose(z["pixel_values"], preprocess_image(image, settings), atol=1e-6)
    ref = _hf_reference(hf, z["pixel_values"])
    for layer in range(2):
        assert z[f"attn.{layer}"].shape == (4, 17, 17)
        np.testing.assert_allclose(z[f"attn.{layer}"], ref.attentions[layer][0].numpy(), atol=1e-5)
    for i in range(2):
        np.testing.assert_allclose(z[f"hidden.{i}"], ref.hidden_states[i][0].numpy(), atol=1e-4)
    assert z["logits"].shape == (5,)
    np.testing.assert_allclose(z["logits"], ref.logits[0].numpy(), atol=1e-4)
    assert z["attention_distance"].shape == (2, 4)


def test_trace_input_errors_are_one_clear_line(vit_dir, tmp_path):
    folder, _ = vit_dir
    out = str(tmp_path / "x.npz")
    r = _cli("trace", str(folder), "--ids", "1,2", "--out", out)
    assert r.returncode != 0 and "a vision model reads images: give --image FILE" in r.stderr
    r = _cli("trace", str(folder), "--image", str(tmp_path / "missing.png"), "--out", out)
    assert r.returncode != 0 and f"{tmp_path / 'missing.png'}: no such image file" in r.stderr
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    r = _cli("trace", str(folder), "--image", str(junk), "--out", out)
    assert r.returncode != 0 and f"{junk}: not an image Qt can decode" in r.stderr
    wrong = tmp_path / "floats.npy"
    np.save(wrong, np.zeros((8, 8, 3), np.float32))
    r = _cli("trace", str(folder), "--image", str(wrong), "--out", out)
    assert r.returncode != 0 and f"{wrong}: image of dtype float32: expected uint8" in r.stderr
    for stderr in (r.stderr,):
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1


def test_image_on_a_text_model_is_refused(tmp_path):
    folder = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1,
                                                         n_head=4)).save_pretrained(folder)
    picture = tmp_path / "p.npy"
    np.save(picture, _image())
    r = _cli("trace", str(folder), "--image", str(picture), "--out", str(tmp_path / "x.npz"))
    assert r.returncode != 0 and "not a vision model; --image needs a ViT folder" in r.stderr

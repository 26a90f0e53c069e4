"""app/images.py: image files as arrays (the codec the front ends register), and as a ViT's pixel values,
read the same way by the Image panel, `trace --image` and `render`."""
from __future__ import annotations

import json

import numpy as np
import pytest

from desktop_app.app import images
from desktop_app.app.images import image_pixel_values, read_image_file, set_image_codec
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig


@pytest.fixture
def no_codec():
    before = images._codec
    set_image_codec(None)
    yield
    set_image_codec(before)


def _png(path, rgb: np.ndarray):
    from PySide6.QtGui import QImage

    h, w, _ = rgb.shape
    data = np.ascontiguousarray(rgb)
    assert QImage(data.data, w, h, 3 * w, QImage.Format.Format_RGB888).save(str(path))


def test_front_ends_register_the_qt_codec_and_a_png_decodes(tmp_path):
    import desktop_app.commands  # noqa: F401  (importing a front end registers Qt's QImage)
    from desktop_app.image_codec import decode_image

    assert images._codec is decode_image
    rgb = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    _png(tmp_path / "x.png", rgb)
    np.testing.assert_array_equal(read_image_file(tmp_path / "x.png", 3), rgb)
    assert read_image_file(tmp_path / "x.png", 1).shape == (5, 7, 1)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"bad\.png: not an image Qt can decode"):
        read_image_file(tmp_path / "bad.png", 3)


def test_without_a_codec_npy_is_read_and_other_files_are_one_line(tmp_path, no_codec):
    arr = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    np.save(tmp_path / "a.npy", arr)
    np.testing.assert_array_equal(read_image_file(tmp_path / "a.npy", 3), arr)
    _png(tmp_path / "x.png", np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match=r"x\.png: no image decoder registered here"):
        read_image_file(tmp_path / "x.png", 3)
    with pytest.raises(ValueError, match=r"missing\.png: no such image file"):
        read_image_file(tmp_path / "missing.png", 3)


def test_pixel_values_name_the_model_folder_or_the_image(tmp_path):
    text = tmp_path / "gpt2"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                                                 context_length=8), seed=0), text)
    np.save(tmp_path / "img.npy", np.zeros((8, 8, 1), np.uint8))
    with pytest.raises(ValueError, match=f"^{text}: not a vision model"):
        image_pixel_values(load_model_folder(text), tmp_path / "img.npy")

    from desktop_app.core.families.vit import preset

    vit = tmp_path / "vit"
    cfg = preset(d_model=8, n_layers=1, n_heads=2, d_ff=16, image_size=8, patch_size=4, num_channels=1, vocab_size=3,
                 lm_head=True)
    save_model_folder(new_model(cfg, seed=0), vit, extra_files={"preprocessor_config.json": json.dumps(
        {"do_resize": False, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": False}).encode()})
    loaded = load_model_folder(vit)
    assert image_pixel_values(loaded, tmp_path / "img.npy").shape == (1, 8, 8)
    np.save(tmp_path / "wide.npy", np.zeros((8, 8, 1, 2), np.uint8))
    with pytest.raises(ValueError, match=r"wide\.npy: "):
        image_pixel_values(loaded, tmp_path / "wide.npy")


def _flat_rgb_png(path, side: int) -> None:
    """A valid side x side RGB PNG of one colour (small on disk, large decoded), written row by row."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row, parts = zlib.compressobj(9), b"\x00" + b"\x40" * (3 * side), []
    parts += [z.compress(row) for _ in range(side)]
    parts.append(z.flush())
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b""))


@pytest.mark.slow
def test_a_valid_png_beyond_qts_256_mb_allocation_limit_opens(tmp_path):
    """Issue 41: a valid 8,200 x 8,200 PNG (269 MB decoded) was called "not an image Qt can decode": Qt's own
    256 MB allocation limit; the limit is raised within the memory estimate made from the header."""
    from desktop_app.image_codec import decode_image

    path = tmp_path / "big.png"
    _flat_rgb_png(path, 8200)
    image = decode_image(path, 3)
    assert image.shape == (8200, 8200, 3) and int(image[4100, 4100, 1]) == 0x40

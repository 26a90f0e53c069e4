"""Issue 41: a damaged file's one line is the app's alone; sentencepiece's own lines (absl's "Model is not
initialized" for an empty tokenizer.model) and libpng's ("libpng error: Read Error", "libpng warning: iCCP")
never come before it. Each runs the CLI in a subprocess: those libraries write to file descriptor 2 directly."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True, text=True,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}, timeout=300)


def test_an_empty_sentencepiece_model_is_the_apps_one_line(tmp_path):
    folder = tmp_path / "model"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=60, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                                 context_length=16), seed=0), folder)
    (folder / "tokenizer.model").write_bytes(b"")
    r = _cli("info", str(folder))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr  # was 4 lines: absl's 3 first
    assert str(folder / "tokenizer.model") in r.stderr and "not a valid SentencePiece model" in r.stderr


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def test_a_damaged_png_is_the_apps_one_line_and_a_warning_none(tmp_path):
    transformers = pytest.importorskip("transformers")
    from PySide6.QtGui import QImage

    folder = tmp_path / "vit"
    torch.manual_seed(0)
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16,
        patch_size=8, num_labels=3)).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "image_processor_type": "ViTImageProcessor", "resample": 2, "rescale_factor": 1 / 255,
        "size": {"height": 16, "width": 16}}))
    pixels = np.random.default_rng(0).integers(0, 256, size=(20, 24, 3), dtype=np.uint8)
    good = tmp_path / "good.png"
    QImage(pixels.tobytes(), 24, 20, 72, QImage.Format.Format_RGB888).save(str(good))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(data[:len(data) // 2])
    bad_profile = tmp_path / "bad-profile.png"  # decodes, but libpng warns about the colour profile
    header_end = 8 + 25
    bad_profile.write_bytes(data[:header_end] + _png_chunk(b"iCCP", b"bad\x00\x00" + zlib.compress(b"junk"))
                            + data[header_end:])
    r = _cli("trace", str(folder), "--image", str(truncated), "--out", str(tmp_path / "t.npz"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr  # "libpng error: Read Error" came first
    assert f"{truncated}: not an image Qt can decode" in r.stderr and "(libpng: Read Error)" in r.stderr
    r = _cli("trace", str(folder), "--image", str(bad_profile), "--out", str(tmp_path / "b.npz"))
    assert r.returncode == 0 and "libpng" not in r.stderr, r.stderr

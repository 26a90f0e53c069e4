"""`render --image`: the Image panel's views of a ViT (attention overlay, filters, position similarity,
attention distance) and the attention/layers views of its [CLS] + patches, to PNG / SVG; clear errors."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from digit_vit import skip_without_digits  # noqa: E402

skip_without_digits()

from digit_vit import save_digit_vit  # noqa: E402
from desktop_app.cli import main as cli_main  # noqa: E402
from desktop_app.commands.render import IMAGE_VIEWS  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder  # noqa: E402
from desktop_app.core.config import ModelConfig  # noqa: E402
from desktop_app.core.training.image_tasks import load_digits, pixel_settings  # noqa: E402
from desktop_app.core.vit import preprocess_image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    """A small untrained digit ViT (8 x 8, one channel, patch 2: 16 patches + [CLS]; 2 layers x 3 heads)."""
    return save_digit_vit(tmp_path_factory.mktemp("render-vit") / "vit")


@pytest.fixture(scope="module")
def digit_file(tmp_path_factory):
    """A held-out-style digit as a uint8 .npy array (what `trace --image` reads too)."""
    path = tmp_path_factory.mktemp("digit") / "digit.npy"
    np.save(path, load_digits()[0][0])
    return path


@pytest.mark.parametrize("view", IMAGE_VIEWS)
def test_every_image_view_renders_png_and_svg(qapp, vit_dir, digit_file, tmp_path, view):
    for suffix in (".png", ".svg"):
        out = tmp_path / f"{view}{suffix}"
        assert cli_main(["render", str(vit_dir), "--image", str(digit_file), "--view", view, "--layer", "1",
                         "--size", "900x600", "--out", str(out)]) == 0
        assert out.stat().st_size > 500
    assert (tmp_path / f"{view}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ET.parse(tmp_path / f"{view}.svg").getroot().tag.endswith("svg")


def test_the_heads_figure_holds_the_query_row_of_the_trace(qapp, vit_dir, digit_file, tmp_path):
    out = tmp_path / "heads.npz"
    assert cli_main(["render", str(vit_dir), "--image", str(digit_file), "--view", "image-heads", "--layer", "1",
                     "--token", "6", "--out", str(out)]) == 0  # token 6 = patch 5 = row 1, column 1
    loaded = load_model_folder(vit_dir)
    pixels = preprocess_image(np.load(digit_file), pixel_settings(8, 1), 1)
    _, trace = loaded.model.run_with_trace(torch.from_numpy(pixels)[None], names=("blocks.*.attn.pattern",))
    expected = trace.pattern(1)[0, :, 6, 1:].reshape(3, 4, 4).numpy()
    assert np.allclose(np.load(out)["attention"], expected, atol=1e-6)
    distance = tmp_path / "distance.csv"
    assert cli_main(["render", str(vit_dir), "--image", str(digit_file), "--view", "image-distance",
                     "--out", str(distance)]) == 0
    assert len(distance.read_text().strip().splitlines()) == 1 + 2 * 3  # header + one row per layer and head


def test_attention_view_of_an_image_has_cls_and_patch_tokens(qapp, vit_dir, digit_file, tmp_path):
    out = tmp_path / "attention.csv"
    assert cli_main(["render", str(vit_dir), "--image", str(digit_file), "--view", "attention", "--layer", "0",
                     "--head", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "[CLS]" in text and "p15" in text


@pytest.mark.parametrize("args, message", [
    (["--view", "image-heads"], "--image needs"),  # no --image on a ViT: the group requires one of the inputs
    (["--view", "image-heads", "--layer", "2"], "--layer 2 is out of range"),
    (["--view", "image-heads", "--token", "17"], "--token 17 is out of range"),
])
def test_bad_image_arguments_are_one_line(qapp, vit_dir, digit_file, tmp_path, capsys, args, message):
    if message != "--image needs":
        args = ["--image", str(digit_file)] + args
    else:
        args = ["--text", "hello"] + args
    assert cli_main(["render", str(vit_dir)] + args + ["--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert (message if message != "--image needs" else "give a ViT folder and --image FILE") in err


def test_image_views_of_a_text_model_are_refused(qapp, digit_file, tmp_path, capsys):
    from desktop_app.core.tokenizer import char_tokenizer

    tok = char_tokenizer("abc")
    folder = tmp_path / "text"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                                 d_ff=32, context_length=16), seed=0), folder, tokenizer=tok)
    assert cli_main(["render", str(folder), "--image", str(digit_file), "--view", "attention",
                     "--out", str(tmp_path / "x.png")]) == 2
    assert "not a vision model" in capsys.readouterr().err


def test_subprocess_renders_the_overlay_headless(vit_dir, digit_file, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    out = tmp_path / "vit_heads.png"
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "render", str(vit_dir), "--image", str(digit_file),
                           "--view", "image-heads", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in proc.stdout

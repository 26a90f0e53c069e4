"""`python -m desktop_app render`: every view to PNG and SVG, the right numbers, clear errors."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from desktop_app.cli import main as cli_main
from desktop_app.commands.render import VIEWS, render_view
from desktop_app.ui.offscreen import dispose
from desktop_app.core import analysis
from desktop_app.core.views import layers as layers_views
from desktop_app.core.checkpoints import load_model_folder
from tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TEXT = "tokens cluster as depth grows"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("render") / "model", TEXT, init_std=0.3)


def test_subprocess_renders_headless_without_a_display(model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    out = tmp_path / "attn.png"
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "render", str(model_dir), "--text", TEXT,
                           "--view", "attention", "--layer", "1", "--head", "3", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in proc.stdout


@pytest.mark.parametrize("view", [v for v in VIEWS if v not in layers_views.MIXTURE_VIEWS])
def test_every_view_renders_png_and_svg(qapp, model_dir, tmp_path, view):
    for suffix in (".png", ".svg"):
        out = tmp_path / f"{view}{suffix}"
        assert cli_main(["render", str(model_dir), "--text", TEXT, "--view", view, "--layer", "1",
                         "--size", "800x600", "--out", str(out)]) == 0
        assert out.stat().st_size > 500
    root = ET.parse(tmp_path / f"{view}.svg").getroot()
    assert root.tag.endswith("svg")


def test_the_figure_shows_the_requested_numbers(qapp, model_dir, tmp_path):
    loaded = load_model_folder(model_dir)
    ids = loaded.tokenizer.encode(TEXT)
    _, trace = loaded.model.run_with_trace(torch.tensor([ids]))
    panel = render_view(loaded, ids, "attention", str(tmp_path / "a.png"), layer=1, head=2, token=5)
    np.testing.assert_allclose(panel.heatmap.values, trace["blocks.1.attn.pattern"][0, 2].numpy(), atol=1e-6)
    assert panel.heatmap.row_box.rect().top() == 5
    dispose(panel)
    panel = render_view(loaded, ids, "cosine", str(tmp_path / "c.npz"), depth=1)
    with np.load(tmp_path / "c.npz") as z:
        np.testing.assert_allclose(z["cosine"][1], analysis.cosine_similarity(trace, 1), atol=1e-5)
        np.testing.assert_allclose(z["mean_cosine"], analysis.mean_cosine_by_depth(trace), atol=1e-6)
    dispose(panel)
    panel = render_view(loaded, ids, "head-stats", str(tmp_path / "s.csv"), stat="mean_distance")
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0].split(",")[1:] == ["H0", "H1", "H2", "H3"]
    first = [float(v) for v in rows[1].split(",")[1:]]
    np.testing.assert_allclose(first, analysis.head_stats(trace).mean_distance[0], rtol=1e-5)
    dispose(panel)


@pytest.mark.parametrize("args, message", [
    (["--view", "attention", "--layer", "7"], "--layer 7 is out of range"),
    (["--view", "attention", "--head", "4"], "--head 4 is out of range"),
    (["--view", "pca", "--out", "x.txt"], "must end in .png"),
    (["--view", "attention", "--token", "999"], "--token 999 is out of range"),
    (["--view", "routing"], "is not a mixture of experts"),  # (it wrote a blank picture and exited 0)
    (["--view", "expert-load"], "is not a mixture of experts"),
])
def test_bad_arguments_give_a_clear_message(qapp, model_dir, tmp_path, capsys, args, message):
    if "--out" not in args:
        args = args + ["--out", str(tmp_path / "x.png")]
    assert cli_main(["render", str(model_dir), "--text", TEXT] + args) == 2
    assert message in capsys.readouterr().err


def test_a_mixtures_routing_views_render(qapp, tmp_path):
    moe = save_tiny_model(tmp_path / "mixtral", "abcdefghijklmnopqrstuvwxyz .", "mixtral")
    for view in layers_views.MIXTURE_VIEWS:
        out = tmp_path / f"{view}.png"
        assert cli_main(["render", str(moe), "--text", "abc abc", "--view", view, "--out", str(out)]) == 0
        assert out.stat().st_size > 500

"""The PyInstaller bundle starts and renders its window offscreen (slow; build it first with
packaging/build_bundle.sh, or set TE_BUNDLE to the executable)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "dist" / "transformer-explorer" / "transformer-explorer"


@pytest.mark.slow
def test_bundle_runs_screenshot_offscreen(tmp_path):
    exe = Path(os.environ.get("TE_BUNDLE", DEFAULT))
    if not exe.is_file():
        pytest.skip(f"no bundle at {exe}: run packaging/build_bundle.sh first")
    out = tmp_path / "bundle.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)  # the bundle must not need the checkout
    r = subprocess.run([str(exe), "--screenshot", str(out), "--panel", "attention"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.stat().st_size > 10_000
    assert "demo model is not installed" not in r.stderr  # resources travelled with the bundle
    info = subprocess.run([str(exe), "info", str(exe.parent / "_internal" / "resources" / "demo-model")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert info.returncode == 0 and '"family": "gpt2"' in info.stdout, info.stderr


@pytest.mark.slow
def test_bundle_trains_on_the_files_it_carries(tmp_path):
    """The digits task reads scikit-learn's digits.csv.gz by its package folder (nothing imports sklearn, so
    only the spec's datas bring it); the text task reads the bundled demo text."""
    exe = Path(os.environ.get("TE_BUNDLE", DEFAULT))
    if not exe.is_file():
        pytest.skip(f"no bundle at {exe}: run packaging/build_bundle.sh first")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)
    tiny = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--steps", "2"]
    runs = {"digits": ["--task", "digits", "--family", "vit", *tiny],
            "text": ["--task", "text", "--family", "gpt2", "--context", "16", *tiny,
                     "--text-file", str(exe.parent / "_internal" / "resources" / "demo-text.txt")]}
    for name, args in runs.items():
        r = subprocess.run([str(exe), "train", *args, "--out", str(tmp_path / name)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{name}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        assert (tmp_path / name / "model.safetensors").is_file()

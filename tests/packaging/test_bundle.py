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

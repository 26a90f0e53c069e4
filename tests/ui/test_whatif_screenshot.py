"""`--screenshot --panel whatif` on a model whose logit cannot be attributed (post-norm: Marian, BART, BERT)
saves the panel with its one-line reason; before, the screenshot waited for an attribution that never
started and failed with "the What if panel's screenshot demo did not finish"."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from translate_models import save_translate_model

REPO = Path(__file__).resolve().parents[2]


def test_the_what_if_screenshot_of_a_post_norm_model_shows_why_it_cannot_attribute(tmp_path):
    folder = tmp_path / "marian"
    save_translate_model(folder, d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32, context_length=24)
    out = tmp_path / "whatif.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "desktop_app", str(folder), "--screenshot", str(out), "--panel", "whatif",
                        "--text", "the black dog runs", "--size", "900x500", "--timeout", "20"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000

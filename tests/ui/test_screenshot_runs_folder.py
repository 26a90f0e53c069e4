"""`--screenshot --panel train` runs its demo training in a temporary runs folder (ui/demo.py): each run left one
(/tmp/te-screenshot-runs-*) behind. The app removes the folders it made when it exits, and only those."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_train_panels_screenshot_removes_the_runs_folder_it_made_and_no_other(tmp_path):
    tmp = tmp_path / "tmp"  # the app's temporary folder (TMPDIR): what is left in it is what the app left
    mine = tmp / "te-screenshot-runs-not-the-apps"
    mine.mkdir(parents=True)
    (mine / "keep.txt").write_text("a user's file")
    env = dict(os.environ, TMPDIR=str(tmp), QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(REPO))
    # --timeout 20: the model opens within it, the demo starts its run, and the wait for four evaluations may end
    # first (exit 1, said in one line): either way the window closes and the app exits
    r = subprocess.run([sys.executable, "-m", "desktop_app", "--panel", "train", "--screenshot",
                        str(tmp_path / "shot.png"), "--timeout", "20"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert ("saved" in r.stdout and r.returncode == 0) or \
        "the Train panel's screenshot demo did not finish within 20 s" in r.stderr, (r.returncode, r.stderr)
    assert sorted(p.name for p in tmp.glob("te-screenshot-runs-*")) == [mine.name]
    assert (mine / "keep.txt").read_text() == "a user's file"

"""The Train panel's training process runs from a neutral folder, and nothing in a folder shadows the package.

Installed from a wheel, resources/ is inside the package (site-packages/desktop_app/resources) and the process
ran `-m desktop_app train` from its parent, the package's own folder: sys.path[0] there made app, core, ui (and
a stray desktop_app/ in it) importable as top-level modules."""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QProcess, Qt

import desktop_app.paths
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState

from .walkthrough import set_tiny_sort_run

SHADOW = '''import json, os, sys
with open({marker!r}, "w") as f:
    json.dump({{"cwd": os.getcwd(), "path0": sys.path[0]}}, f)
sys.exit(3)
'''


def shadow_package(folder: Path, marker: Path) -> None:
    """A `desktop_app` package in `folder` that says it was imported (its cwd and sys.path[0]) and exits."""
    (folder / "desktop_app").mkdir(parents=True)
    (folder / "desktop_app" / "__init__.py").write_text(SHADOW.format(marker=str(marker)), encoding="utf-8")


def test_the_training_process_runs_from_home_with_no_folder_of_its_own_on_its_path(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    marker = tmp_path / "shadowed.json"
    home, package = tmp_path / "home", tmp_path / "site" / "desktop_app"
    shadow_package(home, marker)  # the working folder now: not on the path (-P)
    shadow_package(package, marker)  # the installed layout's resources/ parent: the old working folder
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(desktop_app.paths, "resources_dir", lambda: package / "resources")

    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    set_tiny_sort_run(panel, steps=4, eval_every=2)
    panel.out_edit.setText(str(tmp_path / "runs"))
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    process: QProcess = panel.run.process
    assert Path(process.workingDirectory()) == home
    qtbot.waitUntil(lambda: not panel.running, timeout=120_000)
    shadowed = json.loads(marker.read_text(encoding="utf-8")) if marker.exists() else None
    assert shadowed is None, f"the process imported a desktop_app from its working folder: {shadowed}"
    kinds = [e["event"] for e in panel.events]
    assert kinds[0] == "start" and kinds[-1] == "done", panel.status_label.text()


def test_the_training_process_imports_the_package_the_window_runs(tmp_path):
    """A checkout started as `python -m desktop_app` from its own folder (no install, no PYTHONPATH): the
    process, run with -P from elsewhere, still finds this package (train_environment puts its folder first)."""
    import os
    import subprocess

    from desktop_app.ui.panels.training_run import train_command, train_environment

    here = Path(desktop_app.paths.__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python, flag = train_command()[:2]
    assert flag == "-P"
    done = subprocess.run([python, flag, "-c", "import desktop_app; print(desktop_app.__file__)"], cwd=tmp_path,
                          env=train_environment(env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().parent == here

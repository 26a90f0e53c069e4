"""The benchmarks' child processes find the package as the Train panel's process does (paths.package_on_path):
a source checkout first on PYTHONPATH; an installed package (its folder one of Python's site folders) adds
nothing, since site-packages first on the path shadows the standard library with any module of its name."""
from __future__ import annotations

import os
import site
from pathlib import Path

from desktop_app import benchmarks


def test_an_installed_package_adds_no_site_folder_to_a_benchmarks_child_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    checkout = benchmarks.child_env(X="1")
    assert checkout["PYTHONPATH"] == str(benchmarks.REPO) + os.pathsep + "/elsewhere" and checkout["X"] == "1"
    installed = Path(site.getsitepackages()[0])  # where a wheel's desktop_app/ lies: REPO is its parent
    monkeypatch.setattr(benchmarks, "REPO", installed)
    assert benchmarks.child_env()["PYTHONPATH"] == "/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in benchmarks.child_env()
    from desktop_app.paths import package_on_path

    assert "PYTHONPATH" not in package_on_path({}, installed)  # busy, memory, scale, streamed, quick --separate


def test_the_train_panels_process_and_the_benchmarks_share_one_rule():
    from desktop_app.paths import package_on_path
    from desktop_app.ui.panels.training_run import train_environment

    here = str(Path(benchmarks.__file__).resolve().parents[2])
    assert train_environment({"PYTHONPATH": "/x"})["PYTHONPATH"] == package_on_path({"PYTHONPATH": "/x"})["PYTHONPATH"] \
        == here + os.pathsep + "/x"

"""A plain (non-editable) install carries resources/: the demo model opens from the installed package."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_package_list_names_every_package_folder():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "desktop_app").rglob("__init__.py")}
    assert listed - {"desktop_app.resources"} == found


def source_files() -> list[str]:
    """The checkout's files as git sees them (tracked, and new ones not ignored): no build/ leftovers."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            check=True, capture_output=True, timeout=60).stdout.decode().split("\0")
    return [name for name in listed if name and (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # built from a clean copy: setuptools builds in-tree and never empties build/lib, so a wheel built
    # in the checkout ships modules deleted since the last build (docs/packaging.md)
    source = tmp_path_factory.mktemp("source")
    for name in source_files():
        if name.startswith(("desktop_app/", "resources/")) or name in ("pyproject.toml", "README.md"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("transformer_explorer-*.whl")
    return path


def test_the_wheel_holds_every_module_and_resource_file(wheel):
    """Every module, and every file under resources/ (demo model, demo text, icons, desktop entry
    template: whatever a panel or command reads), is in the wheel; no other module is."""
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {n for n in source_files() if n.startswith("desktop_app/") and n.endswith(".py")}
    wanted |= {"desktop_app/" + n for n in source_files() if n.startswith("resources/")}
    assert wanted - names == set()
    assert {n for n in names if n.endswith(".py")} == {n for n in wanted if n.endswith(".py")}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[gui_scripts]\ntransformer-explorer = desktop_app.ui.app:main" in text
    assert "te-cli = desktop_app.cli:main" in text


def test_an_installed_wheel_opens_its_demo_model(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("config.json", "model.safetensors", "tokenizer.json"):
        assert f"desktop_app/resources/demo-model/{needed}" in names
    assert "desktop_app/resources/icons/transformer-explorer.svg" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import json; from desktop_app.paths import demo_model_dir, demo_text_path;"
            "from desktop_app.core.checkpoints import load_model_folder;"
            "m = load_model_folder(demo_model_dir());"
            "print(json.dumps([str(demo_model_dir()), m.config.n_layers, demo_text_path().is_file()]))")
    # -I: isolated, so neither this checkout nor the editable install is on the path; torch and
    # the rest come from the test environment's site-packages, added explicitly
    deps = [p for p in sys.path if p.endswith("site-packages")]
    env_code = f"import sys; sys.path[:0] = {[str(site)] + deps!r}; " + code
    out = subprocess.run([sys.executable, "-I", "-c", env_code], check=True, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path).stdout
    model_dir, layers, has_text = json.loads(out.strip().splitlines()[-1])
    assert Path(model_dir) == site / "desktop_app" / "resources" / "demo-model"
    assert layers == 4 and has_text

    # the CLI from the wheel alone, run outside the checkout: trace the demo model to a file
    cli = (f"import runpy, sys; sys.path[:0] = {[str(site)] + deps!r}; "
           f"sys.argv = ['desktop_app', 'trace', {model_dir!r}, '--text', 'Alice was', '--out', 'trace.npz']; "
           "runpy.run_module('desktop_app', run_name='__main__')")
    done = subprocess.run([sys.executable, "-I", "-c", cli], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "trace.npz").stat().st_size > 0


def run_installed(site: Path, args: list[str], cwd: Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """`python -m desktop_app ARGS` with the package from `site` (an unpacked wheel) and nothing of this
    checkout: isolated (-I), the test environment's site-packages added for torch and the rest."""
    deps = [p for p in sys.path if p.endswith("site-packages")]
    code = (f"import runpy, sys; sys.path[:0] = {[str(site)] + deps!r}; sys.argv = ['desktop_app', *{args!r}]; "
            "runpy.run_module('desktop_app', run_name='__main__')")
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=dict(os.environ, QT_QPA_PLATFORM="offscreen", **env))


def test_bench_quick_from_a_wheel_says_it_has_no_record_and_writes_nothing_into_the_install(wheel, tmp_path):
    """docs/benchmarks.json is the source checkout's record, not shipped: installed, bench quick looked for it
    in site-packages/docs (and --record would have written there, --readme site-packages/README.md)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    r = run_installed(site, ["bench", "quick", "--only", "load"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["figure", "value", "target"]  # no recorded column
    assert lines[1].startswith("load speedup ") and "FAILED" not in lines[1]
    said = [ln for ln in r.stderr.splitlines() if "no recorded values" in ln]
    assert len(said) == 1 and "docs/benchmarks.json" in said[0]
    for refused in (["--record"], ["--readme"]):
        r = run_installed(site, ["bench", "quick", "--only", "load", *refused], cwd=tmp_path, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and refused[0] in r.stderr, r.stderr
    assert sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts) == \
        [p for p in before if "__pycache__" not in p.parts]


def test_an_installed_package_installs_its_desktop_entry_and_removes_it(wheel, tmp_path):
    """Without the checkout (packaging/install_desktop_entry.sh is not in the wheel): `transformer-explorer
    --install-desktop-entry` writes the entry and the wheel's icons, --uninstall-desktop-entry removes them."""
    site, share = tmp_path / "site", tmp_path / "share"
    zipfile.ZipFile(wheel).extractall(site)
    r = run_installed(site, ["--install-desktop-entry"], cwd=tmp_path, timeout=120, XDG_DATA_HOME=str(share))
    assert r.returncode == 0, r.stderr
    entry = share / "applications" / "transformer-explorer.desktop"
    lines = entry.read_text(encoding="utf-8").splitlines()
    assert "X-Transformer-Explorer-Installer=install_desktop_entry.sh" in lines
    exec_line = next(ln for ln in lines if ln.startswith("Exec="))
    assert exec_line.endswith(" %f") and Path(exec_line[5:].split()[0]).is_file()
    icons = site / "desktop_app" / "resources" / "icons"
    png = share / "icons" / "hicolor" / "48x48" / "apps" / "transformer-explorer.png"
    assert png.read_bytes() == (icons / "transformer-explorer-48.png").read_bytes()
    r = run_installed(site, ["--uninstall-desktop-entry"], cwd=tmp_path, timeout=120, XDG_DATA_HOME=str(share))
    assert r.returncode == 0, r.stderr
    assert [p for p in share.rglob("*") if not p.is_dir()] == []

"""A plain (non-editable) install carries resources/: the demo model opens from the installed package."""
from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("transformer_explorer-*.whl")
    return path


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

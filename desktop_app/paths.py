"""Where the app's files are: shipped resources (demo model, icons) and the user's data folder."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    """resources/: inside a bundle, inside the installed package (a wheel installs it as
    desktop_app/resources), or beside the package (source checkout, editable install)."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    here = Path(__file__).resolve().parent
    installed = here / "resources"
    return installed if installed.is_dir() else here.parent / "resources"


def package_on_path(env: dict[str, str], root: str | Path | None = None) -> dict[str, str]:
    """`env` for a child Python process that must run this code: `root` (default: the folder this package was
    imported from) first on PYTHONPATH, unless it is one of Python's site folders: an installed package is found
    there anyway, and site-packages first on the path would shadow the standard library (a module of its name
    installed there). The one rule of the Train panel's process and the benchmarks' children."""
    import site

    root = Path(root if root is not None else Path(__file__).resolve().parent.parent).resolve()
    if root in {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}:
        return dict(env)
    paths = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": str(root) + (os.pathsep + paths if paths else "")}


def demo_model_dir() -> Path:
    return resources_dir() / "demo-model"


def demo_text_path() -> Path:
    return resources_dir() / "demo-text.txt"


def user_data_dir() -> Path:
    """Per-user folder for logs and the last workspace (XDG on Linux, the usual places elsewhere)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA", Path.home() / "AppData" / "Roaming"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    path = base / "transformer-explorer"
    path.mkdir(parents=True, exist_ok=True)
    return path

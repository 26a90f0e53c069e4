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

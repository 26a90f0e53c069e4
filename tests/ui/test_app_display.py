"""Set-up on a real desktop (issue 13): when Qt's xcb plugin cannot load, the app prints one line
naming the missing packages (the apt-get command) instead of Qt's generic abort."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from desktop_app.ui.app import XCB_LIBRARIES, xcb_problem

REPO = Path(__file__).resolve().parents[2]


def _loader(missing):
    def load(name):
        if name in missing:
            raise OSError(f"{name}: cannot open shared object file")
    return load


def test_missing_xcb_libraries_give_the_apt_get_line(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    line = xcb_problem(_loader({"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}))
    assert line.endswith("sudo apt-get install libxcb-icccm4 libxcb-keysyms1")
    assert "libxcb-icccm.so.4" in line and "\n" not in line
    assert xcb_problem(_loader(set())) is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # another plugin: nothing to check
    assert xcb_problem(_loader(set(XCB_LIBRARIES))) is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert xcb_problem(_loader({"libxcb-cursor.so.0"})).endswith("apt-get install libxcb-cursor0")


def test_the_app_exits_with_that_line_before_qt_aborts(tmp_path):
    # a process of its own: Qt aborts (SIGABRT) when its plugin fails, so the check must come first
    code = ("import ctypes, sys\n"
            "real = ctypes.CDLL\n"
            "def fake(name, *a, **k):\n"
            "    if name == 'libxcb-icccm.so.4':\n"
            "        raise OSError(name + ': cannot open shared object file')\n"
            "    return real(name, *a, **k)\n"
            "ctypes.CDLL = fake\n"
            "sys.platform = 'linux'\n"
            "from desktop_app.ui.app import main\n"
            "sys.exit(main([]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=":99", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "sudo apt-get install libxcb-icccm4" in lines[0]


def test_no_display_gives_one_line_not_a_core_dump(tmp_path):
    """Issue 41: launched with no DISPLAY (nor Wayland), Qt aborted with a core dump (exit 134); the app
    says so in one line and exits 1."""
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY", "DISPLAY")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    code = "import sys\nsys.platform = 'linux'\nfrom desktop_app.ui.app import main\nsys.exit(main([]))\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no display" in lines[0] and "--screenshot" in lines[0]

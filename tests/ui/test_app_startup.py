"""The startup benchmark runs end to end and reports what it promises (slow: several cold starts)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_startup_benchmark_prints_its_json(tmp_path):
    r = subprocess.run([sys.executable, "-m", "desktop_app", "bench", "startup", "--repeat", "1"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["name"] == "startup"
    assert result["ours_s"] > 0 and result["reference_s"] > 0
    assert result["ratio"] == pytest.approx(result["ours_s"] / result["reference_s"], rel=0.01)
    # the app did real work beyond the bare imports: it cannot start faster than importing torch and Qt
    assert result["ours_cpu_s"] > 0.8 * result["reference_cpu_s"]


# -- issue 25 §3: a last session that cannot be restored never stops the start, and the window says so --

BASE = {"format": "transformer-explorer-workspace", "version": 1}
LIGHT_PANELS = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
                ("Second", "desktop_app.ui.panels.model", "ModelPanel")]  # the test is about the shell

POISONED = {
    "non-ASCII geometry": (json.dumps({**BASE, "geometry": "AdnQywADé"}), "'geometry' should be base64"),
    "non-ASCII window state": (json.dumps({**BASE, "window_state": "ü"}), "'window_state' should be base64"),
    "JSON nested 100000 deep": ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    "views nested 100000 deep": (json.dumps(BASE)[:-1] + ', "views": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 "nested too deeply"),
    "a number for the text": (json.dumps({**BASE, "text": 5}), "'text' should be a string"),
    "a list for the model folder": (json.dumps({**BASE, "model_path": ["/a"]}), "'model_path' should be a string"),
    "a string for the version": (json.dumps({**BASE, "version": "1"}), "version '1' is not a version number"),
    "truncated": (json.dumps({**BASE, "text": "cut here"})[:40], "not valid JSON"),
    "binary garbage": (bytes(range(256)) * 8, "not UTF-8"),
    "a list, not an object": ("[1, 2, 3]", "not a Transformer Explorer workspace"),
}


def _start_app(qtbot, monkeypatch) -> dict:
    """app.main() as a user starts it (no arguments: the last session is restored); once the window is
    up with its model traced, records what it shows, clicks the start-up notice's OK and closes it."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    from desktop_app.ui import app as app_module
    from desktop_app.ui import main_window

    from .walkthrough import run_app_main

    monkeypatch.setattr(main_window, "PANELS", LIGHT_PANELS)
    seen: dict = {}

    def drive() -> bool:
        windows = [w for w in QApplication.topLevelWidgets()
                   if isinstance(w, main_window.MainWindow) and w.isVisible() and w.session_path is not None]
        if not windows or windows[0].state.loaded is None or windows[0].state.trace is None:
            return False
        window = windows[0]
        box = window.findChild(QMessageBox, "startup-notice")
        seen.update(model=window.state.loaded.path, text=window.state.text, notice=None)
        if box is not None:
            seen.update(notice=box.text(), title=box.windowTitle(), modal=box.isModal(), visible=box.isVisible())
            qtbot.mouseClick(box.button(QMessageBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
            seen["closed by OK"] = not box.isVisible()
        window.close()
        return True

    seen["exit"] = run_app_main(lambda: app_module.main([]), drive, seen)
    return seen


@pytest.mark.parametrize("case", list(POISONED))
def test_a_poisoned_last_session_starts_with_defaults_moves_the_file_aside_and_says_so(
        case, qtbot, monkeypatch, isolated_user_files):
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.workspace import last_session_path

    content, problem = POISONED[case]
    session = last_session_path()
    session.parent.mkdir(parents=True, exist_ok=True)
    raw = content if isinstance(content, bytes) else content.encode("utf-8")
    session.write_bytes(raw)
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen, seen
    assert Path(seen["model"]) == demo_model_dir()  # the defaults
    notice = seen["notice"]
    assert notice is not None, "nothing said in the window"
    assert str(session) in notice and problem in notice and "\n" not in notice, notice
    assert seen["modal"] is False and seen["visible"] and seen["closed by OK"]
    moved = sorted(session.parent.glob("last-session.json.bad-*"))
    assert len(moved) == 1 and moved[0].read_bytes() == raw  # moved aside whole, never deleted
    assert moved[0].name in notice
    assert session.is_file()  # the clean session the window saved as it closed


def test_a_failure_while_applying_the_session_is_caught_the_same_way(qtbot, monkeypatch, isolated_user_files):
    """Not only a bad file: anything that goes wrong while the window takes the session on."""
    from desktop_app.ui import main_window
    from desktop_app.ui.workspace import Workspace, last_session_path, save_workspace

    save_workspace(last_session_path(), Workspace(text="fine text", panel="Second"))

    def broken(self, ws, open_model=True):
        raise RuntimeError("a bug in restoring")

    monkeypatch.setattr(main_window.MainWindow, "apply_workspace", broken)
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen, seen
    assert "RuntimeError: a bug in restoring" in seen["notice"] and "Started with defaults" in seen["notice"]
    assert seen["text"] != "fine text"  # defaults, not half the session
    assert len(list(last_session_path().parent.glob("last-session.json.bad-*"))) == 1


def test_a_last_session_whose_model_folder_is_gone_says_so_and_keeps_the_rest(
        qtbot, monkeypatch, isolated_user_files, tmp_path):
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.workspace import Workspace, last_session_path, save_workspace

    gone = tmp_path / "my-model-was-here"
    save_workspace(last_session_path(), Workspace(model_path=str(gone), text="the rest is restored"))
    seen = _start_app(qtbot, monkeypatch)
    assert seen["exit"] == 0 and "watchdog" not in seen, seen
    assert Path(seen["model"]) == demo_model_dir() and seen["text"] == "the rest is restored"
    assert str(gone) in seen["notice"] and "gone" in seen["notice"] and seen["title"] == "Model folder missing"
    assert not list(last_session_path().parent.glob("*.bad-*"))  # nothing wrong with the file itself

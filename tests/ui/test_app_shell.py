"""The application shell: main window, Model panel, menus, errors on load, drag and drop, --screenshot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDropEvent, QImage
from PySide6.QtWidgets import QMessageBox
from safetensors import safe_open
from tokenizers import Tokenizer as HFTokenizer

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.devices import available_devices
from desktop_app.ui import settings as app_settings
from desktop_app.ui.main_window import MainWindow, model_folder_from_mime
from desktop_app.ui.state import AppState
from tiny_models import save_tiny_model

REPO = Path(__file__).resolve().parents[2]
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?'"


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    """QSettings and the user's data folder under tmp_path: tests never touch the real ones."""
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    yield


def make_model(path: Path, family: str = "llama", **kw) -> Path:
    return save_tiny_model(path, CHARS, family, specials=["<|endoftext|>"],
                           **{**dict(n_layers=3, n_kv_heads=2, d_ff=48), **kw})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"llama": make_model(root / "tiny-llama"),
            "gpt2": make_model(root / "tiny-gpt2", family="gpt2", n_kv_heads=None, n_layers=2, d_ff=64)}


def open_and_wait(qtbot, window: MainWindow, path: Path) -> None:
    state = window.state
    with qtbot.waitSignal(state.trace_changed, timeout=15000):
        window.open_model(path)
    assert state.loaded is not None and Path(state.loaded.path) == path


@pytest.fixture
def window(qtbot):
    state = AppState()
    w = MainWindow(state)
    qtbot.addWidget(w)
    w.show()
    return w


def test_summary_shows_the_numbers_of_the_checkpoint(qtbot, window, models):
    path = models["llama"]
    window.state.set_text("hello")
    open_and_wait(qtbot, window, path)
    panel = window.panel("Model")
    config = json.loads((path / "config.json").read_text())  # the Hugging Face fields, read independently
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        n_params = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert panel.summary_value("Layers") == str(config["num_hidden_layers"])
    assert panel.summary_value("Heads").startswith(str(config["num_attention_heads"]) + " ")
    assert panel.summary_value("KV heads") == f"{config['num_key_value_heads']} (grouped-query)"
    assert panel.summary_value("d_model") == str(config["hidden_size"])
    assert panel.summary_value("d_ff") == str(config["intermediate_size"])
    assert panel.summary_value("Vocabulary") == str(config["vocab_size"])
    assert panel.summary_value("Context length") == str(config["max_position_embeddings"])
    assert panel.summary_value("Parameters").startswith(f"{n_params:,}")  # untied LLaMA: every tensor counts
    assert panel.summary_value("Family").startswith("LLaMA")
    assert panel.summary_value("dtype") == "float32"
    assert panel.summary_value("Device") == "cpu"
    assert panel.summary_value("Path") == str(path)
    assert window.model_label.text().startswith("tiny-llama")
    assert "cpu" in window.device_label.text()


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def test_typing_updates_the_token_strip(qtbot, window, models):
    path = models["gpt2"]
    open_and_wait(qtbot, window, path)
    panel = window.panel("Model")
    panel.text_edit.clear()
    with qtbot.waitSignal(window.state.trace_changed, timeout=10000):
        qtbot.keyClicks(panel.text_edit, "the cat sat.")
    reference = HFTokenizer.from_file(str(path / "tokenizer.json")).encode("the cat sat.").ids
    qtbot.waitUntil(lambda: panel.token_strip.canvas.ids == reference, timeout=5000)
    assert panel.token_strip.count() == len(reference) == 12
    assert panel.token_strip.canvas.strings[:3] == ["t", "h", "e"]
    assert panel.count_label.text().startswith("12 tokens")
    assert window.state.trace is not None
    # chip colours: p(token | tokens before) from an independent forward pass without tracing
    import math

    import torch

    qtbot.waitUntil(lambda: panel.probabilities is not None, timeout=5000)
    with torch.no_grad():
        logits = window.state.loaded.model(torch.tensor([reference])).logits[0]
    expected = torch.softmax(logits.double(), -1)[torch.arange(len(reference) - 1), reference[1:]]
    assert math.isnan(panel.probabilities[0])
    assert torch.allclose(torch.tensor(panel.probabilities[1:], dtype=torch.float64), expected, atol=1e-5)
    assert panel.token_strip.canvas.values[1:] == panel.probabilities[1:]
    ppl = math.exp(-float(expected.log().mean()))
    assert f"perplexity {ppl:.1f}" in panel.count_label.text()
    # clicking a chip names the token
    panel.token_strip.token_selected.emit(4)
    assert "id %d" % reference[4] in panel.token_info.text()


def test_the_model_panel_colours_its_chips_when_shown_not_while_another_tab_is(qtbot, window, models):
    """The chips' probabilities (a log-softmax over every position's logits) are computed for the Model panel
    on show: a trace arriving while the Attention tab is on show leaves them for when the Model tab is shown."""
    window.show_panel("Attention")
    window.state.text = "the cat sat."
    open_and_wait(qtbot, window, models["gpt2"])
    qtbot.waitUntil(lambda: window.state._trace_job is None and window.state.trace is not None, timeout=15_000)
    panel = window.panel("Model")
    assert window.state.trace is not None and "logits" in window.state.trace
    assert panel.probabilities is None and not panel.isVisible()
    tabs = window.tabs
    qtbot.mouseClick(tabs.tabBar(), Qt.MouseButton.LeftButton,
                     pos=tabs.tabBar().tabRect(tabs.indexOf(window.slot("Model"))).center())
    assert panel.isVisible()
    qtbot.waitUntil(lambda: panel.probabilities is not None, timeout=5000)  # (in a worker)
    ids = window.state.token_ids
    with torch.no_grad():
        logits = window.state.loaded.model(torch.tensor([ids])).logits[0]
    expected = torch.softmax(logits.double(), -1)[torch.arange(len(ids) - 1), ids[1:]]
    assert torch.allclose(torch.tensor(panel.probabilities[1:], dtype=torch.float64), expected, atol=1e-5)
    assert panel.token_strip.canvas.values[1:] == panel.probabilities[1:]


def test_the_chips_colours_are_computed_off_the_ui_thread_and_a_new_texts_replace_them(
        qtbot, window, models, monkeypatch):
    """The Model tab's click does not wait for the log-softmax over every position's logits (~1.1 s of the UI
    thread at 1,024 tokens of the Qwen2.5-0.5B shape, bench ui): a worker computes the colours, the chips show
    uncoloured meanwhile, and colours computed for a text no longer on show are never shown."""
    import threading

    from desktop_app.ui.panels import model as model_panel

    window.show_panel("Attention")
    window.state.text = "the cat sat."
    open_and_wait(qtbot, window, models["gpt2"])
    qtbot.waitUntil(lambda: window.state._trace_job is None and window.state.trace is not None, timeout=15_000)
    panel = window.panel("Model")
    release, threads = threading.Event(), []

    def held(logits, ids):
        threads.append(threading.current_thread())
        release.wait(10)
        return model_panel.token_probabilities.__wrapped__(logits, ids)

    held.__wrapped__ = model_panel.token_probabilities
    monkeypatch.setattr(model_panel, "token_probabilities", held)
    tabs = window.tabs
    qtbot.mouseClick(tabs.tabBar(), Qt.MouseButton.LeftButton,
                     pos=tabs.tabBar().tabRect(tabs.indexOf(window.slot("Model"))).center())
    qtbot.waitUntil(lambda: len(threads) == 1, timeout=5000)
    assert threads[0] is not threading.main_thread()  # (before: the click ran it, on the UI thread)
    assert panel.isVisible() and panel.probabilities is None and panel.token_strip.canvas.values is None
    with qtbot.waitSignal(window.state.trace_changed, timeout=10_000):  # another text while the first is coloured
        window.state.set_text("a dog ran!")
    qtbot.waitUntil(lambda: len(threads) == 2, timeout=5000)
    release.set()
    qtbot.waitUntil(lambda: panel.probabilities is not None, timeout=5000)
    qtbot.wait(100)  # (the first text's colours, had they been kept, would land by now)
    ids = window.state.token_ids
    assert panel.token_strip.canvas.ids == ids
    with torch.no_grad():
        logits = window.state.loaded.model(torch.tensor([ids])).logits[0]
    expected = torch.softmax(logits.double(), -1)[torch.arange(len(ids) - 1), ids[1:]]
    assert len(panel.probabilities) == len(ids)
    assert torch.allclose(torch.tensor(panel.probabilities[1:], dtype=torch.float64), expected, atol=1e-5)
    assert panel.token_strip.canvas.values[1:] == panel.probabilities[1:]
    assert panel.count_label.text().count("perplexity") == 1


def test_model_without_tokenizer_takes_ids(qtbot, window, tmp_path):
    cfg = ModelConfig.gpt2(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=32)
    save_model_folder(new_model(cfg, seed=1), tmp_path / "no-tok")
    window.state.set_text("3 1 4 1 5")
    open_and_wait(qtbot, window, tmp_path / "no-tok")
    panel = window.panel("Model")
    assert panel.token_strip.canvas.ids == [3, 1, 4, 1, 5]
    assert "no tokenizer" in panel.summary_value("Vocabulary")


def test_broken_folder_shows_the_error_and_keeps_the_model(qtbot, window, models, tmp_path, monkeypatch):
    open_and_wait(qtbot, window, models["gpt2"])
    previous = window.state.loaded
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json", encoding="utf-8")
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text)))
    window.open_model(broken)
    qtbot.waitUntil(lambda: bool(shown), timeout=10000)
    title, text = shown[0]
    assert "config.json" in text and str(broken) in text
    assert "tiny-gpt2" in text  # says which model stays open
    assert window.state.loaded is previous
    assert window.panel("Model").summary_value("Path") == str(models["gpt2"])


def test_device_menu_lists_the_available_devices_and_switches(qtbot, window, models):
    open_and_wait(qtbot, window, models["gpt2"])
    assert list(window.device_actions) == available_devices()
    assert window.device_actions[window.state.device].isChecked()
    target = available_devices()[-1]  # CUDA or MPS when present, else CPU
    if target == window.state.device:
        window.state.device = "none"  # make the CPU action a real switch on CPU-only machines
    before = window.state.loaded
    with qtbot.waitSignal(window.state.device_changed, timeout=5000) as sig:
        window.device_actions[target].trigger()
    assert sig.args == [target]
    assert window.device_label.text() == f"device: {target}"
    moved = window.state.loaded
    assert moved.model.device.type == target.split(":")[0]
    assert window.device_actions[target].isChecked()
    # the move made a copy in a worker: the old model (maybe in use by a running job) stays as it was
    assert moved is not before and moved.model is not before.model
    assert before.model.device.type == "cpu"
    old, new = before.model.state_dict(), moved.model.state_dict()
    assert old.keys() == new.keys()
    for name in old:
        assert torch.equal(old[name], new[name].cpu())


def test_a_failed_device_switch_keeps_the_model_where_it_was(qtbot, window, models, monkeypatch):
    from desktop_app.ui import state as state_module

    open_and_wait(qtbot, window, models["gpt2"])
    before, device = window.state.loaded, window.state.device

    def out_of_memory(loaded, target):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(state_module, "_moved", out_of_memory)
    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: warnings.append(a[2]))
    with qtbot.waitSignal(window.state.device_failed, timeout=5000):
        window.state.set_device("elsewhere")
    assert window.state.device == device and window.state.loaded is before
    assert window.device_label.text() == f"device: {device}"
    assert window.device_actions[device].isChecked()
    assert warnings and "elsewhere" in warnings[0] and "out of memory" in warnings[0]


def test_drop_a_folder_opens_it(qtbot, window, models):
    open_and_wait(qtbot, window, models["gpt2"])
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(models["llama"]))])
    assert model_folder_from_mime(mime) == str(models["llama"])
    file_mime = QMimeData()
    file_mime.setUrls([QUrl.fromLocalFile(str(models["llama"] / "config.json"))])
    assert model_folder_from_mime(file_mime) == str(models["llama"])
    web = QMimeData()
    web.setUrls([QUrl("https://example.com/model")])
    assert model_folder_from_mime(web) is None
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.state.model_changed, timeout=10000) as sig:
        window.dropEvent(event)
    assert Path(sig.args[0].path) == models["llama"]
    assert event.isAccepted()


def test_recent_models_are_remembered(qtbot, window, models):
    open_and_wait(qtbot, window, models["gpt2"])
    open_and_wait(qtbot, window, models["llama"])
    assert app_settings.recent_models()[:2] == [str(models["llama"].resolve()), str(models["gpt2"].resolve())]
    window._fill_recent_menu()
    texts = [a.text() for a in window.recent_menu.actions()]
    assert texts[:2] == [str(models["llama"].resolve()), str(models["gpt2"].resolve())]


def test_a_panel_that_fails_to_import_shows_its_error_and_the_rest_works(qtbot, models):
    state = AppState()
    w = MainWindow(state, panels=[("Model", "desktop_app.ui.panels.model", "ModelPanel"),
                                  ("Broken", "desktop_app.ui.panels.no_such_panel", "Nope")])
    qtbot.addWidget(w)
    w.show_panel("Broken")
    assert w.slot("Broken").panel is None
    assert "no_such_panel" in w.slot("Broken").error
    w.show_panel("Model")
    open_and_wait(qtbot, w, models["gpt2"])
    assert w.panel("Model").summary_value("Layers") == "2"


def test_help_shows_the_current_panel_text(qtbot, window, monkeypatch):
    from desktop_app.ui import dialogs

    seen = []
    monkeypatch.setattr(dialogs.HelpDialog, "exec", lambda self: seen.append(self.browser.toPlainText()))
    window.show_panel("Model")
    window.help_action.trigger()
    assert seen and "grouped-query" in seen[0]
    shortcuts = [a.shortcut().toString() for a in window.shortcut_actions()]
    assert "Ctrl+O" in shortcuts and "F1" in shortcuts


def test_shortcuts_dialog_lists_window_and_panel_keys(qtbot, window, monkeypatch):
    from desktop_app.ui import dialogs

    seen = []

    def record(dialog):
        t = dialog.table
        seen.extend((t.item(r, 0).text(), t.item(r, 1).text()) for r in range(t.rowCount()))

    monkeypatch.setattr(dialogs.ShortcutsDialog, "exec", record)
    window.show_shortcuts()
    rows = dict(seen)
    assert rows.get("Generate: Step") == "Right" and rows.get("Generate: Back") == "Left"
    assert "Ctrl+O" in rows.values() and "F1" in rows.values()


def test_about_names_the_versions(qtbot, window, monkeypatch):
    import torch
    from PySide6.QtCore import qVersion

    seen = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: seen.append(text))
    window.about_action.trigger()
    assert torch.__version__ in seen[0] and qVersion() in seen[0] and "Device: cpu" in seen[0]


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(REPO))
    return env


def test_screenshot_writes_a_png_of_the_window(models, tmp_path):
    out = tmp_path / "shot.png"
    r = subprocess.run([sys.executable, "-m", "desktop_app", str(models["gpt2"]), "--screenshot", str(out),
                        "--size", "900x600", "--text", "abc"],
                       cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000
    image = QImage(str(out))
    assert (image.width(), image.height()) == (900, 600)
    # not a blank image: the window has text and chips, so many distinct colours
    colours = {image.pixel(x, y) for x in range(0, 900, 7) for y in range(0, 600, 7)}
    assert len(colours) > 5


def test_a_file_inside_a_model_folder_opens_that_folder(models, tmp_path):
    """What the desktop entry's %f passes when a user opens config.json with the app."""
    out = tmp_path / "shot.png"
    r = subprocess.run([sys.executable, "-m", "desktop_app", str(models["gpt2"] / "config.json"),
                        "--screenshot", str(out), "--text", "abc"],
                       cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000


def test_screenshot_of_a_broken_model_fails_with_a_message(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    r = subprocess.run([sys.executable, "-m", "desktop_app", str(broken), "--screenshot", str(tmp_path / "x.png")],
                       cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert str(broken) in r.stderr and "config.json" in r.stderr
    assert not (tmp_path / "x.png").exists()


def test_the_demo_model_opens_with_its_numbers(qtbot, window):
    from desktop_app.paths import demo_model_dir

    demo = demo_model_dir()
    if not (demo / "config.json").is_file():
        pytest.skip(f"the demo model is not built yet ({demo})")
    config = json.loads((demo / "config.json").read_text())
    window.state.set_text("Alice was beginning")
    open_and_wait(qtbot, window, demo)
    panel = window.panel("Model")
    assert panel.summary_value("Layers") == str(config["n_layer"])
    assert panel.summary_value("d_model") == str(config["n_embd"])
    assert panel.summary_value("Context length") == str(config["n_positions"])
    assert panel.token_strip.count() == len(window.state.token_ids) > 0


def test_export_current_view_saves_a_png_of_the_panel(qtbot, window, models, tmp_path, monkeypatch):
    from desktop_app.ui.widgets import export

    open_and_wait(qtbot, window, models["gpt2"])
    out = tmp_path / "view.png"
    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(out))
    window.show_panel("Model")
    window.export_action.trigger()
    image = QImage(str(out))
    panel = window.panel("Model")
    assert (image.width(), image.height()) == (panel.width(), panel.height())


def test_screenshot_waits_for_a_panel_demo(qtbot, window):
    import time

    from PySide6.QtCore import QTimer

    from desktop_app.ui.app import _run_panel_demo

    panel = window.panel("Model")
    done = []
    panel.screenshot_demo = lambda: QTimer.singleShot(300, lambda: done.append(True))
    panel.screenshot_ready = lambda: bool(done)
    assert _run_panel_demo(window, deadline=time.time() + 10)
    assert done == [True]
    panel.screenshot_ready = lambda: False  # a demo that never finishes: give up at the deadline
    start = time.time()
    assert not _run_panel_demo(window, deadline=time.time() + 0.5)
    assert 0.4 < time.time() - start < 5


def test_closing_the_window_stops_a_running_training_process(qtbot, window, monkeypatch):
    """Panels get their closeEvent when the window closes: the Train panel sends "stop" to its process
    (which then writes its checkpoint and exits) instead of leaving it to be killed."""
    from PySide6.QtCore import QProcess
    from PySide6.QtWidgets import QMessageBox

    # closing asks first while a run is in progress (test_quit_during_work.py): answer "stop it"
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))

    window.show_panel("Train")
    panel = window.current_slot().panel
    proc = QProcess(panel)
    # stands in for the train CLI's --control-stdin loop: exits 0 once it reads "stop"
    proc.start(sys.executable, ["-c", "import sys\nwhile sys.stdin.readline().strip() != 'stop': pass"])
    assert proc.waitForStarted(5000)
    panel.process = proc
    assert panel.running
    window.close()
    assert proc.state() == QProcess.ProcessState.NotRunning
    assert proc.exitStatus() == QProcess.ExitStatus.NormalExit and proc.exitCode() == 0

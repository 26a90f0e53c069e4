"""Workspaces: save/open round trip, automatic restore of the last session, preferences."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QMessageBox

from desktop_app.core.tokenizer import char_tokenizer
from tiny_models import save_tiny_model
from desktop_app.ui import settings as app_settings
from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState
from desktop_app.ui.workspace import Workspace, WorkspaceError, last_session_path, load_workspace, save_workspace

from .walkthrough import click_tab, run_app_main

TWO_PANELS = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
              ("Second", "desktop_app.ui.panels.model", "ModelPanel")]  # light panels: the test is about the shell


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws-models")
    return [save_tiny_model(root / f"m{i}", "abcdefghijklmnopqrstuvwxyz ", seed=i, d_model=16, n_layers=layers,
                            n_heads=2, d_ff=32) for i, layers in enumerate((1, 2))]


def make_window(qtbot) -> MainWindow:
    w = MainWindow(AppState(), panels=TWO_PANELS)
    qtbot.addWidget(w)
    w.show()
    return w


def test_workspace_json_round_trip_and_bad_files(tmp_path):
    ws = Workspace(model_path="/models/a", text="héllo\nwörld", panel="Attention", device="cpu",
                   geometry="AdnQywAD", window_state="")
    path = tmp_path / "w.json"
    save_workspace(path, ws)
    assert load_workspace(path) == ws
    assert json.loads(path.read_text(encoding="utf-8"))["format"] == "transformer-explorer-workspace"
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]  # no temporary file left behind

    cases = {
        "{ nope": "not valid JSON",
        json.dumps({"model_path": "/x"}): "not a Transformer Explorer workspace",
        json.dumps({"format": "transformer-explorer-workspace", "version": 99}): "newer",
        json.dumps({"format": "transformer-explorer-workspace", "version": 1, "text": 3}): "'text' should be a string",
    }
    for i, (content, problem) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(content, encoding="utf-8")
        with pytest.raises(WorkspaceError) as err:
            load_workspace(bad)
        assert str(bad) in str(err.value) and problem in str(err.value)
    (tmp_path / "latin1.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(WorkspaceError, match="not UTF-8"):
        load_workspace(tmp_path / "latin1.json")


def test_save_and_open_workspace_restores_model_text_panel_and_geometry(qtbot, model_dirs, tmp_path, monkeypatch):
    w1 = make_window(qtbot)
    w1.resize(700, 520)
    w1.state.set_text("abc de")
    with qtbot.waitSignal(w1.state.trace_changed, timeout=15000):
        w1.open_model(model_dirs[1])
    w1.show_panel("Second")
    path = tmp_path / "session.json"
    save_workspace(path, w1.capture_workspace())

    w2 = make_window(qtbot)
    w2.resize(500, 400)
    with qtbot.waitSignal(w2.state.trace_changed, timeout=15000):
        assert w2.open_workspace(path)
    assert Path(w2.state.loaded.path) == model_dirs[1]
    assert w2.state.text == "abc de"
    assert w2.panel("Model").text_edit.toPlainText() == "abc de"
    assert w2.current_slot().title == "Second"
    assert (w2.width(), w2.height()) == (700, 520)
    assert w2.state.token_ids == char_tokenizer("abcdefghijklmnopqrstuvwxyz ").encode("abc de")

    # a workspace whose model folder is gone: say so, keep the current model, restore the rest
    ws = load_workspace(path)
    ws.model_path, ws.text = str(tmp_path / "gone"), "xyz"
    save_workspace(path, ws)
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warned.append(text))
    assert w2.open_workspace(path)
    assert warned and "gone" in warned[0]
    assert Path(w2.state.loaded.path) == model_dirs[1] and w2.state.text == "xyz"


def test_the_last_session_comes_back_at_the_next_start(qtbot, model_dirs, monkeypatch):
    """Runs app.main() twice in this process: the first run's state is restored by the second."""
    from desktop_app.ui import app as app_module
    from desktop_app.ui import main_window

    monkeypatch.setattr(main_window, "PANELS", TWO_PANELS)
    save_workspace(last_session_path(), Workspace(model_path=str(model_dirs[0]), text="first text", panel="Second"))
    seen: dict = {}

    def drive(run: int, new_text: str | None) -> bool:
        windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()
                   and w.session_path is not None]
        state = windows[0].state if windows else None
        if state is None or state.loaded is None or state.trace is None:
            return False
        window = windows[0]
        seen[run] = (Path(state.loaded.path), state.text, window.current_slot().title)
        if new_text is not None:
            state.set_text(new_text)
            window.open_model(model_dirs[1])
            qtbot.waitUntil(lambda: Path(state.loaded.path) == model_dirs[1], timeout=10000)
            window.show_panel("Model")
        window.close()  # saves the session, and the event loop ends with the last window
        return True

    assert run_app_main(lambda: app_module.main([]), lambda: drive(1, "second text"), seen) == 0, seen
    assert seen[1] == (model_dirs[0], "first text", "Second")

    assert run_app_main(lambda: app_module.main([]), lambda: drive(2, None), seen) == 0, seen
    assert seen[2] == (model_dirs[1], "second text", "Model")
    saved = load_workspace(last_session_path())
    assert saved.model_path == str(model_dirs[1]) and saved.geometry


def test_preferences_are_saved_and_applied(qtbot):
    from desktop_app.ui.dialogs import PreferencesDialog

    app = QApplication.instance()
    base_size, base_style = app.font().pointSize(), app.style().name()
    w = make_window(qtbot)
    dialog = PreferencesDialog(app_settings.Preferences.load(), ["cpu"])
    assert dialog.preferences() == app_settings.Preferences()  # defaults on a fresh profile
    dialog.theme.setCurrentText("dark")
    dialog.font_size.setValue(base_size + 3)
    dialog.dtype.setCurrentText("bfloat16")
    dialog.restore_session.setChecked(False)
    prefs = dialog.preferences()
    try:
        w.apply_preferences(prefs, save=True)
        assert app_settings.Preferences.load() == prefs
        assert app.palette().color(QPalette.ColorRole.Window).lightness() < 80
        assert app.font().pointSize() == base_size + 3
        assert w.state.dtype == "bfloat16"
        w.apply_preferences(app_settings.Preferences(theme="light"))
        assert app.palette().color(QPalette.ColorRole.Window).lightness() > 180
        assert w.state.dtype is None  # auto: the model's own dtype
    finally:
        w.apply_preferences(app_settings.Preferences())
    assert app.font().pointSize() == base_size
    assert app.style().name() == base_style  # "system" gives the system's style back, not Fusion


def test_sigterm_closes_the_app_normally_and_saves_the_session(model_dirs, tmp_path, spawn):
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "d"),
               XDG_CONFIG_HOME=str(tmp_path / "c"), PYTHONPATH=str(repo))
    proc = spawn([sys.executable, "-m", "desktop_app", str(model_dirs[0]), "--text", "from the terminal"],
                 cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # killed in teardown
    ini = tmp_path / "c" / "transformer-explorer" / "Transformer Explorer.ini"
    deadline = time.time() + 60
    while not (ini.is_file() and "recent_models" in ini.read_text()) and time.time() < deadline:
        time.sleep(0.2)  # the recent-models entry is written once the model has loaded
        assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    session = load_workspace(tmp_path / "d" / "transformer-explorer" / "last-session.json")
    assert session.model_path == str(model_dirs[0]) and session.text == "from the terminal"


INSPECT_PANELS = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
                  ("Attention", "desktop_app.ui.panels.attention", "AttentionPanel"),
                  ("Layers", "desktop_app.ui.panels.layers", "LayersPanel")]


def test_workspace_restores_the_attention_and_layers_view_states(qtbot, model_dirs, tmp_path):
    w1 = _text_window(qtbot, model_dirs[1], INSPECT_PANELS)  # 2 layers x 2 heads
    w1.show_panel("Attention")
    att = w1.panel("Attention")
    qtbot.waitUntil(lambda: att.stats is not None, timeout=15000)
    click_tab(qtbot, att.tabs, "Head statistics")
    qtbot.keyClick(att.stat_combo, Qt.Key.Key_Down)
    click_tab(qtbot, att.tabs, "Heatmap")
    qtbot.keyClick(att.layer_spin, Qt.Key.Key_Up)
    qtbot.keyClick(att.head_spin, Qt.Key.Key_Up)
    qtbot.mouseClick(att.tokens.canvas, Qt.MouseButton.LeftButton, pos=att.tokens.chip_center(4))
    w1.show_panel("Layers")
    lay = w1.panel("Layers")
    qtbot.waitUntil(lambda: lay.result is not None, timeout=15000)
    click_tab(qtbot, lay.tabs, "PCA")
    lay.depth_slider.setFocus()
    qtbot.keyClick(lay.depth_slider, Qt.Key.Key_Right)
    qtbot.mouseClick(lay.tokens.canvas, Qt.MouseButton.LeftButton, pos=lay.tokens.chip_center(2))
    path = tmp_path / "views.json"
    save_workspace(path, w1.capture_workspace())
    saved = json.loads(path.read_text(encoding="utf-8"))["views"]
    assert saved["Attention"] == {"view": "attention", "layer": 1, "head": 1, "statistic": "mean_distance",
                                  "selected_token": 4, "kind": "encoder"}  # (kind: an encoder-decoder's, issue 28)
    assert saved["Layers"] == {"view": "pca", "depth": 1, "selected_token": 2, "stack": "decoder"}  # (stack: seq2seq)

    w2 = MainWindow(AppState(), panels=INSPECT_PANELS)
    qtbot.addWidget(w2)
    w2.show()
    with qtbot.waitSignal(w2.state.trace_changed, timeout=15000):
        assert w2.open_workspace(path)
    lay2 = w2.panel("Layers")  # the workspace's current panel: built, then given its view state
    qtbot.waitUntil(lambda: lay2.result is not None, timeout=15000)
    assert lay2.tabs.tabText(lay2.tabs.currentIndex()) == "PCA"
    assert lay2.depth_slider.value() == 1 and lay2.depth_label.text() == "depth: L0"
    assert lay2.selected_token == 2 and lay2.pca_view.depth == 1
    x, y = lay2.pca_view.selected_point.getData()
    np.testing.assert_allclose([x[0], y[0]], lay2.result.pca.coords[1, 2], atol=1e-6)
    att2 = w2.panel("Attention")  # built after the workspace was opened: its pending view state applies
    qtbot.waitUntil(lambda: att2.stats is not None, timeout=15000)
    assert att2.tabs.tabText(att2.tabs.currentIndex()) == "Heatmap"
    assert (att2.layer_spin.value(), att2.head_spin.value()) == (1, 1)
    assert att2.stat_combo.currentData() == "mean_distance"
    assert att2.selected_token == 4 and att2.heatmap.row_box.isVisible() and att2.heatmap.row_box.rect().top() == 4
    np.testing.assert_allclose(att2.heatmap.values, w2.state.trace["blocks.1.attn.pattern"][0, 1].numpy())
    assert att2.export_bar is not None and att2._export_name() == "attention-L1-H1"


def test_view_states_from_other_versions_are_read_tolerantly(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"format": "transformer-explorer-workspace", "version": 1, "text": "x",
                                "views": {"Attention": {"layer": 1, "head": "two", "future": 3, "view": "nope"},
                                          "Layers": 7}}), encoding="utf-8")
    ws = load_workspace(path)
    assert ws.views == {"Attention": {"layer": 1, "head": "two", "future": 3, "view": "nope"}}
    from desktop_app.core.views import attention as attention_views
    from desktop_app.core.views import state_from_dict

    vs = state_from_dict(attention_views.AttentionViewState, ws.views["Attention"], attention_views.VIEWS)
    assert vs == attention_views.AttentionViewState(layer=1)
    path.write_text(json.dumps({"format": "transformer-explorer-workspace", "version": 1}), encoding="utf-8")
    assert load_workspace(path).views == {}  # an older file: no view states


FORM_PANELS = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
               ("Lipschitz", "desktop_app.ui.panels.lipschitz", "LipschitzPanel"),
               ("Train", "desktop_app.ui.panels.training", "TrainingPanel")]


def _type_into(qtbot, widget, text: str) -> None:
    """Select what a line edit or spin box shows and type over it, as a person does."""
    widget.setFocus()
    qtbot.keyClick(widget, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(widget, text)
    qtbot.keyClick(widget, Qt.Key.Key_Tab)


def test_workspace_restores_the_lipschitz_and_train_forms(qtbot, model_dirs, tmp_path):
    w1 = MainWindow(AppState(), panels=FORM_PANELS)
    qtbot.addWidget(w1)
    w1.show()
    with qtbot.waitSignal(w1.state.trace_changed, timeout=15000):
        w1.open_model(model_dirs[1])  # 2 layers x 2 heads, causal
    w1.show_panel("Lipschitz")
    lip = w1.panel("Lipschitz")
    # the synthetic head's rows first (shown once chosen), then back to the model's layer
    qtbot.keyClick(lip.source, Qt.Key.Key_Down)
    _type_into(qtbot, lip.d, "8")
    _type_into(qtbot, lip.seed, "3")
    qtbot.keyClick(lip.attention, Qt.Key.Key_Down)  # l2
    qtbot.keyClick(lip.source, Qt.Key.Key_Up)
    qtbot.keyClick(lip.layer, Qt.Key.Key_Up)
    qtbot.keyClick(lip.head, Qt.Key.Key_Down)
    qtbot.keyClick(lip.head, Qt.Key.Key_Down)  # head 1
    qtbot.keyClick(lip.data, Qt.Key.Key_Down)  # adversarial
    qtbot.keyClick(lip.masked, Qt.Key.Key_Space)  # unmasked
    _type_into(qtbot, lip.lengths, "4,8,16")
    _type_into(qtbot, lip.samples, "2")
    _type_into(qtbot, lip.radius, "1.5")
    w1.show_panel("Train")
    train = w1.panel("Train")
    train.task.setFocus()
    for _ in range(4):
        qtbot.keyClick(train.task, Qt.Key.Key_Down)  # modadd
    _type_into(qtbot, train.steps, "300")
    _type_into(qtbot, train.layers, "3")
    _type_into(qtbot, train.lr, "0.005")
    path = tmp_path / "forms.json"
    save_workspace(path, w1.capture_workspace())
    saved = json.loads(path.read_text(encoding="utf-8"))["views"]
    assert saved["Lipschitz"] == {"function": "model", "layer": 1, "stack": "", "head": 1, "data": "adversarial",
                                  "search_start": "random", "text_file": "", "d": 8, "norm_A": 1.0, "norm_V": 1.0,
                                  "matrices_file": "", "attention": "l2", "synthetic_data": "random", "seed": 3,
                                  "masked": False, "radius": 1.5, "lengths": "4,8,16", "samples": 2}
    assert saved["Train"]["task"] == "modadd" and saved["Train"]["steps"] == 300 and saved["Train"]["lr"] == 0.005
    assert saved["Train"]["model"]["n_layers"] == 3

    w2 = MainWindow(AppState(), panels=FORM_PANELS)
    qtbot.addWidget(w2)
    w2.show()
    with qtbot.waitSignal(w2.state.trace_changed, timeout=15000):
        assert w2.open_workspace(path)  # the Train panel is current: built at once; its model opens after
    train2 = w2.panel("Train")
    assert (train2.task.currentText(), train2.steps.value(), train2.layers.value()) == ("modadd", 300, 3)
    assert train2.lr.value() == pytest.approx(0.005)
    assert train2.config() == train.config()
    w2.show_panel("Lipschitz")  # built now, with the model open: its pending form applies
    lip2 = w2.panel("Lipschitz")
    assert lip2.source.currentText() == "Model layer" and lip2.layer.value() == 1
    assert lip2.head.currentText() == "head 1" and lip2.data.currentIndex() == 1
    assert not lip2.masked.isChecked() and lip2.lengths.text() == "4,8,16"
    assert (lip2.samples.value(), lip2.radius.value(), lip2.d.value(), lip2.seed.value()) == (2, 1.5, 8, 3)
    assert lip2.attention.currentText() == "l2"
    assert lip2.view_state == lip.view_state
    spec = lip2.spec()
    assert (spec.layer, spec.head, spec.masked, spec.samples) == (1, 1, False, 2)


def test_a_lipschitz_form_restored_before_its_model_arrives_survives_the_model(qtbot, model_dirs):
    from desktop_app.core.views.lipschitz import LipschitzViewState
    from desktop_app.ui.panels.lipschitz import LipschitzPanel

    state = AppState()
    panel = LipschitzPanel(state)
    qtbot.addWidget(panel)
    panel.set_view_state(LipschitzViewState(layer=1, head=0, masked=False, lengths="4,8"))
    assert panel.layer.value() == 0  # no model yet: no layer 1 to show
    with qtbot.waitSignal(state.model_changed, timeout=15000):
        state.open_model(model_dirs[1])  # a new model resets the model rows: the restored ones come back
    assert (panel.layer.value(), panel.head.currentText(), panel.masked.isChecked()) == (1, "head 0", False)
    assert panel.source.currentText() == "Model layer" and panel.lengths.text() == "4,8"


def test_form_states_from_other_versions_are_read_tolerantly():
    from desktop_app.core.training.trainer import TrainConfig
    from desktop_app.core.views import state_from_dict
    from desktop_app.core.views.lipschitz import LipschitzViewState
    from desktop_app.core.views.training import config_from_dict

    vs = state_from_dict(LipschitzViewState, {"layer": 2, "head": "one", "radius": 2, "norm_A": "big",
                                              "samples": -1, "future": True, "masked": 1})
    assert vs == LipschitzViewState(layer=2, radius=2.0)
    cfg = config_from_dict({"task": "sort", "lr": "fast", "steps": 20, "future": 1, "grad_clip": None,
                            "model": {"n_layers": "two", "d_model": 8, "later": 1}, "task_options": [1]})
    assert cfg == TrainConfig(task="sort", steps=20, grad_clip=None, model={"d_model": 8})
    assert config_from_dict("nonsense") == TrainConfig()


TEXT_PANELS = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
               ("Generate", "desktop_app.ui.panels.generation", "GenerationPanel"),
               ("What if", "desktop_app.ui.panels.whatif", "WhatIfPanel"),
               ("Dynamics", "desktop_app.ui.panels.dynamics", "DynamicsPanel")]


def _window(qtbot, panels) -> MainWindow:
    w = MainWindow(AppState(), panels=panels)
    qtbot.addWidget(w)
    w.show()
    return w


def _text_window(qtbot, model_dir, panels=None) -> MainWindow:
    """A window of `panels` (the text panels) with model_dir open and "abc de" traced."""
    w = _window(qtbot, panels or TEXT_PANELS)
    w.state.set_text("abc de")
    with qtbot.waitSignal(w.state.trace_changed, timeout=15000):
        w.open_model(model_dir)
    return w


def _save_and_reopen(qtbot, w1, path, panels) -> MainWindow:
    """Save w1's workspace as File > Save Workspace does, open it in a new window (its model loads)."""
    save_workspace(path, w1.capture_workspace())
    w2 = _window(qtbot, panels)
    with qtbot.waitSignal(w2.state.model_changed, timeout=15000):
        assert w2.open_workspace(path)
    return w2


def _press(qtbot, widget, key, times: int = 1) -> None:
    widget.setFocus()
    for _ in range(times):
        qtbot.keyClick(widget, key)


def test_workspace_restores_the_generate_settings(qtbot, model_dirs, tmp_path):
    w1 = _text_window(qtbot, model_dirs[0])
    w1.show_panel("Generate")
    gen = w1.panel("Generate")
    _type_into(qtbot, gen.prompt, "ab ba")
    _press(qtbot, gen.strategy, Qt.Key.Key_Down, 4)  # beam
    _press(qtbot, gen.temperature, Qt.Key.Key_PageDown, 2)  # 1.00 -> 0.80
    _press(qtbot, gen.top_k, Qt.Key.Key_Right, 5)
    _press(qtbot, gen.top_p, Qt.Key.Key_PageDown)  # 1.00 -> 0.90
    _type_into(qtbot, gen.beams, "3")
    _type_into(qtbot, gen.seed, "42")
    _type_into(qtbot, gen.run_n, "7")
    _type_into(qtbot, gen.length_penalty, "1.5")
    _press(qtbot, gen.early_stopping, Qt.Key.Key_Down, 2)  # false -> true -> never
    w1.show_panel("Model")  # Generate is built later in the new window, with the model open
    path = tmp_path / "generate.json"
    w2 = _save_and_reopen(qtbot, w1, path, TEXT_PANELS)
    assert json.loads(path.read_text(encoding="utf-8"))["views"]["Generate"] == {
        "prompt": "ab ba", "strategy": "beam", "temperature": 0.8, "top_k": 5, "top_p": 0.9, "beams": 3,
        "seed": 42, "run_n": 7, "length_penalty": 1.5, "early_stopping": "never"}
    w2.show_panel("Generate")
    gen2 = w2.panel("Generate")
    assert gen2.prompt.text() == "ab ba" and gen2.strategy.currentText() == "beam"
    assert (gen2.temperature.value(), gen2.top_k.value(), gen2.top_p.value()) == (80, 5, 90)
    assert (gen2.beams.value(), gen2.seed.value(), gen2.run_n.value()) == (3, 42, 7)
    assert (gen2.length_penalty.value(), gen2.early_stopping.currentText()) == (1.5, "early stop never")
    assert gen2.settings() == gen.settings() and gen2.top_k_label.text() == "top-k 5"
    assert gen2.session is None  # the settings, not a generation


def test_workspace_restores_the_what_if_inputs(qtbot, model_dirs, tmp_path):
    w1 = _text_window(qtbot, model_dirs[0])
    w1.show_panel("What if")
    wi = w1.panel("What if")
    _type_into(qtbot, wi.position_spin, "3")
    _type_into(qtbot, wi.token_edit, "d")
    click_tab(qtbot, wi.tabs, "Steer")
    _type_into(qtbot, wi.towards_edit, "abc")
    _type_into(qtbot, wi.away_edit, "de")
    _type_into(qtbot, wi.steer_layer_spin, "0")
    _press(qtbot, wi.scale_slider, Qt.Key.Key_PageDown, 3)  # 4.0 - 3
    click_tab(qtbot, wi.tabs, "Activation patching")
    _type_into(qtbot, wi.clean_edit, "abc ed")
    _type_into(qtbot, wi.corrupted_edit, "abd ed")
    _type_into(qtbot, wi.answer_edit, "e")
    _type_into(qtbot, wi.wrong_edit, "a")
    path = tmp_path / "whatif.json"
    w2 = _save_and_reopen(qtbot, w1, path, TEXT_PANELS)  # What if is current: restored before its model
    assert json.loads(path.read_text(encoding="utf-8"))["views"]["What if"] == {
        "tab": "patching", "position": 3, "token": "d", "clean": "abc ed", "corrupted": "abd ed",
        "answer": "e", "wrong": "a", "steer_towards": "abc", "steer_away": "de", "steer_layer": 0,
        "steer_scale": 1.0}
    wi2 = w2.panel("What if")
    assert wi2.tabs.tabText(wi2.tabs.currentIndex()) == "Activation patching"
    assert (wi2.position_spin.value(), wi2.token_edit.text()) == (3, "d")
    assert (wi2.clean_edit.text(), wi2.corrupted_edit.text()) == ("abc ed", "abd ed")  # not the model's text
    assert (wi2.answer_edit.text(), wi2.wrong_edit.text()) == ("e", "a")
    assert (wi2.towards_edit.text(), wi2.away_edit.text(), wi2.steer_layer_spin.value(), wi2.scale) == \
        ("abc", "de", 0, 1.0)
    assert wi2.patching is None  # inputs, not results
    # shown, the panel attributes as a first look does, with the restored position and token
    qtbot.waitUntil(lambda: wi2.dla_chart.attribution is not None, timeout=15000)
    d = wi2.state.loaded.tokenizer.encode("d")[0]
    assert (wi2.dla_chart.attribution.position, wi2.dla_chart.attribution.token_id) == (3, d)
    wi2.set_view_state(type(wi2.view_state)())  # "last" shows again for no position
    assert wi2.position_spin.text() == "last"


def test_workspace_restores_the_dynamics_form_without_running_it(qtbot, model_dirs, tmp_path):
    w1 = _window(qtbot, TEXT_PANELS)
    with qtbot.waitSignal(w1.state.trace_changed, timeout=15000):
        w1.open_model(model_dirs[1])  # 2 layers x 2 heads, d_model 16
    w1.show_panel("Dynamics")
    dyn = w1.panel("Dynamics")
    _press(qtbot, dyn.attention, Qt.Key.Key_Down)  # l2
    _press(qtbot, dyn.init, Qt.Key.Key_Down, 2)  # Gaussian
    _type_into(qtbot, dyn.covariance, "2")
    _type_into(qtbot, dyn.n, "50")
    _press(qtbot, dyn.qkv, Qt.Key.Key_Down)  # random
    _type_into(qtbot, dyn.norm_qk, "0.5")
    _type_into(qtbot, dyn.norm_v, "2")
    _press(qtbot, dyn.qkv, Qt.Key.Key_Down, 2)  # a head of the loaded model: d follows it
    _press(qtbot, dyn.model_layer, Qt.Key.Key_Up)
    _press(qtbot, dyn.model_head, Qt.Key.Key_Up)
    for box in (dyn.time_dependent, dyn.sphere, dyn.renormalise, dyn.twin, dyn.view3d, dyn.trails):
        _press(qtbot, box, Qt.Key.Key_Space)  # renormalise is enabled once the sphere is off
    _press(qtbot, dyn.integrator, Qt.Key.Key_Down)  # rk4
    _type_into(qtbot, dyn.dt, "0.05")
    _type_into(qtbot, dyn.steps_per_frame, "3")
    _type_into(qtbot, dyn.record_every, "5")
    _type_into(qtbot, dyn.cluster_tol, "0.1")
    _type_into(qtbot, dyn.seed, "7")
    path = tmp_path / "dynamics.json"
    w2 = _save_and_reopen(qtbot, w1, path, TEXT_PANELS)  # Dynamics is current: its form comes before the model
    assert json.loads(path.read_text(encoding="utf-8"))["views"]["Dynamics"] == {
        "attention": "l2", "d": 16, "n": 50, "init": "gaussian", "covariance": "2", "n_clusters": 3,
        "token_layer": 0, "qkv": "model", "norm_qk": 0.5, "norm_v": 2.0, "matrices_file": "", "model_layer": 1,
        "model_head": 1, "time_dependent": True, "sphere": False, "renormalise": True, "twin": True,
        "integrator": "rk4", "dt": 0.05, "steps_per_frame": 3, "record_every": 5, "cluster_tol": 0.1, "seed": 7,
        "view_3d": False, "trails": True, "stack": "encoder"}
    dyn2 = w2.panel("Dynamics")
    assert dyn2.view_state == dyn.view_state
    assert (dyn2.model_layer.value(), dyn2.model_head.value()) == (1, 1)  # not clamped to the no-model 0
    assert dyn2.init.currentText() == "Gaussian" and dyn2.covariance.isEnabled() and not dyn2.n_clusters.isEnabled()
    assert dyn2.renormalise.isEnabled() and dyn2.model_layer.isEnabled() and not dyn2.norm_qk.isEnabled()
    (cfg, cfg2), no_cov = (dyn.config(), dyn2.config()), {"covariance": None}
    np.testing.assert_array_equal(cfg2.covariance, cfg.covariance)  # 2 I, 16 x 16
    assert dataclasses.replace(cfg2, **no_cov) == dataclasses.replace(cfg, **no_cov)
    assert dyn2.sim is None and dyn2._frames == [] and not dyn2.play_button.isChecked()  # not run


def test_workspace_restores_the_image_choices(qtbot, tmp_path):
    from digit_vit import skip_without_digits

    skip_without_digits()
    from digit_vit import save_digit_vit

    vit = save_digit_vit(tmp_path / "vit", labels=False)
    panels = [("Model", "desktop_app.ui.panels.model", "ModelPanel"),
              ("Image", "desktop_app.ui.panels.image", "ImagePanel")]
    w1 = _window(qtbot, panels)
    with qtbot.waitSignal(w1.state.model_changed, timeout=15000):
        w1.open_model(vit)
    w1.show_panel("Image")
    img = w1.panel("Image")
    qtbot.waitUntil(lambda: img.result is not None, timeout=20000)
    _type_into(qtbot, img.digit, "5")
    qtbot.waitUntil(lambda: "#5" in img.source_label.text(), timeout=20000)
    _press(qtbot, img.layer, Qt.Key.Key_Up)
    qtbot.mouseClick(img.canvas, Qt.MouseButton.LeftButton, pos=img.canvas.patch_center(9))
    click_tab(qtbot, img.tabs, "Position similarity")
    path = tmp_path / "image.json"
    w2 = _save_and_reopen(qtbot, w1, path, panels)  # Image is current: restored before its ViT opens
    assert json.loads(path.read_text(encoding="utf-8"))["views"]["Image"] == {
        "digit": 5, "layer": 1, "patch": 9, "tab": "position_similarity"}
    img2 = w2.panel("Image")
    qtbot.waitUntil(lambda: img2.result is not None and "#5" in img2.source_label.text(), timeout=20000)
    assert (img2.digit.value(), img2.layer.value(), img2.canvas.selected) == (5, 1, 9)
    assert img2.tabs.tabText(img2.tabs.currentIndex()) == "Position similarity"
    assert "layer 1: attention from patch (2, 1)" in img2.heads_view.mosaic.caption
    np.testing.assert_allclose(img2.query_weights(), img2.result["patterns"][1, :, 10, 1:].reshape(3, 4, 4))
    img2.set_view_state(type(img2.view_state)(patch=99))  # a patch this 4 x 4 grid lacks: [CLS]
    assert img2.canvas.selected is None


def test_panel_view_states_from_other_versions_are_read_tolerantly():
    from desktop_app.core.views import state_from_dict
    from desktop_app.core.views.dynamics import DynamicsViewState
    from desktop_app.core.views.generation import GenerationViewState
    from desktop_app.core.views.image import ImageViewState
    from desktop_app.core.views.whatif import WhatIfViewState

    assert state_from_dict(GenerationViewState, {"prompt": 3, "top_p": 0.5, "later": 1, "beams": "two"}) == \
        GenerationViewState(top_p=0.5)
    assert state_from_dict(WhatIfViewState, {"position": -2, "clean": "x", "tab": 1}) == WhatIfViewState(clean="x")
    assert state_from_dict(WhatIfViewState, {"steer_scale": -2, "steer_layer": -1, "steer_away": 3}) == \
        WhatIfViewState(steer_scale=-2.0)  # a negative scale steers the other way; a layer is >= 0
    assert state_from_dict(DynamicsViewState, {"sphere": 0, "dt": "fast", "n": 9}) == DynamicsViewState(n=9)
    assert state_from_dict(ImageViewState, {"patch": None, "layer": True}) == ImageViewState()


@pytest.mark.parametrize("content, problem", [
    (json.dumps({"format": "transformer-explorer-workspace", "version": 1, "geometry": "AdnQ\u00e9"}),
     "'geometry' should be base64"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    (json.dumps({"format": "transformer-explorer-workspace", "version": 1, "window_state": "\u00fc"}),
     "'window_state' should be base64"),
])
def test_open_workspace_refuses_a_poisoned_file_in_one_line_and_keeps_the_model(qtbot, model_dirs, tmp_path,
                                                                                  monkeypatch, content, problem):
    """Issue 25 §3: File > Open Workspace on a file that once raised UnicodeEncodeError / RecursionError."""
    from PySide6.QtWidgets import QFileDialog

    w = make_window(qtbot)
    w.state.set_text("abc de")
    with qtbot.waitSignal(w.state.trace_changed, timeout=15000):
        w.open_model(model_dirs[0])
    path = tmp_path / "poisoned.json"
    path.write_text(content, encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))
    said = []
    monkeypatch.setattr(QMessageBox, "critical", staticmethod(lambda parent, title, text: said.append(text)))
    w.open_workspace_action.trigger()  # File > Open Workspace…
    assert len(said) == 1 and str(path) in said[0] and problem in said[0] and "\n" not in said[0], said
    assert Path(w.state.loaded.path) == model_dirs[0] and w.state.text == "abc de" and w.isVisible()
    assert path.read_text(encoding="utf-8") == content  # the user's own file: left where it is


def _change_every_box(qtbot, panel) -> None:
    """Give every option box of the Train form that the chosen task shows a value other than its own, as a
    person does: a combo box one item down (or up, at the end), a spin box typed over, a path typed in."""
    from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

    qtbot.keyClick(panel.family, Qt.Key.Key_Down if panel.family.currentIndex() + 1 < panel.family.count()
                   else Qt.Key.Key_Up)  # first: a family resets the switches that follow from it
    forms = [(panel.model_form, panel.form._model_boxes), (panel.task_form, panel.form._task_rows),
             (None, panel.form._run_boxes)]
    for form, boxes in forms:
        for name, box in boxes.items():
            if name == "model_kind" or (form is not None and not form.isRowVisible(box)):
                continue  # the MLP baseline's choice is the launch's (--baseline), not a setting
            if isinstance(box, QComboBox):
                box.setFocus()
                qtbot.keyClick(box, Qt.Key.Key_Down if box.currentIndex() + 1 < box.count() else Qt.Key.Key_Up)
            elif isinstance(box, (QSpinBox, QDoubleSpinBox)):
                lo, step = box.minimum(), box.singleStep()
                value = lo + step if abs(box.value() - (lo + step)) > 1e-12 else lo + 2 * step
                text = str(int(value)) if isinstance(box, QSpinBox) else f"{value:.{box.decimals()}f}"
                _type_into(qtbot, box, text)
                assert box.value() == pytest.approx(value), name
            else:  # a path's row: its line edit
                _type_into(qtbot, box.findChild(QLineEdit), f"/data/{name}")


@pytest.mark.parametrize("task", ["motif", "sort", "translate", "modadd", "induction", "text", "image-folder",
                                  "digits"])
def test_a_saved_workspace_keeps_every_training_option(qtbot, tmp_path, task):
    """Every option the Train form shows for a task (the image-folder task's folder, channels, image size and
    patch size too), set by typing and clicking, comes back in a new window from a saved workspace."""
    panels = [("Train", "desktop_app.ui.panels.training", "TrainingPanel")]
    w1 = MainWindow(AppState(), panels=panels)
    qtbot.addWidget(w1)
    w1.show()
    w1.show_panel("Train")
    train = w1.panel("Train")
    train.task.setFocus()
    while train.task.currentText() != task:
        qtbot.keyClick(train.task, Qt.Key.Key_Down)
    _change_every_box(qtbot, train)
    if task == "text":  # the BPE vocabulary shows once the BPE tokenizer is chosen
        assert train.tokenizer.currentText() == "bpe"
        _type_into(qtbot, train.vocab_size, "1000")
    cfg = train.config()
    path = tmp_path / "train.json"
    save_workspace(path, w1.capture_workspace())

    w2 = MainWindow(AppState(), panels=panels)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.open_workspace(path)
    train2 = w2.panel("Train")
    assert train2.config() == cfg
    assert cfg.model.get("patch_size" if task in ("image-folder", "digits") else "context_length") is not None
    if task == "image-folder":
        assert set(cfg.task_options) == {"image_folder", "channels", "image_size"}
        assert (train2.image_folder.text(), train2.channels.currentText(), train2.image_size.value(),
                train2.patch_size.value()) == ("/data/image_folder", "1", 1, 3)


def test_a_saved_workspace_keeps_the_dictionary_mode_and_every_dictionary_setting(qtbot, tmp_path):
    """The Train panel's mode (a sparse dictionary) and every box of its dictionary form, set by typing and
    clicking, come back in a new window from a saved workspace; the model form's settings stay beside them."""
    from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

    panels = [("Train", "desktop_app.ui.panels.training", "TrainingPanel")]
    w1 = MainWindow(AppState(), panels=panels)
    qtbot.addWidget(w1)
    w1.show()
    w1.show_panel("Train")
    train = w1.panel("Train")
    _type_into(qtbot, train.steps, "300")  # the model form's own, kept too
    train.mode.setFocus()
    qtbot.keyClick(train.mode, Qt.Key.Key_Down)
    assert train.dictionary_mode
    f = train.dictionary.form
    _type_into(qtbot, f.hook.lineEdit(), "blocks.1.hook_resid_mid")
    _type_into(qtbot, f.hook_out.lineEdit(), "blocks.1.hook_mlp_out")
    _type_into(qtbot, f.text_file, "/data/alice.txt")
    _type_into(qtbot, f.out_edit, "/data/runs")
    boxes = [f.d_sae, f.k, f.max_tokens, f.steps, f.batch_size, f.lr, f.seed, f.eval_every, f.checkpoint_every]
    for box in boxes + [f.l1_coefficient]:
        if box is f.l1_coefficient:  # shown for relu: one item down from topk
            f.architecture.setFocus()
            qtbot.keyClick(f.architecture, Qt.Key.Key_Down)
            assert f.architecture.currentText() == "relu" and f.l1_coefficient.isVisibleTo(f)
        value = box.minimum() + 2 * box.singleStep() if box.value() != box.minimum() + 2 * box.singleStep() \
            else box.minimum() + 3 * box.singleStep()
        _type_into(qtbot, box, str(int(value)) if isinstance(box, QSpinBox) else f"{value:.{box.decimals()}f}")
        assert box.value() == pytest.approx(value), box.toolTip()
        assert isinstance(box, (QSpinBox, QDoubleSpinBox))
    settings, model_cfg = f.config(), train.config()
    assert settings.hook_out == "blocks.1.hook_mlp_out" and settings.text_file == "/data/alice.txt"
    path = tmp_path / "train.json"
    save_workspace(path, w1.capture_workspace())

    w2 = MainWindow(AppState(), panels=panels)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.open_workspace(path)
    train2 = w2.panel("Train")
    assert train2.dictionary_mode and train2.mode.currentText() == "a sparse dictionary"
    assert train2.settings_stack.currentWidget().widget() is train2.dictionary.form
    assert train2.dictionary.form.config() == settings and train2.dictionary.form.out_edit.text() == "/data/runs"
    assert train2.config() == model_cfg and train2.steps.value() == 300
    assert train2.dictionary.form.architecture.currentText() == "relu"


def test_a_workspace_of_an_older_app_or_a_hand_edit_opens_the_train_panel_in_model_mode(qtbot, tmp_path):
    """A saved Train view without a mode (an older app), or with a mode and dictionary settings of the wrong kind,
    opens: the model mode, the dictionary form's defaults where a setting was wrong."""
    panels = [("Train", "desktop_app.ui.panels.training", "TrainingPanel")]
    for extra, dictionary_mode, k in (({}, False, 16),
                                      ({"mode": "a toaster", "dictionary": {"d_sae": "many", "k": 7, "hook_out": 3}},
                                       False, 7),
                                      ({"mode": "sparse dictionary", "dictionary": ["not", "a", "dict"]}, True, 16)):
        path = tmp_path / "old.json"
        save_workspace(path, Workspace(panel="Train", views={"Train": {"steps": 250, **extra}}))
        w = MainWindow(AppState(), panels=panels)
        qtbot.addWidget(w)
        w.show()
        assert w.open_workspace(path)
        train = w.panel("Train")
        assert train.steps.value() == 250
        assert train.dictionary_mode == dictionary_mode
        f = train.dictionary.form
        assert f.d_sae.value() == 512 and f.k.value() == k
        assert f.hook_out.currentText() == "none (a sparse autoencoder)"

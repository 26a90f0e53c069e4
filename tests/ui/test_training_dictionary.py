"""Train panel, dictionary mode (issue 29): a sparse dictionary trained on the loaded model's activations over a
text file, in a worker, with live plots, Pause / Resume / Stop, saved in SAELens' format and opened in the
Features panel. Every action is a click or typing on the real widgets."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QToolButton

from desktop_app.app.features import train_dictionary
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.features import load_dictionary
from desktop_app.core.training.sae import sae_checkpoint_step
from desktop_app.paths import resources_dir
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from desktop_app.ui.workers import active_jobs

from .walkthrough import open_window

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "alice.txt"
    path.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:4000], encoding="utf-8")
    return path


@pytest.fixture
def demo_panel(qtbot, isolated_user_files):
    state = AppState()
    state.set_model(load_model_folder(resources_dir() / "demo-model"))
    panel = TrainingPanel(state)
    qtbot.addWidget(panel)
    panel.show()
    yield panel
    # qtbot deletes the panel first: its run's worker, cancelled with it (workers.run_job's owner), must end
    qtbot.waitUntil(lambda: not any(job.fn is train_dictionary for job in active_jobs()), timeout=60_000)


def _type(qtbot, box, value) -> None:
    """Replace what a box holds by typing, as a person does."""
    box.setFocus()
    line = box.lineEdit() if hasattr(box, "lineEdit") and box.lineEdit() is not None else box
    line.selectAll()
    qtbot.keyClicks(line, str(value))
    qtbot.keyClick(line, Qt.Key.Key_Tab)


def _dictionary_mode(qtbot, panel, text: Path, out: Path, steps: int) -> None:
    """Choose "a sparse dictionary", then tiny settings: 32 TopK features (k 4), batches of 32 tokens."""
    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    assert panel.dictionary_mode and panel.settings_stack.currentWidget().widget() is panel.dictionary.form
    f = panel.dictionary.form
    qtbot.keyClicks(f.text_file, str(text))
    _type(qtbot, f.out_edit, out)
    for box, value in ((f.d_sae, 32), (f.k, 4), (f.batch_size, 32), (f.steps, steps), (f.eval_every, 50)):
        _type(qtbot, box, value)
    assert (f.d_sae.value(), f.k.value(), f.batch_size.value(), f.steps.value()) == (32, 4, 32, steps)


def _events(panel, kind: str) -> list[dict]:
    return [e for e in panel.dictionary.run.events if e["event"] == kind]


def _points(curve) -> int:
    xs = curve.getData()[0]
    return 0 if xs is None else len(xs)


def _click(qtbot, button) -> None:
    assert button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_the_form_says_what_is_missing_and_start_waits_for_it(qtbot, demo_panel, text_file, tmp_path):
    panel = demo_panel
    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    f = panel.dictionary.form
    assert not panel.start_button.isEnabled() and "Choose a text file" in panel.start_button.toolTip()
    assert f.hook.currentText() == "blocks.2.hook_resid_post"  # the demo model's middle layer
    qtbot.keyClicks(f.text_file, str(tmp_path / "missing.txt"))
    assert "missing.txt: no such file" in f.error.toolTip() and not panel.start_button.isEnabled()
    f.text_file.clear()
    qtbot.keyClicks(f.text_file, str(text_file))
    assert panel.start_button.isEnabled()
    _type(qtbot, f.hook_out, "blocks.2.hook_mlp_out")  # a transcoder: relu only
    assert "no TopK transcoder" in panel.start_button.toolTip() and not panel.start_button.isEnabled()
    f.architecture.setFocus()
    qtbot.keyClick(f.architecture, Qt.Key.Key_Down)  # relu (with L1): k hidden, the L1 coefficient shown
    assert f.architecture.currentText() == "relu" and panel.start_button.isEnabled()
    assert f.l1_coefficient.isVisibleTo(f) and not f.k.isVisibleTo(f)
    _type(qtbot, f.hook, "blocks.9.hook_resid_post")
    assert "layers 0..3" in panel.start_button.toolTip()
    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Up)  # back to the model form, untouched
    assert not panel.dictionary_mode and panel.use_button.isVisibleTo(panel)
    assert not panel.dictionary.open_button.isVisibleTo(panel)


def test_a_dictionary_trains_live_pauses_resumes_and_stops_with_what_it_learnt_saved(qtbot, demo_panel, text_file,
                                                                                      tmp_path):
    panel = demo_panel
    _dictionary_mode(qtbot, panel, text_file, tmp_path / "runs", steps=1_000_000)
    _click(qtbot, panel.start_button)
    assert panel.dictionary.run.running and not panel.mode.isEnabled() and not panel.dictionary.form.isEnabled()
    plots = panel.dictionary.plots
    qtbot.waitUntil(lambda: _points(plots.curves["l0"]) >= 3, timeout=60_000)  # the live plot
    xs, ys = plots.curves["variance_explained"].getData()
    assert len(xs) >= 3 and all(-1.0 < y <= 1.0 for y in ys)
    assert "L0" in panel.status_label.text() and panel.progress.value() > 0

    _click(qtbot, panel.pause_button)
    qtbot.waitUntil(lambda: bool(_events(panel, "paused")), timeout=30_000)
    at = _events(panel, "paused")[0]["step"]
    assert panel.pause_button.text() == "Resume" and panel.status_label.text() == f"Paused at step {at}."
    _click(qtbot, panel.pause_button)
    qtbot.waitUntil(lambda: bool(_events(panel, "resumed")), timeout=30_000)
    assert panel.pause_button.text() == "Pause" and _events(panel, "resumed")[0]["step"] == at
    qtbot.waitUntil(lambda: _events(panel, "step")[-1]["step"] > at, timeout=30_000)  # it trains on

    _click(qtbot, panel.stop_button)
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=60_000)
    stopped = panel.dictionary.run.events[-1]
    assert stopped["event"] == "stopped" and stopped["step"] > at
    out = panel.dictionary.run.out_dir
    assert out.parent == tmp_path / "runs" and sae_checkpoint_step(out) == stopped["step"]  # resumable
    d = load_dictionary(out)
    assert d.d_sae == 32 and d.k == 4 and d.hook == "blocks.2.hook_resid_post"
    assert f"Stopped at step {stopped['step']}" in panel.status_label.text() and str(out) in panel.status_label.text()
    assert panel.dictionary.open_button.isEnabled() and panel.start_button.isEnabled() and panel.mode.isEnabled()


def test_a_finished_dictionary_exports_and_opens_in_the_features_panel(qtbot, model_dirs, isolated_user_files,
                                                                       error_watch, text_file, tmp_path, monkeypatch):
    w, state = open_window(qtbot, model_dirs["demo"], text="Alice was beginning to get very tired", watch=error_watch)
    w.show_panel("Train")
    panel = w.panel("Train")
    _dictionary_mode(qtbot, panel, text_file, tmp_path / "runs", steps=60)
    assert not panel.dictionary.open_button.isEnabled()
    _click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=60_000)
    done = panel.dictionary.run.events[-1]
    assert done["event"] == "done" and done["step"] == 60 and panel.progress.value() == 60
    assert len(_events(panel, "eval")) == 2 and "Done at step 60" in panel.status_label.text()
    # the export bar writes the dictionary's plots and numbers (not the model mode's empty ones)
    written = {}
    for button_text, name in (("PNG", "plots.png"), ("Data", "metrics.csv")):
        target = tmp_path / name
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, t=target, **k: (str(t), "")))
        _click(qtbot, next(b for b in panel.export_bar.findChildren(QToolButton) if b.text() == button_text))
        written[name] = target.read_bytes()
    assert written["plots.png"].startswith(b"\x89PNG")
    rows = list(csv.reader(written["metrics.csv"].decode().splitlines()))
    assert rows[0][:5] == ["step", "mse", "l0", "variance_explained", "dead"] and "heldout_l0" in rows[0]
    logged = sorted({e["step"] for e in panel.dictionary.run.events if e["event"] in ("step", "eval")})
    assert [int(r[0]) for r in rows[1:]] == logged
    last = _events(panel, "eval")[-1]
    assert float(rows[-1][rows[0].index("heldout_variance_explained")]) == pytest.approx(last["variance_explained"])
    with qtbot.waitSignal(state.dictionaries_changed, timeout=30_000):
        _click(qtbot, panel.dictionary.open_button)
    assert w.tabs.tabText(w.tabs.currentIndex()) == "Features"
    (attached,) = state.dictionaries
    assert attached.hook == "blocks.2.hook_resid_post" and attached.dictionary.d_sae == 32
    assert Path(attached.dictionary.path) == panel.dictionary.run.out_dir
    features = w.panel("Features")
    qtbot.waitUntil(lambda: features.features_table.rowCount() > 0, timeout=30_000)  # its lens on the text
    # a new run clears the curves: the buttons wait for its first step again (not the finished run's state)
    w.show_panel("Train")
    buttons = [b for b in panel.export_bar.findChildren(QToolButton) if b.text() in ("PNG", "Data")]
    assert all(b.isEnabled() for b in buttons)
    _click(qtbot, panel.start_button)
    assert panel.dictionary.run.running and not any(b.isEnabled() for b in buttons)
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=60_000)
    assert all(b.isEnabled() for b in buttons)
    error_watch.assert_clean()


def test_a_stopped_dictionary_run_resumes_from_the_panel_and_finishes(qtbot, demo_panel, text_file, tmp_path):
    """Start, Stop: the run's folder is offered to resume; ticking Resume this run shows its saved settings and
    Start goes on from the stopped step (more steps may be given; the curves kept) to the last step."""
    panel = demo_panel
    _dictionary_mode(qtbot, panel, text_file, tmp_path / "runs", steps=1_000_000)
    f = panel.dictionary.form
    _click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: len(_events(panel, "step")) >= 2, timeout=60_000)
    _click(qtbot, panel.stop_button)
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=60_000)
    stopped = panel.dictionary.run.events[-1]
    out = panel.dictionary.run.out_dir
    assert stopped["event"] == "stopped" and stopped["step"] > 0 and sae_checkpoint_step(out) == stopped["step"]
    assert "tick Resume this run and Start to go on" in panel.status_label.text()
    assert f.resume_edit.text() == str(out)  # offered, as the model mode offers its stopped run
    before = _points(panel.dictionary.plots.curves["l0"])

    _type(qtbot, f.d_sae, 64)  # the form's own settings change: resuming shows the run's saved ones again
    qtbot.mouseClick(f.resume_check, Qt.MouseButton.LeftButton, pos=f.resume_check.rect().center())
    assert f.resume_check.isChecked() and f.steps.value() == 1_000_000 and f.d_sae.value() == 32
    last = stopped["step"] + 60
    _type(qtbot, f.steps, last)  # a shorter run than the one stopped: it ends soon
    _click(qtbot, panel.start_button)
    assert "--resume" in panel.command_label.text() and str(out) in panel.command_label.text()
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=60_000)
    events = panel.dictionary.run.events
    (start,) = [e for e in events if e["event"] == "start"]
    assert start.get("resumed") and start["step"] == stopped["step"] and start["out"] == str(out)
    after = [e["step"] for e in events[events.index(start) + 1:] if e["event"] == "step"]
    assert after and after[0] > stopped["step"] and after[-1] == last
    assert events[-1]["event"] == "done" and events[-1]["step"] == last and panel.progress.value() == last
    assert sae_checkpoint_step(out) == last and sorted(p.name for p in (tmp_path / "runs").iterdir()) == [out.name]
    assert _points(panel.dictionary.plots.curves["l0"]) > before  # the curves go on from the stopped run's
    assert f"Done at step {last}" in panel.status_label.text()
    panel.resize(1300, 800)
    panel.grab().save(str(tmp_path / "resumed.png"))
    import os
    if os.environ.get("SCREENSHOT_DIR"):
        panel.grab().save(os.path.join(os.environ["SCREENSHOT_DIR"], "train_dictionary_resumed.png"))


def test_resuming_another_kind_of_folder_is_refused_in_one_line_naming_it(qtbot, demo_panel, text_file, tmp_path):
    """A folder that is no dictionary run (empty, a model's run), or a change of what the run keeps (its hook,
    its text): Start stays off and the line names the folder."""
    from desktop_app.core.training import TrainConfig, train

    panel = demo_panel
    _dictionary_mode(qtbot, panel, text_file, tmp_path / "runs", steps=30)
    f = panel.dictionary.form
    qtbot.mouseClick(f.resume_check, Qt.MouseButton.LeftButton, pos=f.resume_check.rect().center())
    assert "Choose the dictionary run folder to resume" in panel.start_button.toolTip()
    empty = tmp_path / "empty"
    empty.mkdir()
    qtbot.keyClicks(f.resume_edit, str(empty))
    assert panel.start_button.toolTip() == f"{empty}: no dictionary checkpoint to resume from."
    model_run = tmp_path / "model_run"
    train(TrainConfig(task="motif", steps=2, eval_every=2, checkpoint_every=2, batch_size=4,
                      model={"n_layers": 1, "d_model": 16, "n_heads": 1, "d_ff": 32}), out_dir=model_run)
    f.resume_edit.clear()
    qtbot.keyClicks(f.resume_edit, str(model_run))
    assert panel.start_button.toolTip() == f"{model_run}: a model's training run, not a dictionary's; resume it " \
                                           "with Train: a model." and not panel.start_button.isEnabled()
    # a dictionary run, stopped: its settings fill the form; another hook or text is refused
    cfg = panel.dictionary.form.config()
    run = tmp_path / "sae_run"
    from desktop_app.core.training.sae import train_sae
    cfg.steps, cfg.checkpoint_every = 20, 10
    train_sae(cfg, panel.state.loaded, run)
    f.resume_edit.clear()
    qtbot.keyClicks(f.resume_edit, str(run))
    assert f.steps.value() == 20
    assert panel.start_button.toolTip() == f"{run}: its checkpoint is at step 20 already; give more steps " \
                                           "(--steps above 20) to train on"
    _type(qtbot, f.steps, 40)
    assert panel.start_button.isEnabled()
    _type(qtbot, f.hook, "blocks.1.hook_resid_post")
    assert panel.start_button.toolTip().startswith(f"{run}: its dictionary was trained with hook "
                                                   "'blocks.2.hook_resid_post', not 'blocks.1.hook_resid_post'")
    assert "\n" not in panel.start_button.toolTip() and not panel.start_button.isEnabled()
    _type(qtbot, f.hook, "blocks.2.hook_resid_post")
    assert panel.start_button.isEnabled()
    other = tmp_path / "other.txt"
    other.write_text(text_file.read_text(encoding="utf-8"), encoding="utf-8")
    _type(qtbot, f.text_file, other)
    assert panel.start_button.toolTip().startswith(f"{run}: its dictionary was trained with text_file "
                                                   f"{str(text_file)!r}, not {str(other)!r}")
    assert not panel.start_button.isEnabled()


def test_a_cross_layer_transcoder_trains_from_the_panel_for_graphs(qtbot, demo_panel, text_file, tmp_path):
    """Train: "a cross-layer transcoder" (issue 37): the hook and architecture rows go (every MLP, relu), the
    command shown is `train --task clt`, and the run saves circuit-tracer's files (what `graph` reads), says
    its replacement score and offers no Open in Features (a transcoder set is for graphs)."""
    from desktop_app.core.graphs import load_transcoders

    panel = demo_panel
    _dictionary_mode(qtbot, panel, text_file, tmp_path / "runs", steps=12)
    f = panel.dictionary.form
    f.kind.setFocus()
    qtbot.keyClick(f.kind, Qt.Key.Key_Down)
    qtbot.keyClick(f.kind, Qt.Key.Key_Down)
    assert f.kind.currentData() == "clt"
    assert not f.hook.isVisibleTo(f) and not f.architecture.isVisibleTo(f) and f.l1_coefficient.isVisibleTo(f)
    _type(qtbot, f.d_sae, 16)
    _type(qtbot, f.eval_every, 6)
    _click(qtbot, panel.start_button)
    assert "train --task clt" in panel.command_label.text() and "--hook" not in panel.command_label.text()
    qtbot.waitUntil(lambda: not panel.dictionary.run.running, timeout=120_000)
    done = panel.dictionary.run.events[-1]
    assert done["event"] == "done" and done["step"] == 12 and len(done["variance_explained_per_layer"]) == 4
    out = panel.dictionary.run.out_dir
    assert out.name.endswith("_clt") and load_transcoders(out).cross_layer and load_transcoders(out).n_features == 16
    assert "replacement score" in panel.status_label.text() and "--transcoders" in panel.status_label.text()
    assert not panel.dictionary.open_button.isEnabled() and panel.start_button.isEnabled()
    panel.grab().save(str(tmp_path / "clt.png"))

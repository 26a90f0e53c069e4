"""Issue 13, clicked: the Train tab on the demo model. A tiny motif run typed into the fields and
started with the Start button; "Use this model" stays disabled until that run's first checkpoint, then
opens the model with a sample of the motif task as the text of every panel (the app's text is English,
which a motif vocabulary cannot tokenize); so does File > Open on a run's folder. A second run gets a folder of its own and leaves the first
run's folder alone; File > Export Current View writes the metrics. No error dialog, no error log."""
from __future__ import annotations

import csv
import hashlib
import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from desktop_app.core.training import checkpoint_step
from desktop_app.ui.panels.training import runs_root

from .walkthrough import open_window, click_panel_tab, type_into






def _snapshot(folder) -> dict[str, tuple[str, int]]:
    """Every file of a folder: name -> (content hash, modification time)."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir()) if p.is_file()}


def _run(qtbot, panel) -> list[tuple[str, bool]]:
    """Click Start, wait for the run to end; returns (event, Use-this-model enabled) as each event arrived."""
    seen: list[tuple[str, bool]] = []
    record = lambda ev: seen.append((ev["event"], panel.use_button.isEnabled()))  # noqa: E731
    panel.run_event.connect(record)
    assert panel.start_button.isEnabled(), panel.start_button.toolTip()
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.running and not panel.use_button.isEnabled()  # nothing of this run to use yet
    qtbot.waitUntil(lambda: not panel.running, timeout=120_000)
    panel.run_event.disconnect(record)
    kinds = [k for k, _ in seen]
    assert kinds[0] == "start" and kinds[-1] == "done", panel.status_label.text()
    return seen


def test_train_walkthrough(qtbot, model_dirs, error_watch, isolated_user_files, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    window, state = open_window(qtbot, model_dirs["demo"], name="demo", watch=error_watch)
    panel = click_panel_tab(qtbot, window, "Train")
    root = runs_root()
    assert str(root).startswith(str(isolated_user_files))  # the runs go under this test's folder
    assert panel.out_edit.text() == str(root) and panel.task.currentText() == "motif"

    for field, value in ((panel.layers, "1"), (panel.heads, "2"), (panel.d_model, "16"), (panel.d_ff, "32"),
                         (panel.context, "20"), (panel.batch_size, "16"), (panel.steps, "30"),
                         (panel.eval_every, "10"), (panel.checkpoint_every, "10")):
        type_into(qtbot, field, value)
        assert str(field.value()) == value
    assert not panel.model_error.isVisible() and not panel.task_error.isVisible()

    # first run: a new folder named by time and task; Use this model only once its checkpoint exists
    seen = _run(qtbot, panel)
    first = panel.out_dir
    assert first.parent == root and re.fullmatch(r"\d{4}-\d\d-\d\d_\d{4}_motif", first.name), first
    assert checkpoint_step(first) == 30
    first_ckpt = next(i for i, (kind, _) in enumerate(seen) if kind == "checkpoint")
    assert not any(enabled for _, enabled in seen[:first_ckpt])
    assert all(enabled for _, enabled in seen[first_ckpt:])
    assert panel.use_button.isEnabled()
    assert panel.progress.value() == 30 and "Finished at step 30" in panel.status_label.text()

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)
    assert state.loaded.config.n_layers == 1 and state.loaded.config.vocab_size <= 5
    assert re.fullmatch(r"[ABCD]( [ABCD]){19}", state.text), state.text  # a sample of the motif task
    qtbot.waitUntil(lambda: len(state.token_ids) == 20 and state.trace is not None, timeout=30_000)
    assert state.trace["blocks.0.attn.pattern"].shape[-1] == 20  # the Attention panel draws the sample
    assert "motif task" in panel.status_label.text()
    model_panel = click_panel_tab(qtbot, window, "Model")
    assert model_panel.text_edit.toPlainText() == state.text

    # second run: its own folder; the first run's files stay as they were
    before = _snapshot(first)
    panel = click_panel_tab(qtbot, window, "Train")
    type_into(qtbot, panel.steps, "20")
    _run(qtbot, panel)
    second = panel.out_dir
    assert second != first and second.parent == root and checkpoint_step(second) == 20
    assert _snapshot(first) == before
    assert checkpoint_step(first) == 30

    # File > Export Current View on the Train tab: the metrics as CSV
    out = tmp_path / "train-metrics.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "CSV table (*.csv)")))
    window.export_action.trigger()
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "step" and int(rows[-1][0]) == 20

    # File > Open on the first run's folder while the text is English: the text becomes a sample of
    # the task (English would be unknown tokens to it), and the status bar says so
    model_panel = click_panel_tab(qtbot, window, "Model")
    model_panel.text_edit.setFocus()
    qtbot.keyClick(model_panel.text_edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(model_panel.text_edit, "The cat sat.")
    qtbot.waitUntil(lambda: state.text == "The cat sat.", timeout=10_000)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(first)))
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_action.trigger()
    assert state.loaded.path is not None and state.loaded.path.resolve() == first.resolve()
    assert re.fullmatch(r"[ABCD]( [ABCD]){19}", state.text), state.text
    qtbot.waitUntil(lambda: len(state.token_ids) == 20 and state.trace is not None, timeout=30_000)
    assert model_panel.text_edit.toPlainText() == state.text
    assert "trained on the motif task: the text is now a sample" in window.statusBar().currentMessage()

    # a text the task model reads whole is kept when a run's folder is opened
    kept = state.text
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_action.trigger()
    assert state.text == kept

    error_watch.assert_clean()

"""Issue 25 §2: the Train panel starts `train` as a process, so a run folder another run is writing is
refused there too, and the panel shows the refusal line naming the holder."""
from __future__ import annotations

import os
import socket

from PySide6.QtCore import Qt

from desktop_app.core.files import lock_folder
from desktop_app.core.training import TrainConfig, checkpoint_step, train
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState


def _type(qtbot, field, text: str) -> None:
    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(field, text)
    qtbot.keyClick(field, Qt.Key.Key_Tab)


def test_resuming_a_folder_another_run_writes_shows_the_refusal(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / "myrun"
    cfg = TrainConfig(task="sort", task_options={"length": 5, "symbols": 10}, family="gpt2",
                      model={"n_layers": 1, "n_heads": 2, "d_model": 32, "d_ff": 64, "context_length": 16},
                      steps=2, eval_every=2, checkpoint_every=2, batch_size=8, seed=0)
    train(cfg, run)
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.resize(1200, 700)
    panel.show()
    qtbot.waitActive(panel)
    panel.settings_scroll.ensureWidgetVisible(panel.resume_edit)
    qtbot.mouseClick(panel.resume_check, Qt.MouseButton.LeftButton)
    _type(qtbot, panel.resume_edit, str(run))
    panel.steps.setValue(4)
    with lock_folder(run):  # this test process writes the folder now: the panel's process is another one
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        assert panel.running
        qtbot.waitUntil(lambda: not panel.running, timeout=120_000)
    shown = panel.status_label.text()
    assert "another run is writing this folder" in shown, shown
    assert f"pid {os.getpid()} on {socket.gethostname()}" in shown and str(run) in shown
    assert checkpoint_step(run) == 2  # nothing was changed
    panel.status_label.grab().save(str(tmp_path / "refusal.png"))

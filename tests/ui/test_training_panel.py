"""Train panel: a real run in a separate process, live metrics, Stop, and "Use this model"."""
from __future__ import annotations

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import checkpoint_step
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState


def _tiny(panel: TrainingPanel, out) -> None:
    panel.task.setCurrentText("sort")
    panel.length.setValue(5)
    panel.layers.setValue(1)
    panel.heads.setValue(2)
    panel.d_model.setValue(32)
    panel.d_ff.setValue(64)
    panel.context.setValue(16)
    panel.steps.setValue(100_000)
    panel.eval_every.setValue(5)
    panel.checkpoint_every.setValue(100_000)
    panel.out_edit.setText(str(out))


def test_parameter_count_follows_the_builder(qtbot):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("motif")
    panel.family.setCurrentText("bert")
    panel.layers.setValue(3)
    panel.heads.setValue(1)
    panel.d_model.setValue(32)
    panel.d_ff.setValue(128)
    first = int(panel.param_label.text().replace(",", ""))
    cfg = panel.config()
    from desktop_app.core.training.trainer import model_config_for, task_for
    from desktop_app.core.model import Transformer
    real = Transformer(model_config_for(cfg, task_for(cfg, causal=False))).num_parameters()
    assert first == real
    panel.layers.setValue(4)
    assert int(panel.param_label.text().replace(",", "")) > first
    panel.heads.setValue(5)  # 32 is not divisible by 5
    assert panel.param_label.text() == "invalid" and "divisible" in panel.param_label.toolTip()


def test_run_shows_metrics_stops_and_loads_the_model(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    state = AppState()
    panel = TrainingPanel(state)
    qtbot.addWidget(panel)
    out = tmp_path / "run"
    _tiny(panel, out)
    assert "--task sort" in " ".join(panel.cli_args())
    panel.start()
    assert panel.running and not panel.start_button.isEnabled()
    qtbot.waitUntil(lambda: sum(e["event"] == "eval" for e in panel.events) >= 2, timeout=90_000)
    steps = [e for e in panel.events if e["event"] == "step"]
    assert steps and panel.progress.value() == steps[-1]["step"]
    x, y = panel.train_curve.getData()
    assert len(x) == len(steps) and y[-1] == steps[-1]["train_loss"]
    assert len(panel.val_curve.getData()[0]) >= 2
    assert set(panel.grad_curves) == {"embed", "blocks.0", "head"}
    assert "tokens/s" in panel.status_label.text() and "ETA" in panel.status_label.text()

    panel.toggle_pause()
    qtbot.waitUntil(lambda: any(e["event"] == "paused" for e in panel.events), timeout=30_000)
    panel.toggle_pause()
    panel.stop()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert panel.events[-1]["event"] == "stopped"
    stopped_at = panel.events[-1]["step"]
    assert checkpoint_step(out) == stopped_at  # Stop writes a checkpoint
    assert panel.use_button.isEnabled()

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        panel.use_model()
    assert state.loaded is not None and state.loaded.config.n_layers == 1
    assert state.loaded.config.vocab_size == load_model_folder(out).config.vocab_size


def test_a_crashing_run_keeps_the_window(qtbot, tmp_path):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("text")
    panel.text_file.setText(str(tmp_path / "missing.txt"))
    panel.out_edit.setText(str(tmp_path / "run"))
    panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert "missing.txt" in panel.status_label.text()
    assert panel.start_button.isEnabled()

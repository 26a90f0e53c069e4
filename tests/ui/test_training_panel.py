"""Train panel: a real run in a separate process, live metrics, Stop, and "Use this model"."""
from __future__ import annotations

import torch

from desktop_app.cli import build_parser
from desktop_app.commands.train import config_from_args
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


def _built_parameters(panel: TrainingPanel) -> int:
    """sum(p.numel()) of the model a run of the panel's settings builds (as train() builds it)."""
    from desktop_app.core.model import Transformer
    from desktop_app.core.training.trainer import model_config_for, task_for

    cfg = panel.config()
    task = task_for(cfg, causal=cfg.model.get("causal", cfg.family != "bert"))
    return sum(p.numel() for p in Transformer(model_config_for(cfg, task)).parameters())


def test_parameter_count_follows_every_builder_control(qtbot):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("motif")
    panel.family.setCurrentText("bert")

    def shown() -> int:
        return int(panel.param_label.text().replace(",", ""))

    assert shown() == _built_parameters(panel)
    changes = [(panel.norm_placement, "pre"), (panel.norm_placement, "post"), (panel.norm, "rmsnorm"),
               (panel.activation, "swiglu"), (panel.activation, "relu"), (panel.positions, "sinusoidal"),
               (panel.positions, "rotary"), (panel.attention, "l2"), (panel.attention, "sinkhorn"),
               (panel.init, "he"), (panel.dropout, 0.1), (panel.layers, 3), (panel.heads, 2), (panel.d_model, 48),
               (panel.d_ff, 96), (panel.context, 64), (panel.family, "gpt2"), (panel.norm_placement, "post"),
               (panel.family, "llama"), (panel.length, 12), (panel.task, "sort"), (panel.symbols, 7),
               (panel.task, "modadd"), (panel.p, 13), (panel.task, "induction")]
    for widget, value in changes:
        before = panel.param_label.text()
        if isinstance(value, str):
            widget.setCurrentText(value)
        else:
            widget.setValue(value)
        assert shown() == _built_parameters(panel), (widget, value, before)
    panel.family.setCurrentText("bert")
    panel.norm_placement.setCurrentText("post")
    post = shown()
    panel.norm_placement.setCurrentText("pre")  # a pre-LN stack gets its final norm: 2 * d_model more
    assert shown() == post + 2 * panel.d_model.value() == _built_parameters(panel)


def test_best_device_and_its_precision_are_the_defaults(qtbot, monkeypatch):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    assert panel.device.currentText() == "cpu" and panel.precision.currentText() == "float32"  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine, as far as the panel can tell
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for bf16, precision in ((True, "bfloat16"), (False, "float16")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        panel = TrainingPanel(AppState())
        qtbot.addWidget(panel)
        assert panel.device.currentText() == "cuda" and panel.precision.currentText() == precision
        assert "--device cuda --precision " + precision in " ".join(panel.cli_args())
        panel.device.setCurrentText("cpu")
        assert panel.precision.currentText() == "float32"
        panel.device.setCurrentText("cuda")
        assert panel.precision.currentText() == precision


def test_noam_schedule_relabels_the_learning_rate(qtbot):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    opt_form = panel.lr.parentWidget().layout()
    assert opt_form.labelForField(panel.lr).text() == "Learning rate"
    panel.schedule.setCurrentText("noam")
    assert opt_form.labelForField(panel.lr).text() == "Noam factor" and "d_model" in panel.lr.toolTip()
    panel.schedule.setCurrentText("constant")
    assert opt_form.labelForField(panel.lr).text() == "Learning rate"


def test_mlp_baseline_and_training_set_size_from_the_panel(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("motif")
    assert panel.task_form.isRowVisible(panel.model_kind) and panel.task_form.isRowVisible(panel.n_train)
    panel.n_train.setValue(1500)
    args = " ".join(panel.cli_args())
    assert "--train-size 1500" in args and "--baseline" not in args  # the transformer on the lectures' 1,500
    assert config_from_args(build_parser().parse_args(["train", *panel.cli_args()])).task_options["n_train"] == 1500
    panel.model_kind.setCurrentText("MLP baseline")
    assert not panel.model_box.isEnabled()
    assert panel.param_label.text() == "41,412 (MLP)"  # 4*32 + 640*64 + 64 + 64*4 + 4
    panel.steps.setValue(40)
    panel.eval_every.setValue(20)
    panel.out_edit.setText(str(tmp_path / "mlp"))
    args = panel.cli_args()
    assert "--task motif" in " ".join(args) and "--baseline mlp" in " ".join(args)
    parsed = build_parser().parse_args(["train", *args])
    assert parsed.baseline == "mlp" and parsed.train_size == 1500 and parsed.steps == 40
    panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=90_000)
    kinds = [e["event"] for e in panel.events]
    assert kinds[0] == "start" and kinds[-1] == "done", panel.status_label.text()
    assert panel.events[0]["parameters"] == 41_412
    evals = [e for e in panel.events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [20, 40]
    assert list(panel.train_acc_curve.getData()[1]) == [e["train_accuracy"] for e in evals]
    assert list(panel.acc_curve.getData()[1]) == [e["val_accuracy"] for e in evals]
    assert "validation accuracy" in panel.status_label.text() and not panel.use_button.isEnabled()
    panel.task.setCurrentText("sort")  # the baseline is the motif task's only
    assert "--baseline" not in panel.cli_args() and panel.model_box.isEnabled()


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
    evals = [e for e in panel.events if e["event"] == "eval"]
    train_acc = panel.train_acc_curve.getData()  # training accuracy beside the validation accuracy
    assert list(train_acc[0][:2]) == [e["step"] for e in evals[:2]]
    assert list(train_acc[1][:2]) == [e["train_accuracy"] for e in evals[:2]]
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


def test_screenshot_demo_starts_the_lectures_motif_run(qtbot, monkeypatch):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    started = []
    monkeypatch.setattr(panel, "start", lambda: started.append(panel.config()))
    panel.screenshot_demo()
    (cfg,) = started
    assert cfg.task == "motif" and cfg.family == "bert"
    assert {k: cfg.model[k] for k in ("n_layers", "n_heads", "d_model", "context_length", "norm_placement")} == \
        {"n_layers": 3, "n_heads": 1, "d_model": 32, "context_length": 20, "norm_placement": "pre"}
    assert 35_000 < int(panel.param_label.text().replace(",", "").split()[0]) < 42_000  # ~39k in the lectures

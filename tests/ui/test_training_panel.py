"""Train panel: a real run in a separate process, live metrics, Stop, and "Use this model"."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QImage, QPainter, QWheelEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QToolButton

from desktop_app.cli import build_parser
from desktop_app.commands.train import config_from_args
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import checkpoint_step
from desktop_app.core.training.tasks import make_task, sample_text
from desktop_app.ui.panels.training import SpacedAxis, TrainingPanel, new_run_dir
from desktop_app.ui.state import AppState

from .walkthrough import choose_item


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
    from desktop_app.core.training.trainer import model_config_for, task_for, trains_causal

    cfg = panel.config()
    task = task_for(cfg, causal=trains_causal(cfg))
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
    assert "validation loss" in panel.status_label.text() and not panel.use_button.isEnabled()
    assert "(evaluation at step 40)" in panel.status_label.text()
    panel.task.setCurrentText("sort")  # the baseline is the motif task's only
    assert "--baseline" not in panel.cli_args() and panel.model_box.isEnabled()


def test_run_shows_metrics_stops_and_loads_the_model(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    state = AppState()
    panel = TrainingPanel(state)
    qtbot.addWidget(panel)
    _tiny(panel, tmp_path / "runs")
    assert "--task sort" in " ".join(panel.cli_args())
    panel.start()
    assert panel.running and not panel.start_button.isEnabled()
    out = panel.out_dir  # a new folder of its own in the runs folder
    assert out.parent == tmp_path / "runs" and out.name.endswith("_sort")
    qtbot.waitUntil(lambda: sum(e["event"] == "eval" for e in panel.events) >= 2, timeout=90_000)
    steps = [e for e in panel.events if e["event"] == "step"]
    assert steps and panel.progress.value() == steps[-1]["step"]
    panel.plots.draw()  # (the steps of the last REDRAW_MS too, as an export draws them)
    x, y = panel.train_curve.getData()
    assert len(x) == len(steps) and y[-1] == steps[-1]["train_loss"]
    assert len(panel.val_curve.getData()[0]) >= 2
    evals = [e for e in panel.events if e["event"] == "eval"]
    train_acc = panel.train_acc_curve.getData()  # training accuracy beside the validation accuracy
    assert list(train_acc[0][:2]) == [e["step"] for e in evals[:2]]
    assert list(train_acc[1][:2]) == [e["train_accuracy"] for e in evals[:2]]
    assert set(panel.grad_curves) == {"embed", "blocks.0", "head"}
    assert "tokens/s" in panel.status_label.text() and "ETA" in panel.status_label.text()

    panel.show()
    qtbot.mouseClick(panel.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(e["event"] == "paused" for e in panel.events), timeout=30_000)
    qtbot.mouseClick(panel.pause_button, Qt.MouseButton.LeftButton)  # "Resume"
    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert panel.events[-1]["event"] == "stopped"
    stopped_at = panel.events[-1]["step"]
    assert checkpoint_step(out) == stopped_at  # Stop writes a checkpoint
    # the bar and the text agree on where the run stopped (step events come only every few steps)
    assert panel.progress.value() == stopped_at and f"Stopped at step {stopped_at}:" in panel.status_label.text()
    # issue 25: the line says which numbers are the training batches' and which the last evaluation's, and
    # at which step each was measured (it mixed an earlier evaluation's accuracy with later batches' loss),
    # accuracies as percentages, as everywhere in the panel
    last_step = [e for e in panel.events if e["event"] == "step"][-1]
    last_eval = [e for e in panel.events if e["event"] == "eval"][-1]
    line = panel.status_label.text()
    assert (f"training loss {last_step['train_loss']:.4f}, accuracy {100 * last_step['train_accuracy']:.1f}% "
            f"(batches up to step {last_step['step']})") in line, line
    assert (f"validation loss {last_eval['val_loss']:.4f}, accuracy {100 * last_eval['val_accuracy']:.1f}% "
            f"(evaluation at step {last_eval['step']})") in line, line
    assert line.index("training loss") < line.index("validation loss") and "\n" not in line
    assert panel.use_button.isEnabled()
    assert panel.resume_edit.text() == str(out)  # ready to be resumed

    # the export bar: the plots as PNG and SVG, the metrics as CSV
    written = {}
    for button_text, name in (("PNG", "plots.png"), ("SVG", "plots.svg"), ("Data", "metrics.csv")):
        target = tmp_path / name
        monkeypatch.setattr(QFileDialog, "getSaveFileName",
                            staticmethod(lambda *a, t=target, **k: (str(t), "")))
        button = next(b for b in panel.export_bar.findChildren(QToolButton) if b.text() == button_text)
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        written[name] = target.read_bytes()
    assert written["plots.png"].startswith(b"\x89PNG") and b"<svg" in written["plots.svg"]
    rows = list(csv.reader(written["metrics.csv"].decode().splitlines()))
    assert rows[0][:6] == ["step", "train_loss", "lr", "val_loss", "val_accuracy", "train_accuracy"]
    assert {"grad_norm.embed", "grad_norm.blocks.0", "grad_norm.head"} <= set(rows[0])
    logged = sorted({e["step"] for e in panel.events if e["event"] in ("step", "eval")})
    assert [int(r[0]) for r in rows[1:]] == logged
    first_eval = next(e for e in panel.events if e["event"] == "eval")
    row = next(r for r in rows[1:] if int(r[0]) == first_eval["step"])
    assert float(row[3]) == first_eval["val_loss"]

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)
    assert state.loaded is not None and state.loaded.config.n_layers == 1
    assert state.loaded.config.vocab_size == load_model_folder(out).config.vocab_size
    assert state.text.split()[5] == "|" and "sort task" in panel.status_label.text()  # a sample of its task
    qtbot.waitUntil(lambda: len(state.token_ids) == 10, timeout=30_000)  # the sample's tokens, traced


def test_a_crashing_run_keeps_the_window(qtbot, tmp_path):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("text")
    panel.tokenizer.setCurrentText("bpe")
    panel.context.setValue(16)
    text = tmp_path / "abab.txt"  # enough characters, but BPE merges them into a handful of tokens
    text.write_text("ab" * 200, encoding="utf-8")
    panel.text_file.setText(str(text))
    panel.out_edit.setText(str(tmp_path / "runs"))
    assert panel.start_button.isEnabled()  # only the run can find this out
    panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert "too few" in panel.status_label.text()
    assert panel.start_button.isEnabled() and not panel.use_button.isEnabled()


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


# -- issue 13, clicked: the Train panel's form, run folders, export and axes ------------------------

def _type(qtbot, field, text: str) -> None:
    """Replace a line edit's or spin box's text as a person does: select all, type, Tab away."""
    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(field, text)
    qtbot.keyClick(field, Qt.Key.Key_Tab)


def _shown_panel(qtbot) -> TrainingPanel:
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.resize(1200, 700)
    panel.show()
    panel.activateWindow()
    qtbot.waitActive(panel)  # focus (the wheel test) needs an active window
    return panel


def _wheel(widget, dy: int = -120) -> None:
    pos = QPointF(widget.rect().center())
    ev = QWheelEvent(pos, QPointF(widget.mapToGlobal(pos.toPoint())), QPoint(0, 0), QPoint(0, dy),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, ev)


def test_builder_and_task_errors_are_shown_beside_the_field_and_disable_start(qtbot, tmp_path):
    panel = _shown_panel(qtbot)
    panel.out_edit.setText(str(tmp_path / "runs"))
    assert panel.start_button.isEnabled() and not panel.model_error.isVisible()
    _type(qtbot, panel.heads, "5")  # d_model 64 is not divisible by 5
    assert panel.model_error.isVisible() and "divisible" in panel.model_error.text()
    assert not panel.start_button.isEnabled() and "divisible" in panel.start_button.toolTip()
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.process is None  # nothing started, nothing cleared
    _type(qtbot, panel.heads, "4")
    assert not panel.model_error.isVisible() and panel.start_button.isEnabled()

    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    qtbot.keyClicks(panel.task, "text")
    assert panel.task.currentText() == "text"
    assert "text file" in panel.task_error.text() and not panel.start_button.isEnabled()  # none chosen yet
    _type(qtbot, panel.text_file, str(empty))
    assert panel.task_error.isVisible() and "empty" in panel.task_error.toolTip() and str(empty) in \
        panel.task_error.toolTip()
    assert not panel.start_button.isEnabled()
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.process is None
    short = tmp_path / "short.txt"
    short.write_text("just a few characters", encoding="utf-8")
    _type(qtbot, panel.text_file, str(short))
    assert "too few" in panel.task_error.toolTip() and not panel.start_button.isEnabled()
    _type(qtbot, panel.context, "4")
    assert not panel.task_error.isVisible() and panel.start_button.isEnabled()

    _type(qtbot, panel.text_file, str(tmp_path / "missing.txt"))
    assert "no such text file" in panel.task_error.toolTip() and not panel.start_button.isEnabled()


def test_mlp_baseline_disables_the_settings_it_ignores(qtbot):
    panel = _shown_panel(qtbot)
    ignored = (panel.optimizer, panel.schedule, panel.warmup, panel.grad_clip, panel.checkpoint_every,
               panel.device, panel.precision)
    assert all(w.isEnabled() for w in ignored) and panel.lr.isEnabled()
    qtbot.keyClicks(panel.model_kind, "MLP")
    assert panel.baseline() == "mlp"
    assert not any(w.isEnabled() for w in ignored) and not panel.model_box.isEnabled()
    assert panel.lr.isEnabled() and panel.steps.isEnabled() and panel.batch_size.isEnabled()  # what it uses
    qtbot.keyClick(panel.model_kind, Qt.Key.Key_Up)  # back to "transformer"
    assert panel.model_kind.currentText() == "transformer"
    assert all(w.isEnabled() for w in ignored) and panel.model_box.isEnabled()


def test_the_wheel_scrolls_the_settings_column_unless_a_field_is_focused(qtbot):
    panel = _shown_panel(qtbot)
    bar = panel.settings_scroll.verticalScrollBar()
    assert bar.maximum() > 0
    steps, optimizer = panel.steps.value(), panel.optimizer.currentText()
    _wheel(panel.steps)
    _wheel(panel.optimizer)
    assert panel.steps.value() == steps and panel.optimizer.currentText() == optimizer
    assert bar.value() > 0  # the column scrolled instead
    assert panel.steps.focusPolicy() == Qt.FocusPolicy.StrongFocus
    panel.settings_scroll.ensureWidgetVisible(panel.steps)
    qtbot.wait(10)
    qtbot.mouseClick(panel.steps.lineEdit(), Qt.MouseButton.LeftButton)  # a clicked field takes the wheel
    assert panel.steps.hasFocus()
    _wheel(panel.steps, dy=120)
    assert panel.steps.value() == steps + panel.steps.singleStep()


def test_the_text_task_rows_fit_the_settings_column(qtbot, tmp_path):
    panel = _shown_panel(qtbot)
    qtbot.keyClicks(panel.task, "text")
    _type(qtbot, panel.text_file, str(tmp_path / ("a-rather-long-folder-name/" * 8) / "missing.txt"))
    qtbot.wait(10)
    assert panel.task_error.isVisible()
    width = panel.settings_scroll.viewport().width()
    assert panel.form_widget.minimumSizeHint().width() <= width
    assert panel.form_widget.width() <= width


def test_gradient_norm_tick_labels_do_not_overlap(qtbot):
    panel = _shown_panel(qtbot)
    assert isinstance(panel.grad_plot.getAxis("left"), SpacedAxis)
    for step, norm in enumerate(np.geomspace(0.05, 3.0, 50)):  # 0.05, 0.06, 0.07... collide by default
        panel.plots.add({"event": "step", "step": step, "train_loss": 1.0, "lr": 1e-3, "grad_norms": {"head": norm}})
    panel.plots.draw()  # (as a run's steps: the axes shown with the first points)
    qtbot.wait(10)
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    texts = panel.grad_plot.getAxis("left").generateDrawSpecs(painter)[2]
    painter.end()
    rects = [t[0] for t in texts]
    assert not any(a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:])
    labels = {t[2] for t in texts}
    assert {"0.1", "1"} <= labels, labels  # the decades stay labelled
    panel.grad_plot.clear()
    panel.grad_plot.plot(np.arange(50), np.geomspace(0.5, 0.6, 50))
    qtbot.wait(10)
    painter = QPainter(image)
    labels = [t[2] for t in panel.grad_plot.getAxis("left").generateDrawSpecs(painter)[2]]
    painter.end()
    assert "0.5" in labels and not any("·" in label for label in labels), labels  # no SI rescaling in log mode


def test_a_new_run_folder_never_reuses_an_existing_one(tmp_path):
    now = 1_790_000_000.0
    first = new_run_dir(tmp_path, "motif", now)
    assert first.parent == tmp_path and first.name.endswith("_motif") and not first.exists()
    first.mkdir()
    second = new_run_dir(tmp_path, "motif", now)
    assert second != first and not second.exists() and second.name == first.name + "-2"


def test_a_new_run_never_writes_its_launch_file_over_a_file_that_is_there(tmp_path):
    from desktop_app.ui.panels.training import launch_config_path

    now = 1_790_000_000.0
    first = new_run_dir(tmp_path, "motif", now)
    launch_config_path(first).write_text("someone's notes")  # the folder is free, its launch file's name is not
    second = new_run_dir(tmp_path, "motif", now)
    assert second != first and not launch_config_path(second).exists()
    assert launch_config_path(first).read_text() == "someone's notes"


@pytest.mark.parametrize("name,options", [("motif", {}), ("sort", {"length": 5}), ("modadd", {"p": 13}),
                                          ("induction", {"length": 6, "symbols": 8})])
def test_a_task_sample_is_text_its_tokenizer_reads_back(name, options):
    task = make_task(name, options)
    text = sample_text(task)
    assert task.tokenizer.encode(text) == task.val_set().inputs[0].tolist()
    assert len(task.tokenizer.encode(text)) == task.seq_len


def test_settings_show_their_values_without_padding_zeros(qtbot):
    panel = _shown_panel(qtbot)
    shown = {w: w.lineEdit().text() for w in (panel.lr, panel.weight_decay, panel.dropout, panel.grad_clip)}
    assert list(shown.values()) == ["0.001", "0.01", "0", "1"]
    _type(qtbot, panel.lr, "0.0003")
    assert panel.lr.value() == 0.0003 and panel.lr.lineEdit().text() == "0.0003"
    _type(qtbot, panel.dropout, "0.15")
    assert panel.dropout.value() == 0.15 and "--dropout 0.15" in " ".join(panel.cli_args())


def test_the_bpe_vocabulary_row_shows_only_for_bpe(qtbot):
    panel = _shown_panel(qtbot)
    qtbot.keyClicks(panel.task, "text")
    assert panel.tokenizer.currentText() == "char" and not panel.task_form.isRowVisible(panel.vocab_size)
    qtbot.keyClicks(panel.tokenizer, "bpe")
    assert panel.task_form.isRowVisible(panel.vocab_size)


def test_resuming_a_run_started_elsewhere_keeps_its_launch_file(qtbot, tmp_path, monkeypatch):
    """A run started with `train --config <run>.train.json`: resuming it from the panel writes the panel's
    settings to <run>.train-2.json, never over the user's file; the same settings again reuse the file."""
    from desktop_app.core.training import TrainConfig, train
    from desktop_app.ui.panels.training import free_launch_config_path, launch_config_path

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / "myrun"
    cfg = TrainConfig(task="sort", task_options={"length": 5, "symbols": 10}, family="gpt2",
                      model={"n_layers": 1, "n_heads": 2, "d_model": 32, "d_ff": 64, "context_length": 16},
                      steps=4, eval_every=2, checkpoint_every=2, batch_size=8, seed=0)
    users = launch_config_path(run)
    users.write_text("{\n  \"task\": \"sort\"  // my notes\n}\n", encoding="utf-8")
    train(cfg, run)
    panel = _shown_panel(qtbot)
    panel.settings_scroll.ensureWidgetVisible(panel.resume_edit)
    qtbot.wait(10)
    qtbot.mouseClick(panel.resume_check, Qt.MouseButton.LeftButton)
    _type(qtbot, panel.resume_edit, str(run))
    panel.steps.setValue(6)
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.running
    assert panel.config_file == run.with_name("myrun.train-2.json")
    assert users.read_text(encoding="utf-8").endswith("// my notes\n}\n")  # untouched
    qtbot.waitUntil(lambda: not panel.running, timeout=90_000)
    assert panel.events[-1]["event"] == "done", panel.status_label.text()
    text = panel.config_file.read_text(encoding="utf-8")
    assert free_launch_config_path(run, text) == panel.config_file  # the same settings: the same file


def test_resume_needs_a_run_folder_with_a_checkpoint(qtbot, tmp_path):
    panel = _shown_panel(qtbot)
    panel.settings_scroll.ensureWidgetVisible(panel.resume_edit)  # the Output group is at the bottom
    qtbot.wait(10)
    qtbot.mouseClick(panel.resume_check, Qt.MouseButton.LeftButton)
    assert panel.resume_check.isChecked()
    assert "run folder" in panel.out_error.text() and not panel.start_button.isEnabled()
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    _type(qtbot, panel.resume_edit, str(empty))
    assert "no checkpoint" in panel.out_error.toolTip() and not panel.start_button.isEnabled()
    run = tmp_path / "2026-11-24_1012_motif"
    run.mkdir()
    (run / "trainer_state.json").write_text('{"step": 5}', encoding="utf-8")  # what checkpoint_step reads
    _type(qtbot, panel.resume_edit, str(run))
    assert not panel.out_error.isVisible() and panel.start_button.isEnabled()
    assert f"--out {run} --resume" in " ".join(panel.cli_args())  # the run's own folder, not a new one
    qtbot.mouseClick(panel.resume_check, Qt.MouseButton.LeftButton)
    assert "--resume" not in panel.cli_args() and panel.start_button.isEnabled()


# -- issue 15: the training config is the contract ---------------------------------------------------

def test_start_hands_the_run_the_forms_config_and_resume_shows_the_runs_settings(qtbot, tmp_path, monkeypatch):
    from desktop_app.core.training.trainer import TrainConfig, read_run_config

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    panel = _shown_panel(qtbot)
    _tiny(panel, tmp_path / "runs")
    panel.steps.setValue(6)
    panel.eval_every.setValue(3)
    panel.checkpoint_every.setValue(3)
    _type(qtbot, panel.lr, "0.002")
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.running
    run_dir = panel.out_dir
    args = panel.process.arguments()  # the settings file, not a list of flags
    assert args[args.index("train") + 1:] == ["--config", str(panel.config_file), "--out", str(run_dir),
                                              "--jsonl", "--control-stdin"]
    written = TrainConfig.from_json(panel.config_file.read_text(encoding="utf-8"))
    assert written == panel.config() and written.lr == 0.002 and written.task_options == {"length": 5, "symbols": 10}
    qtbot.waitUntil(lambda: not panel.running, timeout=90_000)
    assert panel.events[-1]["event"] == "done", panel.status_label.text()
    assert read_run_config(run_dir) == written  # the run kept the settings it was handed

    other = _shown_panel(qtbot)  # a fresh form: the defaults, not the run's
    assert other.task.currentText() == "motif" and other.layers.value() == 2
    other.settings_scroll.ensureWidgetVisible(other.resume_edit)
    qtbot.wait(10)
    qtbot.mouseClick(other.resume_check, Qt.MouseButton.LeftButton)
    _type(qtbot, other.resume_edit, str(run_dir))
    assert other.config() == written  # the form shows the run's saved settings
    assert other.task.currentText() == "sort" and other.length.value() == 5 and other.d_model.value() == 32
    assert other.start_button.isEnabled() and f"--out {run_dir} --resume" in " ".join(other.cli_args())


def test_the_end_of_run_line_names_each_number_and_its_step():
    """A stop between evaluations: the validation figures are the evaluation's at step 1000, the training
    ones the batches' logged at step 1195, the run stopped at 1200 (issue 25 found them mixed)."""
    from desktop_app.core.views.training import end_of_run_line

    events = [{"event": "start", "step": 0},
              {"event": "step", "step": 1000, "train_loss": 0.52, "train_accuracy": 0.88},
              {"event": "eval", "step": 1000, "val_loss": 0.35, "val_accuracy": 0.931, "train_accuracy": 0.88},
              {"event": "step", "step": 1195, "train_loss": 0.41, "train_accuracy": 0.91}]
    stopped = {"event": "stopped", "step": 1200, "train_loss": 0.41, "train_accuracy": 0.91, "val_loss": 0.35,
               "val_accuracy": 0.931}
    assert end_of_run_line(stopped, events) == (
        "Stopped at step 1200: training loss 0.4100, accuracy 91.0% (batches up to step 1195); "
        "validation loss 0.3500, accuracy 93.1% (evaluation at step 1000).")
    assert end_of_run_line({"event": "stopped", "step": 3}, events[:1]) == "Stopped at step 3: no evaluation yet."
    resumed = end_of_run_line(stopped, events[:1])  # a resumed run stopped before logging: the history's numbers
    assert "from the run's history" in resumed and "93.1%" in resumed


def test_the_export_bar_waits_for_a_run(qtbot, tmp_path, monkeypatch):
    """Issue 25: nothing to export before a run (the plots are empty): the buttons say so, disabled."""
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    buttons = panel.export_bar.findChildren(QToolButton)
    assert buttons and all(not b.isEnabled() and "start a run" in b.toolTip() for b in buttons)
    panel._on_event({"event": "step", "step": 1, "steps": 10, "train_loss": 2.0, "train_accuracy": 0.1, "lr": 1e-3,
                     "tokens_per_s": 100.0, "elapsed": 0.1, "eta": 1.0})  # what the run's process reports
    assert all(b.isEnabled() for b in buttons)  # the panel's `drawn`, which its bar follows
    target = tmp_path / "metrics.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.mouseClick(panel.export_bar.buttons["Data"], Qt.MouseButton.LeftButton)
    rows = list(csv.reader(target.read_text().splitlines()))
    assert rows[0][:3] == ["step", "train_loss", "lr"] and rows[1][:3] == ["1", "2.0", "0.001"]
    choose_item(qtbot, panel.mode, "a sparse dictionary")  # its plots: no run yet (the buttons stayed on)
    assert all(not b.isEnabled() and "start a run" in b.toolTip() for b in buttons)
    choose_item(qtbot, panel.mode, "a model")
    assert all(b.isEnabled() for b in buttons)


def test_the_induction_tasks_shortest_repeat_from_the_panel(qtbot):
    """Issue 30: the induction task's min_length (repeats of several lengths) has a box, shown for that task
    only, typed into it reaches the run's config and its command line; 0 means always the length."""
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    box = panel.form.min_length
    qtbot.keyClicks(panel.task, "induction")
    assert panel.task.currentText() == "induction" and panel.task_form.isRowVisible(box)
    assert box.text() == "always the length" and "min_length" not in panel.config().task_options
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, "8")
    assert panel.config().task_options["min_length"] == 8 and "--min-length 8" in " ".join(panel.cli_args())
    assert config_from_args(build_parser().parse_args(["train", *panel.cli_args()])).task_options["min_length"] == 8
    panel.task.setCurrentText("sort")
    assert not panel.task_form.isRowVisible(box)
    assert "min_length" not in panel.config().task_options

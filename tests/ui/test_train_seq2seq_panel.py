"""The Train panel builds and trains encoder-decoders (issue 28): choosing translate offers the encoder-decoder
families (marian, the original Transformer, first), with encoder and decoder layer counts whose parameter count
and command line are what runs; a run draws its held-out exact match and the cross-attention of a held-out
sentence live, and its folder opens in every panel."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QToolButton

from desktop_app.app.training import families_for_task
from desktop_app.cli import build_parser
from desktop_app.commands.train import config_from_args
from desktop_app.core.checkpoints import new_model
from desktop_app.core.families import REGISTRY
from desktop_app.core.training.trainer import model_config_for, task_for
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from .walkthrough import choose_item


def _type(qtbot, box, value: int) -> None:
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, str(value))
    qtbot.keyClick(box, Qt.Key.Key_Tab)
    assert box.value() == value


def _offered(panel) -> list[str]:
    return [panel.family.itemText(i) for i in range(panel.family.count())]


def _built_parameters(panel) -> int:
    """The parameters of the model a run of the panel's settings builds (as train() builds it)."""
    cfg = panel.config()
    return new_model(model_config_for(cfg, task_for(cfg, causal=True))).num_parameters()


def test_translate_offers_the_encoder_decoders_with_their_layer_counts(qtbot):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    form = panel.model_form
    assert not any(REGISTRY[f].encoder_decoder for f in _offered(panel))  # motif: one stack
    assert not form.isRowVisible(panel.decoder_layers)

    choose_item(qtbot, panel.task, "translate")
    assert _offered(panel) == families_for_task("translate") and set(_offered(panel)) == {"marian", "t5"}
    # the original Transformer by default: post-LN, sinusoidal positions, ReLU
    assert panel.family.currentText() == "marian"
    assert (panel.norm_placement.currentText(), panel.positions.currentText(), panel.activation.currentText()) == \
        ("post", "sinusoidal", "relu")
    assert form.isRowVisible(panel.decoder_layers) and panel.form.layers_label.text() == "Encoder layers"
    assert panel.problems() == []

    _type(qtbot, panel.layers, 3)
    _type(qtbot, panel.decoder_layers, 1)
    shown = int(panel.param_label.text().replace(",", ""))
    assert shown == _built_parameters(panel)
    _type(qtbot, panel.decoder_layers, 2)  # a decoder block: self-attention, cross-attention and MLP
    assert int(panel.param_label.text().replace(",", "")) == _built_parameters(panel) > shown
    model = panel.config().model
    assert (model["n_layers"], model["n_decoder_layers"], model["activation"]) == (3, 2, "relu")
    # the command line the panel shows is this run: its flags give back the same settings
    args = panel.cli_args()
    line = " ".join(args)
    assert "--task translate --family marian" in line and "--layers 3" in line and "--decoder-layers 2" in line
    assert config_from_args(build_parser().parse_args(["train", *args])) == panel.config()

    choose_item(qtbot, panel.family, "t5")  # T5-style: relative position buckets, RMS norm
    preset = REGISTRY["t5"].preset()
    assert (panel.norm.currentText(), panel.positions.currentText()) == (preset.norm, preset.positions)
    assert int(panel.param_label.text().replace(",", "")) == _built_parameters(panel)
    assert panel.problems() == []

    # copy / reverse / sort train either kind: every text family is offered, the chosen one kept
    choose_item(qtbot, panel.task, "reverse")
    assert {"gpt2", "marian", "t5"} <= set(_offered(panel)) and panel.family.currentText() == "t5"
    assert int(panel.param_label.text().replace(",", "")) == _built_parameters(panel)
    choose_item(qtbot, panel.family, "gpt2")
    assert not form.isRowVisible(panel.decoder_layers) and panel.form.layers_label.text() == "Layers"
    assert "n_decoder_layers" not in panel.config().model and "--decoder-layers" not in panel.cli_args()
    # a task for decoders only offers no encoder-decoder; translate none but them
    choose_item(qtbot, panel.task, "modadd")
    assert "marian" not in _offered(panel) and "t5" not in _offered(panel)
    choose_item(qtbot, panel.task, "translate")
    assert panel.family.currentText() == "marian" and "gpt2" not in _offered(panel)


@pytest.fixture
def panel(qtbot, monkeypatch):
    """A Train panel whose run, if any, is stopped in teardown (its process ends before the test does)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    yield panel
    if panel.running:
        panel.run.stop()
        qtbot.waitUntil(lambda: not panel.running, timeout=60_000)


def test_a_translate_run_draws_exact_match_and_cross_attention_live_and_opens_everywhere(qtbot, tmp_path, panel,
                                                                                          monkeypatch):
    state = panel.state
    choose_item(qtbot, panel.task, "translate")
    for box, value in ((panel.layers, 1), (panel.decoder_layers, 1), (panel.heads, 2), (panel.d_model, 32),
                       (panel.d_ff, 64), (panel.batch_size, 16), (panel.eval_every, 3), (panel.steps, 100_000),
                       (panel.checkpoint_every, 100_000)):
        _type(qtbot, box, value)
    panel.out_edit.setText(str(tmp_path / "runs"))
    shown = int(panel.param_label.text().replace(",", ""))
    assert not panel.plots.cross_attention.isVisible()
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.running
    # the exact-match curve and the heatmap fill in while it trains
    view = panel.plots.cross_attention
    qtbot.waitUntil(lambda: panel.plots.exact_curve is not None and len(panel.plots.exact_curve.getData()[0]) >= 2
                    and view.has_data, timeout=120_000)
    start = next(e for e in panel.events if e["event"] == "start")
    assert start["parameters"] == shown  # the form's count is the model that runs
    evals = [e for e in panel.events if e["event"] == "eval"]
    steps, exact = panel.plots.exact_curve.getData()
    assert list(steps[:2]) == [e["step"] for e in evals[:2]] and list(exact[:2]) == [e["val_exact_match"]
                                                                                     for e in evals[:2]]
    assert view.isVisible()
    ev = view.event
    heatmap = view.heatmap
    assert heatmap.values.shape == (len(ev["target"]), len(ev["source"])) and ev["target"][-1] == "[END]"
    assert heatmap.row_labels == ev["target"] and heatmap.col_labels == ev["source"]
    assert len(ev["source"]) >= 3 and all(word.isalpha() for word in ev["source"])  # an English sentence
    pattern = np.asarray(ev["pattern"], dtype=np.float32)
    assert pattern.shape[0] == 2 and np.allclose(pattern.sum(-1), 1, atol=1e-3)  # each row a distribution
    assert np.allclose(heatmap.values, pattern.mean(0))  # averaged over heads
    choose_item(qtbot, view.head, "head 1")
    assert np.allclose(heatmap.values, pattern[1]) and "head 1" in heatmap.plot.titleLabel.text
    first = ev["step"]
    qtbot.waitUntil(lambda: view.event["step"] > first, timeout=120_000)  # redrawn at the next evaluation
    assert view.head.currentText() == "head 1"  # the choice stays
    assert np.allclose(heatmap.values, np.asarray(view.event["pattern"], dtype=np.float32)[1])

    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    assert panel.events[-1]["event"] == "stopped"
    last_eval = [e for e in panel.events if e["event"] == "eval"][-1]
    assert f"exact match {100 * last_eval['val_exact_match']:.1f}% (evaluation at step {last_eval['step']})" in \
        panel.status_label.text()
    # the export bar's numbers carry the exact match of each evaluation
    target = tmp_path / "metrics.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    button = next(b for b in panel.export_bar.findChildren(QToolButton) if b.text() == "Data")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    rows = list(csv.DictReader(target.read_text(encoding="utf-8").splitlines()))
    evals = [e for e in panel.events if e["event"] == "eval"]
    assert [float(r["val_exact_match"]) for r in rows if r["val_exact_match"]] == [e["val_exact_match"] for e in evals]
    # the saved folder is the usual result: "Use this model" opens it in every panel
    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)
    loaded = state.loaded
    assert loaded.config.is_encoder_decoder and loaded.config.family == "marian"
    assert (loaded.config.n_layers, loaded.config.n_decoder_layers, loaded.config.activation) == (1, 1, "relu")
    assert "translate task" in panel.status_label.text()
    assert state.text.split()[0] in {"the", "a", "this"}  # a held-out English source
    # a new run clears the last one's live views
    panel.plots.clear()
    assert panel.plots.exact_curve is None and not view.has_data and not view.isVisible()

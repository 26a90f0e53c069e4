"""The Train panel's family list is the registry's trainable text families (the encoder-decoders for the
tasks they train: tests/ui/test_train_seq2seq_panel.py), and choosing one shows that
family's own switches (norm, activation, positions) and builds a model of it, chosen by clicks."""
from __future__ import annotations

import pytest

from desktop_app.core.families import REGISTRY, trainable_families
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from .walkthrough import choose_item


def test_family_combo_is_the_registry_s_trainable_text_families(qtbot):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    offered = [panel.family.itemText(i) for i in range(panel.family.count())]
    assert offered == [f for f in trainable_families() if not REGISTRY[f].encoder_decoder]  # motif: one stack
    assert {"gpt2", "bert", "llama", "qwen3", "gemma3_text"} <= set(offered)
    assert "gpt_neox" not in offered and "vit" not in offered  # load only / not a text model


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "roberta"])
def test_choosing_a_family_shows_its_switches_and_builds_it(qtbot, family):
    from desktop_app.core.model import Transformer
    from desktop_app.core.training.trainer import model_config_for, task_for

    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    panel.task.setCurrentText("motif")
    choose_item(qtbot, panel.family, family)
    preset = REGISTRY[family].preset()
    shown = (panel.norm.currentText(), panel.activation.currentText(), panel.positions.currentText())
    assert shown == (preset.norm, preset.activation, preset.positions)
    cfg = panel.config()
    model_cfg = model_config_for(cfg, task_for(cfg, causal=preset.causal))
    assert model_cfg.family == family
    assert int(panel.param_label.text().replace(",", "")) == Transformer(model_cfg).num_parameters()


def test_the_builder_makes_a_small_mixtral_and_plots_its_router_balance_live(qtbot, tmp_path, monkeypatch):
    """Choosing mixtral shows its experts, top-k and aux-loss boxes at the family's values (8, 2, 0.001); the
    run they start builds that mixture, and each evaluation's router load appears in the load-balance plot."""
    from PySide6.QtCore import Qt

    from desktop_app.core.model import Transformer
    from desktop_app.core.training.trainer import model_config_for, task_for
    from .walkthrough import type_into

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.experts.isVisible()  # gpt2: dense
    choose_item(qtbot, panel.family, "mixtral")
    assert panel.experts.isVisible() and panel.top_k.isVisible() and panel.aux_loss.isVisible()
    assert (panel.experts.value(), panel.top_k.value(), panel.aux_loss.value()) == (8, 2, 0.001)
    panel.task.setCurrentText("sort")
    panel.length.setValue(5)
    panel.layers.setValue(2)
    panel.heads.setValue(2)
    panel.d_model.setValue(32)
    panel.d_ff.setValue(32)
    panel.context.setValue(16)
    type_into(qtbot, panel.experts, "4")
    cfg = panel.config()
    assert {k: cfg.model[k] for k in ("num_experts", "experts_per_token", "router_aux_loss_coef")} == \
        {"num_experts": 4, "experts_per_token": 2, "router_aux_loss_coef": 0.001}
    model_cfg = model_config_for(cfg, task_for(cfg, causal=True))
    assert (model_cfg.num_experts, model_cfg.experts_per_token) == (4, 2)
    assert int(panel.param_label.text().replace(",", "")) == Transformer(model_cfg).num_parameters()

    panel.steps.setValue(100_000)
    panel.eval_every.setValue(5)
    panel.checkpoint_every.setValue(100_000)
    panel.out_edit.setText(str(tmp_path / "runs"))
    assert not panel.plots.load_plot.isVisible()
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    try:
        qtbot.waitUntil(lambda: sum(e["event"] == "eval" for e in panel.events) >= 2, timeout=120_000)
    finally:
        qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not panel.running, timeout=60_000)
    evals = [e for e in panel.events if e["event"] == "eval"]
    assert panel.plots.load_plot.isVisible() and len(panel.plots.load_curves) == 2
    for layer, curve in enumerate(panel.plots.load_curves):
        steps, values = curve.getData()
        assert list(steps[:2]) == [e["step"] for e in evals[:2]]
        assert list(values[:2]) == pytest.approx([max(e["expert_load"][layer]) * 4 for e in evals[:2]])
    panel.grab().save(str(tmp_path / "train-moe.png"))

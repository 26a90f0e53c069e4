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

"""The Train panel sizes a text run for the objective its family trains, chosen by clicks: an encoder
(BERT, RoBERTa, DistilBERT) masks tokens, so its character vocabulary holds [MASK]; a decoder (GPT-2,
LLaMA) predicts the next token and has none. The count shown is the model the run builds."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.core.families import REGISTRY
from desktop_app.core.model import Transformer
from desktop_app.core.training.trainer import model_config_for, task_for
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from .walkthrough import choose_item


def _type(qtbot, field, text: str) -> None:
    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(field, text)
    qtbot.keyClick(field, Qt.Key.Key_Tab)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "gpt2", "llama"])
def test_a_text_run_is_counted_with_its_family_s_objective(qtbot, tmp_path, family):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.resize(1200, 700)
    panel.show()
    choose_item(qtbot, panel.task, "text")
    _type(qtbot, panel.text_file, str(text))
    choose_item(qtbot, panel.family, family)
    qtbot.waitUntil(lambda: panel.param_label.text().replace(",", "").isdigit(), timeout=10_000)
    cfg = panel.config()
    causal = REGISTRY[family].preset().causal  # the mask of the model the family builds
    built = {c: Transformer(model_config_for(cfg, task_for(cfg, c))).num_parameters() for c in (True, False)}
    assert built[True] != built[False]  # the two objectives differ by [MASK]: the count tells them apart
    assert int(panel.param_label.text().replace(",", "")) == built[causal]
    assert (task_for(cfg, causal).tokenizer.mask_token_id is None) == causal
    assert not panel.task_error.isVisible() and not panel.model_error.isVisible()

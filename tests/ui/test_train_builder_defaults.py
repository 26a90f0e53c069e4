"""`train --family marian` on the command line builds the model the Train panel's builder shows for marian: the
original Transformer's ReLU MLP (app.training.BUILDER_SWITCHES, one table for both), not the family preset's silu;
a flag still chooses another."""
from __future__ import annotations


from desktop_app.cli import build_parser
from desktop_app.commands.train import config_from_args
from desktop_app.core.families import REGISTRY
from desktop_app.core.training.trainer import model_config_for
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from .walkthrough import choose_item

SWITCHES = ("norm_placement", "norm", "activation", "positions")


def _cli(tmp_path, *flags: str):
    args = build_parser().parse_args(["train", "--task", "translate", "--family", "marian", "--steps", "10",
                                      "--out", str(tmp_path / "run"), *flags])
    return config_from_args(args)


def _switches(cfg) -> dict:
    built = model_config_for(cfg)
    return {key: getattr(built, key) for key in SWITCHES}


def test_the_cli_builds_marian_with_the_panels_relu(qtbot, tmp_path):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    choose_item(qtbot, panel.task, "translate")
    assert panel.family.currentText() == "marian" and panel.activation.currentText() == "relu"
    assert REGISTRY["marian"].preset().activation != "relu"  # the builder's choice, not the preset's

    cli = _cli(tmp_path)
    assert cli.model.get("activation") == "relu"
    assert _switches(cli) == _switches(panel.config())  # post-LN, layernorm, relu, sinusoidal: one model
    assert _cli(tmp_path, "--activation", "silu").model["activation"] == "silu"  # a flag still wins

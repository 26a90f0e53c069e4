"""Whether a run trains next-token (a causal model) or masked tokens (a bidirectional encoder) follows the
family registry (Family.decoder), never a family's name: RoBERTa and DistilBERT text runs mask tokens as
BERT's do; GPT-2 and LLaMA predict the next token. Through the core train(), the `train` CLI and the Train
panel's parameter count (clicked)."""
from __future__ import annotations

import json
import random

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.families import REGISTRY, trainable_families
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training.tasks import IGNORE, TextTask
from desktop_app.core.training.trainer import trains_causal

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32, "context_length": 16}
MASKED, NEXT_TOKEN = ("bert", "roberta", "distilbert"), ("gpt2", "llama")


def _text(tmp_path):
    path = tmp_path / "t.txt"
    rng = random.Random(0)
    path.write_text("".join(rng.choice("abcdefgh ") for _ in range(600)), encoding="utf-8")
    return path


@pytest.fixture
def batches(monkeypatch):
    """Every (inputs, targets, mask id) the text task hands the run (its training and held-out batches)."""
    seen: list[tuple[torch.Tensor, torch.Tensor, int | None]] = []
    make = TextTask._make

    def spy(self, windows, gen):
        batch = make(self, windows, gen)
        seen.append((batch.inputs.clone(), batch.targets.clone(), self.mask_id))
        return batch

    monkeypatch.setattr(TextTask, "_make", spy)
    return seen


def _check_masked(seen, loaded, events) -> None:
    assert events[0]["task"]["objective"] == "mlm"
    assert not loaded.config.causal
    mask_id = loaded.tokenizer.mask_token_id
    assert mask_id is not None
    assert seen and all(m == mask_id for _, _, m in seen)
    inputs = torch.cat([x.flatten() for x, _, _ in seen])
    targets = torch.cat([y.flatten() for _, y, _ in seen])
    scored = targets != IGNORE
    assert (inputs == mask_id).any()  # the batches carry mask tokens
    assert scored[inputs == mask_id].all()  # every masked position is scored ...
    assert 0.05 < scored.float().mean() < 0.3  # ... and only the ~15% chosen ones are (loss over them only)
    assert not (targets[scored] == mask_id).any()


def _check_next_token(seen, loaded, events) -> None:
    assert events[0]["task"]["objective"] == "clm"
    assert loaded.config.causal and loaded.tokenizer.mask_token_id is None
    assert seen and all(m is None for _, _, m in seen)
    for x, y, _ in seen:
        assert (y != IGNORE).all() and torch.equal(y[:, :-1], x[:, 1:])  # each position scores the next token


@pytest.mark.parametrize("family", MASKED + NEXT_TOKEN)
def test_a_text_run_trains_the_objective_of_its_family(tmp_path, batches, family):
    cfg = TrainConfig(task="text", task_options={"text_file": str(_text(tmp_path))}, family=family,
                      model=dict(TINY), steps=3, warmup_steps=1, batch_size=4, log_every=1, eval_every=3,
                      checkpoint_every=3)
    events: list[dict] = []
    train(cfg, tmp_path / "run", on_event=events.append)
    loaded = load_model_folder(tmp_path / "run")
    (_check_masked if family in MASKED else _check_next_token)(batches, loaded, events)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "gpt2"])
def test_the_train_cli_trains_the_objective_of_its_family(tmp_path, capsys, batches, family):
    from desktop_app.cli import main

    code = main(["train", "--task", "text", "--text-file", str(_text(tmp_path)), "--family", family,
                 "--layers", "1", "--heads", "2", "--d-model", "16", "--context", "16", "--batch-size", "4",
                 "--steps", "2", "--log-every", "1", "--eval-every", "2", "--jsonl", "--out", str(tmp_path / "run")])
    out = capsys.readouterr()
    assert code == 0, out.err
    events = [json.loads(line) for line in out.out.splitlines()]
    loaded = load_model_folder(tmp_path / "run")
    assert loaded.config.family == family
    (_check_masked if family in MASKED else _check_next_token)(batches, loaded, events)


def test_the_objective_is_the_registry_s_and_a_causal_override_wins():
    for name in trainable_families() + trainable_families("patches"):
        family = REGISTRY[name]
        # the registry's declaration is the preset's mask: the model a run builds computes what it says
        assert family.preset().causal == family.decoder, name
        assert trains_causal(TrainConfig(family=name)) == family.decoder, name
    # a run that overrides the model's mask trains the objective of the model it builds
    assert trains_causal(TrainConfig(family="gpt2", model={"causal": False})) is False
    assert trains_causal(TrainConfig(family="roberta", model={"causal": True})) is True
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        trains_causal(TrainConfig(family="nope"))


def test_next_token_training_of_a_bidirectional_model_is_refused(tmp_path):
    # asked for in a settings file: a bidirectional model sees the token it is to predict
    cfg = TrainConfig(task="text", task_options={"text_file": str(_text(tmp_path)), "objective": "clm"},
                      family="roberta", model=dict(TINY), steps=2)
    with pytest.raises(ValueError, match="objective clm.*needs a causal model"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_resuming_an_encoder_run_trained_next_token_says_so(tmp_path, monkeypatch):
    """A RoBERTa text run trained before the objective followed the registry (next-token, no [MASK] in
    its tokenizer) is not resumed as a masked run that crashes at its first batch: one clear line."""
    from desktop_app.core.training import trainer

    cfg = TrainConfig(task="text", task_options={"text_file": str(_text(tmp_path))}, family="roberta",
                      model=dict(TINY), steps=2, warmup_steps=1, batch_size=4, eval_every=2, checkpoint_every=2)
    with monkeypatch.context() as m:
        m.setattr(trainer, "trains_causal", lambda cfg: True)  # the old decision (family != "bert")
        train(cfg, tmp_path / "run")
    assert load_model_folder(tmp_path / "run").tokenizer.mask_token_id is None
    cfg.steps = 4
    with pytest.raises(ValueError, match=r"needs a \[MASK\] token, which the run's tokenizer lacks"):
        train(cfg, tmp_path / "run", resume=True)

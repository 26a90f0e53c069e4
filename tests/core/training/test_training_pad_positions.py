"""A RoBERTa built for a task numbers its positions over the ids that are not pad_token_id (transformers'
create_position_ids_from_input_ids). Its preset's pad is 1, a real token of every task (the copy task's
"1", a text's second character): the builder gives it an id past the task's instead, so every real token has
its own position, and the folder still opens in transformers with the same logits."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.families import REGISTRY, trainable_families
from desktop_app.core.training import TrainConfig
from desktop_app.core.training.trainer import model_config_for, task_for, trains_causal

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32, "context_length": 16}


def _built(family: str, task: str = "copy"):
    cfg = TrainConfig(task=task, family=family, model=dict(TINY))
    task_obj = task_for(cfg, trains_causal(cfg))
    return cfg, task_obj, model_config_for(cfg, task_obj)


def test_a_roberta_for_the_copy_task_gives_token_1_a_position_of_its_own():
    cfg, task, mcfg = _built("roberta")
    assert task.tokenizer.decode([1]) == "1"  # id 1 is a real token of the task
    assert mcfg.positions_from_pad
    assert task.vocab_size <= mcfg.pad_token_id < mcfg.vocab_size  # no id the task's tokenizer writes
    model = new_model(mcfg, seed=0).eval()
    ones = torch.ones(1, 6, dtype=torch.long)  # "1 1 1 1 1 1": only its positions tell the tokens apart
    with torch.no_grad():
        hidden = model(ones, compute_logits=False).hidden[0]
    assert not torch.allclose(hidden[0], hidden[1], atol=1e-4)  # as pads, all six read the same position row
    # the panel's parameter count builds from the task's vocabulary alone: the same model
    assert model_config_for(cfg, vocab_size=task.vocab_size) == mcfg


def test_no_trainable_family_reads_a_task_token_as_padding():
    checked = []
    for family in trainable_families():
        if REGISTRY[family].encoder_decoder:  # their pad is the task's own <pad> (seq2seq_tasks.py)
            continue
        _, task, mcfg = _built(family)
        if mcfg.positions_from_pad:
            assert mcfg.pad_token_id >= task.vocab_size, family
            checked.append(family)
    assert "roberta" in checked  # the check ran: at least the family this file is about counts positions from its pad


def test_the_folder_opens_in_transformers_with_the_same_logits_on_token_1(tmp_path):
    transformers = pytest.importorskip("transformers")
    _, task, mcfg = _built("roberta")
    save_model_folder(new_model(mcfg, seed=0), tmp_path, tokenizer=task.tokenizer)
    loaded = load_model_folder(tmp_path)
    hf = transformers.RobertaForMaskedLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[3, 1, 1, 5, 10, 1, 0, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)

"""`train --task reverse|copy|sort|translate --family marian|t5` (issue 28): an encoder-decoder trained with
teacher forcing, saved as a folder that transformers opens with the same logits and that the app reopens."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from seq2seq_decode import greedy_decode
from desktop_app.core.training.tasks import make_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TINY = ["--layers", "1", "--heads", "2", "--d-model", "32", "--d-ff", "64", "--batch-size", "16"]


def train(capsys, *args) -> tuple[int, list[dict], str]:
    from desktop_app.cli import main

    code = main(["train", *args, "--jsonl"])
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err


def test_translate_trains_a_marian_folder_that_transformers_and_the_app_open(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    code, events, err = train(capsys, "--task", "translate", "--family", "marian", *TINY, "--activation", "relu",
                              "--steps", "40", "--eval-every", "20", "--out", str(tmp_path / "run"),
                              "--export", str(tmp_path / "shared"))
    assert code == 0, err
    evals = [e for e in events if e.get("event") == "eval"]
    assert [e["step"] for e in evals] == [20, 40] and all(0 <= e["val_exact_match"] <= 1 for e in evals)
    summary = events[-1]
    assert summary["step"] == 40 and summary["val_exact_match"] == evals[-1]["val_exact_match"]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]  # it trains

    task = make_task("translate", encoder_decoder=True)
    val = task.val_set(0).rows(slice(0, 24))
    mask = val.src != task.pad_id
    for folder in ("run", "shared"):
        loaded = load_model_folder(tmp_path / folder)  # the app reopens it
        assert loaded.config.is_encoder_decoder and loaded.config.family == "marian"
        assert loaded.tokenizer.encode("the black dog runs") == task.tokenizer.encode("the black dog runs")
        assert loaded.config.decoder_start_token_id == task.start_id and loaded.config.eos_token_id == task.end_id
        ours = loaded.model(val.src, val.inputs, src_mask=mask).logits
        hf = transformers.MarianMTModel.from_pretrained(tmp_path / folder).eval()
        with torch.no_grad():
            theirs = hf(input_ids=val.src, attention_mask=mask.long(), decoder_input_ids=val.inputs).logits
        assert (ours - theirs).abs().max().item() < 1e-4
    # greedy decoding as transformers' generate does it, stopping at [END]
    for src in val.src[:4]:
        src = src[src != task.pad_id]
        generated = hf.generate(src[None], max_new_tokens=9, do_sample=False, num_beams=1)[0, 1:].tolist()
        assert greedy_decode(loaded.model, src, 9, eos_id=task.end_id) == generated


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_the_symbol_tasks_train_a_t5_and_keep_their_names(tmp_path, capsys, task):
    code, events, err = train(capsys, "--task", task, "--family", "t5", *TINY, "--length", "4", "--symbols", "5",
                              "--steps", "6", "--eval-every", "6", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert events[0]["task"]["task"] == task and events[0]["task"]["length"] == 4
    loaded = load_model_folder(tmp_path / "run")
    assert loaded.config.family == "t5" and loaded.config.is_encoder_decoder
    assert loaded.tokenizer.decode([1, 7, 2]) == "[START] 4 [END]"  # the seq2seq vocabulary: specials first
    assert "val_exact_match" in events[-1]


def test_a_decoder_family_on_translate_is_refused_in_one_line(tmp_path, capsys):
    code, events, err = train(capsys, "--task", "translate", "--family", "gpt2", *TINY, "--steps", "2",
                              "--out", str(tmp_path / "run"))
    assert code != 0 and not events
    assert "translate task trains an encoder-decoder" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "model.safetensors").exists()

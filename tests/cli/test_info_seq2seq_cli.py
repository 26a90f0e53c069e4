"""`info` on an encoder-decoder says so and counts both stacks: n_layers is the encoder's, n_decoder_layers the
decoder's (a T5 folder with num_layers 2 and num_decoder_layers 1, as transformers writes it); before, only
n_layers was printed, so an asymmetric model read as 2 + 2 layers. A one-stack model's JSON is unchanged."""
from __future__ import annotations

import json

import pytest

from desktop_app.cli import main

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_info_of_an_encoder_decoder_counts_both_stacks(tmp_path, capsys):
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=1, num_heads=2,
        decoder_start_token_id=0))
    hf.save_pretrained(tmp_path / "t5")
    assert main(["info", str(tmp_path / "t5")]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["family"] == "t5" and info["is_encoder_decoder"] is True
    assert (info["n_layers"], info["n_decoder_layers"]) == (2, 1)
    assert info["parameters"] == sum(p.numel() for p in hf.parameters())


def test_info_of_a_one_stack_model_has_no_decoder_keys(tmp_path, capsys):
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                                 context_length=16), seed=0), tmp_path / "gpt2")
    assert main(["info", str(tmp_path / "gpt2")]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "n_decoder_layers" not in info and "is_encoder_decoder" not in info


def test_num_decoder_layers_zero_is_not_read_as_num_layers(tmp_path, capsys):
    # transformers reads num_decoder_layers as given (only a missing one follows num_layers); a decoder of
    # no blocks is refused in one line naming the file, never read as num_layers' 2
    transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        decoder_start_token_id=0)).save_pretrained(tmp_path / "t5")
    path = tmp_path / "t5" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_decoder_layers": 0}))
    assert main(["info", str(tmp_path / "t5")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    refusal = [line for line in err if "n_decoder_layers" in line]
    assert len(refusal) == 1 and "must be a positive integer, got 0" in refusal[0] and "t5" in refusal[0]

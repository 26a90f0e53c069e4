"""Issue 28, encoder-decoders in the last two commands. `dynamics --model MODEL --layer L --head H --stack
encoder|decoder` runs the particles under an encoder-decoder's self-attention head of the stack named; a stack
is required there, refused elsewhere, and cross-attention is not one (each in one line). `features` on an
encoder-decoder: a decoder hook's rows are [start] + --target-text, as core.features reads them; `train --task
sae` refuses a decoder hook and a TransformerLens name there in one line and trains on an encoder hook."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from desktop_app.cli import EXIT_INPUT, main
from desktop_app.core import dynamics as dy
from desktop_app.app.whatif import decoder_input
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.features import attach, feature_activations, load_dictionary
from desktop_app.core.features.dictionary import SparseDictionary, save_dictionary
from desktop_app.paths import demo_model_dir
from desktop_app.core.tokenizer import char_tokenizer
from translate_models import save_translate_model


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian") / "m"
    save_translate_model(folder, d_model=16, n_layers=2, n_decoder_layers=2, n_heads=2, d_ff=32, context_length=24,
                         init_std=0.3)
    return folder


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["dynamics", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("stack", dy.STACKS)
def test_a_stacks_head_drives_the_same_run_as_the_core(marian_dir, tmp_path, capsys, stack):
    out_csv = tmp_path / "c.csv"
    code, out, err = run_cli(capsys, "--model", str(marian_dir), "--layer", "1", "--head", "0", "--stack", stack,
                             "--n", "12", "--init", "gaussian", "--steps", "5", "--seed", "2", "--csv", str(out_csv))
    assert code == 0, err
    model = load_model_folder(marian_dir).model.float().eval()
    head = dy.model_head(model, 1, 0, stack=stack)
    sim = dy.run(dy.DynamicsConfig(d=16, n=12, init="gaussian", seed=2), 5, head=head)
    assert out_csv.read_text() == dy.csv_text(sim.records)
    assert f"{stack} layer 1 head 0" in out
    assert json.loads(out.strip().splitlines()[-1])["rows"] == 6


def test_the_stack_is_required_for_an_encoder_decoder_and_refused_elsewhere(marian_dir, tmp_path, capsys):
    csv = str(tmp_path / "o.csv")
    for extra, expected in (((), "is an encoder-decoder: choose --stack encoder or decoder"),
                            (("--layer", "2", "--stack", "decoder"), "decoder has layers 0..1, not 2")):
        code, _, err = run_cli(capsys, "--model", str(marian_dir), *extra, "--csv", csv)
        assert code == EXIT_INPUT and len(err.strip().splitlines()) == 1 and expected in err, err
    with pytest.raises(SystemExit):  # cross-attention is not a choice
        run_cli(capsys, "--model", str(marian_dir), "--stack", "cross", "--csv", csv)
    assert "invalid choice: 'cross'" in capsys.readouterr().err
    tok = char_tokenizer("abc ")
    gpt2 = tmp_path / "gpt2"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=8, n_layers=1, n_heads=2,
                                                 d_ff=16, context_length=16), seed=0), gpt2, tokenizer=tok)
    code, _, err = run_cli(capsys, "--model", str(gpt2), "--stack", "encoder", "--csv", csv)
    assert code == EXIT_INPUT and len(err.strip().splitlines()) == 1
    assert f"--stack: {gpt2} is not an encoder-decoder" in err
    code, _, err = run_cli(capsys, "--stack", "encoder", "--csv", csv)
    assert code == EXIT_INPUT and "give --model too" in err
    code, out, err = run_cli(capsys, "--model", str(gpt2), "--head", "1", "--steps", "2", "--csv", csv)
    assert code == 0 and "layer 0 head 1" in out, err


# -- features ----------------------------------------------------------------------------------------

TARGET = "le chien noir"


def _dictionary(folder, hook: str):
    g = torch.Generator().manual_seed(0)
    d = SparseDictionary(torch.randn(16, 24, generator=g), torch.zeros(24), torch.randn(24, 16, generator=g),
                         torch.zeros(16), hook=hook)
    save_dictionary(d, folder)
    return folder


def test_a_decoder_hook_reads_start_and_the_target_text(marian_dir, tmp_path, capsys):
    sae = _dictionary(tmp_path / "dec", "decoder.blocks.1.resid_post")
    out = tmp_path / "f.npz"
    code = main(["features", str(marian_dir), "--sae", str(sae), "--text", "the black dog runs",
                 "--target-text", TARGET, "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    loaded = load_model_folder(marian_dir)
    source = loaded.tokenizer.encode("the black dog runs")
    dec = decoder_input(loaded, TARGET)
    ref = feature_activations(loaded.model, source, [attach(load_dictionary(sae), loaded.config)], decoder_ids=dec)[0]
    saved = np.load(out)
    assert saved["ids"].tolist() == dec and len(dec) > 1
    np.testing.assert_allclose(saved["acts"], ref.acts.numpy(), rtol=1e-5, atol=1e-6)
    assert json.loads(printed.out.strip().splitlines()[-1])["tokens"] == len(dec)


def test_training_refuses_a_decoder_hook_and_a_name_without_a_stack(marian_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the black dog sees a white cow\n" * 30, encoding="utf-8")
    for hook, expected in (("decoder.blocks.0.resid_post", "reads the decoder, whose input"),
                           ("blocks.0.hook_resid_post", "cannot say which stack")):
        code = main(["train", "--task", "sae", "--model", str(marian_dir), "--hook", hook, "--text-file", str(text),
                     "--out", str(tmp_path / "out"), "--d-sae", "16", "--k", "2", "--steps", "5"])
        err = capsys.readouterr().err
        assert code == EXIT_INPUT and len(err.strip().splitlines()) == 1 and expected in err, err
    code = main(["train", "--task", "sae", "--model", str(marian_dir), "--hook", "encoder.blocks.0.resid_post",
                 "--text-file", str(text), "--out", str(tmp_path / "out"), "--d-sae", "16", "--k", "2", "--steps", "5"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert json.loads((tmp_path / "out" / "cfg.json").read_text())["metadata"]["hook_name"] == \
        "encoder.blocks.0.resid_post"


def test_target_text_is_refused_for_a_one_stack_model(tmp_path, capsys):
    sae = _dictionary(tmp_path / "x", "blocks.0.hook_resid_post")
    code = main(["features", str(demo_model_dir()), "--sae", str(sae), "--text", "Alice", "--target-text", "x",
                 "--out", str(tmp_path / "f.npz")])
    err = capsys.readouterr().err
    assert code == EXIT_INPUT and "--target-text" in err and "not an encoder-decoder" in err

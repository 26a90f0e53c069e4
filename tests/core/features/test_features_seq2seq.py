"""Sparse dictionaries on an encoder-decoder (issue 28): the app's stack-prefixed names (encoder.blocks.L.*,
decoder.blocks.L.*) as a dictionary's hook; one trained here on a tiny Marian's encoder hook reads, in the lens,
exactly encode() of that activation of the source; a decoder hook reads the decoder's input; a feature edit goes
through the interventions at that name; TransformerLens names, which cannot say which stack, are refused."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.app.features import dictionary_problems, lens_on
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.features import attach, feature_edit, hook_point, load_dictionary
from desktop_app.core.features.edits import FeatureOp
from desktop_app.core.trace import Trace
from desktop_app.core.training.sae import SaeTrainConfig, train_sae
from translate_models import save_translate_model

SENTENCES = ["the black dog sees a white cow", "the small cat runs", "a white cow likes the black dog",
             "the lazy mouse sleeps slowly", "the blue pig likes a lazy mouse"]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian") / "m"
    save_translate_model(folder, d_model=16, n_layers=2, n_decoder_layers=2, n_heads=2, d_ff=32, context_length=24,
                         init_std=0.3)
    return load_model_folder(folder)


@pytest.fixture(scope="module")
def trained(marian, tmp_path_factory):
    """(dictionary folder, summary) of a TopK dictionary trained on the encoder's layer-1 residual stream."""
    root = tmp_path_factory.mktemp("sae")
    text = root / "t.txt"
    text.write_text("\n".join(SENTENCES * 20), encoding="utf-8")
    cfg = SaeTrainConfig(text_file=str(text), hook="encoder.blocks.1.resid_post", d_sae=32, k=4, steps=40,
                         batch_size=64, log_every=10, eval_every=20)
    summary, _ = train_sae(cfg, marian, root / "out")
    return root / "out", summary


def _source_and_target(marian):
    src = marian.tokenizer.encode(SENTENCES[0])
    start = marian.model.start_token()
    return list(src), [start, 5, 6, 7]


def _recorded(marian, src, dec, *names):
    trace = Trace(names)
    with torch.no_grad():
        enc = marian.model.encode(torch.tensor([src]), trace=trace)
        marian.model.decode(torch.tensor([dec]), enc, trace=trace, compute_logits=False)
    return trace


def test_a_dictionary_trained_on_an_encoder_hook_reads_encode_of_that_activation(marian, trained):
    folder, summary = trained
    saved = json.loads((folder / "cfg.json").read_text())
    assert saved["metadata"]["hook_name"] == "encoder.blocks.1.resid_post" and summary["step"] == 40
    d = load_dictionary(folder)
    att = attach(d, marian.config)
    assert att.read.stack == "encoder" and att.read.name == "encoder.blocks.1.resid_post"
    src, dec = _source_and_target(marian)
    [(run, tokens)] = lens_on(marian, src, [att], [], 5)
    x = _recorded(marian, src, dec, "encoder.blocks.1.resid_post")["encoder.blocks.1.resid_post"][0].float()
    assert run.acts.shape == (len(src), 32) and len(tokens) == len(src)  # the source's tokens
    torch.testing.assert_close(run.acts, d.encode(x))
    assert (run.acts != 0).sum(-1).max() <= 4 and run.mean_l0 > 0
    assert tokens[0].l0 == int((run.acts[0] != 0).sum())


def test_a_decoder_hook_reads_the_decoders_input_and_an_edit_there_changes_what_follows(marian, trained):
    from desktop_app.core.features.dictionary import SparseDictionary

    g = torch.Generator().manual_seed(0)
    d = SparseDictionary(torch.randn(16, 8, generator=g), torch.zeros(8), torch.randn(8, 16, generator=g),
                         torch.zeros(16), architecture="standard", hook="decoder.blocks.0.resid_post")
    att = attach(d, marian.config)
    src, dec = _source_and_target(marian)
    with pytest.raises(ValueError, match="reads the decoder, whose input"):
        lens_on(marian, src, [att], [], 5)  # no target given
    [(run, tokens)] = lens_on(marian, src, [att], [], 5, decoder_ids=dec)
    names = ("decoder.blocks.0.resid_post", "decoder.blocks.1.resid_post")
    clean = _recorded(marian, src, dec, *names)
    torch.testing.assert_close(run.acts, d.encode(clean[names[0]][0].float()))
    assert len(tokens) == len(dec)
    # a feature edit is an intervention at that name: zeroing an active feature changes the next layer
    k = int(run.acts[1].argmax())
    assert run.acts[1, k] > 0
    iv = feature_edit(att, [FeatureOp(k, "zero")])
    trace = Trace(names)
    with torch.no_grad():
        enc = marian.model.encode(torch.tensor([src]))
        marian.model.decode(torch.tensor([dec]), enc, trace=trace, compute_logits=False, interventions=[iv])
    assert not torch.allclose(trace[names[1]], clean[names[1]])
    delta = trace[names[0]][0] - clean[names[0]][0]
    expected = d.decode_delta(-run.acts * (torch.arange(8) == k))  # minus feature k's part, at every position
    torch.testing.assert_close(delta.float(), expected, rtol=1e-4, atol=1e-5)


def test_hooks_of_an_encoder_decoder_name_their_stack(marian):
    cfg = marian.config
    with pytest.raises(ValueError, match="cannot say which stack"):
        hook_point("blocks.1.hook_resid_post", cfg)
    with pytest.raises(ValueError, match="the decoder has layers 0..1"):
        hook_point("decoder.blocks.2.resid_post", cfg)
    with pytest.raises(ValueError, match="the encoder has no cross-attention"):
        hook_point("encoder.blocks.0.resid_cross", cfg)
    assert hook_point("decoder.blocks.1.resid_cross", cfg).stack == "decoder"
    assert hook_point("encoder.embed", cfg).layer == -1
    from desktop_app.core.config import ModelConfig

    gpt2 = ModelConfig.gpt2(vocab_size=30, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=16)
    with pytest.raises(ValueError, match="one stack of layers"):
        hook_point("encoder.blocks.0.resid_post", gpt2)
    problems = dictionary_problems(marian, SaeTrainConfig(text_file=__file__, hook="decoder.blocks.0.resid_post"))
    assert problems == ["Hook decoder.blocks.0.resid_post reads the decoder, whose input is a target: a dictionary "
                        "trains on a text file read as the encoder's source; choose an encoder hook "
                        "(encoder.blocks.L.*)."]
    assert dictionary_problems(marian, SaeTrainConfig(text_file=__file__, hook="encoder.blocks.0.resid_post")) == []


@pytest.mark.parametrize("hooks, blocks_run", [
    (["encoder.blocks.0.resid_post"], ["encoder.0"]),  # the encoder's first layer only, no decoder
    (["encoder.blocks.0.resid_post", "decoder.blocks.0.resid_post"], ["encoder.0", "encoder.1", "decoder.0"]),
    (["decoder.blocks.1.mlp.out"], ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]),
])
def test_recording_hooks_runs_no_further_than_the_last_layer_they_need(marian, monkeypatch, hooks, blocks_run):
    """The decoder reads the whole encoder's output (its cross-attention); each stack stops at its last layer
    needed, with the values of the whole pass."""
    from desktop_app.core.features.activations import record_points

    src, dec = _source_and_target(marian)
    points = [hook_point(h, marian.config) for h in hooks]
    ran = []
    for stack in ("encoder", "decoder"):
        for l, block in enumerate(getattr(marian.model, stack).blocks):
            monkeypatch.setattr(block, "forward", lambda *a, _real=block.forward, _name=f"{stack}.{l}", **k:
                                ran.append(_name) or _real(*a, **k))
    trace = record_points(marian.model, src, points, decoder_ids=dec)
    assert ran == blocks_run
    whole = _recorded(marian, src, dec, *[p.recorded for p in points])
    for p in points:
        assert torch.equal(trace[p.recorded], whole[p.recorded]), p.hook

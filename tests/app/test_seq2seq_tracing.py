"""app.tracing for encoder-decoders (issue 28): the input is a source and a target, the decoder reads
[start] + the target's tokens (through Tokenizer.target when the model has one), the trace holds both stacks,
attention_view maps one kind of attention onto the names the views read, a cancel stops after the block where it
is seen, and the memory estimate counts both stacks and the cross-attention."""
from __future__ import annotations

import pytest
import torch

from desktop_app.app.tracing import (CROSS, DECODER, ENCODER, EncodedPair, attention_view, check_trace_memory,
                                     estimated_trace_bytes, trace_input)
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training.tasks import word_tokenizer
from translate_models import save_translate_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SOURCE, TARGET = "the black dog runs", "le chien noir court"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian") / "m"
    save_translate_model(folder, d_model=16, n_layers=2, n_decoder_layers=3, n_heads=2, d_ff=32, context_length=24,
                         init_std=0.2)
    return load_model_folder(folder)


def test_the_decoder_reads_the_start_token_then_the_target_and_the_trace_is_the_models_forward(loaded):
    tok = loaded.tokenizer
    enc, trace = trace_input(loaded, SOURCE, None, target=TARGET)
    assert isinstance(enc, EncodedPair)
    assert enc.ids == tok.encode(SOURCE) and enc.target.ids == tok.encode(TARGET)
    assert enc.decoder_ids == [loaded.model.start_token()] + tok.encode(TARGET)
    S, T = len(enc.ids), len(enc.decoder_ids)
    with torch.no_grad():
        ref = loaded.model(torch.tensor([enc.ids]), torch.tensor([enc.decoder_ids])).logits
    torch.testing.assert_close(trace["logits"], ref, atol=1e-5, rtol=0)  # (the recording path, not the fused one)
    assert trace["logits"].shape[1] == T  # row i predicts target token i
    shapes = {ENCODER: (S, S), DECODER: (T, T), CROSS: (T, S)}
    layers = {ENCODER: 2, DECODER: 3, CROSS: 3}
    for kind, shape in shapes.items():
        view = attention_view(trace, kind)
        assert view.n_layers == layers[kind]
        for l in range(view.n_layers):
            assert tuple(view.pattern(l).shape) == (1, 2, *shape)
            stack = "encoder" if kind == ENCODER else "decoder"
            name = f"{stack}.blocks.{l}.{'cross_attn' if kind == CROSS else 'attn'}.pattern"
            assert view.pattern(l) is trace[name]  # shared, not copied
    causal = attention_view(trace, DECODER).pattern(0)[0, 0]
    assert torch.all(causal.triu(1) == 0)
    # no target: the start token alone
    enc, trace = trace_input(loaded, SOURCE, None)
    assert enc.decoder_ids == [1] and trace["logits"].shape[1] == 1


def test_a_target_side_tokenizer_cuts_the_target(loaded, monkeypatch):
    """Marian's target.spm (Tokenizer.target) encodes the target; the source stays the model tokenizer's."""
    words = ["le", "chien", "noir", "court"]
    target_side = word_tokenizer(list(reversed(words)))  # other ids than the model tokenizer's for the same words
    monkeypatch.setattr(loaded.tokenizer, "target", target_side)
    enc, _ = trace_input(loaded, SOURCE, None, target=TARGET)
    assert enc.ids == loaded.tokenizer.encode(SOURCE)
    assert enc.decoder_ids == [1] + target_side.encode(TARGET) and target_side.encode(TARGET) != loaded.tokenizer.encode(TARGET)


def test_ids_a_cancel_and_edits_of_an_encoder_decoder(loaded):
    from desktop_app.core.interventions import Intervention
    from desktop_app.core.jobs import Cancelled, JobControl

    enc, plain = trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10])
    assert enc.ids == [5, 6, 7] and enc.decoder_ids == [1, 9, 10]
    # "layer k / L" after each block of both stacks, and a cancel stops it after the encoder
    # (mid-stack: tests/app/test_seq2seq_cancel.py)
    seen = []
    job = JobControl(on_progress=lambda done, total, _m: seen.append((done, total)))
    trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10], job=job)
    assert seen == [(k, 5) for k in range(6)]
    job = JobControl(on_progress=lambda done, total, _m: job.cancel() if done == 2 else None)
    with pytest.raises(Cancelled):
        trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10], job=job)
    # a cross-attention head zeroed changes the decoder's logits, and mean-ablated otherwise (its mean over the
    # decoder's input, core/interventions.resolve); a resampled one is refused in one line
    _, edited = trace_input(loaded, "", [5, 6, 7], [Intervention("decoder.blocks.0.cross_attn.head.1")],
                            target_ids=[9, 10])
    assert not torch.allclose(edited["logits"], plain["logits"])
    _, mean = trace_input(loaded, "", [5, 6, 7], [Intervention("decoder.blocks.0.cross_attn.head.1", "mean")],
                          target_ids=[9, 10])
    assert not torch.allclose(mean["logits"], plain["logits"]) and not torch.allclose(mean["logits"], edited["logits"])
    with pytest.raises(ValueError, match="resampled ablations of an encoder-decoder are not supported"):
        trace_input(loaded, "", [5, 6, 7], [Intervention("decoder.blocks.0.cross_attn.head.1", "resample",
                                                         source_ids=(5, 6))], target_ids=[9, 10])
    # a target for a model that is not an encoder-decoder
    from desktop_app.core.config import ModelConfig
    gpt = ModelConfig.gpt2(vocab_size=20, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=8)

    class Loaded:
        config, name = gpt, "gpt"
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        trace_input(Loaded, "", [1, 2], target_ids=[3])


def test_the_memory_estimate_counts_both_stacks_and_the_cross_attention(loaded):
    from desktop_app.core import devices

    enc, trace = trace_input(loaded, SOURCE, None, target=TARGET)
    S, T = len(enc.ids), len(enc.decoder_ids)
    need = estimated_trace_bytes(loaded, S, n_target=T)
    assert need >= trace.nbytes()
    # the cross-attention's [L_dec, H, T, S] patterns: a longer source grows the decoder's share too
    cfg = loaded.config
    grow = estimated_trace_bytes(loaded, 2 * S, n_target=T) - need
    assert grow >= cfg.n_decoder_layers * cfg.n_heads * T * S * 4 + cfg.n_layers * cfg.n_heads * 3 * S * S * 4
    with pytest.raises(devices.MemoryEstimateError, match=f"{S} source and {T} target tokens through both stacks"):
        check_trace_memory(loaded, S, n_target=T, available=need - 1)
    assert check_trace_memory(loaded, S, n_target=T, available=need) == need

"""The encoder-decoder families against `transformers` (test-only reference), issue 28: T5 v1.0, T5 v1.1
(gated-GELU, untied head), BART and Marian, each a tiny random model saved by `save_pretrained`.

Each opens here with the same decoder logits (1e-4), every attention map of the three kinds
(encoder self-attention, causal decoder self-attention, cross-attention; 1e-5), the same greedy and
beam ids as `generate`, and a model saved here (perturbed first, so the round trip cannot pass by
re-reading transformers' own file) opens in `transformers` with the same logits.
"""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, save_model_folder
from desktop_app.core.seq2seq import EncoderDecoder
from seq2seq_decode import beam_decode, greedy_decode

transformers = pytest.importorskip("transformers")

from family_cases.bart import bart  # noqa: E402
from family_cases.marian import marian  # noqa: E402
from family_cases.t5 import VOCAB, t5_v10, t5_v11  # noqa: E402
from family_parity import compare_seq2seq as compare  # noqa: E402
from family_parity import randomise_biases, seq2seq_inputs  # noqa: E402


def bart_untied():
    """tie_word_embeddings false: transformers then ties neither the head nor each stack's embed_tokens to
    shared; the stacks' tables are made the shared one (what a model with only its head untied holds)."""
    hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        activation_function="relu", dropout=0.0, attention_dropout=0.0, forced_eos_token_id=None,
        tie_word_embeddings=False))
    with torch.no_grad():
        hf.model.encoder.embed_tokens.weight.copy_(hf.model.shared.weight)
        hf.model.decoder.embed_tokens.weight.copy_(hf.model.shared.weight)
    return hf


def test_a_bart_folder_whose_stacks_hold_other_embeddings_is_refused_by_name(tmp_path):
    torch.manual_seed(0)
    hf = bart_untied()
    with torch.no_grad():
        hf.model.decoder.embed_tokens.weight.add_(1.0)
    hf.save_pretrained(tmp_path / "hf")
    from desktop_app.core.checkpoints import ModelLoadError
    with pytest.raises(ModelLoadError, match=r"model.safetensors: tensor 'model.decoder.embed_tokens.weight' differs "
                                             r"from the one read before into 'tok_embed.weight'"):
        load_model_folder(tmp_path / "hf")


MODELS = {"t5_v1_0": t5_v10, "t5_v1_1": t5_v11, "bart": bart, "marian": marian, "bart_untied": bart_untied}


def make(name: str, tmp_path):
    torch.manual_seed(0)
    hf = MODELS[name]()
    randomise_biases(hf)
    hf.eval()
    hf.set_attn_implementation("eager")  # attention probabilities only come from the eager path
    hf.save_pretrained(tmp_path / "hf")
    return hf, load_model_folder(tmp_path / "hf")


def inputs(seed: int = 1):
    return seq2seq_inputs(VOCAB, seed)


@pytest.mark.parametrize("name", list(MODELS))
def test_an_encoder_decoder_folder_opens_with_transformers_logits_and_attention(name, tmp_path):
    hf, loaded = make(name, tmp_path)
    assert isinstance(loaded.model, EncoderDecoder) and loaded.config.family == name.split("_")[0]
    compare(loaded.model, hf, *inputs(), "from transformers:")


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_and_beam_ids_are_generates(name, tmp_path):
    hf, loaded = make(name, tmp_path)
    eos = hf.config.eos_token_id
    common = dict(do_sample=False, pad_token_id=hf.config.pad_token_id, forced_eos_token_id=None,
                  forced_bos_token_id=None, bad_words_ids=None, no_repeat_ngram_size=0, repetition_penalty=1.0,
                  min_length=0, decoder_start_token_id=loaded.config.decoder_start_token_id)
    src, _, _ = inputs(2)
    for row in range(2):
        s = src[row:row + 1]
        with torch.no_grad():
            # without an end token: every step compared; with one: where generate stops
            ref = hf.generate(s, max_new_tokens=10, num_beams=1, eos_token_id=None, **common)[0, 1:].tolist()
            assert greedy_decode(loaded.model, s[0], 10) == ref
            for stop in (eos, None):
                for early in (True, False):
                    ref = hf.generate(s, max_new_tokens=10, num_beams=3, eos_token_id=stop, early_stopping=early,
                                      length_penalty=1.0, **common)[0, 1:].tolist()
                    ref = ref[:ref.index(stop) + 1] if stop is not None and stop in ref else ref
                    assert beam_decode(loaded.model, s[0], 10, 3, eos_id=stop, early_stopping=early) == ref, \
                        (row, stop, early)


def test_beam_search_stops_at_the_end_token_as_generate_does(tmp_path):
    """A Marian model whose end token is likely (its logits bias raised): the hypotheses finish at
    different lengths, and length normalisation decides between them as in generate."""
    torch.manual_seed(0)
    hf = marian()
    with torch.no_grad():
        hf.final_logits_bias[0, 0] = 2.5  # eos_token_id 0
    hf.eval()
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    finished_early = 0
    for seed in range(6):
        src = torch.randint(3, VOCAB - 1, (1, 7), generator=torch.Generator().manual_seed(seed))
        for penalty in (1.0, 0.5, 2.0):
            with torch.no_grad():
                ref = hf.generate(src, max_new_tokens=12, num_beams=3, eos_token_id=0, early_stopping=False,
                                  length_penalty=penalty, do_sample=False, forced_eos_token_id=None,
                                  bad_words_ids=None, pad_token_id=VOCAB - 1)[0, 1:].tolist()
            ref = ref[:ref.index(0) + 1] if 0 in ref else ref
            finished_early += 0 in ref and len(ref) < 12
            assert beam_decode(loaded.model, src[0], 12, 3, eos_id=0, length_penalty=penalty) == ref, (seed, penalty)
    greedy = hf.generate(src, max_new_tokens=12, num_beams=1, eos_token_id=0, do_sample=False, forced_eos_token_id=None,
                         bad_words_ids=None, pad_token_id=VOCAB - 1)[0, 1:].tolist()
    assert greedy_decode(loaded.model, src[0], 12, eos_id=0) == greedy
    # Marian's generate never writes its pad token (bad_words_ids [[pad]]): made likely here, then banned
    with torch.no_grad():
        hf.final_logits_bias[0, VOCAB - 1] = 3.0
    hf.save_pretrained(tmp_path / "pad")
    loaded = load_model_folder(tmp_path / "pad")
    for beams in (1, 3):
        ref = hf.generate(src, max_new_tokens=12, num_beams=beams, eos_token_id=0, do_sample=False,
                          forced_eos_token_id=None, bad_words_ids=[[VOCAB - 1]], pad_token_id=VOCAB - 1)[0, 1:].tolist()
        ref = ref[:ref.index(0) + 1] if 0 in ref else ref
        assert VOCAB - 1 not in ref
        ours = (greedy_decode(loaded.model, src[0], 12, eos_id=0, banned_ids=[VOCAB - 1]) if beams == 1 else
                beam_decode(loaded.model, src[0], 12, 3, eos_id=0, banned_ids=[VOCAB - 1]))
        assert ours == ref, beams
        assert VOCAB - 1 in greedy_decode(loaded.model, src[0], 12)  # without the ban the pad token comes
    assert finished_early, "no hypothesis ended before the last step: the test would not see the end token"


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_saved_here_opens_in_transformers_with_the_same_logits(name, tmp_path):
    hf, loaded = make(name, tmp_path)
    model = loaded.model
    with torch.no_grad():  # perturb, so that the round trip cannot pass by re-reading transformers' own file
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
        if model.cfg.final_logits_bias:
            model.lm_bias.add_(torch.randn_like(model.lm_bias))
    save_model_folder(model, tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours")
    back.eval()
    back.set_attn_implementation("eager")
    src, tgt, src_mask = inputs(3)
    with torch.no_grad():
        assert (model(src, tgt, src_mask=src_mask).logits - hf(input_ids=src, attention_mask=src_mask,
                                                               decoder_input_ids=tgt).logits).abs().max() > 1e-3
    compare(model, back, src, tgt, src_mask, "saved here:")
    again = load_model_folder(tmp_path / "ours")
    with torch.no_grad():
        assert torch.equal(again.model(src, tgt, src_mask=src_mask).logits, model(src, tgt, src_mask=src_mask).logits)

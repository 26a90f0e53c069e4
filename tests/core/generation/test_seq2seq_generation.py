"""GenerationSession on encoder-decoders (issue 28): the prompt is the source, encoded once; the session's
sequence is the target from the decoder's start token. Greedy and beam ids are core.seq2seq's
greedy_decode / beam_decode and transformers' generate (tiny random Marian and T5 folders, test-only
reference); each step records its cross-attention over the source; the tree, forcing, back, the logit
lens and edits work as for decoders."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationError, GenerationSession, GenerationSettings, generate
from seq2seq_decode import beam_decode, greedy_decode

transformers = pytest.importorskip("transformers")

VOCAB = 60
EOS = 0


def marian(eos_bias: float = 0.0):
    """A Marian whose weights are large enough (init_std 0.3) for varied tokens; eos_bias raises its end
    token so that beams finish at different lengths."""
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, init_std=0.3,
        pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=EOS, forced_eos_token_id=None))
    with torch.no_grad():
        hf.final_logits_bias[0, EOS] = eos_bias
    return hf


def t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=VOCAB - 1, eos_token_id=EOS,
        pad_token_id=VOCAB - 1, initializer_factor=8.0))


def folder(hf, path):
    hf.eval()
    hf.save_pretrained(path)
    return load_model_folder(path)


def sources(n: int = 6, length: int = 7):
    return [torch.randint(3, VOCAB - 1, (length,), generator=torch.Generator().manual_seed(s)).tolist()
            for s in range(n)]


def reference(hf, src, max_new, beams, eos):
    with torch.no_grad():
        out = hf.generate(torch.tensor([src]), max_new_tokens=max_new, num_beams=beams, do_sample=False,
                          eos_token_id=eos, early_stopping=False, length_penalty=1.0, forced_eos_token_id=None,
                          forced_bos_token_id=None, bad_words_ids=None, pad_token_id=VOCAB - 1,
                          decoder_start_token_id=VOCAB - 1, min_length=0, no_repeat_ngram_size=0,
                          repetition_penalty=1.0)[0, 1:].tolist()
    return out[:out.index(eos) + 1] if eos is not None and eos in out else out


@pytest.mark.parametrize("make, must_end", [(marian, False), (lambda: marian(5.0), True), (t5, False)],
                         ids=["marian", "marian-eos", "t5"])
def test_greedy_and_beam_ids_are_generates_and_seq2seqs(make, must_end, tmp_path):
    hf = make()
    loaded = folder(hf, tmp_path / "m")
    varied = ended = 0
    for src in sources():
        for eos in (EOS, None):
            stops = [] if eos is None else [eos]
            ids, s = generate(loaded, src, 10, stop_tokens=stops)
            assert s.prompt == [VOCAB - 1] and s.source == src  # the target starts at the start token
            assert ids[1:] == greedy_decode(loaded.model, src, 10, eos_id=eos) == reference(hf, src, 10, 1, eos)
            ids, s = generate(loaded, src, 10, GenerationSettings("beam", beams=3), stop_tokens=stops)
            want = reference(hf, src, 10, 3, eos)
            assert ids[1:] == beam_decode(loaded.model, src, 10, 3, eos_id=eos) == want, (src, eos)
            varied += len(set(want)) > 2
            ended += eos is not None and want[-1:] == [eos] and len(want) < 10
    assert varied  # not one token repeated: the ids say something
    assert ended or not must_end  # beams that end before the last step were compared too


def test_each_step_records_its_cross_attention_over_the_source(tmp_path):
    loaded = folder(marian(), tmp_path / "m")
    src = sources(1)[0]
    s = GenerationSession(loaded, src, stop_tokens=[])
    for _ in range(4):
        s.step()
    cfg = loaded.config
    # the step that produced the distribution after each node, from a plain teacher-forced forward
    tgt = torch.tensor([s.ids()])
    _, trace = loaded.model.run_with_trace(torch.tensor([src]), tgt, names=("decoder.blocks.*.cross_attn.pattern",))
    for i, node in enumerate(s.current.path()):
        rows = s.cross_attention(node)
        assert rows.shape == (cfg.n_decoder_layers, cfg.n_heads, len(src))
        torch.testing.assert_close(rows.sum(-1), torch.ones(cfg.n_decoder_layers, cfg.n_heads))
        want = torch.stack([trace[f"decoder.blocks.{l}.cross_attn.pattern"][0, :, i]
                            for l in range(cfg.n_decoder_layers)])
        torch.testing.assert_close(rows, want, atol=1e-5, rtol=1e-4)
    # the whole path as a trace with the model's own names, the encoder's included
    trace2, ids = s.step_trace()
    assert ids == s.ids()
    assert trace2["decoder.blocks.1.cross_attn.pattern"].shape == (1, cfg.n_heads, 5, len(src))
    assert trace2["encoder.blocks.0.attn.pattern"].shape == (1, cfg.n_heads, len(src), len(src))
    torch.testing.assert_close(trace2["decoder.blocks.1.cross_attn.pattern"], trace["decoder.blocks.1.cross_attn.pattern"],
                               atol=1e-5, rtol=1e-4)


def test_forcing_back_branches_and_the_logit_lens_on_the_target(tmp_path):
    loaded = folder(marian(), tmp_path / "m")
    model = loaded.model
    src = sources(1)[0]
    s = GenerationSession(loaded, src, GenerationSettings("sample", temperature=0.8, top_k=5), seed=3, stop_tokens=[])
    a = s.step()
    assert a.how == "sampled" and s.distribution(s.root).kept.sum() == 5
    s.back()
    forced = s.choose(7)  # a branch beside the sampled token
    assert len(s.root.children) == 2 and s.ids() == [VOCAB - 1, 7]
    s.step()
    # the distribution after the forced token is the model's own, decoded with the source
    with torch.no_grad():
        logits = model(torch.tensor([src]), torch.tensor([[VOCAB - 1, 7]])).logits[0, -1]
    torch.testing.assert_close(forced.next_logits, logits.float(), atol=1e-5, rtol=1e-4)
    lens = s.logit_lens(s.current)
    assert len(lens) == model.cfg.n_decoder_layers + 1
    assert lens[-1].chosen_prob == pytest.approx(s.current.model_prob, abs=1e-5)
    s.goto(a)
    assert s.ids() == [VOCAB - 1, a.token]


def test_a_zero_ablated_cross_attention_head_changes_the_generation_as_the_edited_model(tmp_path):
    from desktop_app.core.interventions import Intervention

    loaded = folder(marian(), tmp_path / "m")
    src = sources(1)[0]
    edits = [Intervention(f"decoder.blocks.1.cross_attn.head.{h}").check(loaded.config) for h in range(4)]
    plain = GenerationSession(loaded, src, stop_tokens=[])
    edited = plain.with_interventions(edits)
    assert edited.source == src and edited.prompt == plain.prompt
    with torch.no_grad():
        enc = loaded.model.encode(torch.tensor([src]))
        ref = loaded.model.decode(torch.tensor([[VOCAB - 1]]), enc, interventions=edits).logits[0, -1]
    torch.testing.assert_close(edited.root.next_logits, ref.float(), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(edited.root.next_logits, plain.root.next_logits, atol=1e-3)


def test_an_empty_source_or_a_mean_ablation_is_refused_in_one_line(tmp_path):
    from desktop_app.core.interventions import Intervention

    loaded = folder(marian(), tmp_path / "m")
    with pytest.raises(GenerationError, match="the source is empty"):
        GenerationSession(loaded, [])
    with pytest.raises(GenerationError, match="mean and resample ablations"):
        GenerationSession(loaded, sources(1)[0], interventions=[Intervention("decoder.blocks.0.attn.head.1", "mean")])

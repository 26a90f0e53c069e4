"""What if on encoder-decoders (issue 28): direct logit attribution of a decoder token over every head of
the decoder (self- and cross-attention), its MLPs and its embedding; a zero-ablated head of each kind
changes only what comes after it; activation patching between two source texts (core/analysis.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from desktop_app.core.analysis import (seq2seq_activation_patching, seq2seq_head_rows,
                                       seq2seq_logit_attribution)
from desktop_app.core.checkpoints import new_model
from desktop_app.core.families import REGISTRY
from desktop_app.core.interventions import Intervention, parse_ablations

SMALL = dict(vocab_size=40, d_model=32, n_layers=2, n_decoder_layers=3, n_heads=4, d_ff=48, context_length=24,
             init_std=0.2)
PRESETS = {
    "t5_v1_0": lambda: REGISTRY["t5"].preset(**SMALL, relative_buckets=8, relative_max_distance=12),
    "t5_v1_1": lambda: REGISTRY["t5"].preset(**SMALL, relative_buckets=8, relative_max_distance=12,
                                             activation="geglu", tie_embeddings=False),
    "marian": lambda: REGISTRY["marian"].preset(**SMALL),
}


def model_of(name: str, seed: int = 0):
    model = new_model(PRESETS[name](), seed=seed).eval()
    with torch.no_grad():  # norms and biases away from their initial ones and zeros
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


SRC = [5, 9, 12, 7, 30, 3, 22]
DEC = [0, 14, 8, 27, 11]


@pytest.mark.parametrize("name", ["t5_v1_0", "t5_v1_1"])
@pytest.mark.parametrize("position", [0, 2, -1])
def test_the_attribution_of_a_decoder_token_sums_to_its_logit(name, position):
    model = model_of(name)
    with torch.no_grad():
        logits = model(torch.tensor([SRC]), torch.tensor([DEC])).logits[0, position].double()
    for token in (int(logits.argmax()), 17):
        att = seq2seq_logit_attribution(model, SRC, DEC, position, token)
        assert att.logit == pytest.approx(float(logits[token]), abs=1e-5)
        assert abs(att.sum - att.logit) < 1e-4
        L, H = model.cfg.n_decoder_layers, model.cfg.n_heads
        # one row per self-attention head and per cross-attention head of every decoder layer
        assert att.components.count("head") == L * H and att.components.count("cross_head") == L * H
        assert att.head_table.shape == att.cross_table.shape == (L, H) and att.mlp.shape == (L,)
        assert np.abs(att.cross_table).max() > 1e-3  # cross-attention writes into the logit
        rows = att.rows()
        assert sum(v for c, *_, v in rows if c == "cross_head") == pytest.approx(att.cross_table.sum())


def test_a_cross_attention_head_contribution_is_what_its_own_output_adds():
    """The cross head's bar is W_U[t] . norm_linear(W_O,h z_h): recomputed here from the head's own z."""
    model = model_of("t5_v1_0")
    att = seq2seq_logit_attribution(model, SRC, DEC, -1, 17)
    _, trace = model.run_with_trace(torch.tensor([SRC]), torch.tensor([DEC]))
    l, h = 1, 2
    z = trace[f"decoder.blocks.{l}.cross_attn.z"][0, h, -1].double()  # [d_head]
    W_O = model.decoder.blocks[l].cross_attn.o.weight.detach().double()  # [d, H * d_head]
    dh = model.cfg.d_head
    c = W_O[:, h * dh:(h + 1) * dh] @ z
    resid = trace[f"decoder.blocks.{model.cfg.n_decoder_layers - 1}.resid_post"][0, -1].double()
    norm = model.decoder.final_norm
    scale = torch.sqrt(resid.pow(2).mean() + norm.eps)
    want = float((c / scale * norm.weight.double()) @ model.lm_head.weight[17].detach().double() * model.cfg.lm_head_scale)
    assert att.cross_table[l, h] == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_a_post_norm_encoder_decoder_is_refused_in_one_line():
    with pytest.raises(ValueError, match="^direct logit attribution: a post-norm model") as info:
        seq2seq_logit_attribution(model_of("marian"), SRC, DEC, -1, 3)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("spec, target", [("cross.1.2", "decoder.blocks.1.cross_attn.z"),
                                          ("dec.1.2", "decoder.blocks.1.attn.z"),
                                          ("enc.1.2", "encoder.blocks.1.attn.z")])
def test_ablating_a_head_of_each_kind_changes_only_what_comes_after_it(spec, target):
    model = model_of("marian")
    (iv,) = parse_ablations(spec, model.cfg)
    src, dec = torch.tensor([SRC]), torch.tensor([DEC])
    _, clean = model.run_with_trace(src, dec)
    out, edited = model.run_with_trace(src, dec, interventions=[iv])
    z = edited[target][0]
    assert torch.equal(z[2], torch.zeros_like(z[2]))  # the head writes nothing
    torch.testing.assert_close(z[[0, 1, 3]], clean[target][0][[0, 1, 3]])  # its layer's other heads as before
    stack, layer = target.split(".")[0], 1
    # everything before it is untouched: the other stack when it comes first, and the layers before
    before = [n for n in clean if n.startswith(f"{stack}.blocks.0.") or n == f"{stack}.embed"]
    if stack == "decoder":
        before += [n for n in clean if n.startswith("encoder.")]
    assert before
    for n in before:
        assert torch.equal(edited[n], clean[n]), n
    if target.endswith("cross_attn.z"):  # the same layer's self-attention runs before its cross-attention
        for n in ("decoder.blocks.1.attn.pattern", "decoder.blocks.1.resid_mid"):
            assert torch.equal(edited[n], clean[n]), n
    # and the logits change
    assert (out.logits - clean["logits"]).abs().max() > 1e-4


@pytest.mark.parametrize("spec, message", [("2.1", "names its stack"), ("cross.0.mlp", "is not LAYER.HEAD"),
                                           ("dec.5.0", "layers 0..2")])
def test_an_encoder_decoder_ablation_names_its_stack(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_ablations(spec, PRESETS["marian"]())
    with pytest.raises(ValueError, match="one stack"):
        from desktop_app.core.config import ModelConfig

        parse_ablations("enc.0.1", ModelConfig.gpt2(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=8,
                                                     context_length=8))


def test_patching_between_two_sources_recovers_exactly_where_it_must():
    """The sources differ at one position: patching the encoder's embedding there restores the clean run
    (recovery 1), at any other position changes nothing (0); the decoder's first self-attention heads read
    only the target, the same in both runs (0)."""
    model = model_of("marian")
    corrupted = list(SRC)
    corrupted[3] = 31
    with torch.no_grad():
        logits = model(torch.tensor([SRC]), torch.tensor([DEC])).logits[0, -1]
    answer, wrong = int(logits.argmax()), int(logits.argmin())
    res = seq2seq_activation_patching(model, SRC, corrupted, DEC, answer, wrong)
    assert res.resid.shape == (model.cfg.n_layers + 1, len(SRC))
    assert res.resid_rows[0] == "encoder.embed"
    assert res.resid[0, 3] == pytest.approx(1.0, abs=1e-6)
    assert np.abs(np.delete(res.resid[0], 3)).max() < 1e-6
    rows = seq2seq_head_rows(model.cfg)
    assert res.heads.shape == (len(rows), model.cfg.n_heads) == (2 + 3 + 3, 4)
    assert res.head_rows == ["enc L0", "enc L1", "dec L0", "dec L1", "dec L2", "cross L0", "cross L1", "cross L2"]
    assert np.abs(res.heads[res.head_rows.index("dec L0")]).max() < 1e-6
    cross = [i for i, r in enumerate(res.head_rows) if r.startswith("cross")]
    assert np.abs(res.heads[cross]).max() > 1e-3  # cross-attention carries the source's difference
    # a zero-ablated head carries nothing in any run: patching it recovers nothing
    ablated = seq2seq_activation_patching(model, SRC, corrupted, DEC, answer, wrong,
                                          interventions=[Intervention("decoder.blocks.0.cross_attn.head.1")])
    assert abs(ablated.heads[res.head_rows.index("cross L0"), 1]) < 1e-6


def test_patching_sources_of_different_lengths_is_refused():
    with pytest.raises(ValueError, match="same length in tokens"):
        seq2seq_activation_patching(model_of("marian"), SRC, SRC[:-1], DEC, 3)


@pytest.mark.parametrize("name", ["marian", "t5_v1_0"])
@pytest.mark.parametrize("target, z_name, positions", [
    ("decoder.blocks.1.cross_attn.head.2", "decoder.blocks.1.cross_attn.z", len(DEC)),
    ("decoder.blocks.2.attn.head.0", "decoder.blocks.2.attn.z", len(DEC)),
    ("encoder.blocks.1.attn.head.3", "encoder.blocks.1.attn.z", len(SRC))])
def test_a_mean_ablation_of_a_head_is_its_z_replaced_by_its_mean_over_its_stacks_positions(name, target, z_name,
                                                                                            positions):
    """resolve's mean of an encoder-decoder head (interventions.resolve with decoder_ids): the same forward as
    replacing that head's z, at every position, by the mean over the positions of the stack's own input (the
    source's for the encoder, the decoder input's for self- and cross-attention) of its z in the clean run,
    computed here by hand; a resampled head is refused in one line."""
    from desktop_app.core.interventions import resolve

    model = model_of(name)
    src, dec = torch.tensor([SRC]), torch.tensor([DEC])
    _, clean = model.run_with_trace(src, dec)
    head = int(target.rsplit(".", 1)[1])
    z = clean[z_name][0, head]
    assert z.shape[0] == positions and not torch.allclose(z, z.mean(0).expand_as(z))  # the mean changes it
    by_hand = Intervention(target, "replace", value=z.mean(0))
    (resolved,) = resolve(model, SRC, [Intervention(target, "mean")], decoder_ids=DEC)
    assert resolved.how == "replace"
    out, edited = model.run_with_trace(src, dec, interventions=[resolved])
    ref_out, ref = model.run_with_trace(src, dec, interventions=[by_hand])
    torch.testing.assert_close(edited[z_name][0, head], z.mean(0).expand_as(z), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.logits, ref_out.logits, rtol=0, atol=1e-6)
    assert (out.logits - clean["logits"]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="resampled ablations of an encoder-decoder are not supported"):
        resolve(model, SRC, [Intervention(target, "resample", source_ids=(4, 5, 6))], decoder_ids=DEC)
    with pytest.raises(ValueError, match="needs its decoder's input"):
        resolve(model, SRC, [Intervention(target, "mean")])


def test_attribution_and_patching_under_a_mean_ablated_cross_head_are_those_of_its_mean_z():
    """What if's attribution (app.whatif.attribute_ids) and patching between two sources read an encoder-decoder
    with a mean-ablated cross-attention head as the model whose head z is its clean mean over the decoder's
    input (computed by hand; the patching's mean taken on the clean source), not a refusal."""
    from types import SimpleNamespace

    from desktop_app.app.whatif import attribute_ids

    model = model_of("t5_v1_0")
    target = "decoder.blocks.1.cross_attn.head.2"
    _, clean = model.run_with_trace(torch.tensor([SRC]), torch.tensor([DEC]))
    by_hand = Intervention(target, "replace", value=clean["decoder.blocks.1.cross_attn.z"][0, 2].mean(0))
    loaded = SimpleNamespace(model=model, config=model.cfg, name="t5")
    att, token = attribute_ids(loaded, SRC, 2, None, [Intervention(target, "mean")], decoder_ids=DEC)
    ref, ref_token = attribute_ids(loaded, SRC, 2, None, [by_hand], decoder_ids=DEC)
    plain, _ = attribute_ids(loaded, SRC, 2, token, None, decoder_ids=DEC)
    assert token == ref_token and att.logit == pytest.approx(ref.logit, abs=1e-5)
    np.testing.assert_allclose(att.cross_table, ref.cross_table, atol=1e-5)
    assert abs(att.logit - plain.logit) > 1e-4  # the ablation changes the logit
    corrupted = list(SRC)
    corrupted[3] = 31
    with torch.no_grad():
        logits = model(torch.tensor([SRC]), torch.tensor([DEC])).logits[0, -1]
    answer, wrong = int(logits.argmax()), int(logits.argmin())
    mean = seq2seq_activation_patching(model, SRC, corrupted, DEC, answer, wrong,
                                       interventions=[Intervention(target, "mean")])
    ref = seq2seq_activation_patching(model, SRC, corrupted, DEC, answer, wrong, interventions=[by_hand])
    np.testing.assert_allclose(mean.heads, ref.heads, atol=1e-5)
    np.testing.assert_allclose(mean.resid, ref.resid, atol=1e-5)


@pytest.mark.parametrize("point, how", [("decoder.blocks.1.resid_post", "add"),
                                        ("decoder.blocks.0.cross_attn.out", "zero"),
                                        ("decoder.blocks.2.resid_mid", "add")])
def test_an_edit_of_the_decoders_residual_stream_gets_a_bar_and_the_bars_still_sum(point, how):
    """Issue 41: an edit at a residual-stream point (a steer, a feature edit at resid_post) is in no head's or
    MLP's output; its change there is its own bar, so the bars add up to the edited logit."""
    model = model_of("t5_v1_0")
    value = 0.5 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1)) if how == "add" else None
    iv = Intervention(point, how, value=value)
    with torch.no_grad():
        logits = model(torch.tensor([SRC]), torch.tensor([DEC]), interventions=[iv]).logits[0, -1].double()
    att = seq2seq_logit_attribution(model, SRC, DEC, -1, 17, [iv])
    assert att.logit == pytest.approx(float(logits[17]), abs=1e-5)
    assert abs(att.sum - att.logit) < 1e-4
    bar = "edit_" + point.split(".", 3)[3]
    assert att.components.count(bar) == 1 and abs(att.contributions[att.components.index(bar)]) > 1e-4

"""The block-level placement options new families need, each against its formula, written out here with
the block's own attention and MLP modules (what is checked is how the block wires them to the stream):

    shared_input_norm (GPT-J, Phi-2, Falcon):  x + attn(n(x)) + mlp(n(x)), one norm n
    norm_placement "output" (OLMo 2):          x + n_a(attn(x)), then + n_m(mlp(.)), no input norms
    residual_multiplier r (Granite):           x + r * attn(n1(x)), then + r * mlp(n2(.))

and the switches' validation (one clear line each). Every parameter is perturbed first: norms at 1 and
zero biases would hide a norm or a term used in the wrong place.
"""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.config import ConfigError, ModelConfig
from desktop_app.core.model import Transformer
from desktop_app.core.seq2seq import EncoderDecoder
from desktop_app.core.trace import Trace

IDS = [[5, 17, 3, 40, 22, 9, 31]]


def model_of(**kw) -> Transformer:
    cfg = ModelConfig.gpt2(vocab_size=61, d_model=32, n_layers=1, n_heads=4, d_ff=64, context_length=32, **kw)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def run(model: Transformer) -> Trace:
    trace = Trace()
    with torch.no_grad():
        model(torch.tensor(IDS), trace=trace)
    return trace


def attn(block, h):  # the attention module alone, causal over the whole text (learned positions: no rotary)
    return block.attn(h, None, None, None, None, "", True)


def test_a_parallel_block_with_one_shared_input_norm_adds_attention_and_mlp_of_the_same_normed_input():
    model = model_of(parallel_residual=True, shared_input_norm=True)
    block = model.blocks[0]
    assert not hasattr(block, "norm2") and "blocks.0.norm2.weight" not in model.state_dict()
    trace = run(model)
    x = trace["embed"]
    with torch.no_grad():
        n = block.norm1(x)
        want = x + attn(block, n) + block.mlp(n)
    torch.testing.assert_close(trace["blocks.0.resid_post"], want)
    torch.testing.assert_close(trace["blocks.0.mlp.input"], n)  # not norm1(resid_mid)
    torch.testing.assert_close(trace["blocks.0.resid_post"], trace["blocks.0.resid_mid"] + trace["blocks.0.mlp.out"])


def test_output_norms_norm_each_sublayers_output_and_nothing_normalises_its_input():
    model = model_of(norm="rmsnorm", norm_placement="output", attention_bias=False, mlp_bias=False)
    block = model.blocks[0]
    assert not hasattr(block, "norm1") and not hasattr(block, "norm2")
    assert {"blocks.0.post_attn_norm.weight", "blocks.0.post_mlp_norm.weight"} <= set(model.state_dict())
    trace = run(model)
    x = trace["embed"]
    with torch.no_grad():
        mid = x + block.post_attn_norm(attn(block, x))
        want = mid + block.post_mlp_norm(block.mlp(mid))
    torch.testing.assert_close(trace["blocks.0.attn.input"], x)
    torch.testing.assert_close(trace["blocks.0.resid_mid"], mid)
    torch.testing.assert_close(trace["blocks.0.resid_post"], want)


def test_a_residual_multiplier_scales_what_each_sublayer_adds_to_the_stream():
    r = 0.25
    model = model_of(residual_multiplier=r)
    block = model.blocks[0]
    trace = run(model)
    x = trace["embed"]
    with torch.no_grad():
        a = attn(block, block.norm1(x))
        mid = x + r * a
        want = mid + r * block.mlp(block.norm2(mid))
    torch.testing.assert_close(trace["blocks.0.attn.out"], r * a)  # attn.out: what the stream adds
    torch.testing.assert_close(trace["blocks.0.resid_mid"], mid)
    torch.testing.assert_close(trace["blocks.0.resid_post"], want)
    plain = run(model_of())
    assert not torch.allclose(plain["blocks.0.resid_post"], trace["blocks.0.resid_post"])  # the switch does something


@pytest.mark.parametrize("kw, says", [
    (dict(shared_input_norm=True), "needs parallel_residual"),
    (dict(shared_input_norm=1, parallel_residual=True), "shared_input_norm must be true or false"),
    (dict(residual_multiplier=0.0), "residual_multiplier must be a positive finite number"),
    (dict(residual_multiplier=float("nan")), "residual_multiplier must be a positive finite number"),
    (dict(residual_multiplier=True), "residual_multiplier must be a positive finite number"),
    (dict(norm_placement="output", sandwich_norms=True), "need norm_placement 'pre'"),
    (dict(norm_placement="output", parallel_residual=True), "need norm_placement 'pre'"),
    (dict(norm_placement="inside"), "unknown norm placement"),
    (dict(qk_norm_across_heads=True), "qk_norm_across_heads needs qk_norm"),
])
def test_the_placement_switches_are_validated_in_one_line(kw, says):
    with pytest.raises(ConfigError, match=says):
        ModelConfig.gpt2(**kw)


def test_an_unembedding_bias_is_only_a_linear_heads():
    with pytest.raises(ConfigError, match="lm_head_bias is the bias of a decoder's linear language-model head"):
        ModelConfig.bert(lm_head_bias=True)  # the MLM head has its own bias (lm_bias)
    with pytest.raises(ConfigError, match="lm_head_bias is the bias of a decoder's linear language-model head"):
        ModelConfig.gpt2(lm_head_bias=True, lm_head=False)


@pytest.mark.parametrize("kw", [dict(norm_placement="output"), dict(residual_multiplier=0.5)])
def test_an_encoder_decoder_refuses_the_placements_its_blocks_do_not_have(kw):
    with pytest.raises(ConfigError, match="an encoder-decoder has no output-only norms or residual multiplier"):
        ModelConfig(family="t5", is_encoder_decoder=True, positions="none", relative_buckets=8, **kw)


def test_the_decoder_block_of_an_encoder_decoder_is_a_block_with_cross_attention_between():
    cfg = ModelConfig(family="t5", vocab_size=61, d_model=32, n_layers=1, n_heads=4, d_ff=64, norm="rmsnorm",
                      is_encoder_decoder=True, positions="none", relative_buckets=8, decoder_start_token_id=0,
                      tie_embeddings=False)
    model = EncoderDecoder(cfg)
    assert [s.name for s in model.decoder.blocks[0].sublayers] == ["attn", "cross_attn", "mlp"]
    assert [s.name for s in model.encoder.blocks[0].sublayers] == ["attn", "mlp"]
    assert type(model.decoder.blocks[0]) is type(model.encoder.blocks[0])

"""Dynamics on an encoder-decoder (issue 28): a head of the encoder's or the decoder's self-attention drives the
particles with that stack's own weights; the tokens and the model curves are that stack's; cross-attention
and a stack on a one-stack model are refused in one line."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from desktop_app.app.dynamics import stack_layer_curves, stack_trace
from desktop_app.core import dynamics as dy
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.families import REGISTRY
from desktop_app.core.trace import Trace


@pytest.fixture(scope="module")
def marian():
    cfg = REGISTRY["marian"].preset(vocab_size=40, d_model=16, n_layers=2, n_decoder_layers=2, n_heads=2, d_ff=32,
                                    context_length=24, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
                                    init_std=0.3)
    return new_model(cfg, seed=0).double().eval()


def _by_hand(attn, head: int):
    """A = W_K^T W_Q / sqrt(dh) and V = W_O W_V read from the module's own weights."""
    dh = attn.cfg.d_head
    rows = slice(head * dh, (head + 1) * dh)
    W_Q, W_K = attn.q.weight[rows].detach().double(), attn.k.weight[rows].detach().double()
    W_V, W_O = attn.v.weight[rows].detach().double(), attn.o.weight[:, rows].detach().double()
    return W_K.T @ W_Q / math.sqrt(dh), W_O @ W_V


@pytest.mark.parametrize("stack", dy.STACKS)
def test_a_stacks_head_moves_the_particles_by_that_stacks_own_weights(marian, stack):
    layer, head = 1, 1
    h = dy.model_head(marian, layer, head, stack=stack)
    A, V = _by_hand(getattr(marian, stack).blocks[layer].attn, head)
    torch.testing.assert_close(h.A, A, rtol=1e-5, atol=1e-6)  # (head_matrices reads float32)
    torch.testing.assert_close(h.V, V, rtol=1e-5, atol=1e-6)
    assert h.name == f"{stack} layer {layer} head {head}"
    other = "decoder" if stack == "encoder" else "encoder"
    assert not torch.allclose(h.A, _by_hand(getattr(marian, other).blocks[layer].attn, head)[0])
    # the simulation's velocity is sum_j softmax_j(<A x_i, x_j>) V x_j with these matrices
    cfg = dy.DynamicsConfig(d=16, n=7, init="gaussian", perturbation=0.0, seed=3)
    sim = dy.Simulation(cfg, h)
    X = sim.x.clone()
    P = torch.softmax((X @ h.A.T) @ X.T, dim=1)
    torch.testing.assert_close(sim.field(0.0, X), P @ X @ h.V.T, rtol=1e-9, atol=1e-12)


def test_cross_attention_and_a_missing_or_foreign_stack_are_refused_in_one_line(marian):
    with pytest.raises(ValueError, match="cross-attention moves no particles") as e:
        dy.model_head(marian, 0, 0, stack="cross")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="names its stack: encoder or decoder"):
        dy.model_head(marian, 0, 0)  # an encoder-decoder's head is never picked silently
    with pytest.raises(ValueError, match="decoder has layers 0..1"):
        dy.model_head(marian, 2, 0, stack="decoder")
    gpt2 = new_model(ModelConfig.gpt2(vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                      context_length=16), seed=0)
    with pytest.raises(ValueError, match="this model has one stack"):
        dy.model_head(gpt2, 0, 0, stack="encoder")
    assert dy.model_head(gpt2, 0, 1).name == "layer 0 head 1"


def test_a_stacks_tokens_and_curves_are_its_residual_stream(marian):
    src, tgt = torch.tensor([[5, 6, 7, 8, 9, 2]]), torch.tensor([[1, 10, 11, 12]])
    trace = Trace()
    with torch.no_grad():
        enc = marian.encode(src, trace=trace)
        marian.decode(tgt, enc, trace=trace)
    for stack, T in (("encoder", 6), ("decoder", 4)):
        view = stack_trace(trace, stack)
        names = dy.layer_names(view)
        assert names == ["embed", "blocks.0.resid_mid", "blocks.1.resid_mid"]
        tokens = dy.trace_tokens(view, names[2])
        assert tokens.shape == (T, 16)
        np.testing.assert_array_equal(tokens, trace[f"{stack}.blocks.1.resid_mid"][0].double().numpy())
        curves = stack_layer_curves(trace, stack)
        expected = dy.layer_curves(view)
        assert curves.radius == expected.radius and len(curves.radius) == 3
        assert curves.radius[0] == pytest.approx(dy.support_radius(trace[f"{stack}.embed"][0].double().numpy()))
    with pytest.raises(ValueError, match="stack 'cross'"):
        stack_trace(trace, "cross")
    assert stack_trace(trace, None) is trace

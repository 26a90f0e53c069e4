"""The model core's own invariants (parity with transformers is in tests/parity)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from desktop_app.core import model as model_mod
from desktop_app.core.config import ConfigError, ModelConfig
from desktop_app.core.attention import attention_probs
from desktop_app.core.model import KVCache, Transformer, sinusoidal_table
from desktop_app.core.trace import Trace

SMALL = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=32)
CONFIGS = {
    "gpt2": ModelConfig.gpt2(**SMALL),
    "bert": ModelConfig.bert(**SMALL),
    "llama-gqa": ModelConfig.llama(**SMALL, n_kv_heads=2),
    "sinusoidal-postln-relu": ModelConfig.gpt2(**SMALL, positions="sinusoidal", norm_placement="post", activation="relu"),
    "l2": ModelConfig.gpt2(**SMALL, attention_kind="l2"),
    "sinkhorn-encoder": ModelConfig.bert(**SMALL, attention_kind="sinkhorn", sinkhorn_iters=5),
}


def _model(name: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(CONFIGS[name]).eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_recording_does_not_change_the_output(name):
    m = _model(name)
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        plain = m(ids).logits
        out, trace = m.run_with_trace(ids)
    assert (plain - out.logits).abs().max() < 1e-5
    p = trace.pattern(0)
    assert p.shape == (2, 4, 12, 12)
    assert torch.allclose(p.sum(-1), torch.ones(2, 4, 12), atol=1e-5)
    if m.cfg.causal:
        assert p[0, 0].triu(1).abs().max() == 0  # nothing attends to the future
    # the last layer's logit lens is the model's own logits
    assert (trace["blocks.1.logit_lens"] - out.logits).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "sinusoidal-postln-relu", "l2"])
def test_kv_cache_matches_full_forward(name):
    m = _model(name)
    ids = torch.randint(0, 50, (1, 15))
    with torch.no_grad():
        full = m(ids).logits
        cache = KVCache(m.cfg.n_layers)
        pieces = [m(ids[:, :7], cache=cache).logits]
        for t in range(7, 15):
            pieces.append(m(ids[:, t:t + 1], cache=cache).logits)
    assert cache.length == 15
    assert (torch.cat(pieces, 1) - full).abs().max() < 1e-5


def test_head_outputs_sum_to_the_attention_output():
    m = _model("gpt2")
    ids = torch.randint(0, 50, (1, 9))
    _, trace = m.run_with_trace(ids)
    head_sum = trace["blocks.1.attn.head_out"].sum(1) + m.blocks[1].attn.o.bias
    assert (head_sum - trace["blocks.1.attn.out"]).abs().max() < 1e-5


def test_head_matrices_give_the_models_scores_and_values():
    cfg = CONFIGS["llama-gqa"].replace(positions="none")  # A_h is position-free only without rotary
    torch.manual_seed(3)
    m = Transformer(cfg).eval()
    ids = torch.randint(0, 50, (1, 6))
    _, trace = m.run_with_trace(ids)
    x = trace["blocks.0.attn.input"][0]  # [T, d]
    for head in (0, 3):
        hm = m.head_matrices(0, head)
        scores = x @ hm.A.T @ x.T  # x_i^T A^T x_j
        p = torch.softmax(torch.where(torch.ones(6, 6).tril().bool(), scores, -torch.inf), -1)
        assert (p - trace.pattern(0)[0, head]).abs().max() < 1e-5
        assert (trace["blocks.0.attn.head_out"][0, head] - p @ x @ hm.V.T).abs().max() < 1e-5


def test_recording_is_opt_in_and_fused_otherwise(monkeypatch):
    m = _model("gpt2")
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(0, 50, (1, 8))
    with torch.no_grad():
        m(ids)
    assert len(calls) == 2  # every layer through the fused kernel
    trace = Trace(names=["blocks.0.resid_post"])
    with torch.no_grad():
        m(ids, trace=trace)
    assert list(trace.keys()) == ["blocks.0.resid_post"] and len(calls) == 4


def test_sinusoidal_table_matches_the_formula():
    pe = sinusoidal_table(7, 6)
    for t in range(7):
        for i in range(3):
            assert math.isclose(pe[t, 2 * i].item(), math.sin(t / 10000 ** (2 * i / 6)), abs_tol=1e-6)
            assert math.isclose(pe[t, 2 * i + 1].item(), math.cos(t / 10000 ** (2 * i / 6)), abs_tol=1e-6)


def test_l2_and_sinkhorn_attention_follow_their_definitions():
    torch.manual_seed(0)
    q, k = torch.randn(5, 4), torch.randn(5, 4)
    d2 = torch.cdist(q, k) ** 2
    assert torch.allclose(attention_probs(q, k, "l2"), torch.softmax(-d2 / 2.0, -1), atol=1e-6)
    p = attention_probs(q, k, "sinkhorn", sinkhorn_iters=200)
    assert torch.allclose(p.sum(-1), torch.ones(5), atol=1e-5)
    assert torch.allclose(p.sum(-2), torch.ones(5), atol=1e-4)  # doubly stochastic in the limit
    # Sinkhorn-Knopp by hand, in the probability domain
    kmat = torch.exp(-d2 / 2.0).double()
    for _ in range(200):
        kmat = kmat / kmat.sum(1, keepdim=True)
        kmat = kmat / kmat.sum(0, keepdim=True)
    kmat = kmat / kmat.sum(1, keepdim=True)
    assert torch.allclose(p.double(), kmat, atol=1e-5)


def test_config_validation_names_the_problem():
    from desktop_app.core.families import family_of
    with pytest.raises(ConfigError, match="divisible"):
        ModelConfig.gpt2(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="unknown family"):  # checked where families are looked up
        family_of(ModelConfig(family="pegasus"))
    with pytest.raises(ConfigError, match="n_kv_heads"):
        ModelConfig.llama(n_heads=4, n_kv_heads=3)


def test_context_length_is_enforced():
    m = _model("gpt2")
    with pytest.raises(ValueError, match="context length"):
        m(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert"])
def test_packing_for_decoding_keeps_values_gradients_and_checkpoints(name, tmp_path):
    from desktop_app.core.checkpoints import load_model_folder, save_model_folder

    m, ref = _model(name), _model(name)
    ids = torch.randint(0, 50, (2, 10))
    with torch.no_grad():  # as GPT-2's Conv1D [in, out] weights load: column-major
        m.blocks[0].mlp.down.weight.data = m.blocks[0].mlp.down.weight.data.t().contiguous().t()
    m.pack_for_decoding()
    m.pack_for_decoding()  # idempotent
    for attn in (b.attn for b in m.blocks):
        assert attn._packed_qkv() is not None  # Q, K, V as one product...
        W, _ = attn._packed_qkv()
        assert W.stride() == (1, W.shape[0])  # ...stored column-major
    assert m.blocks[0].mlp.up.weight.stride() == (1, m.cfg.d_ff)
    assert m.blocks[0].mlp.down.weight.is_contiguous()  # a wide-input product streams faster row-major
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and p1.shape == p2.shape and torch.equal(p1, p2)
    with torch.no_grad():
        assert (m(ids).logits - ref(ids).logits).abs().max() < 1e-5
        _, trace = m.run_with_trace(ids)
        _, ref_trace = ref.run_with_trace(ids)
    assert (trace["blocks.1.attn.q"] - ref_trace["blocks.1.attn.q"]).abs().max() < 1e-5
    # training still sees every parameter (the fused product is only used without gradients)
    m.train(), ref.train()
    torch.manual_seed(1)
    m(ids).logits.square().mean().backward()
    torch.manual_seed(1)
    ref(ids).logits.square().mean().backward()
    for (n, p1), p2 in zip(m.named_parameters(), ref.parameters()):
        assert (p1.grad - p2.grad).abs().max() < 1e-5, n
    # an optimiser step writes through the views: the fused product follows it
    with torch.no_grad():
        m.blocks[0].attn.k.weight.add_(0.5)
        ref.blocks[0].attn.k.weight.add_(0.5)
    m.eval(), ref.eval()
    with torch.no_grad():
        assert (m(ids).logits - ref(ids).logits).abs().max() < 1e-5
    save_model_folder(m, tmp_path / "saved")
    back = load_model_folder(tmp_path / "saved").model
    with torch.no_grad():
        assert (back(ids).logits - ref(ids).logits).abs().max() < 1e-5


def test_a_weight_replaced_after_packing_falls_back_to_three_products():
    m = _model("gpt2")
    m.pack_for_decoding()
    attn = m.blocks[0].attn
    with torch.no_grad():
        attn.v.weight.data = attn.v.weight.detach().contiguous() * 2  # as a load with assign=True would
    assert attn._packed_qkv() is None
    x = torch.randn(1, 3, 32)
    with torch.no_grad():
        assert torch.allclose(attn.project_qkv(x)[2], F.linear(x, attn.v.weight, attn.v.bias))


@pytest.mark.parametrize("name", ["gpt2", "bert", "parallel"])
@pytest.mark.parametrize("stop_at", ["embed", "blocks.0.attn.input", "blocks.0.attn.out", "blocks.0.resid_mid",
                                     "blocks.1.mlp.input", "blocks.1.mlp.out", "blocks.1.resid_post",
                                     "blocks.0.attn.pattern"])
def test_stop_at_ends_the_pass_right_after_the_point(name, stop_at):
    # the records of a pass stopped at a point are those of the whole pass up to that point, bit for bit,
    # and nothing after it; a point inside a sublayer (attn.pattern) ends the pass at its block's end
    torch.manual_seed(0)
    m = Transformer(ModelConfig.gpt2(**SMALL, parallel_residual=True) if name == "parallel" else CONFIGS[name]).eval()
    ids = torch.randint(0, 50, (2, 9))
    full_out, full = m.run_with_trace(ids)
    out, early = m.run_with_trace(ids, stop_at=stop_at)
    last = "blocks.0.resid_post" if stop_at.endswith("pattern") else stop_at
    assert stop_at in full and out.logits is None
    assert list(early) == list(full)[:list(full).index(last) + 1]
    for k in early:
        assert torch.equal(early[k], full[k]), k
    stream = {"embed": "embed", "blocks.0.attn.input": "embed", "blocks.0.attn.out": "embed",
              "blocks.1.mlp.input": "blocks.1.resid_mid", "blocks.1.mlp.out": "blocks.1.resid_mid"}
    assert torch.equal(out.hidden, full[stream.get(stop_at, last)])  # the residual stream there
    # without a trace too (the attention then fused: the same values up to rounding)
    with torch.no_grad():
        torch.testing.assert_close(m(ids, stop_at=stop_at).hidden, out.hidden)


def test_stop_at_a_point_the_model_has_not_is_an_error_not_a_whole_pass():
    m = Transformer(CONFIGS["gpt2"]).eval()
    ids = torch.randint(0, 50, (1, 5))
    for wrong in ("blocks.9.attn.input", "block.0.attn.input", "emb"):
        with pytest.raises(ValueError, match="no point of this"):
            m(ids, stop_at=wrong)

"""core.analysis against direct, loop-by-loop computations (numpy / plain Python)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from desktop_app.core import analysis
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.model import KVCache

T = 9


def _model(family: str):
    kw = dict(vocab_size=23, d_model=24, n_layers=3, n_heads=3, d_ff=40, context_length=32, init_std=0.3)
    cfg = getattr(ModelConfig, family)(**kw)
    return new_model(cfg, seed=3).eval()


@pytest.fixture(params=["gpt2", "bert", "llama"])
def model_and_trace(request):
    model = _model(request.param)
    ids = torch.tensor([[1, 5, 7, 2, 9, 11, 3, 3, 20]])
    _, trace = model.run_with_trace(ids, names=("*",))
    return model, trace


def _p(trace, l):
    return trace[f"blocks.{l}.attn.pattern"][0].double().numpy()


def test_patterns_are_causal_only_for_decoders(model_and_trace):
    model, trace = model_and_trace
    p = analysis.attention_pattern(trace, 0)
    mask = analysis.allowed_mask(T, T, model.cfg.causal)
    assert np.all(p[:, ~mask] == 0)
    if not model.cfg.causal:
        assert mask.all() and np.all(p > 0)
    else:
        assert not mask[0, 1] and mask[1, 0]


def test_mean_over_heads_and_rollout(model_and_trace):
    _, trace = model_and_trace
    L = trace.n_layers
    rollout = analysis.attention_rollout(trace)
    assert rollout.shape == (L, T, T)
    # naive: loops over heads, rows and the product
    prod = np.eye(T)
    for l in range(L):
        p = _p(trace, l)
        H = p.shape[0]
        mean = np.zeros((T, T))
        for h in range(H):
            mean += p[h] / H
        np.testing.assert_allclose(analysis.mean_over_heads(trace, l), mean, atol=1e-6)
        a = mean + np.eye(T)
        for i in range(T):
            a[i] = a[i] / sum(a[i])
        new = np.zeros((T, T))
        for i in range(T):
            for j in range(T):
                new[i, j] = sum(a[i, k] * prod[k, j] for k in range(T))
        prod = new
        np.testing.assert_allclose(rollout[l], prod, atol=1e-6)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-6)  # rows stay distributions


def test_rollout_is_lower_triangular_for_causal_models():
    model = _model("gpt2")
    _, trace = model.run_with_trace(torch.tensor([[1, 2, 3, 4, 5]]))
    r = analysis.attention_rollout(trace)[-1]
    assert np.all(np.triu(r, 1) == 0) and r[0, 0] == pytest.approx(1.0)


def test_head_stats(model_and_trace):
    _, trace = model_and_trace
    stats = analysis.head_stats(trace)
    L = trace.n_layers
    for l in range(L):
        p = _p(trace, l)
        H = p.shape[0]
        for h in range(H):
            ent = dist = first = 0.0
            for i in range(T):
                e = 0.0
                for j in range(T):
                    if p[h, i, j] > 0:
                        e -= p[h, i, j] * math.log(p[h, i, j])
                    dist += p[h, i, j] * abs(i - j) / T
                ent += e / T
                first += p[h, i, 0] / T
            assert stats.entropy[l, h] == pytest.approx(ent, abs=1e-6)
            assert stats.mean_distance[l, h] == pytest.approx(dist, abs=1e-6)
            assert stats.first_token[l, h] == pytest.approx(first, abs=1e-6)
    assert stats.entropy.shape == (L, 3)


def test_head_stats_known_patterns():
    """Uniform causal attention: entropy of query i is log(i + 1), distance i / 2."""
    from desktop_app.core.trace import Trace

    t = 6
    p = np.tril(np.ones((t, t)))
    p = p / p.sum(-1, keepdims=True)
    tr = Trace()
    tr.record("blocks.0.attn.pattern", torch.tensor(p)[None, None])
    s = analysis.head_stats(tr)
    assert s.entropy[0, 0] == pytest.approx(np.mean([math.log(i + 1) for i in range(t)]))
    assert s.mean_distance[0, 0] == pytest.approx(np.mean([i / 2 for i in range(t)]))
    assert s.first_token[0, 0] == pytest.approx(np.mean([1 / (i + 1) for i in range(t)]))


def test_head_stats_on_a_cached_generation_step():
    """One new token with a KV cache: a 1 x T pattern whose query sits at the last position."""
    model = _model("gpt2")
    cache = KVCache(model.cfg.n_layers)
    model(torch.tensor([[1, 2, 3, 4]]), cache=cache)
    _, trace = model.run_with_trace(torch.tensor([[5]]), cache=cache)
    p = _p(trace, 0)
    assert p.shape[1:] == (1, 5)
    s = analysis.head_stats(trace)
    for h in range(p.shape[0]):
        assert s.mean_distance[0, h] == pytest.approx(sum(p[h, 0, j] * (4 - j) for j in range(5)), abs=1e-6)
    with pytest.raises(ValueError, match="rollout"):
        analysis.attention_rollout(trace)


def test_norms(model_and_trace):
    _, trace = model_and_trace
    L = trace.n_layers
    res = analysis.residual_norms(trace)
    heads = analysis.head_output_norms(trace)
    mlp = analysis.mlp_output_norms(trace)
    assert res.shape == (L + 1, T) and heads.shape == (L, 3, T) and mlp.shape == (L, T)
    for t in range(T):
        x = trace["embed"][0, t].double().numpy()
        assert res[0, t] == pytest.approx(math.sqrt(sum(v * v for v in x)), rel=1e-6)
        for l in range(L):
            x = trace[f"blocks.{l}.resid_post"][0, t].double().numpy()
            assert res[l + 1, t] == pytest.approx(math.sqrt(sum(v * v for v in x)), rel=1e-6)
            y = trace[f"blocks.{l}.mlp.out"][0, t].double().numpy()
            assert mlp[l, t] == pytest.approx(math.sqrt(sum(v * v for v in y)), rel=1e-6)


def test_head_output_norms_from_head_matrices():
    model = _model("gpt2")
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    _, trace = model.run_with_trace(ids)
    norms = analysis.head_output_norms(trace)
    for l in range(model.cfg.n_layers):
        x = trace[f"blocks.{l}.attn.input"][0].double()
        p = trace[f"blocks.{l}.attn.pattern"][0].double()
        for h in range(model.cfg.n_heads):
            m = model.head_matrices(l, h)
            v = x @ m.W_V.double().T + m.b_V.double()  # [T, dh]
            out = (p[h] @ v) @ m.W_O.double().T  # [T, d]
            np.testing.assert_allclose(norms[l, h], out.norm(dim=-1).numpy(), rtol=1e-4, atol=1e-6)
    # the heads' outputs plus the output bias add up to the attention sublayer's output
    total = trace["blocks.0.attn.head_out"][0].sum(0) + model.blocks[0].attn.o.bias
    torch.testing.assert_close(total, trace["blocks.0.attn.out"][0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_logit_lens_recorded_and_lazy_agree_with_a_direct_unembedding(family):
    model = _model(family)
    ids = torch.tensor([[1, 5, 7, 2, 9, 11]])
    _, full = model.run_with_trace(ids, names=("*",))
    _, lean = model.run_with_trace(ids, names=("embed", "blocks.*.resid_post"))
    assert "blocks.0.logit_lens" not in lean
    rec = analysis.logit_lens(full)
    lazy = analysis.logit_lens(lean, model)
    np.testing.assert_array_equal(rec.top_ids, lazy.top_ids)
    np.testing.assert_allclose(rec.top_probs, lazy.top_probs, rtol=1e-5)
    # naive: the last layer's lens is the model's own next-token distribution
    logits = model(ids).logits[0].double()
    for t in range(ids.shape[1]):
        row = logits[t].tolist()
        z = [math.exp(v - max(row)) for v in row]
        best = max(range(len(row)), key=lambda i: row[i])
        assert lazy.top_ids[-1, t] == best
        assert lazy.top_probs[-1, t] == pytest.approx(z[best] / sum(z), rel=1e-5)
    with pytest.raises(ValueError, match="pass the model"):
        analysis.logit_lens(lean)
    # chunking over tokens gives the same table
    chunked = pytest.MonkeyPatch.context()
    with chunked as mp:
        mp.setattr(analysis, "LENS_CHUNK", 4)
        small = analysis.logit_lens(lean, model)
    np.testing.assert_array_equal(small.top_ids, lazy.top_ids)
    np.testing.assert_allclose(small.top_probs, lazy.top_probs, rtol=1e-6)


def test_pca_matches_covariance_eigenvectors(model_and_trace):
    _, trace = model_and_trace
    L = trace.n_layers
    pca = analysis.pca_over_depth(trace)
    assert pca.coords.shape == (L + 1, T, 2)
    # naive: covariance of the pooled vectors, eigen-decomposition, projection
    pts = [trace["embed"][0, t].double().numpy() for t in range(T)]
    for l in range(L):
        pts += [trace[f"blocks.{l}.resid_post"][0, t].double().numpy() for t in range(T)]
    X = np.array(pts)
    mu = X.mean(0)
    cov = (X - mu).T @ (X - mu)
    w, v = np.linalg.eigh(cov)
    order = np.argsort(w)[::-1]
    for k in range(2):
        axis = v[:, order[k]]
        proj = (X - mu) @ axis
        ours = pca.coords[..., k].reshape(-1)
        sign = np.sign(ours @ proj)
        np.testing.assert_allclose(ours, sign * proj, atol=1e-6 * np.abs(proj).max())
        assert pca.explained_variance_ratio[k] == pytest.approx(w[order[k]] / w.sum(), rel=1e-6)


def test_cosine_similarity_and_its_mean(model_and_trace):
    _, trace = model_and_trace
    L = trace.n_layers
    curve = analysis.mean_cosine_by_depth(trace)
    assert curve.shape == (L + 1,)
    for depth in range(L + 1):
        name = "embed" if depth == 0 else f"blocks.{depth - 1}.resid_post"
        X = trace[name][0].double().numpy()
        c = analysis.cosine_similarity(trace, depth)
        total = 0.0
        for i in range(T):
            for j in range(T):
                ref = float(X[i] @ X[j]) / (math.sqrt(float(X[i] @ X[i])) * math.sqrt(float(X[j] @ X[j])))
                assert c[i, j] == pytest.approx(ref, abs=1e-9)
                if i != j:
                    total += ref
        assert curve[depth] == pytest.approx(total / (T * (T - 1)), abs=1e-9)


def test_missing_names_give_a_clear_message():
    model = _model("gpt2")
    _, trace = model.run_with_trace(torch.tensor([[1, 2, 3]]), names=("embed", "blocks.*.attn.pattern"))
    with pytest.raises(ValueError, match="resid_post"):
        analysis.residual_norms(trace)


@pytest.mark.parametrize("bidirectional_from", [None, 0, 2])
def test_rollout_and_head_stats_match_float64_on_bfloat16_patterns(monkeypatch, bidirectional_from):
    """torch in float32, a layer's heads at once in pieces of query rows (here 10, the last short), against the
    float64 numpy computation (benchmarks.attention_stats' reference) on bfloat16 heads from flat to sharp;
    causal (the rollout's products by bands, _lower_triangular_product), bidirectional, and causal layers
    then a bidirectional one (full products from there on).
    Tolerances: the worst-case rounding of a sum of n same-signed float32 terms, n * 2^-24 relative; a row's
    statistic sums T terms, and each rollout layer one more product of non-negative matrices (T terms, plus
    the identity and the normalisation). bfloat16 arithmetic (2^-9) would fail them."""
    from desktop_app.benchmarks.attention_stats import causal_trace, reference_head_stats, reference_rollout

    layers, heads, t = 4, 3, 150
    monkeypatch.setattr(analysis, "PIECE_ELEMENTS", heads * t * 16)  # 16 rows a piece
    trace = causal_trace(layers, heads, t, seed=1)
    if bidirectional_from is not None:
        for l in range(bidirectional_from, layers):
            p = torch.randn((1, heads, t, t), generator=torch.Generator().manual_seed(l)).mul(4).softmax(-1)
            trace.record(f"blocks.{l}.attn.pattern", p.to(torch.bfloat16))
        assert reference_rollout(trace)[-1][np.triu_indices(t, 1)].min() > 0  # no longer lower triangular
    rollout = analysis.attention_rollout(trace)
    assert rollout.dtype == np.float32
    np.testing.assert_allclose(rollout, reference_rollout(trace), rtol=layers * (t + 2) * 2.0 ** -24, atol=0)
    stats, ref = analysis.head_stats(trace).as_dict(), reference_head_stats(trace).as_dict()
    for name in ("entropy", "mean_distance", "first_token"):
        assert stats[name].shape == (layers, heads)
        np.testing.assert_allclose(stats[name], ref[name], rtol=t * 2.0 ** -24, atol=0, err_msg=name)


def test_rollout_and_head_stats_report_each_layer_and_stop_when_cancelled():
    from desktop_app.benchmarks.attention_stats import causal_trace
    from desktop_app.core.jobs import Cancelled, JobControl

    trace = causal_trace(3, 2, 8)
    seen = []
    job = JobControl(on_progress=lambda done, total, what: seen.append((done, total, what)))
    analysis.attention_rollout(trace, job=job)
    analysis.head_stats(trace, job=job)
    assert seen == [(l, 3, "rollout") for l in range(3)] + [(l, 3, "head statistics") for l in range(3)]
    job.cancel()
    for compute in (analysis.attention_rollout, analysis.head_stats):
        with pytest.raises(Cancelled):
            compute(trace, job=job)


def test_head_stats_of_more_queries_than_keys_with_keys_never_attended(monkeypatch):
    """Cross-attention's shape (20 decoder queries reading 10 encoder tokens), the last 4 keys never attended:
    pieces whose zero keys are skipped give the float64 reference's statistics."""
    from desktop_app.benchmarks.attention_stats import reference_head_stats
    from desktop_app.core.trace import Trace

    monkeypatch.setattr(analysis, "PIECE_ELEMENTS", 2 * 10 * 4)  # 4 query rows a piece
    logits = torch.randn((1, 2, 20, 10), generator=torch.Generator().manual_seed(0))
    trace = Trace()
    trace.record("blocks.0.attn.pattern", logits.masked_fill(torch.arange(10) >= 6, float("-inf")).softmax(-1))
    stats, ref = analysis.head_stats(trace).as_dict(), reference_head_stats(trace).as_dict()
    for name in ("entropy", "mean_distance", "first_token"):
        np.testing.assert_allclose(stats[name], ref[name], rtol=10 * 2.0 ** -24, err_msg=name)


@pytest.mark.parametrize("n_tokens", [2, 9])  # (4 depths x 2 tokens < d_model 24: the SVD; 36 points: the covariance)
def test_pca_agrees_with_an_svd_of_the_points_whichever_way_it_is_computed(n_tokens):
    model = _model("gpt2")
    _, trace = model.run_with_trace(torch.tensor([[1, 5, 7, 2, 9, 11, 3, 3, 20][:n_tokens]]), names=("*",))
    pca = analysis.pca_over_depth(trace)
    X = analysis.residual_stream(trace).astype(np.float64).reshape(-1, 24)
    centred = X - X.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    for k in range(2):
        proj = centred @ vt[k]
        ours = pca.coords[..., k].reshape(-1)
        np.testing.assert_allclose(ours, np.sign(ours @ proj) * proj, atol=1e-6 * np.abs(proj).max())
        assert pca.explained_variance_ratio[k] == pytest.approx(s[k] ** 2 / (s ** 2).sum(), rel=1e-6)


def test_the_logit_lens_stops_at_a_cancel_between_layers():
    """The Layers panel's Cancel: its logit lens (~21 s of ~39 s at 512 tokens of a GPT-2-small shape) checked
    its job only before and after; now at each layer."""
    from desktop_app.core.jobs import Cancelled, JobControl

    model = _model("gpt2")
    _, trace = model.run_with_trace(torch.tensor([[1, 5, 7, 2]]), names=("blocks.*.resid_post",))
    seen = []
    job = JobControl()
    real = model.unembed

    def unembed(x):  # the person cancels while layer 0 is read
        seen.append(1)
        job.cancel()
        return real(x)

    model.unembed = unembed
    with pytest.raises(Cancelled):
        analysis.logit_lens(trace, model, job=job)
    assert len(seen) == 1  # layer 1 and 2 never read

"""Issue 37: attribution graphs on tiny random models and transcoders.

The definition is checked directly: every edge is the change in its target's pre-activation when its source
is removed with everything else frozen (attention patterns, norm scales, the other features and errors);
the frozen replacement forward reproduces the real model's logits; influence is checked against the matrix
inverse; zeroing a feature moves the logits as its edges say (frozen) and as a What-if edit (live).
"""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.graphs import (TranscoderError, attribute, build_context, graph_scores, load_transcoders,
                                     prune_graph, salient_targets, token_targets)
from desktop_app.core.graphs.attribution import influence, normalize_matrix
from desktop_app.core.graphs.edits import FeatureSet, feature_interventions, frozen_logits
from desktop_app.core.graphs.transcoders import random_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = [1, 5, 7, 9, 3, 4, 11]


def llama(dtype=torch.float64, n_layers=3):
    cfg = ModelConfig.llama(vocab_size=40, d_model=16, n_layers=n_layers, n_heads=4, n_kv_heads=2, d_ff=32,
                            context_length=32)
    return new_model(cfg, seed=0).eval().to(dtype)


def gpt2(dtype=torch.float64):
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=32)
    return new_model(cfg, seed=1).eval().to(dtype)


KINDS = {  # name: (model builder, random_transcoders options)
    "plt-relu": (llama, dict(cross_layer=False)),
    "plt-skip-jumprelu": (llama, dict(cross_layer=False, skip=True, activation="jump_relu")),
    "clt-jumprelu": (llama, dict(cross_layer=True, activation="jump_relu")),
    "clt-resid-mid-topk": (llama, dict(cross_layer=True, activation="topk", k=5, input_hook="hook_resid_mid")),
    "gpt2-plt": (gpt2, dict(cross_layer=False)),
}


def setup(tmp_path, kind, dtype=torch.float64):
    build, options = KINDS[kind]
    model = build(dtype)
    random_transcoders(tmp_path / kind, model.cfg.n_layers, 16, 24, seed=3, **options)
    tc = load_transcoders(tmp_path / kind)
    ctx = build_context(model, IDS, tc)
    return model, ctx


def pre_activation(ctx, node, activations=None, errors=None, tokens=None, targets=None):
    """Target node's pre-activation in the frozen replacement model (forward evaluation, no gradient)."""
    feature_inputs, h = ctx.forward(tokens=tokens, activations=activations, errors=errors)
    if node[0] == "logit":
        return float(targets.vectors[node[1]].to(h.dtype) @ h[-1])
    layer, pos, feat = ctx.active[node[1]].tolist()
    return float(ctx.encoder_vectors(torch.tensor([node[1]]))[0] @ feature_inputs[layer][pos])


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_edge_is_the_direct_effect_of_removing_its_source(tmp_path, kind):
    model, ctx = setup(tmp_path, kind)
    assert len(ctx.active) > 20
    targets = salient_targets(model, ctx.frozen.logits[-1], 3, 0.95, str)
    graph = attribute(ctx, targets, batch_size=16)
    A = graph.adjacency
    n, L, T = len(ctx.active), ctx.n_layers, ctx.n_pos
    assert A.shape == (n + (L + 1) * T + len(targets.vocab_ids),) * 2
    last_layer = [i for i in range(n) if ctx.active[i, 0] == L - 1][:2]
    checked_rows = [("logit", 0)] + [("feature", i) for i in last_layer]
    rows = [graph.logit_index(0)] + last_layer
    for node, row in zip(checked_rows, rows):
        base = pre_activation(ctx, node, targets=targets)
        scale = A[row].abs().max()
        for s in range(n):  # every feature source
            acts = ctx.activations.clone()
            acts[s] = 0
            effect = base - pre_activation(ctx, node, activations=acts, targets=targets)
            assert abs(A[row, s] - effect) <= 1e-9 * scale + 1e-12, (node, s)
        for layer in range(L):  # every error node
            for pos in range(T):
                errors = ctx.error_vectors.clone()
                errors[layer, pos] = 0
                effect = base - pre_activation(ctx, node, errors=errors, targets=targets)
                assert abs(A[row, graph.error_index(layer, pos)] - effect) <= 1e-9 * scale + 1e-12
        for pos in range(T):
            tokens = ctx.frozen.token_vectors.clone()
            tokens[pos] = 0
            effect = base - pre_activation(ctx, node, tokens=tokens, targets=targets)
            assert abs(A[row, graph.token_index(pos)] - effect) <= 1e-9 * scale + 1e-12
    # a feature has no edge from its own layer or later (except through a cross-layer decoder: none back)
    for t in range(n):
        later = ctx.active[:, 0] >= ctx.active[t, 0]
        assert (A[t, :n][later] == 0).all()
    assert (A[:, graph.error_index(0, 0)] == 0).all()  # position 0's error node is zero (circuit-tracer's)
    assert not (ctx.active[:, 1] == 0).any()


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_frozen_replacement_forward_reproduces_the_real_logits(tmp_path, kind):
    model, ctx = setup(tmp_path, kind)
    feature_inputs, h = ctx.forward()
    real = model(torch.tensor(IDS)[None]).logits[0]
    # the model's RMSNorm rounds its output to float32 even in a float64 model (as the LLaMA reference
    # computes it), and the frozen norm does not: agreement to float32's precision (~1e-7 relative per layer)
    assert torch.allclose(ctx.logits(h), real, atol=2e-5, rtol=0)
    # and the feature inputs are the recorded ones
    assert torch.allclose(torch.stack(feature_inputs), ctx.frozen.feature_in, atol=2e-5)
    # error nodes make it exact: reconstruction + error = the MLP output (positions after 0)
    recon = torch.stack(ctx.mlp_values())
    assert torch.allclose(recon, torch.stack(ctx.mlp_constants), atol=1e-12)


def test_influence_is_the_neumann_series_of_the_normalised_adjacency(tmp_path):
    model, ctx = setup(tmp_path, "clt-jumprelu")
    targets = salient_targets(model, ctx.frozen.logits[-1], 4, 0.95, str)
    graph = attribute(ctx, targets, batch_size=32)
    A = normalize_matrix(graph.adjacency)
    w = torch.zeros(A.shape[0], dtype=A.dtype)
    w[-graph.n_logits:] = graph.logit_probabilities.to(A.dtype)
    eye = torch.eye(A.shape[0], dtype=A.dtype)
    expected = w @ (torch.linalg.inv(eye - A) - eye)
    assert torch.allclose(influence(A, w), expected, atol=1e-10)
    pruned = prune_graph(graph, 0.8, 0.98)
    assert pruned.node_mask[-graph.n_logits - graph.n_pos:].all()  # tokens and logits always kept
    assert pruned.node_mask[:graph.n_features].sum() < graph.n_features
    assert not pruned.edge_mask[~pruned.node_mask].any() and not pruned.edge_mask[:, ~pruned.node_mask].any()
    everything = prune_graph(graph, 1.0, 1.0)
    assert everything.node_mask.sum() > pruned.node_mask.sum()
    replacement, completeness = graph_scores(graph)
    assert 0 < replacement < 1 and 0 < completeness < 1


def test_fewer_feature_rows_keep_the_same_edges(tmp_path):
    model, ctx = setup(tmp_path, "plt-relu")
    targets = salient_targets(model, ctx.frozen.logits[-1], 3, 0.95, str)
    full = attribute(ctx, targets, batch_size=8)
    part = attribute(ctx, targets, batch_size=8, max_feature_nodes=20)
    sel = part.selected_features
    assert len(sel) == 20 and part.adjacency.shape[0] == full.adjacency.shape[0] - (len(ctx.active) - 20)
    n = len(ctx.active)
    columns = torch.cat([sel, torch.arange(n, full.adjacency.shape[0])])
    assert torch.allclose(part.adjacency[:20], full.adjacency[sel][:, columns])
    assert torch.allclose(part.adjacency[-3:], full.adjacency[-3:][:, columns])
    # the features chosen first are the influential ones: each beats every feature left out, on the
    # logit rows' partial influence at the first ranking (one round: 20 < update_interval x batch)
    from desktop_app.core.graphs.attribution import partial_influences
    infl = partial_influences(full.adjacency[-3:], targets.probabilities, torch.arange(3) + full.adjacency.shape[0] - 3)
    left_out = torch.ones(n, dtype=torch.bool)
    left_out[sel] = False
    assert infl[sel].min() >= infl[:n][left_out].max()


def test_zeroing_the_top_feature_moves_the_logits_as_its_edges_say(tmp_path):
    model, ctx = setup(tmp_path, "clt-jumprelu", dtype=torch.float32)
    targets = token_targets(model, ctx.frozen.logits[-1], [0, 1, 2], str)
    graph = attribute(ctx, targets)
    pruned = prune_graph(graph)
    f = graph.n_features
    top = int(torch.argmin(pruned.cumulative_scores[:f]))  # the most influential feature (smallest cumulative share)
    assert pruned.node_mask[top]
    before, after = ctx.logits(ctx.forward()[1])[-1], frozen_logits(ctx, [FeatureSet(top, "zero")])[-1]
    for k, tok in enumerate(targets.vocab_ids):
        moved = (after[tok] - after.mean()) - (before[tok] - before.mean())
        assert abs(float(moved) + float(graph.adjacency[graph.logit_index(k), top])) < 1e-4
    assert float(graph.adjacency[graph.logit_index(0):, top].abs().max()) > 1e-3  # an edge worth testing
    # scaling by 0.5 moves them half as far (linear in the activation)
    half = frozen_logits(ctx, [FeatureSet(top, "scale", 0.5)])[-1]
    assert torch.allclose(half - before, (after - before) / 2, atol=1e-5)


def test_the_same_edit_as_a_what_if_edit_on_the_live_model(tmp_path):
    model, ctx = setup(tmp_path, "plt-relu")
    last = ctx.n_layers - 1
    i = int(torch.nonzero(ctx.active[:, 0] == last)[0])  # a last-layer feature: nothing downstream but the norm
    layer, pos, feat = ctx.active[i].tolist()
    edits = feature_interventions(ctx, [FeatureSet(i, "clamp", 2.0)])
    assert [e.target for e in edits] == [f"blocks.{last}.mlp.out"]
    ids = torch.tensor(IDS)[None]
    names = [f"blocks.{last}.resid_post"]
    _, plain = model.run_with_trace(ids, names)
    _, edited = model.run_with_trace(ids, names, interventions=edits)
    moved = edited[names[0]][0] - plain[names[0]][0]
    W_dec = ctx.transcoders.decoder_rows(layer, torch.tensor([feat]))[0, 0].to(moved.dtype)
    expected = torch.zeros_like(moved)
    expected[pos] = (2.0 - ctx.activations[i]) * W_dec
    assert torch.allclose(moved, expected, atol=1e-12)


def test_bad_transcoder_folders_are_refused_in_one_line(tmp_path):
    random_transcoders(tmp_path / "plt", 2, 16, 8)
    cfg = (tmp_path / "plt" / "config.yaml").read_text()
    (tmp_path / "plt" / "config.yaml").write_text(cfg.replace("layer_1.safetensors", "hf://org/repo/layer_1.safetensors"))
    with pytest.raises(TranscoderError, match="remote"):
        load_transcoders(tmp_path / "plt")
    (tmp_path / "plt" / "config.yaml").write_text(cfg.replace("layer_1.safetensors", "layer_1.pt"))
    with pytest.raises(TranscoderError, match="only safetensors"):
        load_transcoders(tmp_path / "plt")
    (tmp_path / "plt" / "config.yaml").write_text(cfg.replace("mlp.hook_in", "hook_resid_pre"))
    with pytest.raises(TranscoderError, match="feature_input_hook"):
        load_transcoders(tmp_path / "plt")
    (tmp_path / "plt" / "config.yaml").write_text(cfg)
    (tmp_path / "plt" / "layer_1.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(TranscoderError, match="layer_1.safetensors"):
        load_transcoders(tmp_path / "plt")
    random_transcoders(tmp_path / "clt", 3, 16, 8, cross_layer=True)
    from safetensors.torch import save_file
    save_file({"W_dec_1": torch.zeros(8, 3, 16)}, str(tmp_path / "clt" / "W_dec_1.safetensors"))
    with pytest.raises(TranscoderError, match=r"W_dec_1 has shape \[8, 3, 16\], expected \[8, 2, 16\]"):
        load_transcoders(tmp_path / "clt")
    with pytest.raises(TranscoderError, match="neither config.yaml"):
        load_transcoders(tmp_path)
    model = llama(torch.float32, n_layers=2)
    random_transcoders(tmp_path / "three", 3, 16, 8)
    with pytest.raises(ValueError, match="transcoders for 3 layers"):
        build_context(model, IDS, load_transcoders(tmp_path / "three"))


def test_transcoders_encode_as_declared(tmp_path):
    from safetensors.torch import load_file
    random_transcoders(tmp_path / "j", 2, 16, 24, activation="jump_relu", skip=True, seed=5)
    random_transcoders(tmp_path / "k", 2, 16, 24, cross_layer=True, activation="topk", k=3, seed=6)
    x = torch.randn(5, 16)
    plt, clt = load_transcoders(tmp_path / "j"), load_transcoders(tmp_path / "k")
    t = load_file(str(tmp_path / "j" / "layer_1.safetensors"))
    pre = x @ t["W_enc"].T + t["b_enc"]
    assert torch.equal(plt.encode(1, x), torch.where(pre > t["activation_function.threshold"], pre, 0))
    assert torch.allclose(plt.skip(1, x), x @ t["W_skip"].T)
    c = load_file(str(tmp_path / "k" / "W_enc_1.safetensors"))
    acts = clt.encode(1, x)
    pre = x @ c["W_enc_1"].T + c["b_enc_1"]
    assert ((acts != 0).sum(-1) <= 3).all() and torch.equal(acts.topk(3).values, pre.topk(3).values)
    d = load_file(str(tmp_path / "k" / "W_dec_0.safetensors"))["W_dec_0"]
    assert torch.equal(clt.decoder_rows(0, torch.tensor([4, 2])), d[[4, 2]])
    assert list(clt.output_layers(0)) == [0, 1] and list(plt.output_layers(0)) == [0]


def test_unsupported_models_are_refused_in_one_line():
    cfg = ModelConfig.bert(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=16)
    from desktop_app.core.graphs import graph_problem
    problem = graph_problem(cfg)
    assert problem is not None and "\n" not in problem and "language-model head" in problem
    assert graph_problem(llama().cfg) is None and graph_problem(gpt2().cfg) is None
    # every other decoder family, and encoder-decoders' decoders: test_graph_families.py


def test_a_topk_k_beyond_the_features_is_refused_in_one_line(tmp_path):
    """config.yaml's `k: 30` over 24 features a layer: encode kept min(k, 24), every feature, without a word
    (circuit-tracer's own topk fails there). Refused when the folder opens, naming config.yaml, as a TopK SAE's
    k beyond its d_sae is (features.dictionary); k = F still opens."""
    random_transcoders(tmp_path / "k", 2, 16, 24, cross_layer=True, activation="topk", k=30, seed=6)
    with pytest.raises(TranscoderError) as exc:
        load_transcoders(tmp_path / "k")
    assert str(exc.value) == (f"{tmp_path / 'k' / 'config.yaml'}: activation_function topk needs k, an integer in "
                              "1..24 (the features a layer has), got 30")
    random_transcoders(tmp_path / "all", 2, 16, 24, activation="topk", k=24, seed=6)
    assert load_transcoders(tmp_path / "all").encode(0, torch.randn(3, 16)).shape == (3, 24)

"""core.views: the panels' views as data (view states, VIEWS tables, compute functions), no Qt."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from desktop_app.core import analysis
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.views import (HeatmapResult, View, export_name, find_view, state_from_dict, state_to_dict,
                                    view_names, views_using)
from desktop_app.core.views import attention as av
from desktop_app.core.views import layers as lv


@pytest.fixture(scope="module")
def trace():
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=32, init_std=0.3)
    model = new_model(cfg, seed=0).eval()
    _, tr = model.run_with_trace(torch.tensor([[1, 5, 9, 2, 7, 3, 8]]))
    return tr


@pytest.mark.parametrize("module", [av, lv])
def test_tables_are_well_formed(module):
    names = view_names(module.VIEWS)
    assert len(set(names)) == len(names)
    state = module.VIEWS and (av.AttentionViewState() if module is av else lv.LayersViewState())
    assert state.view in names
    for v in module.VIEWS:
        assert set(v.controls) <= set(module.CONTROLS) and v.title and callable(v.compute)


def test_attention_views_compute_the_analysis_numbers(trace):
    data = av.prepare(trace, causal=True, tokens=None)
    rollout, stats, problem = av.aggregates(trace)
    data.rollout, data.stats, data.aggregated = rollout, stats, True
    state = av.AttentionViewState(view="mean", layer=1, head=1, statistic="first_token")
    mean = find_view(av.VIEWS, "mean").compute(data, state)
    np.testing.assert_allclose(mean.values, analysis.mean_over_heads(trace, 1))
    assert mean.levels == av.display_levels(mean.values, data.mask) and data.mask is not None
    head = find_view(av.VIEWS, "attention").compute(data, state)
    np.testing.assert_allclose(head.values, analysis.attention_pattern(trace, 1)[1])
    assert head.title == "Layer 1, head 1"
    np.testing.assert_allclose(find_view(av.VIEWS, "rollout").compute(data, state).values,
                               analysis.attention_rollout(trace)[1])
    stat = find_view(av.VIEWS, "head-stats").compute(data, state)
    np.testing.assert_allclose(stat.values, analysis.head_stats(trace).first_token)
    assert find_view(av.VIEWS, "head-view").compute(data, state).pattern.shape == (2, 7, 7)
    assert views_using(av.VIEWS, "layer") == ("attention", "head-view", "mean", "rollout")
    assert views_using(av.VIEWS, "head") == ("attention",)
    assert export_name(av.VIEWS, state) == "mean-L1"
    assert export_name(av.VIEWS, dataclasses.replace(state, view="attention")) == "attention-L1-H1"
    assert export_name(av.VIEWS, dataclasses.replace(state, view="head-stats")) == "head-stats-first_token"


def test_rollout_and_statistics_wait_for_the_worker(trace):
    data = av.prepare(trace, causal=None, tokens=[str(i) for i in range(7)])
    assert data.causal  # guessed from the patterns: nothing above the diagonal
    state = av.AttentionViewState()
    assert find_view(av.VIEWS, "rollout").compute(data, state) is None
    assert find_view(av.VIEWS, "head-stats").compute(data, state) is None


def max_pool(m: np.ndarray, size: int) -> np.ndarray:
    """The reference: a [R, C] matrix shrunk to at most size x size by block maxima, in numpy (the app's
    thumbnails were made this way before they were pooled by torch in the trace's dtype)."""
    r, c = m.shape
    fr, fc = -(-r // size), -(-c // size)
    if fr == 1 and fc == 1:
        return m
    # pad with the smallest value so padding never shows (a block always holds one real cell)
    padded = np.full((-(-r // fr) * fr, -(-c // fc) * fc), m.min() if m.size else 0, dtype=m.dtype)
    padded[:r, :c] = m
    return padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))


def test_thumbnails_are_pooled_and_masked_cells_grey():
    m = np.tril(np.ones((300, 300), np.float32))
    small = av.pooled_heads(m[None], None, 96)[0]
    assert small.shape == (75, 75) and small.max() == 1  # blocks of 4 x 4: at most 96 a side
    lut = np.stack([np.arange(256)] * 3, axis=1).astype(np.uint8)
    thumbs = av.thumbnails([m[None]], np.tril(np.ones((300, 300), bool)), lut, 96)
    assert thumbs[0][0].shape == (75, 75, 4) and tuple(thumbs[0][0][0, -1]) == (190, 190, 190, 255)


def test_thumbnails_pooled_in_the_traces_dtype_equal_numpys_in_float32():
    """pooled_heads pools a bfloat16 layer as the trace holds it: the same values as max_pool of each head's
    float32 copy, masked cells -1 (sizes that do not divide into blocks, one that needs none; masked cells
    holding zeros as a softmax leaves them, or anything, and weights below -1)."""
    import torch

    from desktop_app.core import analysis

    gen = torch.Generator().manual_seed(0)
    for t_q, t_k, causal in ((300, 300, True), (193, 193, True), (200, 1000, False), (1, 500, True), (100, 300, True),
                             (40, 40, True)):
        mask = analysis.allowed_mask(t_q, t_k, causal)
        for heads in (torch.rand(3, t_q, t_k, generator=gen) * torch.from_numpy(mask),
                      torch.rand(3, t_q, t_k, generator=gen) * 3 - 2):
            heads = heads.to(torch.bfloat16)
            shown = None if mask.all() else mask
            ref = np.stack([max_pool(m if shown is None else np.where(shown, m, -1.0), 96)
                            for m in heads.float().numpy()])
            got = av.pooled_heads(heads, shown, 96)
            assert got.dtype == np.float32 and got.shape == ref.shape and max(got.shape[1:]) <= 96
            assert np.array_equal(got, ref)
    assert (got == -1).any()  # the causal mask's corner stays masked when blocks are single cells


def test_layers_views(trace):
    res = lv.compute_layers(trace)  # the trace records the logit lens: no model needed
    data = lv.LayersData(res, [f"t{i}" for i in range(7)], causal=True)
    state = lv.LayersViewState(view="cosine", depth=2)
    np.testing.assert_allclose(find_view(lv.VIEWS, "residual-norms").compute(data, state).values,
                               analysis.residual_norms(trace).T)
    cos = find_view(lv.VIEWS, "cosine").compute(data, state)
    assert cos.depth == 2 and cos.cosine.shape == (3, 7, 7)
    lens = find_view(lv.VIEWS, "logit-lens").compute(data, state)
    assert not lens.problem and lens.ids.shape == (2, 7) and lens.next_tokens == data.tokens[1:] + [""]
    comp = find_view(lv.VIEWS, "component-norms").compute(data, state)
    assert comp.col_labels == ["head 0", "head 1", "MLP"]
    assert export_name(lv.VIEWS, state, depth_name="L1") == "cosine-L1"
    assert views_using(lv.VIEWS, "depth") == ("pca", "cosine", "routing", "expert-norms")  # the block at that depth


def test_view_states_round_trip_as_plain_dicts_and_tolerate_other_versions():
    for cls, views, state in ((av.AttentionViewState, av.VIEWS, av.AttentionViewState("rollout", 1, 0, "entropy", 3)),
                              (lv.LayersViewState, lv.VIEWS, lv.LayersViewState("pca", 2, None))):
        assert state_from_dict(cls, state_to_dict(state), views) == state
    odd = {"view": "gone", "layer": -1, "head": True, "selected_token": "3", "statistic": 5, "new_key": 1}
    assert state_from_dict(av.AttentionViewState, odd, av.VIEWS) == av.AttentionViewState()
    assert state_from_dict(av.AttentionViewState, None, av.VIEWS) == av.AttentionViewState()


def test_adding_a_view_is_one_declaration_and_its_compute(trace):
    """What the README shows: a compute function and a View line; the generic parts need nothing else."""
    def compute_max(data, state):
        m = data.patterns[state.layer].max(axis=0)
        return HeatmapResult(m, data.row_labels, data.col_labels, data.mask, av.display_levels(m, data.mask),
                             f"Layer {state.layer}, max over heads")

    table = av.VIEWS + (View("max", "Max over heads", ("layer",), compute_max, "{view}-L{layer}", rows="queries"),)
    state = av.AttentionViewState(view="max", layer=1)
    data = av.prepare(trace, causal=True, tokens=None)
    assert find_view(table, "max").compute(data, state).values.shape == (7, 7)
    assert "max" in views_using(table, "layer") and export_name(table, state) == "max-L1"

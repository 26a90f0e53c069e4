"""Steering (activation addition, core/interventions.py): the "add" edit in the full forward, the
KV-cached generation steps and mask filling, and `steering_vector` against trace means taken by hand."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings, MaskedFillSession
from desktop_app.core.interventions import Intervention, is_steer, steer, steering_vector

L, D = 3, 48
PLUS = [5, 17, 3, 88, 41, 9]
MINUS = [12, 4, 77]  # another length: the means make the texts comparable
IDS = [2, 60, 33, 71, 8, 19, 90]


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.llama(vocab_size=97, d_model=D, n_layers=L, n_heads=4, n_kv_heads=2, d_ff=80,
                            context_length=64)
    return new_model(cfg, seed=0).eval()


def _logits(model, ids, interventions=None):
    with torch.no_grad():
        return model(torch.tensor([ids]), interventions=interventions).logits[0]


def _resid(model, ids, interventions=None):
    _, trace = model.run_with_trace(torch.tensor([ids]), names=["blocks.*.resid_post"], interventions=interventions)
    return [trace[f"blocks.{l}.resid_post"][0] for l in range(L)]


def test_steering_vector_is_the_difference_of_the_two_texts_mean_residuals(model):
    for layer in range(L):
        want = _resid(model, PLUS)[layer].mean(0) - _resid(model, MINUS)[layer].mean(0)
        got = steering_vector(model, PLUS, MINUS, layer)
        assert got.shape == (D,) and torch.allclose(got, want, atol=1e-6)
        assert got.abs().max() > 1e-3  # two different texts: not a zero vector
    assert torch.allclose(steering_vector(model, PLUS, PLUS, 1), torch.zeros(D))


def test_adding_zero_changes_nothing_and_a_vector_is_added_exactly_at_its_layer(model):
    plain = _logits(model, IDS)
    assert torch.equal(_logits(model, IDS, [Intervention("blocks.1.resid_post", "add", value=torch.zeros(D))]), plain)

    layer, scale = 1, 4.0
    v = steering_vector(model, PLUS, MINUS, layer)
    iv = steer(v, layer, scale, "plus", "minus")
    before, after = _resid(model, IDS), _resid(model, IDS, [iv])
    assert torch.equal(after[0], before[0])  # upstream of the edit: untouched
    assert torch.allclose(after[layer], before[layer] + scale * v, atol=1e-5)  # every position, plus scale x v
    assert not torch.allclose(after[layer + 1], before[layer + 1] + scale * v, atol=1e-3)  # later blocks react
    assert not torch.allclose(_logits(model, IDS, [iv]), plain, atol=1e-4)


def test_add_at_chosen_positions_and_one_row_per_position(model):
    v = torch.randn(D, generator=torch.Generator().manual_seed(1))
    before = _resid(model, IDS)[0]
    after = _resid(model, IDS, [Intervention("blocks.0.resid_post", "add", positions=(2, 5), value=v)])[0]
    assert torch.allclose(after[[2, 5]], before[[2, 5]] + v, atol=1e-5)
    assert torch.equal(after[[0, 1, 3, 4, 6]], before[[0, 1, 3, 4, 6]])
    rows = torch.randn(len(IDS), D, generator=torch.Generator().manual_seed(2))
    after = _resid(model, IDS, [Intervention("blocks.0.resid_post", "add", value=rows)])[0]
    assert torch.allclose(after, before + rows, atol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
def test_cached_generation_steps_are_the_steered_full_forward(model, use_cache):
    """Every step's next-token logits equal a full forward of the steered model over the whole
    sequence so far: the generated positions get the vector too (positions None)."""
    iv = steer(steering_vector(model, PLUS, MINUS, 1), 1, 8.0, "plus", "minus")
    s = GenerationSession(model, IDS[:4], GenerationSettings("greedy"), use_cache=use_cache, interventions=[iv])
    nodes = [s.root, *s.run(6)]
    ids = s.ids()
    assert len(ids) == 10
    for node in nodes:
        t = len(s.ids(node))
        assert torch.allclose(node.next_logits, _logits(model, ids[:t], [iv])[-1], atol=1e-4)
    plain = GenerationSession(model, IDS[:4], GenerationSettings("greedy"), use_cache=use_cache)
    list(plain.run(6))
    assert not torch.allclose(plain.current.next_logits, s.current.next_logits, atol=1e-3)


def test_mask_filling_applies_the_steer():
    cfg = ModelConfig.bert(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=32)
    bert = new_model(cfg, seed=0).eval()
    mask = 39
    v = steering_vector(bert, [3, 4, 5, 6], [7, 8], 0)
    iv = steer(v, 0, 6.0, "a", "b")
    ids = [1, 2, mask, 4, mask, 6]
    fill = MaskedFillSession(bert, ids, [2, 4], mask, GenerationSettings("greedy"), interventions=[iv])
    assert torch.allclose(fill.all_logits(), _logits(bert, ids, [iv]), atol=1e-5)
    assert not torch.allclose(fill.all_logits(), _logits(bert, ids), atol=1e-4)


def test_steer_names_and_clear_errors(model):
    v = steering_vector(model, PLUS, MINUS, 2)
    iv = steer(v, 2, -2.5, "I love this", "a rather long text that goes on and on")
    assert iv.label == 'steer L2 x-2.5 ("I love this" - "a rather long text …")'
    assert is_steer(iv) and not is_steer(Intervention("blocks.0.attn.head.1"))
    assert steer(v, 0, 4, "a", "b").label.startswith("steer L0 x4.0 ")
    with pytest.raises(ValueError, match="towards text is empty"):
        steering_vector(model, [], MINUS, 0)
    with pytest.raises(ValueError, match="away from text is empty"):
        steering_vector(model, PLUS, [], 0)
    with pytest.raises(ValueError, match="layers 0..2"):
        steering_vector(model, PLUS, MINUS, 3)
    with pytest.raises(ValueError, match="needs a value"):
        Intervention("blocks.0.resid_post", "add")
    with pytest.raises(ValueError, match="width 5"):
        Intervention("blocks.0.resid_post", "add", value=torch.zeros(5)).check(model.cfg)

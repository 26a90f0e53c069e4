"""process_logits: temperature, top-k and top-p keep exactly the tokens their definitions say."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from desktop_app.core.generation import GenerationError, process_logits, top_k_mask, top_p_mask


def _logits(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def _kept(d):
    return set(torch.nonzero(d.kept).flatten().tolist())


def test_temperature_one_is_softmax_and_high_temperature_tends_to_uniform():
    logits = torch.tensor([2.0, 1.0, -1.0, 0.5])
    d = process_logits(logits)
    assert torch.allclose(d.probs, torch.softmax(logits.double(), 0))
    d = process_logits(logits, temperature=0.5)
    assert torch.allclose(d.probs, torch.softmax(logits.double() * 2, 0))
    hot = process_logits(logits, temperature=1e6)
    assert (hot.probs - 0.25).abs().max() < 1e-5
    cold = process_logits(logits, temperature=0)
    assert cold.probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert math.isclose(d.entropy, float(-(d.probs * d.probs.log()).sum()))


def test_top_k_keeps_the_k_most_probable_and_ties_at_the_edge():
    d = process_logits(_logits([0.1, 0.4, 0.2, 0.3]), top_k=2)
    assert _kept(d) == {1, 3}
    assert torch.allclose(d.probs, torch.tensor([0, 0.4, 0, 0.3], dtype=torch.float64) / 0.7)
    tie = process_logits(_logits([0.3, 0.2, 0.2, 0.3]), top_k=3)  # 3rd place is shared by 1 and 2
    assert _kept(tie) == {0, 1, 2, 3}
    assert _kept(process_logits(_logits([0.25] * 4), top_k=1)) == {0, 1, 2, 3}
    assert _kept(process_logits(_logits([0.1, 0.9]), top_k=0)) == {0, 1}  # 0 = off
    assert _kept(process_logits(_logits([0.1, 0.9]), top_k=5)) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = [0.5, 0.25, 0.125, 0.125]
    assert _kept(process_logits(_logits(probs), top_p=0.5)) == {0}  # 0.5 reaches 0.5 exactly
    assert _kept(process_logits(_logits(probs), top_p=0.51)) == {0, 1}
    assert _kept(process_logits(_logits(probs), top_p=0.75)) == {0, 1}
    assert _kept(process_logits(_logits(probs), top_p=0.76)) == {0, 1, 2, 3}  # tie at the edge: both
    assert _kept(process_logits(_logits(probs), top_p=0.01)) == {0}  # the top token always stays
    # p = 1 keeps everything, even a token whose probability underflows to 0
    d = process_logits(torch.tensor([0.0, 0.0, -1e4]), top_p=1.0)
    assert _kept(d) == {0, 1, 2}
    with pytest.raises(GenerationError):
        process_logits(_logits(probs), top_p=0.0)
    with pytest.raises(GenerationError):
        process_logits(_logits(probs), temperature=-1)


def test_temperature_keeps_top_k_set_but_can_change_top_p_set():
    logits = _logits([0.6, 0.2, 0.1, 0.06, 0.04])
    for T in (0.3, 1.0, 3.0):
        assert _kept(process_logits(logits, temperature=T, top_k=2)) == {0, 1}
    assert _kept(process_logits(logits, temperature=1.0, top_p=0.75)) == {0, 1}
    assert _kept(process_logits(logits, temperature=0.3, top_p=0.75)) == {0}  # sharper: 0.6 -> ~0.97
    assert len(_kept(process_logits(logits, temperature=3.0, top_p=0.75))) >= 3  # flatter


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-8, 8), min_size=2, max_size=30), st.integers(1, 30), st.floats(0.01, 1.0),
       st.floats(0.2, 5.0))
def test_sets_match_the_definitions_by_brute_force(values, k, p, T):
    logits = torch.tensor(values, dtype=torch.float64)
    d = process_logits(logits, temperature=T, top_k=k, top_p=p)
    probs = torch.softmax(logits / T, 0).tolist()
    n = len(probs)
    # top-k: tokens with fewer than k tokens strictly more probable
    want_k = {i for i in range(n) if sum(q > probs[i] for q in probs) < k}
    # top-p: tokens whose strictly-more-probable mass is below p (ties with the last one kept)
    want_p = {i for i in range(n) if sum(q for q in probs if q > probs[i]) < p * (1 - 1e-9)} if p < 1 else set(range(n))
    kept = _kept(d)
    assert kept == want_k & want_p or _near_boundary(probs, p) or _near_kth(probs, k)
    assert math.isclose(float(d.probs.sum()), 1.0, rel_tol=1e-9)
    assert all(d.probs[i] == 0 for i in range(n) if i not in kept)
    # temperature never changes the top-k set
    assert (_kept(process_logits(logits, top_k=k)) == _kept(process_logits(logits, temperature=T, top_k=k))
            or _near_kth(torch.softmax(logits, 0).tolist(), k) or _near_kth(probs, k))


def _near_kth(probs, k):
    """Two probabilities a few ulps apart (logits 1e-16 apart) at the k-th place: whether they tie
    depends on the order of the rounding (found by hypothesis: logits [0, 5e-17], k = 1)."""
    kth = sorted(probs, reverse=True)[min(k, len(probs)) - 1]
    return any(q != kth and abs(q - kth) <= 1e-12 * kth for q in probs)


def _near_boundary(probs, p):
    """Rounding can decide a token whose preceding mass equals p to ~1e-9."""
    return any(abs(sum(q for q in probs if q > x) - p) < 1e-9 for x in probs)


def test_top_p_of_one_keeps_every_token_in_the_filter_itself():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)  # a zero-probability token
    assert top_p_mask(probs, 1.0).all()
    assert top_p_mask(probs, 1.0 - 1e-9).tolist() == [True, True, True, False]  # just below 1: mass reached
    rounded = torch.tensor([0.1] * 10, dtype=torch.float32)  # sums to 1 only up to rounding
    assert top_p_mask(rounded, 1.0).all() and top_p_mask(rounded, 0.95).all()  # 0.9 < 0.95: the tie keeps all
    # with top-k on, process_logits runs the top-p filter at p = 1: the set is top-k's alone
    d = process_logits(_logits([0.4, 0.3, 0.2, 0.1]), top_k=2, top_p=1.0)
    assert _kept(d) == {0, 1} and torch.equal(d.kept, top_k_mask(d.tempered_probs, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([-math.inf, -1.0, 0.0, 2.0, 2.0, math.nan]), min_size=1, max_size=40))
def test_greedy_picks_argmax_first_of_ties_and_a_nan_as_torch_does(values):
    """pick's greedy token is torch.argmax's on the logits: the first of tied maxima, the first NaN if any
    (it reads max(0)'s index, which is faster; the two must never differ)."""
    from desktop_app.core.generation.sampling import pick
    logits = torch.tensor(values, dtype=torch.float32)
    dist = process_logits(logits)
    token, how = pick(dist, "greedy", torch.Generator())
    assert how == "greedy"
    assert token == int(torch.argmax(logits.double()))


@pytest.mark.parametrize("args, problem", [
    ((1.0, 2.5, 1.0), "top_k: must be an integer from 0 to 1,000,000,000 (0: off), got 2.5"),
    ((1.0, True, 1.0), "top_k: must be an integer"),
    ((1.0, 0, 2.0), "top_p: must be in (0, 1], got 2.0"),
    ((1.0, 0, 0.0), "top_p: must be in (0, 1], got 0.0"),
    ((float("inf"), 0, 1.0), "temperature: must be in [0, 1e+06], got inf"),
    ((-1.0, 0, 1.0), "temperature: must be in [0, 1e+06], got -1.0"),
])
def test_process_logits_checks_a_scripts_numbers_by_name(args, problem):
    """process_logits(logits, top_k=2.5) failed deep inside (torch.topk's TypeError), top_p=2 was no filter and
    temperature=inf a distribution of NaN, without a word. Its numbers are checked as GenerationSettings checks
    them: one GenerationError naming the argument. Numbers a script gives as ints or numpy's are taken."""
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    with pytest.raises(GenerationError) as err:
        process_logits(logits, *args)
    assert str(err.value).startswith(problem), str(err.value)
    d = process_logits(logits, np.float32(1), np.int64(2), 1)
    assert (d.temperature, d.top_k, d.top_p) == (1.0, 2, 1.0) and d.kept.tolist() == [True, True, False, False]

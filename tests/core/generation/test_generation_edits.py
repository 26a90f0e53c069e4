"""A generation history kept across what-if edits (issue 25 §6): GenerationSession.with_interventions
and MaskedFillSession.with_interventions keep every token the user had, recompute what the edited
model says about them, and leave the original session as it was."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings, MaskedFillSession, process_logits
from desktop_app.core.interventions import Intervention
from desktop_app.core.jobs import Cancelled, JobControl

EDITS = [Intervention("blocks.1.attn.head.2"), Intervention("blocks.0.mlp.out", "mean")]


def _gpt2():
    cfg = ModelConfig.gpt2(vocab_size=97, d_model=48, n_layers=3, n_heads=4, d_ff=96, context_length=24, init_std=0.3)
    return new_model(cfg, seed=0).eval()


def _fresh(model, prompt, tokens):
    s = GenerationSession(model, prompt, stop_tokens=[], interventions=EDITS)
    for t in tokens:
        s.choose(t)
    return s.current


def _tree(s):
    out, stack = [], [s.root]
    while stack:
        n = stack.pop()
        out.append(([c.token for c in n.path()[1:]], n.how))
        stack.extend(reversed(n.children))
    return out


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_the_tree_is_kept_and_every_node_is_the_edited_models(strategy):
    model = _gpt2()
    prompt = [1, 2, 3]
    s = GenerationSession(model, prompt, GenerationSettings(strategy, beams=3), stop_tokens=[])
    list(s.run(3))
    if strategy == "greedy":  # a branch: back one, force another token, one more step
        s.back()
        alt = next(t for t in range(97) if t != s.current.children[0].token)
        s.choose(alt)
        s.step()
    before = _tree(s)
    current = [n.token for n in s.current.path()[1:]]
    old_logits = s.current.next_logits.clone()

    e = s.with_interventions(EDITS)
    assert _tree(e) == before and _tree(s) == before  # the same tokens, branches and how; s untouched
    assert [n.token for n in e.current.path()[1:]] == current
    assert torch.equal(s.current.next_logits, old_logits) and not s.interventions and e.interventions
    assert [[n.token for n in b.path()[1:]] for b in e.beams] == [[n.token for n in b.path()[1:]] for b in s.beams]
    changed = False
    stack = [e.root]
    while stack:  # every node: the edited model's logits after its path, its probability and score
        n = stack.pop()
        stack.extend(n.children)
        tokens = [c.token for c in n.path()[1:]]
        ref = _fresh(model, prompt, tokens)
        assert (n.next_logits - ref.next_logits).abs().max() < 1e-4
        assert n.model_prob == pytest.approx(ref.model_prob, rel=1e-4) and n.score == pytest.approx(ref.score, abs=1e-4)
        old = s.node_at(tokens)
        changed |= not torch.allclose(old.next_logits, n.next_logits, atol=1e-3)
    assert changed  # the edits matter on this model: the test could fail
    back = e.with_interventions([])  # and back to the model as trained: s's numbers again
    assert (back.current.next_logits - old_logits).abs().max() < 1e-4 and _tree(back) == before


def test_replaying_is_cancellable_and_a_cancelled_replay_changes_nothing():
    s = GenerationSession(_gpt2(), [1, 2], stop_tokens=[])
    list(s.run(4))
    job = JobControl()
    job.cancel()
    with pytest.raises(Cancelled):
        s.with_interventions(EDITS, job)
    assert s.current.depth == 4 and not s.interventions


def test_masked_fills_are_kept_in_order_with_the_edited_models_distributions():
    cfg = ModelConfig.bert(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=16, init_std=0.3)
    model = new_model(cfg, seed=0).eval()
    s = MaskedFillSession(model, [2, 10, 11, 12, 13, 14, 3], masked=[2, 4, 5], mask_token_id=1)
    s.step()
    s.choose(7)
    e = s.with_interventions(EDITS)
    assert [(st.position, st.token, st.how) for st in e.history] == [(st.position, st.token, st.how) for st in s.history]
    assert e.ids() == s.ids() and e.interventions and not s.interventions
    for k, st in enumerate(e.history):
        ref = MaskedFillSession(model, s.ids0, s.masked, 1, interventions=EDITS)
        for done in e.history[:k]:
            ref.choose(done.token, done.position)
        want = process_logits(ref.all_logits()[st.position])
        assert torch.allclose(st.logits, ref.all_logits()[st.position], atol=1e-5)
        assert st.model_prob == pytest.approx(float(want.model_probs[st.token]), rel=1e-4)
    assert not torch.allclose(e.history[0].logits, s.history[0].logits, atol=1e-3)

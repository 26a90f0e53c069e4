"""GenerationSession: cache vs full recompute, parity with transformers' greedy generate,
reproducible sampling, the tree (back / choose / branches), beam search, recording, masked fill."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import (ContextLengthReached, GenerationError, GenerationSession,
                                         GenerationSettings, MaskedFillSession, generate)
from desktop_app.core.jobs import Cancelled, JobControl


def _gpt2(**kw):
    cfg = ModelConfig.gpt2(vocab_size=97, d_model=48, n_layers=3, n_heads=4, d_ff=96, context_length=24, **kw)
    return new_model(cfg, seed=0).eval()


def _llama(**kw):
    cfg = ModelConfig.llama(vocab_size=97, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=80,
                            context_length=24, **kw)
    return new_model(cfg, seed=1).eval()


def _full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("make", [_gpt2, _llama, lambda: _gpt2(attention_kind="l2")], ids=["gpt2", "llama", "l2"])
def test_cached_logits_equal_full_recompute_at_every_step(make):
    model = make()
    s = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=1, stop_tokens=[])
    list(s.run(12))
    ids = s.ids()
    full = _full_logits(model, ids)
    for node in s.current.path():
        assert (node.next_logits - full[node.position]).abs().max().item() < 1e-5, node.position
    # a branch made after going back reuses the truncated cache and still agrees
    s.back(), s.back(), s.back()
    s.choose(11)
    list(s.run(3))
    full = _full_logits(model, s.ids())
    for node in s.current.path():
        assert (node.next_logits - full[node.position]).abs().max().item() < 1e-5


def test_sinkhorn_falls_back_to_full_recompute():
    model = _gpt2(attention_kind="sinkhorn")
    s = GenerationSession(model, [5, 9, 2], stop_tokens=[])
    assert not s.incremental
    list(s.run(5))
    full = _full_logits(model, s.ids())
    assert (s.current.next_logits - full[-1]).abs().max().item() < 1e-5
    # the cache would be wrong here: column normalisation changes earlier rows as tokens are added
    cached = GenerationSession(model, [5, 9, 2], stop_tokens=[], use_cache=True)
    for n in s.generated():
        cached.choose(n.token)
    assert (cached.current.next_logits - full[-1]).abs().max().item() > 1e-4


def _hf_case(kind):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=97, n_positions=40, n_embd=48, n_layer=3, n_head=4,
                                      bos_token_id=None, eos_token_id=None)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=80, max_position_embeddings=64,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_ids_equal_transformers_generate(kind, tmp_path):
    hf = _hf_case(kind)
    hf.save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path)
    prompt = [3, 17, 42, 8]
    hf.eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, num_beams=1,
                          pad_token_id=0, eos_token_id=None)[0].tolist()
    ids, _ = generate(loaded, prompt, 20, GenerationSettings("greedy"), stop_tokens=[])
    assert ids == ref
    assert len(ids) == len(prompt) + 20


def test_sampling_is_reproducible_with_a_seed():
    model = _gpt2()
    settings = GenerationSettings("top-p", temperature=1.3, top_p=0.95)
    a, _ = generate(model, [1, 2], 15, settings, seed=7, stop_tokens=[])
    b, _ = generate(model, [1, 2], 15, settings, seed=7, stop_tokens=[])
    c, _ = generate(model, [1, 2], 15, settings, seed=8, stop_tokens=[])
    assert a == b
    assert a != c  # 15 draws at T=1.3 over 97 tokens: equal only with negligible probability
    s = GenerationSession(model, [1, 2], settings, seed=7, stop_tokens=[])
    list(s.run(15))
    s.reset()
    list(s.run(15))
    assert s.ids() == a  # reset reseeds


def test_sampled_token_is_always_in_the_kept_set():
    model = _gpt2()
    s = GenerationSession(model, [4], GenerationSettings("top-k", top_k=3, temperature=2.0), seed=0, stop_tokens=[])
    for node in s.run(15):
        kept = s.distribution(node.parent).kept
        assert kept[node.token] and int(kept.sum()) == 3


def test_back_choose_branch_keep_a_consistent_tree():
    model = _gpt2()
    s = GenerationSession(model, [1, 2, 3], stop_tokens=[])
    list(s.run(5))
    first = s.ids()
    assert s.back().depth == 4 and s.back().depth == 3
    again = s.step()  # greedy again: the existing child is reused, no second copy
    assert s.ids() == first[:7] and len(again.parent.children) == 1
    s.back()
    alt = next(t for t in range(97) if t != first[6])
    node = s.choose(alt)
    assert node.how == "chosen" and len(node.parent.children) == 2
    assert s.ids() == first[:6] + [alt]
    list(s.run(2))
    leaves = s.branches()
    assert len(leaves) == 2
    for leaf in leaves:  # every node's children point back to it, positions increase by one
        path = leaf.path()
        assert path[0] is s.root
        for p, c in zip(path, path[1:]):
            assert c.parent is p and c in p.children and c.position == p.position + 1
    s.goto(leaves[0])
    assert s.ids() == first
    assert (s.current.next_logits - _full_logits(model, first)[-1]).abs().max() < 1e-5
    while s.current is not s.root:
        s.back()
    assert s.back() is s.root  # back at the root stays there


def test_stop_tokens_and_context_length_give_messages_not_crashes():
    model = _gpt2()
    s = GenerationSession(model, [1, 2], stop_tokens=[])
    greedy_next = int(torch.argmax(s.root.next_logits))
    s2 = GenerationSession(model, [1, 2], stop_tokens=[greedy_next])
    list(s2.run(5))
    assert s2.ids() == [1, 2, greedy_next] and s2.current.stop and s2.stop_reason
    with pytest.raises(GenerationError, match="stop token"):
        s2.step()
    list(s.run(100))
    assert len(s.ids()) == 24 and "context length" in s.stop_reason
    with pytest.raises(ContextLengthReached, match="context length"):
        s.step()
    with pytest.raises(ContextLengthReached):
        GenerationSession(model, list(range(25)))
    with pytest.raises(GenerationError, match="empty"):
        GenerationSession(model, [])


def test_run_is_cancelled_between_tokens():
    model = _gpt2()
    s = GenerationSession(model, [1], stop_tokens=[])
    job = JobControl()
    it = s.run(10, job)
    next(it), next(it)
    job.cancel()
    with pytest.raises(Cancelled):
        next(it)
    assert s.current.depth == 2


@pytest.mark.parametrize("make,strategy", [(_llama, "sample"), (lambda: _gpt2(attention_kind="l2"), "sample"),
                                           (_gpt2, "beam")], ids=["llama-gqa-rotary", "gpt2-l2", "gpt2-beam"])
def test_step_trace_equals_a_traced_forward_of_the_path(make, strategy):
    model = make()
    s = GenerationSession(model, [7, 8, 9], GenerationSettings(strategy, beams=3), seed=2, stop_tokens=[])
    list(s.run(6))
    node = s.current.parent
    trace, ids = s.step_trace(node)
    assert ids == s.ids(node)
    _, ref = model.run_with_trace(torch.tensor([ids]))
    assert f"blocks.{model.cfg.n_layers - 1}.attn.head_out" in trace.keys()  # computed on inspection
    for name in trace.keys():
        assert trace[name].shape == ref[name].shape, name
        assert (trace[name] - ref[name]).abs().max().item() < 1e-5, name


def test_logit_lens_last_layer_is_the_models_distribution():
    model = _gpt2()
    s = GenerationSession(model, [3, 4], GenerationSettings("sample"), seed=0, stop_tokens=[])
    list(s.run(4))
    node = s.current.parent
    rows = s.logit_lens(node)
    assert [r.layer for r in rows] == [-1, 0, 1, 2]
    probs = torch.softmax(node.parent.next_logits.double(), 0)
    assert rows[-1].top_token == int(probs.argmax())
    assert math.isclose(rows[-1].chosen_prob, node.model_prob, rel_tol=1e-4)
    # layer 0's lens: unembed of block 0's output at that position, computed independently
    _, ref = model.run_with_trace(torch.tensor([s.ids(node)]))
    lens0 = torch.softmax(ref["blocks.0.logit_lens"][0, node.position - 1], -1)
    assert rows[1].top_token == int(lens0.argmax())
    assert math.isclose(rows[1].top_prob, float(lens0.max()), rel_tol=1e-4)


# -- beam search on a hand-built bigram model ------------------------------------------------


def _bigram_model(table: torch.Tensor):
    """A real Transformer whose logits depend only on the last token: logits = table[last].

    Blocks output zero (so the residual is the embedding), positions are off, and the
    unembedding is solved so that lm_head(LayerNorm(e_v)) = table[v] exactly."""
    V = table.shape[0]
    cfg = ModelConfig.gpt2(vocab_size=V, d_model=2 * V, n_layers=1, n_heads=2, d_ff=8, context_length=16,
                           positions="none", tie_embeddings=False)
    model = new_model(cfg, seed=0).double().eval()
    with torch.no_grad():
        for p in model.blocks.parameters():
            p.zero_()
        normed = model.final_norm(model.tok_embed.weight)  # [V, d], rank V
        W = torch.linalg.lstsq(normed, table.double()).solution  # [d, V]
        model.lm_head.weight.copy_(W.T)
        assert (model.unembed(model.tok_embed.weight) - table).abs().max() < 1e-8
    return model


def test_beam_search_returns_the_highest_scoring_sequence():
    V = 5
    logp = torch.full((V, V), -30.0, dtype=torch.float64)
    # from token 0: greedy takes 1 (0.5) but 2 (0.4) leads to a near-certain token
    logp[0, 1], logp[0, 2], logp[0, 3] = math.log(0.5), math.log(0.4), math.log(0.1)
    logp[1, :] = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1]).log()  # after 1: nearly flat
    logp[2, 4], logp[2, 0] = math.log(0.95), math.log(0.05)
    logp[3, 4] = math.log(0.99)
    logp[4, 4] = 0.0
    logp = torch.log_softmax(logp, -1)
    model = _bigram_model(logp)
    # independent reference: enumerate every 3-token continuation
    best = max(itertools.product(range(V), repeat=3),
               key=lambda seq: sum(float(logp[a, b]) for a, b in zip((0,) + seq, seq)))
    greedy, _ = generate(model, [0], 3, GenerationSettings("greedy"), stop_tokens=[])
    ids, s = generate(model, [0], 3, GenerationSettings("beam", beams=2), stop_tokens=[])
    assert ids[1:] == list(best) and greedy[1:] != list(best)
    want = sum(float(logp[a, b]) for a, b in zip([0] + list(best), best))
    assert math.isclose(s.current.score, want, rel_tol=1e-6)
    assert len(s.beams) == 2 and s.current is max(s.beams, key=lambda b: b.score)
    # width 1 beam search is greedy
    ids1, _ = generate(model, [0], 3, GenerationSettings("beam", beams=1), stop_tokens=[])
    assert ids1 == greedy
    # back() restores the previous beams
    prev = list(s._beam_history[-1])
    s.back()
    assert s.beams == prev


def test_bert_masked_fill(tmp_path):
    cfg = ModelConfig.bert(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=16)
    model = new_model(cfg, seed=0).eval()
    with pytest.raises(GenerationError, match="encoder"):
        GenerationSession(model, [1, 2])
    ids = [2, 10, 11, 12, 13, 14, 3]
    s = MaskedFillSession(model, ids, masked=[2, 4, 5], mask_token_id=1, order="confident")
    assert s.ids() == [2, 10, 1, 12, 1, 1, 3]
    # reference for the first pick: the most confident masked position, its argmax token
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([s.ids()])).logits[0].double(), -1)
    conf = {p: float(probs[p].max()) for p in (2, 4, 5)}
    first = max(conf, key=conf.get)
    step = s.step()
    assert step.position == first and step.token == int(probs[first].argmax())
    list(s.run(5))
    assert s.finished and len(s.history) == 3 and 1 not in s.ids()
    s.back()
    assert len(s.remaining) == 1
    s.choose(7)
    assert s.ids()[s.history[-1].position] == 7
    l2r = MaskedFillSession(model, ids, masked=[5, 2], mask_token_id=1, order="left-to-right")
    assert [st.position for st in l2r.run(5)] == [2, 5]


def test_cancel_inside_a_forward_leaves_the_tree_and_cache_consistent():
    model = _gpt2()
    s = GenerationSession(model, [1, 2], stop_tokens=[])
    list(s.run(3, lazy_last=True))
    job = JobControl()
    seen = []

    def cancel_in_layer_1(module, args):  # cancel while layer 1 is about to run
        seen.append(1)
        # the run's cancel check rides on the forward (on_layer): no hook on any block but this test's
        assert not model.blocks[0]._forward_pre_hooks and len(model.blocks[1]._forward_pre_hooks) == 1
        if len(seen) == 3:  # the first run's last token's forward (made as the next run starts), a step, then this
            job.cancel()
    h = model.blocks[1].register_forward_pre_hook(cancel_in_layer_1)
    try:
        with pytest.raises(Cancelled):
            list(s.run(5, job))
    finally:
        h.remove()
    assert len(seen) == 3 and s.current.depth == 4  # one more step finished, the second was interrupted
    assert len(s.current.children) == 0  # no half-made node
    assert not any(b._forward_pre_hooks for b in model.blocks)
    list(s.run(2))  # carries on with a rebuilt cache
    full = _full_logits(model, s.ids())
    for node in s.current.path():
        assert (node.next_logits - full[node.position]).abs().max().item() < 1e-5


def test_sinkhorn_step_trace_keeps_each_steps_own_row():
    model = _gpt2(attention_kind="sinkhorn")
    s = GenerationSession(model, [5, 9, 2], stop_tokens=[])
    list(s.run(3))
    trace, ids = s.step_trace()
    assert trace.pattern(0).shape == (1, 4, 6, 6)
    # the last row is what the last step computed: the full forward's last query row
    _, ref = model.run_with_trace(torch.tensor([ids]))
    assert (trace.pattern(0)[0, :, -1] - ref.pattern(0)[0, :, -1]).abs().max() < 1e-5
    assert (trace["blocks.1.resid_post"][0, -1] - ref["blocks.1.resid_post"][0, -1]).abs().max() < 1e-5
    # earlier rows are as they were when their step ran: Sinkhorn changed them since
    assert (trace["blocks.1.resid_post"][0, :-1] - ref["blocks.1.resid_post"][0, :-1]).abs().max() > 1e-5


def test_beam_search_at_the_context_length_says_so_not_stop_token():
    model = _gpt2()  # context 24
    s = GenerationSession(model, list(range(20)), GenerationSettings("beam", beams=3), stop_tokens=[])
    assert len(list(s.run(10))) == 4
    assert s.finished and len(s.ids()) == 24
    assert "context length" in s.stop_reason and "stop token" not in s.stop_reason
    stopper = GenerationSession(model, [1, 2], GenerationSettings("beam", beams=2), stop_tokens=range(97))
    list(stopper.run(5))  # every token stops: both beams end on a stop token
    assert stopper.stop_reason == "a stop token was generated"


def _count_fed_tokens(model):
    """Token counts of every model forward (the cache makes a step one token)."""
    fed = []
    return fed, model.register_forward_pre_hook(lambda module, args: fed.append(args[0].shape[-1]) and None)


def _same_node(a, b) -> None:
    """Two nodes' next-token logits and records bit for bit."""
    assert torch.equal(a.next_logits, b.next_logits)
    assert a.record.keys() == b.record.keys()
    for name in a.record:
        assert torch.equal(a.record[name], b.record[name]), name


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_a_runs_last_forward_waits_for_a_read_and_gives_the_values_a_step_gives(make):
    """run(n) makes the forward that consumes its last token (or a stop token) only when that node's
    next_logits or record is first read, or before the cache moves on: as transformers' generate, which
    never makes it, n tokens cost the prompt and n - 1 one-token forwards. Read later, or after back and a
    branch, the values are those of step() making it at once, bit for bit."""
    model = make()
    eager = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=3, stop_tokens=[])
    for _ in range(4):
        eager.step()
    lazy = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=3, stop_tokens=[])
    fed, h = _count_fed_tokens(model)
    try:
        assert [n.token for n in lazy.run(4, lazy_last=True)] == eager.ids()[3:]
        assert fed == [1] * 3
        trace, _ = lazy.step_trace()  # reads the last node's records: its forward now
        assert fed == [1] * 4
    finally:
        h.remove()
    for a, b in zip(lazy.current.path(), eager.current.path()):
        _same_node(a, b)
    assert torch.equal(trace["blocks.1.resid_post"], eager.step_trace()[0]["blocks.1.resid_post"])
    # a branch from an earlier token: the waiting node is made before the cache moves back, then read
    again = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=3, stop_tokens=[])
    list(again.run(4, lazy_last=True))
    last = again.current
    again.back(), again.back()
    alt = next(t for t in range(97) if t != again.current.children[0].token)
    branch = again.choose(alt)
    eager.back(), eager.back()
    _same_node(branch, eager.choose(alt))
    _same_node(last, eager.current.parent.children[0].children[0])
    # a stop token ends the run and waits too; reading it (its distribution) makes it
    stop_at = eager.ids()[4]
    stopping = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=3, stop_tokens=[stop_at])
    list(stopping.run(6, lazy_last=True))
    assert stopping.current.stop and stopping.current.compute is not None
    assert stopping.distribution().logits.shape == (97,) and stopping.current.compute is None
    # step() (the Step button) makes every forward at once, a stop token's too: no forward on a view's thread
    stepped = GenerationSession(model, [5, 9, 2], GenerationSettings("sample"), seed=3, stop_tokens=[eager.ids()[3]])
    assert stepped.step().stop and stepped.current.compute is None and stepped.current.record


def test_two_threads_reading_a_waiting_node_make_its_forward_once():
    """A view's read on the UI thread and a worker's read of the node a run left waiting: one forward,
    both see its logits (the second waits on the first)."""
    import threading
    model = _gpt2()
    s = GenerationSession(model, [5, 9, 2], stop_tokens=[])
    list(s.run(3, lazy_last=True))
    node = s.current
    fed, h = _count_fed_tokens(model)
    start, seen = threading.Barrier(2), []

    def read() -> None:
        start.wait()
        seen.append(node.next_logits)
    threads = [threading.Thread(target=read) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        h.remove()
    assert fed == [1] and len(seen) == 2 and seen[0] is seen[1] and seen[0] is not None


def test_a_cached_step_feeds_one_token_and_a_branch_reuses_the_shared_prefix():
    model = _gpt2()
    s = GenerationSession(model, [5, 9, 2, 7], stop_tokens=[])
    fed, h = _count_fed_tokens(model)
    try:
        list(s.run(6, lazy_last=True))
        assert fed == [1] * 5  # the sixth token's forward waits for a read of its logits or records
        s.current.next_logits
        assert fed == [1] * 6
        fed.clear()
        s.back(), s.back(), s.back()
        alt = next(t for t in range(97) if t != s.current.children[0].token)
        s.choose(alt)  # the cache is truncated to the shared prefix: only the new token runs
        assert fed == [1]
        fed.clear()
        first = s.branches()[0]
        s.goto(first.parent)  # on the first branch, two tokens past the fork at depth 3
        s.choose(next(t for t in range(97) if t not in [c.token for c in s.current.children]))
        assert fed == [2, 1]  # the first branch's two tokens after the fork, then the new one: no prefix
    finally:
        h.remove()
    full = _full_logits(model, s.ids())
    assert (s.current.next_logits - full[-1]).abs().max().item() < 1e-5

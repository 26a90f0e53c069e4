"""The preallocated KV cache (core/model.py KVCache): growth past its first capacity, going back
(truncate, then overwrite in place), copy-on-write clones, beam rows, gradients, and equality
with the full forward at every step; and generation's branching over it."""
from __future__ import annotations

import torch

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.model import KVCache

CFG = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=160)


def _model(kind="gpt2"):
    if kind == "llama":  # grouped keys (2 of 4 heads) and rotary positions
        return new_model(ModelConfig.llama(**CFG, n_kv_heads=2), seed=3).eval()
    return new_model(ModelConfig.gpt2(**CFG), seed=2).eval()


def _full(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _step(model, cache, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids]), cache=cache).logits[0]


def test_one_token_steps_past_the_first_capacity_equal_the_full_forward():
    for kind in ("gpt2", "llama"):
        model = _model(kind)
        ids = torch.randint(0, 61, (150,), generator=torch.Generator().manual_seed(0)).tolist()
        cache = KVCache(model.cfg.n_layers)
        rows = [_step(model, cache, ids[:5])]
        for t in range(5, 150):  # crosses the first capacity (64) and a doubling (128)
            rows.append(_step(model, cache, ids[t:t + 1]))
        assert cache.length == 150 and cache._keys.shape[3] >= 150
        assert (torch.cat(rows) - _full(model, ids)).abs().max() < 1e-4
        for lc in cache.layers:  # every layer's keys are views of the one buffer
            assert lc.k.untyped_storage().data_ptr() == cache._keys.untyped_storage().data_ptr()


def test_going_back_overwrites_in_place_and_matches_the_full_forward():
    model = _model()
    a = [3, 1, 4, 1, 5, 9, 2, 6]
    b = [3, 1, 4, 8, 8]
    cache = KVCache(model.cfg.n_layers)
    _step(model, cache, a)
    ptr = cache._keys.data_ptr()
    cache.truncate(3)
    out = _step(model, cache, b[3:])
    assert cache.length == 5 and cache._keys.data_ptr() == ptr  # written in place, no new buffer
    assert (out - _full(model, b)[3:]).abs().max() < 1e-5


def test_a_clone_is_copy_on_write():
    model = _model()
    cache = KVCache(model.cfg.n_layers)
    _step(model, cache, [7, 8, 9, 10])
    twin = cache.clone()
    assert twin._keys is cache._keys  # shared until a write
    twin.truncate(2)
    out_twin = _step(model, twin, [11, 12])
    out_cache = _step(model, cache, [13])
    assert twin._keys is not cache._keys
    assert (out_twin - _full(model, [7, 8, 11, 12])[2:]).abs().max() < 1e-5
    assert (out_cache - _full(model, [7, 8, 9, 10, 13])[4:]).abs().max() < 1e-5


def test_selected_rows_continue_like_their_own_sequences():
    model = _model("llama")
    seqs = [[1, 2, 3], [4, 5, 6]]
    cache = KVCache(model.cfg.n_layers)
    with torch.inference_mode():
        model(torch.tensor(seqs), cache=cache)
        beams = cache.select(torch.tensor([1, 1, 0]))
        out = model(torch.tensor([[7], [8], [9]]), cache=beams).logits[:, 0]
    for row, ids in zip(out, ([4, 5, 6, 7], [4, 5, 6, 8], [1, 2, 3, 9])):
        assert (row - _full(model, ids)[-1]).abs().max() < 1e-5


def test_gradients_flow_through_the_cache():
    model = _model()
    cache = KVCache(model.cfg.n_layers)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    model(torch.tensor([[4]]), cache=cache).logits.sum().backward()  # no in-place write broke the graph
    assert model.blocks[0].attn.k.weight.grad is not None and cache.length == 4


def test_an_inference_cache_continues_outside_inference_mode():
    model = _model()
    cache = KVCache(model.cfg.n_layers)
    _step(model, cache, [1, 2, 3])
    with torch.no_grad():
        out = model(torch.tensor([[4]]), cache=cache).logits[0]
    assert (out - _full(model, [1, 2, 3, 4])[3:]).abs().max() < 1e-5


def test_branching_and_going_back_in_a_session_match_the_full_forward():
    model = _model()
    s = GenerationSession(model, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])
    list(s.run(70))  # past the first capacity
    for _ in range(30):
        s.back()
    branch = s.choose((s.current.next_logits.argmax().item() + 1) % 61)  # a new branch
    list(s.run(5))
    s.goto(branch.parent.children[0])  # back onto the first path: the cache truncates and refills
    list(s.run(2))
    for node in (s.current, branch):
        ids = s.ids(node)
        assert (node.next_logits - _full(model, ids)[-1]).abs().max() < 1e-4
        trace, _ = s.step_trace(node)
        with torch.no_grad():
            _, ref = model.run_with_trace(torch.tensor([ids]), names=("blocks.*.attn.pattern", "blocks.*.resid_post"))
        for name in ("blocks.1.attn.pattern", "blocks.1.resid_post"):
            assert (trace[name] - ref[name]).abs().max() < 1e-5


def test_half_precision_rows_against_the_padded_buffer_equal_the_exact_keys():
    """A bfloat16 session scores each step's query against the cache's whole buffer (one product shape
    for many steps) and keeps the first T columns: the same attention rows, bit for bit, as the exact keys
    give, before and after the buffer grows past its first capacity (64 rows)."""
    from desktop_app.core.attention import attention_probs

    model = _model("llama").to(torch.bfloat16)
    cache = KVCache(model.cfg.n_layers)
    g = torch.Generator().manual_seed(0)
    _step(model, cache, torch.randint(0, 61, (60,), generator=g).tolist())
    checked, longer = 0, 0
    for token in torch.randint(0, 61, (10,), generator=g).tolist():
        _step(model, cache, [token])
        exact, padded = cache.stacked_keys(), cache.stacked_keys(padded=True)
        T = exact.shape[-2]
        assert padded.shape[-2] >= T and torch.equal(padded[..., :T, :], exact)
        longer += padded.shape[-2] > T
        q = torch.randn(2, 1, 2, 1, 8, generator=g).to(torch.bfloat16)  # [L, B, H_kv, 1, dh]
        rows = attention_probs(q, padded, n_keys=T)
        assert rows.shape[-1] == T
        assert torch.equal(rows, attention_probs(q, exact))
        checked += 1
    assert checked == 10 and longer >= 6 and cache.length == 70  # (64 rows, then 128)

"""What a one-token generation step costs: no work in it that a step before has already done, no copies
it does not need (the per-step overhead that bounds generation on a GPU and for small models)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.model import packed_linears
from desktop_app.core.trace import Trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _llama(**kw):
    cfg = ModelConfig.llama(vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                            context_length=64, init_std=0.4, **kw)
    return new_model(cfg, seed=0).eval()


def test_the_packed_weights_are_worked_out_once_and_again_when_a_weight_moves():
    model = _llama(attention_bias=True)
    model.pack_for_decoding()
    attn = model.blocks[0].attn
    linears = (attn.q, attn.k, attn.v)
    first = packed_linears(linears)
    assert first is not None and packed_linears(linears) is first  # kept, not worked out each step
    # a load copies into the packed buffer: the same views, now holding the new values
    new_q = torch.randn_like(attn.q.weight)
    model.load_state_dict({**model.state_dict(), "blocks.0.attn.q.weight": new_q})
    assert packed_linears(linears) is first and torch.equal(first[0][:attn.q.out_features], new_q)
    # a replaced weight is no longer side by side with the others: not packed, whatever was kept
    with torch.no_grad():
        attn.k.weight.data = attn.k.weight.data.clone()
    assert packed_linears(linears) is None
    x = torch.randn(1, 1, 32)
    with torch.inference_mode():
        q, k, v = attn.project_qkv(x)
    torch.testing.assert_close(k, attn.k(x))
    # packed again (another layout): new views of the new buffer
    model.pack_for_decoding()
    again = packed_linears(linears)
    assert again is not None and again is not first
    assert again[0].untyped_storage().data_ptr() == attn.q.weight.untyped_storage().data_ptr()


def test_a_grouped_query_step_reads_the_cached_keys_without_repeating_them(monkeypatch):
    model = _llama()
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=False)
    calls = []
    real = torch.Tensor.repeat_interleave

    def counting(self, *args, **kw):
        calls.append(tuple(self.shape))
        return real(self, *args, **kw)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", counting)
    list(session.run(6))
    assert calls == []  # before: the keys and values of every layer repeated, two copies a layer a step
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", real)
    # the explicit path (recording patterns: keys and values repeated) gives the same logits
    with torch.no_grad():
        full = model(torch.tensor([session.ids()]), trace=Trace(("blocks.*.attn.pattern",))).logits[0]
    for node in session.current.path():
        torch.testing.assert_close(node.next_logits, full[node.position], rtol=1e-5, atol=1e-5)


def test_a_step_rotates_q_and_k_together_and_runs_no_dropout_module(monkeypatch):
    from desktop_app.core import model as model_module
    model = _llama()
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=False)
    rotations, dropouts = [], []
    real = model_module.apply_rotary

    def counting(x, *tables):
        rotations.append(tuple(x.shape))
        return real(x, *tables)
    monkeypatch.setattr(model_module, "apply_rotary", counting)
    hooks = [m.register_forward_hook(lambda *a: dropouts.append(1)) for m in model.modules()
             if isinstance(m, torch.nn.Dropout)]
    list(session.run(3))
    for h in hooks:
        h.remove()
    # one rotation a layer a step, of q and k as one [B, H + H_kv, 1, dh] tensor (before: two)
    assert rotations == [(1, 4 + 2, 1, 8)] * (3 * model.cfg.n_layers)
    assert dropouts == []  # an evaluating model calls no dropout module (two a layer a step before)
    with torch.no_grad():
        full = model(torch.tensor([session.ids()])).logits[0]
    for node in session.current.path():
        torch.testing.assert_close(node.next_logits, full[node.position], rtol=1e-5, atol=1e-5)


def test_a_steps_python_work_does_not_grow_with_the_generated_length(monkeypatch):
    from desktop_app.core import generation
    model = _llama()
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=False)
    list(session.run(20))
    walks = []
    real = generation.Node.path
    monkeypatch.setattr(generation.Node, "path", lambda self: walks.append(1) or real(self))
    list(session.run(5))
    assert walks == []  # the context check walked the whole path at every step (O(length) Python)
    assert len(session.ids()) == 4 + 25


class _ReadsBack(TorchDispatchMode):
    """Every op that hands a tensor's value to Python (.item(), int(t), `if t:`, torch.equal): on a GPU each
    waits for the device to finish all the work queued before it."""
    READS = {"_local_scalar_dense", "item", "is_nonzero", "equal"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.READS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["gqa", "longrope", "alibi-window"])
def test_a_steps_model_work_reads_no_value_back_from_its_tensors(monkeypatch, kind):
    """One sync a token on a GPU: the step's forward and its recorded attention rows queue their work and
    read nothing back; the step's one read is its hand-off (logits and records in one transfer, then the
    token picked on the host). Longrope read the last position back from the device each step
    (positions.max()): the forward knows it. Structural: every op of the model's part of the step is seen."""
    kw = {"gqa": {}, "longrope": dict(rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 6,
                                                    "attention_factor": 1.2, "short_factor": [1.0, 1.5, 2.0, 2.5],
                                                    "long_factor": [2.0, 3.0, 4.0, 5.0]}),
          "alibi-window": dict(positions="alibi", sliding_window=3)}[kind]
    model = _llama(**kw)
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=True)
    mode = _ReadsBack()
    for name in ("_model_forward", "_attention_rows"):
        real = getattr(GenerationSession, name)

        def watched(self, *args, _real=real):
            with mode:
                return _real(self, *args)
        monkeypatch.setattr(GenerationSession, name, watched)
    nodes = list(session.run(4))  # past the original context (6): longrope's long factors
    assert len(nodes) == 4 and all(n.record for n in nodes)
    assert mode.seen == []


class _CountingOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_steps_records_lose_their_batch_dim_only_when_read():
    """A one-row step's records are handed on as the forward left them ([1, ...]): dropping the batch dim
    was a select op a record (~150 a step at 24 layers) for every node, read or not; it is made at a
    node's first read, with the same values."""
    model = _llama()
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=True)
    session.step()
    counting = _CountingOps()
    with counting:
        node = session.step()
    made = counting.ops.count("select.int")
    with counting:
        record = node.record
    read = counting.ops.count("select.int") - made
    assert read == len(record) > 3 * model.cfg.n_layers  # a view a record, made here
    assert made < len(record) // 2  # the step's own selects (its logits' row ...), none a record
    assert record["embed"].shape == (1, model.cfg.d_model) and record["blocks.0.attn.pattern"].shape == (4, 1, 6)
    assert node.record is record  # made once


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_a_bfloat16_steps_records_keep_their_dtype_until_read_and_read_as_the_float32_they_were(strategy):
    """A half-precision step's records are kept in the model's dtype: half a float32 history's bytes, and no
    cast a record in the step (~150 a step at 24 layers, for nodes mostly never read). The first read makes
    the float32 tensors every reader gets (the cast is exact), once."""
    model = _llama().to(torch.bfloat16)
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings(strategy, beams=2), stop_tokens=[],
                                record=True)
    session.step()
    counting = _CountingOps()
    with counting:
        session.step()
    casts = sum(op.startswith("_to_copy") for op in counting.ops)
    nodes = session.beams if strategy == "beam" else [session.current]
    assert len(nodes) == (2 if strategy == "beam" else 1)
    for node in nodes:
        stored = dict(node._rows)  # as the node keeps them until read
        assert len(stored) > 3 * model.cfg.n_layers
        assert all(t.dtype == torch.bfloat16 and t.shape[0] == 1 for t in stored.values())
        assert casts < len(stored) // 2  # the step's own (its logits ...), none a record
        record = node.record
        assert node._rows is None and node.record is record  # made once
        for name, t in record.items():
            assert t.dtype == torch.float32 and torch.equal(t, stored[name][0].float()), name
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in stored.values()}
        # memory of its own (no more than its values: the layers' patterns share one tensor), half a float32's
        assert sum(storages.values()) == 2 * sum(t.numel() for t in record.values())



def test_a_bfloat16_sessions_step_trace_leaves_its_nodes_records_as_kept():
    """step_trace joins the path's records as kept and makes float32 once a name: the nodes stay in bfloat16
    (the Attention view of a step does not double its path's memory), the trace the same as from the records
    read (float32) node by node, and any mix of read and unread nodes gives it too."""
    model = _llama().to(torch.bfloat16)
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=True)
    list(session.run(5))
    path = session.current.path()
    trace, _ = session.step_trace()
    assert all(n._rows is not None for n in path)  # none read
    assert all(t.dtype == torch.float32 for t in trace.tensors.values())
    path[2].record
    mixed, _ = session.step_trace()
    for n in path:
        n.record
    read, _ = session.step_trace()
    assert trace.tensors.keys() == read.tensors.keys()
    for name, t in read.tensors.items():
        assert torch.equal(trace[name], t) and torch.equal(mixed[name], t), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rotary_one_token_step_rotates_q_and_k_as_a_view_of_the_qkv_product(dtype):
    """Q, K and V of a one-token step are one product (laid out or prepacked side by side): q and k, side by
    side in it, rotate as one view of it. Split out and concatenated again, they were an op and a copy a
    layer more; the same values (tests/core/generation/test_generation_half.py: transformers' bits)."""
    def cats(n_layers: int) -> int:
        cfg = ModelConfig.llama(vocab_size=61, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, d_ff=64,
                                context_length=64)
        session = GenerationSession(new_model(cfg, seed=0).eval().to(dtype), [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[])
        session.step()
        counting = _CountingOps()
        with counting:
            session.step()
        return sum(op.startswith("cat") for op in counting.ops)
    assert cats(6) == cats(3)  # none a layer


def test_hooks_on_a_blocks_modules_still_run_where_their_forward_is_called_directly():
    """A block calls its attention, MLP and norms through their forward (nn.Module.__call__'s frames saved) only
    while no hook is set: a hook set on one, or a global one, runs at every step as nn.Module.__call__ would run it."""
    model = _llama()
    session = GenerationSession(model, [3, 14, 15, 9], GenerationSettings("greedy"), stop_tokens=[], record=True)
    block = model.blocks[1]
    seen = []
    handles = [m.register_forward_hook(lambda mod, args, out, name=name: seen.append(name))
               for name, m in (("attn", block.attn), ("mlp", block.mlp), ("norm1", block.norm1))]
    handles.append(torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append("global") if mod is block.norm2 else None))
    try:
        list(session.run(2))
    finally:
        for h in handles:
            h.remove()
    assert sorted(seen) == sorted(["norm1", "attn", "global", "mlp"] * 2)
    seen.clear()
    list(session.run(1))  # removed: none runs
    assert seen == []

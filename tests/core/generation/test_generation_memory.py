"""What a generation's history tree holds: every node's next-token logits and records in the model's dtype until
read (a bfloat16 history half a float32 one's bytes), each copied once out of a step, and the memory check
before a generation (app.generation) estimating exactly those bytes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from desktop_app.app import generation as app_generation
from desktop_app.core import devices
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.devices import MemoryEstimateError
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.generation.session import _kept_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

PROMPT = [3, 14, 15, 9]


def _llama(dtype: torch.dtype = torch.float32):
    cfg = ModelConfig.llama(vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                            context_length=64, init_std=0.4)
    return new_model(cfg, seed=0).eval().to(dtype)


def _nodes(session: GenerationSession) -> list:
    out, stack = [], [session.root]
    while stack:
        out.append(stack.pop())
        stack.extend(out[-1].children)
    return out


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_a_bfloat16_history_keeps_its_next_token_logits_in_bfloat16_and_reads_them_as_float32(strategy):
    """The logits were made float32 at every step: at a 151,936-token vocabulary 0.6 MB a token, the larger part
    of a bfloat16 history. Kept in bfloat16, they read as the float32 they were (the cast is exact), and the
    distribution, beam scores and sampling see those values."""
    session = GenerationSession(_llama(torch.bfloat16), PROMPT, GenerationSettings(strategy, beams=3),
                                stop_tokens=[], record=True)
    list(session.run(4))
    nodes = _nodes(session)
    assert len(nodes) == (1 + 4 * 3 if strategy == "beam" else 5)
    V = session.model.cfg.vocab_size
    for node in nodes:
        kept = node._next_logits
        assert kept.dtype == torch.bfloat16 and kept.shape == (V,)
        read = node.next_logits
        assert read.dtype == torch.float32 and torch.equal(read, kept.float())
        assert torch.equal(session.distribution(node).logits, kept.double())
    assert session.held_bytes()["logits"] == 2 * V * len(nodes)  # no storage larger than its values
    float32 = GenerationSession(_llama(), PROMPT, GenerationSettings(strategy, beams=3), stop_tokens=[], record=True)
    list(float32.run(4))
    for node in _nodes(float32):  # float32 already: read as kept, no copy
        assert node.next_logits is node._next_logits


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_the_memory_estimate_is_the_bytes_the_history_holds_in_the_models_dtype(strategy):
    """app.generation.generation_bytes counted 4 bytes a value whatever the dtype: a bfloat16 model was refused
    generations that fit. It is now the bytes a session's nodes hold (logits and records, in the model's dtype),
    exactly, and so half float32's in bfloat16."""
    held = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = _llama(dtype)
        session = GenerationSession(model, PROMPT, GenerationSettings(strategy, beams=3), stop_tokens=[],
                                    record=True)
        list(session.run(6))
        held[dtype] = session.held_bytes()
        beams = 3 if strategy == "beam" else 1
        estimate = app_generation.generation_bytes(model.cfg, dtype, len(PROMPT), 6, beams, record=True)
        assert {k: estimate[k] for k in held[dtype]} == held[dtype], dtype
        unrecorded = app_generation.generation_bytes(model.cfg, dtype, len(PROMPT), 6, beams)
        assert unrecorded["records"] == 0 and unrecorded["kv cache"] == estimate["kv cache"] > 0
    assert held[torch.bfloat16] == {k: v // 2 for k, v in held[torch.float32].items()}


def test_a_bfloat16_generation_that_fits_is_not_refused(monkeypatch):
    """The refusal boundary follows the dtype: memory for a bfloat16 generation but not for a float32 one refuses
    the float32 model only (both were refused)."""
    models = {dtype: _llama(dtype) for dtype in (torch.float32, torch.bfloat16)}
    need = {dtype: sum(app_generation.generation_bytes(m.cfg, dtype, 4, 50, 3).values()) for dtype, m in models.items()}
    assert need[torch.bfloat16] * 2 == need[torch.float32]
    monkeypatch.setattr(devices, "available_memory", lambda device: (need[torch.float32] + need[torch.bfloat16]) / 2)
    loaded = {dtype: SimpleNamespace(config=m.cfg, model=m) for dtype, m in models.items()}
    app_generation.check_generation_memory(loaded[torch.bfloat16], 4, 50, 3, "--beams 3")
    with pytest.raises(MemoryEstimateError, match="--beams 3 needs about"):
        app_generation.check_generation_memory(loaded[torch.float32], 4, 50, 3, "--beams 3")


class _Copies(TorchDispatchMode):
    """Counts the ops that copy a tensor's values (clone, a cast, copy_)."""
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.__name__.split(".")[0] in ("clone", "_to_copy", "copy_")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_beam_steps_records_are_copied_once_out_of_the_transfer_buffer(dtype):
    """From a GPU a beam step's records were copied twice: out of to_host's pinned buffer whole, then each beam's
    row again. Run here on CPU tensors standing for to_host's views of that buffer (the device branch): each
    record row copied once, into memory of its own no larger than it (neither the buffer nor the batch kept),
    the logits copied once, everything in its dtype, the same values."""
    B, V = 3, 7
    buffer = torch.arange(B * (V + 2 * 5 + 4 * 6), dtype=dtype)
    sizes = [(B, V), (B, 2, 5), (B, 4, 1, 6)]
    views, at = [], 0
    for shape in sizes:
        n = torch.Size(shape).numel()
        views.append(buffer[at:at + n].view(shape))
        at += n
    copies = _Copies()
    with copies:
        logits, rows = _kept_rows(views, torch.device("cuda"), B)
    assert copies.count == 1 + B * (len(views) - 1)
    assert torch.equal(logits, views[0]) and logits.dtype == dtype
    assert logits.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    assert len(rows) == B
    for b, row in enumerate(rows):
        for got, view in zip(row, views[1:]):
            assert got.dtype == dtype and torch.equal(got, view[b:b + 1])
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
    # on the CPU the rows are the only copies (to_host handed the forward's tensors as they are)
    with copies:
        copies.count = 0
        cpu_logits, _ = _kept_rows(views, torch.device("cpu"), B)
    assert copies.count == B * (len(views) - 1) and cpu_logits is views[0]


def _seq2seq(family: str, dtype: torch.dtype = torch.float32):
    from desktop_app.core.families import REGISTRY

    cfg = REGISTRY[family].preset(vocab_size=61, d_model=32, n_layers=2, n_decoder_layers=3, n_heads=4, d_ff=64,
                                  context_length=64)
    return new_model(cfg, seed=0).eval().to(dtype)


def _held_with_the_encoders(session: GenerationSession) -> dict[str, int]:
    held = session.held_bytes()
    held["encoder records"] = sum(t.untyped_storage().nbytes() for t in session._steps.encoder_records.values())
    return held


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_an_encoder_decoders_estimate_counts_its_cross_attention_rows_and_its_encoders_records(strategy, dtype):
    """generation_bytes left out an encoder-decoder's cross-attention rows ([H, S] a token and layer) and what the
    session keeps of the source's encoder pass (float32: the patterns [H, S, S], per-head outputs [H, S, d]...):
    a T5's recorded history of 6 tokens over a 5-token source held 18,256 + 17,440 bytes against an estimate of
    16,576. Now the estimate is those bytes exactly (T5: a norm before each attention), and the cache counts each
    beam row's cross-attention keys and values."""
    source, beams = [3, 14, 15, 9, 7], (3 if strategy == "beam" else 1)
    model = _seq2seq("t5", dtype)
    session = GenerationSession(model, source, GenerationSettings(strategy, beams=3), stop_tokens=[], record=True)
    list(session.run(6))
    held = _held_with_the_encoders(session)
    assert held["encoder records"] > 0 and len(session.prompt) == 1
    estimate = app_generation.generation_bytes(model.cfg, dtype, 1, 6, beams, record=True, source_length=len(source))
    assert {k: estimate[k] for k in held} == held
    cfg = model.cfg
    unrecorded = app_generation.generation_bytes(cfg, dtype, 1, 6, beams, source_length=len(source))
    assert unrecorded["records"] == unrecorded["encoder records"] == 0
    assert unrecorded["kv cache"] == dtype.itemsize * beams * (1 + 6 + len(source)) * cfg.n_decoder_layers * 2 \
        * cfg.n_kv_heads * cfg.d_head  # self-attention's keys and values of the target, cross-attention's of the source


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_a_post_norm_encoder_decoders_estimate_is_an_upper_bound_by_its_shared_attention_inputs(family):
    """BART and Marian (post-norm): a block's attention input is the residual it reads, one tensor with the last
    block's output where a step has one row; the estimate counts it twice, an upper bound by at most that."""
    source = [3, 14, 15, 9, 7]
    model = _seq2seq(family)
    for strategy, beams in (("greedy", 1), ("beam", 3)):
        session = GenerationSession(model, source, GenerationSettings(strategy, beams=3), stop_tokens=[], record=True)
        list(session.run(6))
        held = _held_with_the_encoders(session)
        estimate = app_generation.generation_bytes(model.cfg, torch.float32, 1, 6, beams, record=True,
                                                   source_length=len(source))
        nodes = len(_nodes(session))
        shared = 4 * nodes * model.cfg.n_decoder_layers * model.cfg.d_model
        assert estimate["logits"] == held["logits"] and estimate["encoder records"] == held["encoder records"]
        assert held["records"] <= estimate["records"] <= held["records"] + shared, (strategy, held, estimate)

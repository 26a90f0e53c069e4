"""A generation step on a GPU: the same ids, logits and records as on the CPU, and one wait on the device.

Every test runs once per device: "cpu" here (the same code path, the device a parameter: to_host hands
CPU tensors back as they are), and "cuda" marked `cuda` (packaging/gpu_check.sh runs `pytest -m cuda`
on a real GPU; skipped with a reason where torch.cuda.is_available() is False). Collected without Qt:
run with `-p no:pytest-qt` on a machine without PySide6.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from desktop_app.core import generation
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(params=[pytest.param("cpu", id="cpu"),
                        pytest.param("cuda", id="cuda",
                                     marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason=NO_CUDA)])])
def device(request) -> str:
    return request.param


PROMPT = [3, 14, 15, 9, 26, 5]


def _llama(seed: int = 0):
    """A tiny LLaMA-style model (rotary, grouped-query attention, SwiGLU) on the CPU in float32; init_std
    0.4 keeps its top tokens well apart, so a device's rounding cannot change a greedy pick."""
    cfg = ModelConfig.llama(vocab_size=61, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=64,
                            context_length=64, init_std=0.4)
    return new_model(cfg, seed=seed).eval()


def _on(model, device: str, dtype: torch.dtype = torch.float32):
    twin = new_model(model.cfg, seed=0).eval()
    twin.load_state_dict(model.state_dict())
    return twin.to(device=device, dtype=dtype)


def _close(got: torch.Tensor, want: torch.Tensor, share: float, what: str) -> None:
    atol = share * float(want.abs().max())
    torch.testing.assert_close(got.double(), want.double(), rtol=share, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_a_device_sessions_ids_logits_and_records_equal_the_cpu_sessions(device, strategy):
    model = _llama()
    settings = GenerationSettings(strategy, beams=3)
    want = GenerationSession(model, PROMPT, settings, stop_tokens=[])
    got = GenerationSession(_on(model, device), PROMPT, settings, stop_tokens=[])
    list(want.run(10)), list(got.run(10))
    assert got.ids() == want.ids()
    for mine, theirs in zip(got.current.path(), want.current.path()):
        assert mine.next_logits.device.type == "cpu" and mine.next_logits.dtype == torch.float32
        _close(mine.next_logits, theirs.next_logits, 1e-4, f"logits after position {mine.position}")
        assert set(mine.record) == set(theirs.record)
        for name, t in mine.record.items():
            assert t.device.type == "cpu" and t.dtype == torch.float32, name
            if device != "cpu":  # copied out of the step's pinned transfer buffer: the tree keeps no pinned memory
                assert not t.is_pinned(), name
            _close(t, theirs.record[name], 1e-4, f"{name} at position {mine.position}")
    trace, _ = got.step_trace()
    want_trace, _ = want.step_trace()
    for name, t in trace.items():
        _close(t, want_trace[name], 1e-4, f"step_trace {name}")


def test_a_half_precision_device_session_records_float32_cpu_tensors(device):
    model = _llama()
    session = GenerationSession(_on(model, device, torch.bfloat16), PROMPT, GenerationSettings("greedy"),
                                stop_tokens=[])
    reference = GenerationSession(model, PROMPT, GenerationSettings("greedy"), stop_tokens=[])
    list(session.run(4)), list(reference.run(4))
    for node, ref in zip(session.current.path(), reference.current.path()):
        assert node.next_logits.device.type == "cpu" and node.next_logits.dtype == torch.float32
        _close(node.next_logits, ref.next_logits, 0.1, f"bfloat16 logits after position {node.position}")
        assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in node.record.values())


@pytest.fixture
def transfers(monkeypatch):
    """Every call generation makes to devices.to_host: the number of tensors it was handed."""
    calls: list[int] = []
    real = generation.session.to_host

    def counting(tensors, dtype=None):
        calls.append(len(tensors))
        return real(tensors, dtype)
    monkeypatch.setattr(generation.session, "to_host", counting)
    return calls


@pytest.mark.parametrize("record", [True, False])
def test_a_step_brings_its_logits_and_records_to_the_host_in_one_transfer(device, transfers, record):
    session = GenerationSession(_on(_llama(), device), PROMPT, GenerationSettings("greedy"), stop_tokens=[],
                                record=record)
    list(session.run(2))
    transfers.clear()
    syncs: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device == "cuda":  # every operation that waits on the device warns
            torch.cuda.set_sync_debug_mode("warn")
        try:
            nodes = list(session.run(3))
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    # (the debug mode's own "prototype feature" warning names no operation)
    syncs = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert len(nodes) == 3
    # one transfer a step: the logits and every record together
    assert transfers == [1 + len(node.record) for node in nodes]
    assert all(bool(node.record) == record for node in nodes)
    if device == "cuda":  # the token in (host to device) and everything out: two waits a step
        assert len(syncs) <= 2 * len(nodes), f"{len(syncs)} waits on the device in {len(nodes)} steps: {syncs[:3]}"


def test_what_a_device_hands_back_is_copied_out_of_the_transfer_buffer():
    """The device branch of a step's hand-off, run here on CPU tensors standing for to_host's pinned views:
    CPU tensors sharing no memory with the transfer buffer (the history tree keeps no pinned buffer), the same
    values; the first `float32` (the logits) as float32, the records in their own dtype (a bfloat16 one half a
    float32's bytes; Node.record makes it float32 when read). On the CPU, tensors in their dtype are handed on
    as they are."""
    buffer = torch.arange(30, dtype=torch.float32)
    views = [buffer[:6].view(2, 3), buffer[6:30].view(2, 3, 4)]
    halves = [v.bfloat16() for v in views]
    for handed in (views, halves):
        out = generation.session._of_their_own(handed, torch.device("cuda"), n_float32=1)
        assert [t.dtype for t in out] == [torch.float32, handed[1].dtype]
        for got, view in zip(out, handed):
            assert torch.equal(got, view.float()) and got.shape == view.shape
            assert got.untyped_storage().data_ptr() not in {buffer.untyped_storage().data_ptr(),
                                                            view.untyped_storage().data_ptr()}
    out = generation.session._of_their_own(halves, torch.device("cpu"), n_float32=1)
    assert out[0].dtype == torch.float32 and out[1] is halves[1]
    assert generation.session._of_their_own(views, torch.device("cpu"), n_float32=1) == views

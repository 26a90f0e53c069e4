"""Issue 27: on a GPU the app's trace keeps the weights and one layer's work on the card.

Each block's records go to pinned CPU memory as soon as the block has run (Trace.hand_off, one
transfer per dtype through devices.to_host), before the panels' on_layer sees them; the memory
estimate splits into the card's part and the host's, each checked against its own memory.

The CPU tests run the same code with the hand-off asked for by parameter (host_records=True; on the
CPU to_host copies nothing, so a spy stands in for it to see what is handed off and when); the
`cuda` tests run it on a real card (pytest -m cuda, packaging/gpu_check.sh). No Qt in this file's
import chain: it runs where PySide6 is absent (-p no:pytest-qt).
"""
from __future__ import annotations

import copy

import pytest
import torch

from desktop_app.app.tracing import check_trace_memory, trace_input, trace_memory, trace_settings
from desktop_app.core import analysis, devices
from desktop_app.core import trace as trace_module
from desktop_app.core.checkpoints import LoadedModel, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.trace import estimate_trace_memory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"
on_cuda = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason=NO_CUDA)]


def _loaded(n_layers: int = 6, d: int = 32, heads: int = 4, vocab: int = 64, device: str = "cpu",
            model=None) -> LoadedModel:
    cfg = ModelConfig.llama(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=heads, n_kv_heads=2,
                            d_ff=2 * d, context_length=512)
    model = (new_model(cfg, seed=0).eval() if model is None else copy.deepcopy(model)).to(device)
    return LoadedModel(model=model, config=model.cfg, tokenizer=None, path=None, name="tiny-llama",
                       stored_dtype=torch.float32)


def _ids(n: int, vocab: int = 64) -> list[int]:
    return [(7 * i + 3) % vocab for i in range(n)]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- on the CPU, the same code by parameter ------------------------------------------------------


def test_each_layer_is_handed_off_once_before_on_layer_sees_it_and_the_values_are_the_plain_traces(monkeypatch):
    loaded = _loaded()
    L = loaded.config.n_layers
    _, plain = trace_input(loaded, "", _ids(40))

    handed: list[list[int]] = []  # ids of the tensors each hand-off received
    made: set[int] = set()  # ids of what it gave back

    def spy(tensors, dtype=None):
        handed.append([id(t) for t in tensors])
        out = [t.clone() for t in tensors]  # a stand-in for the pinned copies a GPU would get
        made.update(id(t) for t in out)
        return out

    monkeypatch.setattr(trace_module, "to_host", spy)
    seen = []

    def on_layer(ready):
        layer = ready.done - 1
        names = [n for n in ready.trace.keys() if n.startswith(f"blocks.{layer}.")]
        # this block's records, and everything before, are the hand-off's copies when the panels read them
        assert names and all(id(ready.trace.tensors[n]) in made for n in ready.trace.keys())
        seen.append((ready.done, len(handed)))

    _, trace = trace_input(loaded, "", _ids(40), on_layer=on_layer, host_records=True)
    assert seen == [(k, k) for k in range(1, L + 1)]  # block k-1 handed off (one transfer) before on_layer(k)
    assert len(handed) == L + 1  # and the final norm's output and the logits once at the end
    assert sum(len(h) for h in handed) == len(trace.keys())  # every record handed off exactly once
    assert all(id(t) in made for t in trace.tensors.values())
    assert list(trace.keys()) == list(plain.keys())
    for name in plain.keys():
        assert torch.equal(trace[name], plain[name]), name
    # derived later from the handed-off records: the same head outputs and logit lens
    assert torch.equal(trace.head_out(3), plain.head_out(3))
    lens, plain_lens = analysis.logit_lens(trace, loaded.model), analysis.logit_lens(plain, loaded.model)
    assert (lens.top_ids == plain_lens.top_ids).all() and (lens.top_probs == plain_lens.top_probs).all()


def test_without_the_hand_off_the_cpu_trace_copies_nothing(monkeypatch):
    def never(tensors, dtype=None):
        raise AssertionError("the CPU trace handed records off")

    monkeypatch.setattr(trace_module, "to_host", never)
    loaded = _loaded()
    _, trace = trace_input(loaded, "", _ids(40), on_layer=lambda ready: None)  # the CPU default
    assert trace.head_out(2).shape[-1] == loaded.config.d_model


def test_the_estimate_splits_into_one_layers_work_on_the_card_and_every_record_on_the_host():
    loaded = _loaded(n_layers=12)
    T, L = 64, 12
    on_device = trace_memory(loaded, T, host_records=False)
    split = trace_memory(loaded, T, host_records=True)
    assert on_device.host == 0
    _, trace = trace_input(loaded, "", _ids(T))
    records = trace.nbytes()
    layer = records / L
    # the card: a few layers' records and one layer's work, not the trace; the host: the whole trace
    assert split.device < on_device.device - records / 2
    assert split.device < 8 * layer + on_device.device - records
    assert records <= split.host <= 1.1 * records  # (on the CPU nothing is rounded up: no pinned buffers)
    kw = trace_settings(loaded, T)
    pinned = estimate_trace_memory(loaded.config, T, kw["names"], torch.float32, None, lazy=True,
                                   host_records=True, pinned=True)
    assert split.host <= pinned.host <= 2 * split.host  # each layer's pinned buffer: a power of two


def test_a_trace_short_of_host_or_card_memory_is_refused_naming_which(monkeypatch):
    loaded = _loaded(n_layers=12)
    T = 64
    need = trace_memory(loaded, T, host_records=True)
    assert check_trace_memory(loaded, T, host_records=True, available=need.device, available_host=need.host) \
        == need.total
    with pytest.raises(devices.MemoryEstimateError) as exc:  # the host cannot hold the records
        check_trace_memory(loaded, T, host_records=True, available=10 * need.device, available_host=need.host - 1)
    msg = str(exc.value)
    assert "\n" not in msg and "of host memory for the records (this machine has" in msg, msg
    assert "available" in msg and "work" not in msg and "at most" in msg and "the first" in msg
    tokens = int(msg.split("at most ")[1].split(" tokens")[0])
    assert trace_memory(loaded, tokens, host_records=True).host <= need.host - 1 \
        < trace_memory(loaded, tokens + 1, host_records=True).host
    with pytest.raises(devices.MemoryEstimateError) as exc:  # the device cannot hold a layer's work
        check_trace_memory(loaded, T, host_records=True, available=need.device - 1, available_host=10 * need.host)
    msg = str(exc.value)
    assert "one layer's work" in msg and "host memory" not in msg, msg
    # trace_input checks both before it runs, against what each memory has
    monkeypatch.setattr(devices, "available_memory",
                        lambda device="cpu": need.host - 1 if torch.device(device).type == "cpu" else 10**12)
    with pytest.raises(devices.MemoryEstimateError, match="host memory"):
        trace_input(loaded, "", _ids(T), host_records=True)


# -- on a real card ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_a_gui_trace_on_cuda_gives_pinned_cpu_records_equal_to_the_cpu_trace(dtype):
    cpu = _loaded()
    cpu.model.to(dtype)
    gpu = _loaded(model=cpu.model, device="cuda")
    ids = _ids(48)
    _, ref = trace_input(cpu, "", ids)
    devices_seen = []

    def on_layer(ready):  # what the panels read as each layer arrives
        layer = ready.done - 1
        devices_seen.extend((t.device.type, t.is_pinned()) for n, t in ready.trace.items()
                            if n.startswith(f"blocks.{layer}."))

    _, trace = trace_input(gpu, "", ids, on_layer=on_layer)
    assert devices_seen and set(devices_seen) == {("cpu", True)}
    assert list(trace.keys()) == list(ref.keys())
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # relative to the reference's norm

    def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        err = (a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)
        assert err < tol, f"{what}: relative error {err:.2e}"

    for name, t in trace.items():
        assert t.device.type == "cpu" and t.is_pinned() and t.dtype == ref[name].dtype, name
        close(t, ref[name], name)
    head_out = trace.head_out(2)  # derived on the card from the CPU record, returned to the CPU
    assert head_out.device.type == "cpu" and head_out.is_pinned() and head_out.dtype == dtype
    close(head_out, ref.head_out(2), "head_out")
    close(trace.head_out_norms(4), ref.head_out_norms(4), "head_out_norms")
    if dtype == torch.float32:
        lens, ref_lens = analysis.logit_lens(trace, gpu.model), analysis.logit_lens(ref, cpu.model)
        assert (lens.top_ids == ref_lens.top_ids).mean() > 0.99


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_the_card_holds_the_weights_and_one_layers_work_during_a_cuda_trace():
    L, T = 24, 256
    gpu = _loaded(n_layers=L, d=64, device="cuda")
    ids = _ids(T)
    for host in (True, False):  # warm up both ways at this size: kernels, cuBLAS workspaces (kept, in the base)
        trace_input(gpu, "", ids, host_records=host)

    def peak(**kw) -> tuple[int, object]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _, trace = trace_input(gpu, "", ids, **kw)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, trace

    used, trace = peak()
    records = trace.nbytes()  # the whole trace, on the host
    layer = records / L
    assert all(t.device.type == "cpu" for t in trace.tensors.values())
    est = trace_memory(gpu, T)  # the card's part: one layer's records, their packed copy, one layer's work
    work = 3 * 4 * T * T * 4  # float32 scores, probabilities and the patterns of 4 heads: one layer's work
    bound = 4 * layer + work + 2 * T * 64 * 4 * 4  # a few layers' records, the work, the final logits
    assert bound < records / 2  # everything kept on the card would not fit under it
    assert used <= est.device <= bound, (used, est, bound, records)
    kept, _ = peak(host_records=False)  # the same trace left on the card breaks the bound
    assert kept > bound + records / 2, (kept, bound, records)

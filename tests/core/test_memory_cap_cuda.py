"""Our memory checks respect a CUDA process's memory cap (torch.cuda.set_per_process_memory_fraction),
which torch.cuda.mem_get_info does not know (issue 31: bench scale --memory-cap-gb runs an 8B model in
24 GiB of an 80 GB card): a trace beyond the cap is refused by the estimate, in one line, not by an OOM.

The arithmetic is checked on any machine with torch.cuda's answers faked; the cuda-marked test sets a
real cap on the card (packaging/gpu_check.sh runs it) and restores it after."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from desktop_app.core import devices
from desktop_app.core.devices import MemoryEstimateError, available_memory, check_memory, cuda_memory_cap

GiB = 2**30
CUDA = torch.cuda.is_available()


def _fake_card(monkeypatch, free: int, total: int, fraction: float, allocated: int) -> None:
    def get_fraction(device=None):  # as torch's: a device without an index is refused
        if not isinstance(device, int):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return fraction

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", get_fraction)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_available_cuda_memory_is_the_cap_less_what_the_process_holds(monkeypatch):
    # an 80 GiB card, 70 free, a 24 GiB cap of which 5 are allocated: 19 GiB, not the card's 70
    _fake_card(monkeypatch, free=70 * GiB, total=80 * GiB, fraction=24 / 80, allocated=5 * GiB)
    for device in ("cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0)):  # with or without an index
        assert cuda_memory_cap(device) == 24 * GiB, device
        assert available_memory(device) == 19 * GiB, device
    with pytest.raises(MemoryEstimateError, match="this GPU has"):
        check_memory(20 * GiB, "a trace", "for its records", "cuda")
    check_memory(18 * GiB, "a trace", "for its records", "cuda")
    # the card's free memory still bounds it when it is the smaller
    _fake_card(monkeypatch, free=3 * GiB, total=80 * GiB, fraction=24 / 80, allocated=5 * GiB)
    assert available_memory("cuda") == 3 * GiB


def test_without_a_cap_available_cuda_memory_is_the_cards_free_memory(monkeypatch):
    _fake_card(monkeypatch, free=70 * GiB, total=80 * GiB, fraction=1.0, allocated=5 * GiB)
    assert cuda_memory_cap("cuda") is None and available_memory("cuda") == 70 * GiB
    # a torch without the getter (older than 2.6): no cap known, the card's free memory
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")
    monkeypatch.delattr(torch.cuda.memory, "get_per_process_memory_fraction")
    assert devices.cuda_memory_cap("cuda") is None and available_memory("cuda") == 70 * GiB


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
def test_a_trace_beyond_the_memory_cap_is_refused_by_the_estimate_on_cuda(tmp_path):
    from desktop_app.app.tracing import trace_input, trace_memory
    from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
    from desktop_app.core.config import ModelConfig
    from desktop_app.core.tokenizer import char_tokenizer

    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyz ")
    cfg = ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=256, n_layers=4, n_heads=8, d_ff=512,
                           context_length=2048)
    save_model_folder(new_model(cfg, seed=0), tmp_path / "m", tokenizer=tok)
    loaded = load_model_folder(tmp_path / "m", device="cuda")
    n = 2048
    need = trace_memory(loaded, n).device  # on the card beside the weights (the records go to the host)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    assert need > 0
    try:  # a cap that leaves half the card's share of the estimate free
        torch.cuda.set_per_process_memory_fraction((allocated + need // 2) / total)
        assert available_memory("cuda") <= need // 2 + 2**20
        with pytest.raises(MemoryEstimateError) as refusal:
            trace_input(loaded, "", [i % tok.vocab_size for i in range(n)])
        line = str(refusal.value)
        assert "\n" not in line and "needs about" in line and "this GPU has" in line and "at most" in line, line
        assert 0 < refusal.value.tokens < n
        # a shorter trace runs under the cap (half what the refusal offers: the cap's small fixed costs)
        trace_input(loaded, "", [i % tok.vocab_size for i in range(refusal.value.tokens // 2)])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()

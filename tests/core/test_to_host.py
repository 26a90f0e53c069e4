"""devices.to_host: CPU copies of many tensors in one transfer (the GPU paths of trace and generation)."""
import pytest
import torch

from desktop_app.core.devices import to_host


def test_cpu_tensors_come_back_as_they_are_or_cast():
    a, b = torch.randn(2, 3), torch.arange(4)
    same = to_host([a, b])
    assert same[0] is a and same[1] is b
    cast = to_host([a.bfloat16(), a], dtype=torch.float32)
    assert cast[0].dtype == torch.float32 and torch.equal(cast[0], a.bfloat16().float())
    assert cast[1] is a


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_gpu_tensors_arrive_in_one_pinned_buffer_per_dtype():
    xs = [torch.randn(3, 5, device="cuda"), torch.randn(7, device="cuda", dtype=torch.bfloat16),
          torch.randn(2, 2, 2, device="cuda")]
    host = to_host(xs)
    for x, h in zip(xs, host):
        assert h.device.type == "cpu" and h.is_pinned() and h.shape == x.shape and h.dtype == x.dtype
        assert torch.equal(h, x.cpu())
    assert host[0].untyped_storage().data_ptr() == host[2].untyped_storage().data_ptr()  # one buffer
    as_float = to_host(xs, dtype=torch.float32)
    assert all(h.dtype == torch.float32 for h in as_float)
    assert torch.equal(as_float[1], xs[1].float().cpu())

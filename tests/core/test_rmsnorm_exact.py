"""RMSNorm without gradients (a generation step, a traced forward) runs torch.rms_norm in float32: one dispatch
where the formula op by op was six. It must give the formula's bits, the ones transformers' op-by-op LLaMA / Qwen
RMSNorm gives, on every shape and scale; with gradients the formula itself runs (its own backward)."""
from __future__ import annotations

import random

import pytest
import torch

from desktop_app.core.model import RMSNorm


def _formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm / Qwen2RMSNorm for a float32 input, op by op."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_rmsnorm_without_gradients_gives_the_formulas_bits(mode):
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    for _ in range(300):
        d = rng.choice([1, 7, 8, 31, 64, 65, 127, 896, 1000, 2048, 4096])
        shape = (rng.choice([1, 2, 3]), rng.choice([1, 1, 5, 17]), d)
        eps = rng.choice([1e-5, 1e-6, 1e-8, 1e-12])
        x = torch.randn(shape, generator=gen) * 10 ** rng.uniform(-4, 4)
        if rng.random() < 0.3:  # a view with other strides (a sliced stream)
            x = torch.randn((shape[0], shape[1] * 2, d), generator=gen)[:, ::2] * 10 ** rng.uniform(-4, 4)
        norm = RMSNorm(d, eps)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(d, generator=gen) * rng.choice([0.1, 1.0, 3.0]))
        with context():
            got = norm(x)
        want = _formula(x, norm.weight.detach(), eps)
        assert got.dtype == torch.float32 and torch.equal(got, want), (shape, eps)


def test_rmsnorm_with_gradients_is_the_formula_and_its_backward():
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(2, 5, 64, requires_grad=True)
    norm(x).square().sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), norm.weight.detach().clone().requires_grad_()
    _formula(x2, w2, 1e-6).square().sum().backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(norm.weight.grad, w2.grad)

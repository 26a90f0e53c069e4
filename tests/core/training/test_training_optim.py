"""Schedules and optimisers against their written definitions (SOURCES.md, Training facts)."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from desktop_app.core.training.optim import (Lion, make_optimizer, optimizer_state_from_tensors,
                                             optimizer_state_to_tensors)
from desktop_app.core.training.schedules import lr_at


def test_noam_matches_the_paper_formula():
    # d = 512, warmup 4000: the peak is at t = warmup, lr = 512^-0.5 * 4000^-0.5
    peak = lr_at(3999, "noam", 1.0, 100_000, warmup=4000, d_model=512)
    assert peak == pytest.approx(1 / math.sqrt(512) / math.sqrt(4000))
    assert peak == pytest.approx(6.98771e-4, rel=1e-5)  # hand-computed
    assert lr_at(0, "noam", 1.0, 1, warmup=4000, d_model=512) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert lr_at(15999, "noam", 1.0, 1, warmup=4000, d_model=512) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)  # t^-1/2 side


def test_cosine_warms_up_then_decays_to_ten_percent():
    lrs = [lr_at(s, "cosine", 1e-3, 1000, warmup=100) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[99] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:100], lrs[1:100]))
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))
    assert lr_at(1000, "cosine", 1e-3, 1000, warmup=100) == pytest.approx(1e-4)
    mid = lr_at(550, "cosine", 1e-3, 1000, warmup=100)  # halfway through the decay: (1 + 0.1) / 2
    assert mid == pytest.approx(0.55e-3)
    assert lr_at(5, "constant", 0.3, 10) == 0.3
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_at(0, "triangle", 1.0, 1)


def test_lion_follows_its_definition():
    torch.manual_seed(0)
    p0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(4)]
    lr, b1, b2, wd = 0.01, 0.9, 0.99, 0.1
    p = torch.nn.Parameter(p0.clone())
    opt = Lion([p], lr=lr, betas=(b1, b2), weight_decay=wd)
    theta, m = p0.clone().double(), torch.zeros(5, 3, dtype=torch.float64)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        g = g.double()
        c = b1 * m + (1 - b1) * g
        theta = theta - lr * (torch.sign(c) + wd * theta)
        m = b2 * m + (1 - b2) * g
    assert torch.allclose(p.detach().double(), theta, atol=1e-6)
    assert torch.allclose(opt.state[p]["exp_avg"].double(), m, atol=1e-6)


def test_lion_minimises_a_quadratic():
    x = torch.nn.Parameter(torch.tensor([3.0, -2.0]))
    opt = make_optimizer("lion", [x], lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        (x ** 2).sum().backward()
        opt.step()
    assert x.abs().max().item() < 0.1


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd", "lion"])
def test_optimizer_state_survives_safetensors(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    opt_a = make_optimizer(name, model.parameters(), lr=0.01, weight_decay=0.01)
    data = [torch.randn(8, 4) for _ in range(6)]
    for x in data[:3]:
        opt_a.zero_grad()
        model(x).pow(2).mean().backward()
        opt_a.step()
    tensors, rest = optimizer_state_to_tensors(opt_a)
    tensors = st_load(st_save(tensors))  # through the file format, no pickle
    twin.load_state_dict(model.state_dict())
    opt_b = make_optimizer(name, twin.parameters(), lr=0.01, weight_decay=0.01)
    opt_b.load_state_dict(optimizer_state_from_tensors(tensors, rest))
    for x in data[3:]:
        for m, o in ((model, opt_a), (twin, opt_b)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    assert torch.equal(model.weight, twin.weight)

"""attention_probs adds a boolean mask to the scores as a bias (attention.mask_bias: 0 where seen, the dtype's
minimum where not) on the CPU, where it filled them with masked_fill, a pass that cost ~2.5x an add's (bench
firstlook's trace): the weights are the same, bit for bit, as the scores scaled, masked with the dtype's minimum
and normalised; and where a masked score could be inf or NaN the mask is still filled in (masked_fill hides
those; a bias would spread them to the rows before them)."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from desktop_app.core.attention import attention_probs, causal_mask

H, DH = 3, 24  # (1/sqrt(24) is not a power of two: the scaling rounds)


class OpsOverScores(TorchDispatchMode):
    """The ops run on a tensor of the scores' shape [B, H, T_q, T_k]."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.ops = tuple(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(isinstance(a, torch.Tensor) and tuple(a.shape) == self.shape for a in args):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _inputs(dtype, t_q, t_k, batch=1):
    g = torch.Generator().manual_seed(t_q * 1000 + t_k)
    q = (3 * torch.randn(batch, H, t_q, DH, generator=g)).to(dtype)
    k = (3 * torch.randn(batch, H, t_k, DH, generator=g)).to(dtype)
    return q, k


def _masked_then_normalised(q, k, mask, scale):
    """The weights as attention_probs made them with masked_fill (before the bias), op for op."""
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim=-1) if s.dtype == torch.bfloat16 else torch.softmax(s, dim=-1).to(q.dtype)


def _masks(t_q, t_k, batch):
    pad = torch.ones(batch, t_k, dtype=torch.bool)
    pad[-1, :3] = False  # the last text's first keys are padding
    return {"causal": causal_mask(t_q, t_k)[None, None],
            "window": causal_mask(t_q, t_k, window=5)[None, None],
            "causal and padding": causal_mask(t_q, t_k)[None, None] & pad[:, None, None, :]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("t_q,t_k", [(33, 33), (7, 40)], ids=["square", "queries after a prefix"])
@pytest.mark.parametrize("scale", [None, 0.1], ids=["1/sqrt(dh)", "attn_scale 0.1"])
def test_the_mask_added_as_a_bias_gives_the_masked_weights_bit_for_bit(dtype, t_q, t_k, scale):
    q, k = _inputs(dtype, t_q, t_k, batch=2)
    for name, mask in _masks(t_q, t_k, 2).items():
        with torch.no_grad(), OpsOverScores((2, H, t_q, t_k)) as seen:
            p = attention_probs(q, k, "softmax", mask, scale=scale)
        assert not any("masked_fill" in op for op in seen.ops), (name, seen.ops)  # the bias's way was taken
        want = _masked_then_normalised(q, k, mask, 1.0 / math.sqrt(DH) if scale is None else scale)
        assert p.dtype == dtype and torch.equal(p, want), (name, (p.double() - want.double()).abs().max())
        if name == "causal":
            assert torch.all(p[~mask.expand_as(p)] == 0)


def test_with_gradients_the_weights_are_the_same_as_without():
    q, k = _inputs(torch.float32, 20, 20)
    mask = causal_mask(20, 20)[None, None]
    with torch.no_grad():
        fast = attention_probs(q, k, "softmax", mask)
    q.requires_grad_(True)
    slow = attention_probs(q, k, "softmax", mask)  # under autograd
    assert torch.equal(fast, slow.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_under_autograd_the_bias_gives_masked_fills_weights_and_gradients_bit_for_bit(dtype):
    """Training and attribution differentiate the weights: the bias is added there too (in place: an add's
    backward is no pass of its own, masked_fill's was one more over [B, H, T, T]), and the gradients reaching the
    queries and keys are masked_fill's, bit for bit (softmax's backward gives a masked key 0 either way)."""
    q, k = _inputs(dtype, 24, 24, batch=2)
    pad = torch.ones(2, 24, dtype=torch.bool)
    pad[-1, 1:3] = False  # padding that leaves every query a key (the first)
    mask = causal_mask(24, 24)[None, None] & pad[:, None, None, :]
    upstream = torch.randn(2, H, 24, 24, generator=torch.Generator().manual_seed(5)).to(dtype)
    grads = []
    for way in ("bias", "masked_fill"):
        qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        if way == "bias":
            with OpsOverScores((2, H, 24, 24)) as seen:
                p = attention_probs(qq, kk, "softmax", mask)
            assert not any("masked_fill" in op for op in seen.ops), seen.ops
        else:
            p = _masked_then_normalised(qq, kk, mask, 1.0 / math.sqrt(DH))
        p.backward(upstream)
        grads.append((p.detach(), qq.grad, kk.grad))
    for ours, filled in zip(*grads):
        assert torch.equal(ours, filled), (ours.double() - filled.double()).abs().max()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_key_that_is_not_finite_leaves_the_rows_before_it_as_they_were(bad):
    q, k = _inputs(torch.bfloat16, 16, 16)
    k[:, :, 10] = bad  # position 10's key: the queries before it never see it
    mask = causal_mask(16, 16)[None, None]
    with torch.no_grad(), OpsOverScores((1, H, 16, 16)) as seen:
        p = attention_probs(q, k, "softmax", mask)
    assert any("masked_fill" in op for op in seen.ops)  # filled, as before the bias
    assert torch.isfinite(p[:, :, :10]).all() and torch.equal(p[:, :, :10], _masked_then_normalised(q, k, mask, 1.0 / math.sqrt(DH))[:, :, :10])


def test_float16_still_fills_the_mask():
    q, k = _inputs(torch.float16, 16, 16)
    mask = causal_mask(16, 16)[None, None]
    with torch.no_grad(), OpsOverScores((1, H, 16, 16)) as seen:
        attention_probs(q, k, "softmax", mask)
    assert any("masked_fill" in op for op in seen.ops)  # its products can overflow to inf where it is masked


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_finite_keys_whose_scores_overflow_still_fill_the_mask(dtype):
    """Finite queries and keys can still make scores of inf (or scores so large that the minimum plus
    them is not the minimum); masked_fill hides them where masked, an added bias would not."""
    q, k = _inputs(dtype, 16, 16)
    k[:, :, 10] = 1e19  # position 10's key: finite, its scores (~1e20 x 24) overflow to inf
    q = q.abs() + 1
    mask = causal_mask(16, 16)[None, None]
    with torch.no_grad(), OpsOverScores((1, H, 16, 16)) as seen:
        p = attention_probs(q, k, "softmax", mask)
    assert any("masked_fill" in op for op in seen.ops)
    want = _masked_then_normalised(q, k, mask, 1.0 / math.sqrt(DH))
    assert torch.equal(p[:, :, :10], want[:, :, :10]) and torch.isfinite(p[:, :, :10]).all()


def test_under_autograd_a_query_that_sees_no_key_keeps_masked_fill():
    """A query whose keys are all masked (padding before the first real token) has uniform weights; masked_fill
    keeps its gradient from the keys' scores, where an added bias would pass it on."""
    q, k = _inputs(torch.float32, 16, 16, batch=2)
    mask = _masks(16, 16, 2)["causal and padding"]  # the last text's first 3 queries see nothing
    qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    with OpsOverScores((2, H, 16, 16)) as seen:
        p = attention_probs(qq, kk, "softmax", mask)
    assert any("masked_fill" in op for op in seen.ops)
    p.sum(-2).pow(2).sum().backward()
    qf, kf = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    _masked_then_normalised(qf, kf, mask, 1.0 / math.sqrt(DH)).sum(-2).pow(2).sum().backward()
    assert torch.equal(qq.grad, qf.grad) and torch.equal(kk.grad, kf.grad)


def test_under_autograd_off_the_cpu_no_value_is_read_back():
    """Off the CPU the mask is filled as before and nothing waits on the device (no bool() of a tensor there: on
    CUDA a sync per attention call); the meta device stands for it here (reading a meta tensor's value raises)."""
    q = torch.empty(2, H, 16, DH, device="meta", requires_grad=True)
    k = torch.empty(2, H, 16, DH, device="meta", requires_grad=True)
    p = attention_probs(q, k, "softmax", causal_mask(16, 16).to("meta")[None, None])
    assert p.shape == (2, H, 16, 16) and p.device.type == "meta"

"""Attention weights in half precision (issue 27: the trace at size): core.attention.attention_probs makes
the [..., T_q, T_k] weights with two full-size tensors (the scores and the weights), none in float32,
when nothing differentiates them, and they are the float32 softmax rounded once to the dtype."""
from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from desktop_app.core.attention import attention_probs, causal_mask

H, T, DH = 4, 64, 16
on_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                reason="needs a CUDA device: torch.cuda.is_available() is False")]


class FullSizeTensors(TorchDispatchMode):
    """Every new float tensor of `shape` in its last two dims an op makes (in-place results, views and the
    mask's booleans excluded)."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.made = tuple(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape[-2:]) == self.shape \
                    and t.untyped_storage().data_ptr() not in inputs:
                self.made.append((str(func), t.dtype, tuple(t.shape)))
        return out


def _qk(dtype, device="cpu"):
    g = torch.Generator().manual_seed(0)
    q, k = (3 * torch.randn(1, H, T, DH, generator=g) for _ in range(2))
    return q.to(device, dtype), k.to(device, dtype)


def _float32_then_rounded(q, k, mask):
    s = (q.float() @ k.float().transpose(-1, -2)) if q.dtype == torch.float32 else (q @ k.transpose(-1, -2)).float()
    s = s * DH ** -0.5
    return torch.softmax(s.masked_fill(~mask, torch.finfo(s.dtype).min), dim=-1).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_weights_make_no_float32_copy_of_the_scores(dtype):
    q, k = _qk(dtype)
    mask = causal_mask(T, T)[None, None]
    with torch.no_grad(), FullSizeTensors((T, T)) as seen:
        p = attention_probs(q, k, "softmax", mask)
    assert p.dtype == dtype
    # the scores (masked and scaled in place) and the weights: nothing else of H x T x T, nothing in float32
    # (bfloat16 adds the mask as a bias of one T x T, attention.mask_bias, shared by the heads)
    per_head = [m for m in seen.made if m[2][-3] == H]
    assert len(per_head) == 2 and all(d == dtype for _, d, _ in seen.made), seen.made
    assert len(seen.made) == (3 if dtype == torch.bfloat16 else 2), seen.made


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_weights_are_the_float32_softmax_rounded_once(dtype):
    _check_rounded_once(dtype, "cpu")


def _check_rounded_once(dtype, device):
    q, k = _qk(dtype, device)
    mask = causal_mask(T, T, device)[None, None]
    q0, k0, m0 = q.clone(), k.clone(), mask.clone()
    with torch.no_grad():
        p = attention_probs(q, k, "softmax", mask)
    want = _float32_then_rounded(q, k, mask)
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(mask, m0)  # the inputs are untouched
    assert torch.all(p[..., ~mask[0, 0]] == 0)
    # the same weights, but for a rare last-bit difference where the float32 sums' order differs
    differ = p != want
    assert differ.float().mean() < 1e-3, int(differ.sum())
    info = torch.finfo(dtype)
    ulp = info.eps * want.float().abs() + info.eps * info.smallest_normal  # (a subnormal's last bit too)
    assert torch.all((p.float() - want.float()).abs() <= ulp)
    torch.testing.assert_close(p.float().sum(-1), torch.ones(1, H, T, device=device), atol=1e-2, rtol=0)


def test_with_gradients_the_weights_are_made_out_of_place_and_differentiate():
    q, k = (t.requires_grad_() for t in _qk(torch.float32))
    mask = causal_mask(T, T)[None, None]
    p = attention_probs(q, k, "softmax", mask)
    p[..., 5].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and k.grad.abs().sum() > 0
    torch.testing.assert_close(p, _float32_then_rounded(q.detach(), k.detach(), mask))
    # a mask broader than the scores (a batch of masks over one head's scores) broadcasts as before
    with torch.no_grad():
        wide = attention_probs(q[0, 0].detach(), k[0, 0].detach(), "softmax", mask.expand(2, 1, T, T))
    assert wide.shape == (2, 1, T, T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch.cuda.is_available() is False")
def test_half_precision_weights_on_cuda_are_the_float32_softmax_rounded_once(dtype):
    _check_rounded_once(dtype, "cuda")

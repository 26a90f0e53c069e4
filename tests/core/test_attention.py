"""core/attention.py, the one home of the attention formulas (model, generation, the Lipschitz lab and
the dynamics import them), against PyTorch's own attention and the masks' definitions."""
import pytest
import torch
import torch.nn.functional as F

from desktop_app.core import attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_weights_times_values_are_torch_s_attention(dtype, masked):
    g = torch.Generator().manual_seed(int(masked))
    for t_q, t_k, dh in [(1, 1, 4), (5, 5, 8), (3, 7, 16), (12, 12, 32)]:
        q = (torch.randn(2, 3, t_q, dh, generator=g) * 2).to(dtype)
        k = (torch.randn(2, 3, t_k, dh, generator=g) * 2).to(dtype)
        v = torch.randn(2, 3, t_k, dh, generator=g).to(dtype)
        mask = attention.causal_mask(t_q, t_k) if masked else None
        for scale in (None, 0.3):
            ours = attention.attention_probs(q, k, "softmax", mask, scale=scale) @ v
            theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            torch.testing.assert_close(ours, theirs)


def test_causal_mask_is_its_definition():
    """Query i sits at absolute position t_k - t_q + i; it sees key j <= its position, and with a
    window only the last `window` of them (itself included)."""
    for t_q, t_k in [(1, 1), (1, 9), (4, 4), (3, 10)]:
        for window in (None, 1, 3, 20):
            expected = torch.tensor([[j <= t_k - t_q + i and (window is None or j > t_k - t_q + i - window)
                                      for j in range(t_k)] for i in range(t_q)])
            assert torch.equal(attention.causal_mask(t_q, t_k, window=window), expected)


def test_l2_scores_are_minus_the_scaled_squared_distance():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randn(9, 8, generator=g, dtype=torch.float64)
    expected = -torch.cdist(q, k) ** 2 / 8 ** 0.5
    torch.testing.assert_close(attention.attention_scores(q, k, "l2"), expected)


def test_sinkhorn_weights_are_nearly_doubly_stochastic():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)
    p = attention.attention_probs(q, k, "sinkhorn", sinkhorn_iters=50)
    torch.testing.assert_close(p.sum(-1), torch.ones(7))
    torch.testing.assert_close(p.sum(-2), torch.ones(7), atol=1e-4, rtol=0)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown attention kind"):
        attention.attention_probs(torch.zeros(2, 4), torch.zeros(2, 4), "cosine")

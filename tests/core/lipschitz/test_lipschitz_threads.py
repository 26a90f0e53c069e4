"""How many threads the estimator's products run on: a large batch's count follows the cores free now."""
from __future__ import annotations

import torch

from desktop_app.core import lipschitz as lip
from desktop_app.core.lipschitz import estimator
from desktop_app.threads import SMALL_WORK_ELEMENTS


def test_a_large_batch_takes_the_cores_free_as_the_steps_go_never_more_than_given_and_gives_the_count_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    X = torch.randn(2, 40, 1000)
    assert X.numel() > SMALL_WORK_ELEMENTS
    w = torch.rand_like(X)
    seen, free = [], [1]

    class Diagonal(torch.autograd.Function):  # X -> w * X; records the thread count of each J^T u
        @staticmethod
        def forward(x):
            return x * w

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            seen.append(torch.get_num_threads())
            if len(seen) == 4:  # a neighbour stops: 5 cores free, more than the caller gave
                free[0] = 5
            return g * w

    monkeypatch.setattr(estimator, "fair_thread_count", lambda reserve=0: free[0], raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        est = lip.spectral_norm(Diagonal.apply, X, tol=1e-12, max_iter=9)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    # seen[0]: the linearisation, built before the first step; then one J^T u per step, the count chosen again
    # before steps 0, 4 and 8; the last: the final Rayleigh quotient's linearisation
    assert seen[1:5] == [1, 1, 1, 1]
    assert seen[5:10] == [2, 2, 2, 2, 2]
    assert after == 2
    assert int(est.iterations.max()) == 9
    torch.testing.assert_close(est.sigma, w.flatten(1).amax(1), rtol=0.05, atol=0)

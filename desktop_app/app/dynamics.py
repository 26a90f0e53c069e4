"""Dynamics set-up: the Dynamics panel's Reset and `dynamics` build their core.dynamics.DynamicsConfig
here, with the same checks and one-line messages: the head of a Q/K/V file and its d, the Gaussian
start's covariance, the memory of the n x n attention matrices, and (for a run of known length) the
radius bound exp(||V|| t) that would overflow.
"""
from __future__ import annotations


def check_dynamics_memory(n: int, d: int, twin: bool, integrator: str) -> None:
    """Refuse, before the run, n particles whose n x n attention matrices cannot fit (float64: the
    scores, the weights and a temporary, per field evaluation; rk4 keeps its stages, a twin doubles it)."""
    from ..core.devices import check_memory

    per_field = 3 * 8.0 * n * n + 8 * 8.0 * n * d
    check_memory(per_field * (2 if twin else 1) * (2 if integrator == "rk4" else 1), f"--n {n}",
                 "for the n x n attention matrices")


def dynamics_setup(attention: str, d: int | None, n: int, init: str, *, matrices: str | None = None,
                   variances: str | None = None, steps: int | None = None, qkv: str = "identity",
                   norm_v: float = 1.0, amplitude: float = 0.0, dt: float = 0.1, perturbation: float = 1e-3,
                   integrator: str = "euler", model=None, model_layer: int = 0, model_head: int = 0,
                   stack: str | None = None, **options):
    """(DynamicsConfig, the head read from `matrices`, or `model`'s head `model_head` of layer `model_layer`
    (of an encoder-decoder's `stack`: encoder or decoder, core.dynamics.check_stack), or None).
    d None: the head's V's, or 3.
    `variances` (None: none) is the covariance text of the Gaussian start (core.dynamics.parse_covariance);
    `steps` (None: open-ended, as the panel plays) checks that the radius bound stays finite.
    Other DynamicsConfig fields (init_radius, n_clusters, norm_qk, sphere, seed, ...) go in `options`.
    ValueError, one line, when the set-up cannot run."""
    import numpy as np

    from ..core import dynamics as dy

    if model is not None and matrices:
        raise ValueError("--matrices and --model both give the head: choose one")
    if model is None and stack is not None:
        raise ValueError("--stack picks an encoder-decoder's head: give --model too")
    if model is not None:
        head = dy.model_head(model, model_layer, model_head, stack=stack)
    else:
        head = dy.load_head(matrices) if matrices else None
    given_d = d
    d = head.d if head is not None else (d or 3)
    if head is not None and given_d is not None and given_d != d:
        raise ValueError(f"{matrices or head.name}: V is {d}x{d} but --d is {given_d}")
    covariance = None
    if variances is not None:
        if init != "gaussian":
            raise ValueError("--variances sets the covariance of --init gaussian")
        covariance = dy.parse_covariance(variances, d)
    check_dynamics_memory(n, d, perturbation > 0, integrator)
    if steps is not None:
        v = (float(np.linalg.norm(head.V.double().numpy(), 2)) if head is not None else
             norm_v if qkv == "random" else 1.0)
        growth = v * steps * dt * (1 + 2 * amplitude)  # log of R(t) / R(0) at most
        if growth > 700:  # exp() of it overflows a float
            raise ValueError(f"--steps {steps} x --dt {dt:g} x ||V|| {v:g} = {growth:.3g}: the radius "
                             "bound exp(||V|| t) overflows (beyond exp(700)); use fewer steps or a smaller --dt")
    cfg = dy.DynamicsConfig(attention=attention, d=d, n=n, init=init, covariance=covariance, qkv=qkv, norm_v=norm_v,
                            amplitude=amplitude, integrator=integrator, dt=dt, perturbation=perturbation, **options)
    return cfg, head


def stack_trace(trace, stack: str | None):
    """The trace whose tokens and layer curves the Dynamics panel reads: a one-stack model's own (stack None),
    or an encoder-decoder's `stack` seen as one stack (app.tracing.attention_view: embed, blocks.l.resid_mid
    of its encoder, or of its decoder, resid_mid there being after the decoder's self-attention)."""
    if stack is None:
        return trace
    from ..core.dynamics import STACKS
    from .tracing import attention_view

    if stack not in STACKS:
        raise ValueError(f"stack {stack!r}: one of {', '.join(STACKS)}")
    return attention_view(trace, stack)


def stack_layer_curves(trace, stack: str | None, cluster_tol: float = 0.05):
    """core.dynamics.layer_curves of the stack's tokens (stack_trace)."""
    from ..core.dynamics import layer_curves

    return layer_curves(stack_trace(trace, stack), cluster_tol)

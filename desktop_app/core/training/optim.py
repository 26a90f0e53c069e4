"""Optimisers: AdamW (default), Adam, SGD with momentum (PyTorch's), and Lion (written here).

Lion (Chen et al. 2023), as defined in SOURCES.md: with gradient g and momentum m,
    c = beta1 * m + (1 - beta1) * g
    theta <- theta - lr * (sign(c) + weight_decay * theta)      (decoupled decay)
    m <- beta2 * m + (1 - beta2) * g
Its state is one tensor per parameter ("exp_avg"), so checkpoints hold half Adam's.

AdamW, Adam and SGD take PyTorch's fused step (one kernel over every parameter) wherever the
parameters' device has it, CPU included: on CPU the default is otherwise a Python loop of about
six small ops per parameter, measured at about 3x the fused step's time (AdamW over the 68 tensors
of `bench training`'s 4x128 model, one thread). The
fused step does the same arithmetic, so a run's losses change only by float rounding (its state dict
has the same tensors, and resuming from a checkpoint written either way works). Set the environment
variable TRANSFORMER_EXPLORER_FUSED_OPTIMIZER=0 to use PyTorch's default step instead.
"""
from __future__ import annotations

import os
from typing import Iterable

import torch

OPTIMIZERS = ("adamw", "adam", "sgd", "lion")


class Lion(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if lr <= 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Lion: invalid lr {lr} or betas {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr)
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss


FUSED_ENV = "TRANSFORMER_EXPLORER_FUSED_OPTIMIZER"


def fused_step_available(params) -> bool:
    """True when PyTorch has a fused optimizer kernel for every one of these parameters (their device
    and floating dtype) and the user has not turned it off with TRANSFORMER_EXPLORER_FUSED_OPTIMIZER=0."""
    if os.environ.get(FUSED_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        devices = set(_get_fused_kernels_supported_devices())
    except (ImportError, AttributeError):  # a torch without the list: keep its default step
        return False
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    return bool(tensors) and all(p.device.type in devices and p.is_floating_point() for p in tensors)


def use_fused_step(opt: torch.optim.Optimizer) -> None:
    """Switch a built optimizer's groups to the fused step, or off it, as fused_step_available says for
    its parameters (after load_state_dict, whose saved groups carry the flag of the run that wrote them)."""
    if not isinstance(opt, (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)):
        return
    fused = fused_step_available(opt.param_groups)
    for g in opt.param_groups:
        g["fused"] = fused or None
        if fused:
            g["foreach"] = None  # fused and foreach are exclusive


def make_optimizer(name: str, params, lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] | None = None, momentum: float = 0.9) -> torch.optim.Optimizer:
    name = name.lower()
    params = list(params)
    fused = fused_step_available(params) or None  # None: PyTorch's own default
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas or (0.9, 0.999), fused=fused)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, betas=betas or (0.9, 0.999), fused=fused)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused)
    if name == "lion":
        return Lion(params, lr=lr, weight_decay=weight_decay, betas=betas or (0.9, 0.99))
    raise ValueError(f"unknown optimizer {name!r} (known: {', '.join(OPTIMIZERS)})")


def optimizer_state_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into safetensors-ready tensors and a JSON-ready rest."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_state_from_tensors(tensors: dict[str, torch.Tensor], rest: dict) -> dict:
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = t
    for idx, extra in rest.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(extra)
    groups = rest["param_groups"]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}

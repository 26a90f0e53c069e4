"""Learning-rate schedules: the multiplier-free learning rate at each optimiser step.

step counts from 0 (the first update uses lr_at(0)).
- constant: peak after an optional linear warmup.
- cosine: linear warmup to the peak over `warmup` steps, then cosine decay to `floor` x peak
  (10% by default) at `total` steps.
- noam (Vaswani et al. 2017): peak_factor * d_model^-1/2 * min(t^-1/2, t * warmup^-3/2), t = step + 1;
  here `peak` is that factor (1.0 gives the paper's schedule).
"""
from __future__ import annotations

import math

SCHEDULES = ("cosine", "noam", "constant")


def lr_at(step: int, schedule: str, peak: float, total: int, warmup: int = 0,
          d_model: int = 512, floor: float = 0.1) -> float:
    if schedule == "noam":
        t = step + 1
        w = max(warmup, 1)
        return peak * d_model ** -0.5 * min(t ** -0.5, t * w ** -1.5)
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    if schedule == "cosine":
        span = max(total - warmup, 1)
        progress = min(max(step - warmup, 0) / span, 1.0)
        return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")

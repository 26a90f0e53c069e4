"""The growth exponent: least squares of log L against log n, with a Student-t confidence interval
(written out here so the core needs no SciPy)."""
from __future__ import annotations

import math

import numpy as np


def _student_t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t: Newton's method on the CDF (integrated with Simpson's rule), kept inside a
    bisection bracket. A sweep refits after every length: 60 bisection steps there were ~7% of a demo
    sweep; Newton needs ~5 CDFs."""
    if df <= 0:
        return float("nan")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def pdf(t: float) -> float:
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    def cdf(t: float) -> float:
        xs = np.linspace(0.0, t, 2001)
        ys = c * (1 + xs ** 2 / df) ** (-(df + 1) / 2)
        h = t / 2000
        return 0.5 + h / 3 * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    t = (lo + hi) / 2
    for _ in range(100):
        f = cdf(t) - p
        if f < 0:
            lo = t
        else:
            hi = t
        step = f / pdf(t)
        t_next = t - step
        if not lo < t_next < hi:  # Newton left the bracket: bisect
            t_next = (lo + hi) / 2
        if abs(t_next - t) <= 1e-13 * max(1.0, t) or hi - lo <= 1e-13 * max(1.0, hi):
            return t_next
        t = t_next
    return t

def fit_exponent(ns, values) -> tuple[float, tuple[float, float], float]:
    """Least squares log L = a log n + b over all points: (a, 95% CI of a (Student t, N-2 dof), e^b)."""
    x, y = np.log(np.asarray(ns, dtype=float)), np.log(np.asarray(values, dtype=float))
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) == 0 or bool((x == x[0]).all()):  # fewer than two distinct n (np.unique imports numpy.ma: ~40 ms)
        return float("nan"), (float("nan"), float("nan")), float("nan")
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    a = float(((x - xm) * (y - ym)).sum() / sxx)
    b = float(ym - a * xm)
    if len(x) <= 2:
        return a, (float("nan"), float("nan")), math.exp(b)
    resid = y - (a * x + b)
    se = math.sqrt(float((resid ** 2).sum()) / (len(x) - 2) / sxx)
    t = _student_t_quantile(0.975, len(x) - 2)
    return a, (a - t * se, a + t * se), math.exp(b)

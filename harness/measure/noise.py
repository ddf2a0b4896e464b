"""Run-to-run noise, defined once with the formula in each docstring: Student's t distribution (standard library
and numpy only), the prediction band a rerun of the same commit stays in, and the paired bootstrap CI of a
difference of two rates (the conventions of :mod:`harness.measure.metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.measure.metrics import Number, bootstrap_rows, is_missing


def paired_rate_difference_ci(hits_a: Sequence[Sequence[float]], totals_a: Sequence[Sequence[float]],
                              hits_b: Sequence[Sequence[float]], totals_b: Sequence[Sequence[float]],
                              n_boot: int = 10000, seed: int = 0) -> list[tuple[float, float, float]]:
    """Difference of two pooled rates, B minus A, per column with a paired percentile-bootstrap 95% CI over rows:
    ``[(diff, lo, hi)]``, one per column.

    Input: per row (a unit such as a held-out conversation) and column (such as a draft position), the hits and
    the totals of A and of B, all ``[R, P]``. Each rate pools its rows (Σ hits / Σ totals); diff = rate_B - rate_A.
    The CI resamples rows with replacement ``n_boot`` times, the same rows for A and B (paired), recomputes the
    difference and takes its 2.5th and 97.5th percentiles; rows, not the hits inside them, are resampled because
    the hits of one row are correlated (resamples where a side counts nothing in that column are left out). NaN
    triple for a column where a side counts nothing. Example: A hits [[1], [0]] of [[2], [2]] (rate 1/4), B hits
    [[2], [1]] of the same totals (3/4) -> diff 0.5; a resample of row 1 twice gives 1/2, of row 2 twice 1/2, of
    both 1/2 -> (0.5, 0.5, 0.5). The same A and B give (0.0, 0.0, 0.0).
    """
    ha, na, hb, nb = (np.asarray(x, dtype=float).reshape(len(x), -1)                      # [R, P] each
                      for x in (hits_a, totals_a, hits_b, totals_b))
    if not ha.shape == na.shape == hb.shape == nb.shape:
        raise ValueError(f"paired_rate_difference_ci: shapes differ: {ha.shape}, {na.shape}, {hb.shape}, {nb.shape}")
    idx = bootstrap_rows(len(ha), n_boot, seed)                                            # [n_boot, R]
    b_ha, b_na, b_hb, b_nb = (x[idx].sum(axis=1) for x in (ha, na, hb, nb))                 # [n_boot, P]
    out = []
    for j in range(ha.shape[1]):
        if not (na[:, j].sum() and nb[:, j].sum()):
            out.append((math.nan, math.nan, math.nan))
            continue
        ok = (b_na[:, j] > 0) & (b_nb[:, j] > 0)
        boot = b_hb[ok, j] / b_nb[ok, j] - b_ha[ok, j] / b_na[ok, j]                       # [n_ok]
        lo, hi = np.percentile(boot, [2.5, 97.5])
        out.append((float(hb[:, j].sum() / nb[:, j].sum() - ha[:, j].sum() / na[:, j].sum()), float(lo), float(hi)))
    return out


# ---- run-to-run noise: a tolerance fitted on repeats of one commit -----------------------------------------------
# A band that a rerun of the same commit leaves with probability 1 - PREDICTION_LEVEL (two-sided; a one-sided floor
# is left with half of that).
PREDICTION_LEVEL = 0.99
MIN_FIT_REPEATS = 5  # fewer repeats fit no tolerance: t_{0.995, n-1} is 5.84 at n = 4 and 63.7 at n = 2


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz; Press et al.,
    Numerical Recipes, 3rd ed., section 6.4), on the side of x where the fraction converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: 1 − ½ I_{df/(df+t²)}(df/2, ½) for t >= 0, by
    symmetry below. Example: student_t_cdf(0, 4) = 0.5; student_t_cdf(4.604, 4) ≈ 0.995."""
    if df < 1:
        raise ValueError(f"student_t_cdf: df must be >= 1, got {df}")
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`student_t_cdf` to 1e-10).
    Example: student_t_quantile(0.995, 4) ≈ 4.6041; (0.995, 5) ≈ 4.0321; (0.975, 9) ≈ 2.2622."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def prediction_band(values: Sequence[Number | None], m: int = 1,
                    level: float = PREDICTION_LEVEL) -> tuple[float, float, int]:
    """The normal-theory prediction interval for the mean of ``m`` new observations of a figure measured once per
    repeat of the same commit: ``(mean, half-width, n)`` with half-width = t_{(1+level)/2, n−1} · s · √(1/n + 1/m),
    where mean and s (sample standard deviation) are over the n non-missing ``values``. A rerun of the same commit
    (m repeats) lands outside mean ± half-width with probability 1 − ``level`` when the per-repeat figure is normal
    (each is a mean over many questions and steps), and the interval accounts for s being estimated from n values
    (hence t, not z). (NaN, NaN, n) when n < 2. Example: values [2.00, 2.02, 1.98, 2.01, 1.99] (s = 0.0158), m = 1:
    4.604 · 0.0158 · √1.2 = 0.0797, so (2.00, 0.0797, 5).
    """
    xs = [float(v) for v in values if not is_missing(v)]
    n = len(xs)
    if n < 2 or m < 1:
        return math.nan, math.nan, n
    mean = sum(xs) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, student_t_quantile((1.0 + level) / 2.0, n - 1) * s * math.sqrt(1.0 / n + 1.0 / m), n

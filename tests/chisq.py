"""Pearson chi-square goodness of fit for the statistical losslessness tests (no scipy needed)."""

from __future__ import annotations

from collections import Counter

import torch


def chi_square_pvalue(counts: Counter, expected_probs: dict, min_expected: float = 5.0) -> float:
    """p-value of observing ``counts`` (outcome -> count) if outcomes follow ``expected_probs`` (outcome -> prob).

    Outcomes whose expected count is below ``min_expected`` are pooled into one bin (so the chi-square
    approximation holds); an observed outcome with expected probability 0 gives p = 0.
    """
    n = sum(counts.values())
    if any(expected_probs.get(k, 0.0) <= 0 for k in counts):
        return 0.0
    stat, bins, pooled_obs, pooled_exp = 0.0, 0, 0.0, 0.0
    for k, prob in expected_probs.items():
        exp = n * prob
        obs = counts.get(k, 0)
        if exp < min_expected:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    dof = max(bins - 1, 1)
    # survival function of chi2(dof) = regularised upper incomplete gamma Q(dof/2, stat/2)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))

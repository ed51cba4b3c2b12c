"""Statistics over seeds: means with Student-t intervals, seed-paired differences and the
smallest difference a sweep could have detected.

Everything here works on plain numbers (no scipy): the t quantiles for 2-10 seeds are
written out, larger samples use a Cornish-Fisher expansion; the t distribution's tail (for
p-values) has a closed form at integer degrees of freedom. `ablations/report.py` builds its
tables from these, `ablations/claims.py` its verdicts.

When a paired difference may be called an effect (`MIN_PAIRS`, `ZERO_SPREAD_RTOL`). A
verdict needs an estimate of the seed-to-seed spread of the differences, and that estimate
needs room to be wrong by less than the effect. With 2 pairs the sd rests on one degree of
freedom, |d1 - d2| / sqrt(2): held-out accuracies are multiples of 1/N, so two differences
often agree exactly, and then the "interval" is +-0 and any nonzero mean would be
"separated" (a 3-step sweep printed +0.016 +- 0.000 that way). So a verdict needs at least
3 pairs (2 degrees of freedom), and differences with no spread at all (every pair differs by
the same amount, up to rounding) get no verdict either: a t interval of zero width is not a
95% interval, it is a sample too small or too coarse to show its own noise.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

MIN_PAIRS = 3  # fewest seed pairs a verdict rests on (module docstring)
ZERO_SPREAD_RTOL = 1e-9  # an sd below this fraction of the values' size is rounding, not spread

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = n - 1 = 1..9 (n = 2..10 seeds),
# written out so the report needs no scipy.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
# One-sided t_{0.80, df}, for the smallest difference detectable with 80% power.
T_80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883}


# One-sided t_{0.95, df} and t_{0.90, df}: the equivalence test (TOST, two one-sided tests at 5%)
# and its power (80% for both one-sided tests together at a true difference of 0).
T_95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}
T_90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383}


def as_float(value) -> float:
    """JSON null, strings and missing values become NaN so every statistic can be nan-aware."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return float("nan")


def _t_quantile(z: float, table: dict[int, float], df: int) -> float:
    """A Student-t quantile: `table` for small df, else a Cornish-Fisher expansion around the
    normal quantile `z` (error < 1e-3 for df >= 10)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df in table:
        return table[df]
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the two-sided 95% quantile."""
    return _t_quantile(1.959964, T_975, df)


def t_quantile_80(df: int) -> float:
    """t_{0.80, df}: the quantile for 80% power in `paired_difference`'s detectable size."""
    return _t_quantile(0.841621, T_80, df)


def t_quantile_95(df: int) -> float:
    """t_{0.95, df}: the one-sided 5% quantile (each test of TOST, and a non-inferiority test)."""
    return _t_quantile(1.644854, T_95, df)


def t_quantile_90(df: int) -> float:
    """t_{0.90, df}: with `t_quantile_95`, the size TOST shows with 80% power at a true difference of 0."""
    return _t_quantile(1.281552, T_90, df)


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer `df`, in closed form (Abramowitz & Stegun
    26.7.3-4): with theta = atan(|t| / sqrt(df)), P(|T| < |t|) is
    sin(theta) * (1 + cos^2/2 + 1*3/(2*4) cos^4 + ...) for even df and
    (2/pi) * (theta + sin(theta) * (cos + 2/3 cos^3 + ...)) for odd df.

    Worked example: df = 1 is the Cauchy distribution, P(|T| >= 1) = 1 - 2 * atan(1) * 2 / pi
    = 0.5; and t_two_sided_p(12.706, 1) = 0.05, the 95% quantile above.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):  # terms (1*3*...*(2k-1)) / (2*4*...*2k) cos^2k
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        inside = sin * total
    else:
        total = 0.0
        if df > 1:
            term = math.cos(theta)
            total = term
            for k in range(1, (df - 1) // 2):  # terms (2*4*...*2k) / (3*5*...*(2k+1)) cos^(2k+1)
                term *= cos2 * (2 * k) / (2 * k + 1)
                total += term
        inside = 2 / math.pi * (theta + sin * total)
    return max(0.0, 1.0 - inside)


def mean_ci95(values: Iterable[float]) -> dict:
    """Mean, sample sd, 95% Student-t half-width and n over the finite `values`.

    Worked example: [0.5, 0.6, 0.7] -> mean 0.6, sd 0.1, half-width 4.303 * 0.1 / sqrt(3)
    = 0.2484. With one value the sd and the interval are undefined (NaN), not zero.
    """
    finite = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(finite)
    if n == 0:
        return {"mean": float("nan"), "sd": float("nan"), "ci": float("nan"), "n": 0}
    if n == 1:
        return {"mean": float(finite[0]), "sd": float("nan"), "ci": float("nan"), "n": 1}
    sd = float(finite.std(ddof=1))  # sample sd: seeds are a sample of the seed distribution
    return {"mean": float(finite.mean()), "sd": sd, "ci": t_quantile_975(n - 1) * sd / math.sqrt(n), "n": n}


def paired_difference(base: dict, variant: dict) -> dict:
    """The per-seed difference ``variant - base`` over the seeds both have a finite value for.

    Variants of one ablation share seeds (same prompts drawn, same initial model), so the
    difference seed by seed removes the seed-to-seed spread both share; its 95% interval
    is `mean_ci95` of the differences. Returns mean, sd, ci, n, ``seeds``, ``p`` (the paired
    t test's two-sided p-value), ``too_few`` (fewer than `MIN_PAIRS` pairs), ``zero_spread``
    (every pair differs by the same amount), ``separated`` (the interval excludes 0, and
    neither of those holds) and ``detectable``: the smallest true difference this many
    seeds would separate with 80% power at this spread,
    ``(t_{0.975,n-1} + t_{0.80,n-1}) * sd / sqrt(n)`` (NaN below `MIN_PAIRS` pairs or with
    zero spread, where no interval means anything).

    Worked example: base [0.5, 0.6, 0.7], variant [0.3, 0.4, 0.8] -> differences
    [-0.2, -0.2, +0.1], mean -0.1, sd sqrt(0.03) = 0.1732, ci 4.303 * 0.1732 / sqrt(3) = 0.430,
    not separated, detectable (4.303 + 1.061) * 0.1 = 0.536. Base [0.5, 0.6], variant
    [0.6, 0.7]: +0.1 twice, sd 0, ci 0: too few pairs and zero spread, not separated.
    """
    seeds = sorted(seed for seed in base if seed in variant
                   and np.isfinite(as_float(base[seed])) and np.isfinite(as_float(variant[seed])))
    stats = mean_ci95(as_float(variant[seed]) - as_float(base[seed]) for seed in seeds)
    n = stats["n"]
    scale = max((abs(as_float(side[seed])) for side in (base, variant) for seed in seeds), default=0.0)
    zero_spread = bool(n >= 2 and stats["sd"] <= ZERO_SPREAD_RTOL * scale)
    too_few = n < MIN_PAIRS
    testable = not too_few and not zero_spread
    separated = bool(testable and abs(stats["mean"]) > stats["ci"])
    detectable = ((t_quantile_975(n - 1) + t_quantile_80(n - 1)) * stats["sd"] / math.sqrt(n)
                  if testable else float("nan"))
    p = (t_two_sided_p(stats["mean"] / (stats["sd"] / math.sqrt(n)), n - 1) if testable else float("nan"))
    return {**stats, "separated": separated, "detectable": detectable, "p": p, "too_few": too_few,
            "zero_spread": zero_spread, "seeds": seeds}

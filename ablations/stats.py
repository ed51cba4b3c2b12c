"""Statistics over seeds: means with Student-t intervals, seed-paired differences and the
smallest difference a sweep could have detected.

Everything here works on plain numbers (no scipy): the t quantiles for 2-10 seeds are
written out, larger samples use a Cornish-Fisher expansion. `ablations/report.py` builds its
tables from these, `ablations/claims.py` its verdicts.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = n - 1 = 1..9 (n = 2..10 seeds),
# written out so the report needs no scipy.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
# One-sided t_{0.80, df}, for the smallest difference detectable with 80% power.
T_80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883}


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
    is `mean_ci95` of the differences. Returns mean, sd, ci, n, ``separated`` (the interval
    excludes 0) and ``detectable``: the smallest true difference this many seeds would
    separate with 80% power at this spread, ``(t_{0.975,n-1} + t_{0.80,n-1}) * sd / sqrt(n)``
    (NaN below 2 pairs).

    Worked example: base [0.5, 0.6, 0.7], variant [0.3, 0.4, 0.8] -> differences
    [-0.2, -0.2, +0.1], mean -0.1, sd sqrt(0.03) = 0.1732, ci 4.303 * 0.1732 / sqrt(3) = 0.430,
    not separated, detectable (4.303 + 1.061) * 0.1 = 0.536.
    """
    seeds = sorted(seed for seed in base if seed in variant
                   and np.isfinite(as_float(base[seed])) and np.isfinite(as_float(variant[seed])))
    stats = mean_ci95(as_float(variant[seed]) - as_float(base[seed]) for seed in seeds)
    n = stats["n"]
    separated = bool(n >= 2 and np.isfinite(stats["ci"]) and abs(stats["mean"]) > stats["ci"])
    detectable = ((t_quantile_975(n - 1) + t_quantile_80(n - 1)) * stats["sd"] / math.sqrt(n)
                  if n >= 2 else float("nan"))
    return {**stats, "separated": separated, "detectable": detectable, "seeds": seeds}

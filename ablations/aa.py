"""The A/A check: how often the verdict machinery calls a difference where there is none.

An A/A sweep runs one configuration twice per seed: arm ``a`` with seed k and arm ``b``, the
same configuration with seed k + offset (`ablations.registry.Variant.seed_offset`), paired with
``a``'s seed k exactly as the arms of a real ablation are. Every difference between them is
noise, so a verdict of "separated" is a false positive, and over many pairs the rate of such
verdicts should sit near the nominal 5% of the 95% interval the report draws.

``python -m ablations aa SWEEP_DIR`` reads the sweep's P >= 20 pairs and, for a verdict on n
seeds (the number a claim would use, default 5), runs `ablations.stats.paired_difference` on
every n-pair subset (or a fixed random sample of them when there are too many) and reports the
fraction that come out separated. That average over subsets is a U-statistic of the P pairs;
its standard error is the leave-one-pair-out jackknife's, and the interval is the estimate
+- 1.96 standard errors. The paired difference over all P pairs is reported beside it: with no
true difference its interval should cover zero.

Writes ``--json FILE``; saved as docs/results/data/aa_NAME.json, it fills the
``<!-- generated:aa:NAME -->`` blocks of the docs (``python -m ablations claims DATA --update FILE``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from .stats import MIN_PAIRS, ZERO_SPREAD_RTOL, paired_difference, t_quantile_975

MIN_AA_PAIRS = 20  # fewer pairs leave the false-positive rate's interval too wide to check 5%
MAX_SUBSETS = 20_000  # above this many n-pair subsets, a fixed random sample of them


def subsets(pairs: int, size: int, most: int = MAX_SUBSETS, seed: int = 0) -> list[tuple[int, ...]]:
    """Every `size`-subset of range(`pairs`), or `most` of them drawn at random (fixed seed)."""
    if math.comb(pairs, size) <= most:
        return list(itertools.combinations(range(pairs), size))
    rng = random.Random(seed)
    return [tuple(sorted(rng.sample(range(pairs), size))) for _ in range(most)]


def separated_fraction(differences: Sequence[float], chosen: Sequence[tuple[int, ...]]) -> float:
    """The fraction of the `chosen` subsets of `differences` whose 95% paired interval excludes 0.

    The same rule as `ablations.stats.paired_difference` ("separated": at least `MIN_PAIRS`
    pairs, some spread, |mean| > t_{0.975,n-1} * sd / sqrt(n)), vectorised over subsets.
    """
    values = np.asarray(differences, dtype=float)[np.asarray(chosen)]  # [subsets, n]
    n = values.shape[1]
    if n < MIN_PAIRS:
        return 0.0
    mean = values.mean(1)
    sd = values.std(1, ddof=1)
    scale = np.abs(values).max(1)
    separated = (np.abs(mean) > t_quantile_975(n - 1) * sd / math.sqrt(n)) & (sd > ZERO_SPREAD_RTOL * scale)
    return float(separated.mean())


def false_positive_rate(differences: Sequence[float], size: int, most: int = MAX_SUBSETS) -> float:
    """The fraction of `size`-pair subsets of `differences` that a paired verdict separates.

    Worked example: differences [0, 0, 0, 1] with size 3: of the four subsets, the three that
    hold the 1 have mean 1/3, sd 0.577, half-width 4.303 * 0.577 / sqrt(3) = 1.43: none is
    separated, and the all-zero subset has zero spread (no verdict): rate 0.
    """
    return separated_fraction(differences, subsets(len(differences), size, most))


def jackknife_interval(differences: Sequence[float], size: int, most: int = MAX_SUBSETS) -> dict:
    """`false_positive_rate` with its leave-one-pair-out jackknife standard error and 95% interval."""
    estimate = false_positive_rate(differences, size, most)
    count = len(differences)
    leave_one_out = [false_positive_rate([d for j, d in enumerate(differences) if j != i], size, most)
                     for i in range(count)]
    mean = sum(leave_one_out) / count
    se = math.sqrt((count - 1) / count * sum((value - mean) ** 2 for value in leave_one_out))
    return {"rate": estimate, "se": se, "low": max(0.0, estimate - 1.96 * se), "high": min(1.0, estimate + 1.96 * se),
            "subset_size": size, "pairs": count}


def aa_differences(rows: list[dict], quantity: str, base: str = "a", other: str = "b") -> dict[int, float]:
    """Seed -> ``other - base`` of `quantity` over the finished runs of an A/A sweep."""
    values = {(row["variant"], int(row["seed"])): float(row[quantity]) for row in rows
              if row["status"] == "ok" and row.get(quantity) not in (None, "")}
    return {seed: values[(other, seed)] - value for (variant, seed), value in values.items()
            if variant == base and (other, seed) in values and math.isfinite(value)
            and math.isfinite(values[(other, seed)])}


def check(rows: list[dict], quantities: Sequence[str], size: int) -> list[dict]:
    """The A/A result for each quantity: the all-pairs difference and the subset false-positive rate."""
    result = []
    for quantity in quantities:
        diffs = aa_differences(rows, quantity)
        if len(diffs) < MIN_AA_PAIRS:
            raise ValueError(f"{quantity}: {len(diffs)} finished A/A pairs; the check needs at least {MIN_AA_PAIRS}")
        values = [diffs[seed] for seed in sorted(diffs)]
        overall = paired_difference({s: 0.0 for s in diffs}, diffs)
        result.append({"quantity": quantity, "mean_difference": overall["mean"], "ci": overall["ci"],
                       "separated_over_all_pairs": overall["separated"], **jackknife_interval(values, size)})
    return result


def markdown(result: list[dict]) -> str:
    lines = ["| quantity | A/A pairs | mean difference (95% CI) | verdicts on | false-positive rate (95% CI) |",
             "|---|---|---|---|---|"]
    for entry in result:
        lines.append(f"| `{entry['quantity']}` | {entry['pairs']} | {entry['mean_difference']:+.4f} +- {entry['ci']:.4f} "
                     f"| {entry['subset_size']} seeds | {entry['rate']:.3f} ({entry['low']:.3f} to {entry['high']:.3f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations aa", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", help="an A/A sweep (python -m ablations run aa_grpo --seeds 20)")
    parser.add_argument("--quantity", action="append", default=None,
                        help="results.csv column(s) to check (default: final_sampled_accuracy, late_sampled_accuracy, "
                             "accuracy_gain)")
    parser.add_argument("--verdict-seeds", type=int, default=5, help="seeds per verdict (the subset size)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from .run_results import collect_runs

    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir():
        print(f"aa: {sweep_dir}: no such sweep directory", file=sys.stderr)
        return 2
    quantities = args.quantity or ["final_sampled_accuracy", "late_sampled_accuracy", "accuracy_gain"]
    rows = collect_runs(sweep_dir)
    try:
        result = check(rows, quantities, args.verdict_seeds)
    except ValueError as error:
        print(f"aa: {error}", file=sys.stderr)
        return 1
    text = markdown(result)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        provenance = sorted({(row.get("prov_commit"), str(row.get("prov_dirty"))) for row in rows})
        Path(args.json).write_text(json.dumps({"sweep": str(sweep_dir), "result": result,
                                               "runs_provenance": provenance}, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

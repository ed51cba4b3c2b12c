"""Variants compared: statistics over each variant's seeds, and seed-paired differences.

Every number is a mean over the ok seeds with, for the headline numbers, a 95% Student-t
interval (`summarise`). Variants share seeds, so each variant's difference from the
ablation's base variant is also taken seed by seed (`paired_differences`): the intervals of
those differences are what a conclusion rests on, since they drop the seed-to-seed spread
both variants share.
"""

from __future__ import annotations

from typing import Sequence

from .run_results import RUN_COLUMNS, TEXT_COLUMNS, AblationSpec, spec_for
from .stats import as_float as _as_float
from .stats import mean_ci95, paired_difference

# Columns compared between variants seed by seed (`paired_differences`).
PAIRED_COLUMNS = ("final_sampled_accuracy", "final_greedy_accuracy", "metric_value", "reward", "kl", "kl_k1",
                  "entropy", "response_length_correct", "response_length_incorrect", "wall_seconds")


def base_variant(ablation: str, variants: Sequence[str], spec: AblationSpec | None = None) -> str:
    """The variant others are compared with: the base of the ablation's definition (`spec`,
    default the registry's), whether or not it has runs; for an ablation no definition
    describes, the first of `variants` in sorted order."""
    spec = spec or spec_for(ablation, None)
    if spec.base:
        return spec.base
    return sorted(variants)[0]


def paired_differences(rows: Sequence[dict], base: str | None = None,
                       specs: dict[str, AblationSpec] | None = None) -> list[dict]:
    """For every ablation, every non-base variant and every `PAIRED_COLUMNS` column plus the
    ablation's extra metrics: the seed-paired difference from the base variant (ok runs only).
    `base` names another variant to compare with instead (for rows of one ablation); `specs`
    are the ablations' descriptions (`ablations.run_results.sweep_specs`; default the
    registry's). An ablation whose base has no finished run gets no pairs: another variant
    never stands in for it."""
    values: dict[tuple[str, str], dict[int, dict]] = {}
    for row in rows:
        if row["status"] == "ok":
            values.setdefault((row["ablation"], row["variant"]), {})[row["seed"]] = row
    result = []
    for ablation in sorted({a for a, _ in values}):
        variants = [v for a, v in values if a == ablation]
        if base is not None and base not in variants:
            raise ValueError(f"{ablation}: no variant {base!r} with a finished run (have {', '.join(sorted(variants))})")
        spec = spec_for(ablation, specs)
        reference = base if base is not None else base_variant(ablation, variants, spec)
        if reference not in variants:
            continue
        order = {name: i for i, name in enumerate(spec.variants)}
        for variant in sorted(variants, key=lambda v: (order.get(v, len(order)), v)):
            if variant == reference:
                continue
            columns = PAIRED_COLUMNS + tuple(c for c in spec.extra_metrics if c not in PAIRED_COLUMNS)
            for column in (c for c in columns if c != spec.metric):  # metric_value already holds it
                base_values = {seed: r.get(column) for seed, r in values[(ablation, reference)].items()}
                variant_values = {seed: r.get(column) for seed, r in values[(ablation, variant)].items()}
                result.append({"ablation": ablation, "variant": variant, "base": reference, "column": column,
                               **paired_difference(base_values, variant_values)})
    return result


def _numeric_columns(rows: Sequence[dict]) -> list[str]:
    columns = [c for c in RUN_COLUMNS if c not in TEXT_COLUMNS]
    for row in rows:
        columns += [k for k in row if k not in TEXT_COLUMNS and k not in columns]
    return columns


def summarise(rows: Sequence[dict], specs: dict[str, AblationSpec] | None = None) -> list[dict]:
    """One row per (ablation, variant): statistics over its ok seeds.

    Keys: ablation, variant, question, metric, n_runs, n_ok, n_failed, n_incomplete,
    failed (list of (seed, error) pairs), incomplete (list of seeds);
    ``final_sampled_accuracy_{mean,sd,ci,n}`` and ``metric_value_{mean,sd,ci,n}`` where ``ci``
    is the 95% half-width (NaN for n < 2); and ``<column>_mean`` for every other numeric
    column. Failed and incomplete runs are counted but never averaged: a crashed seed's
    partial numbers are not a sample of the variant's result.
    Ablations are sorted by name; variants follow the definition's order (`specs`, default the
    registry's: base first), then the rest sorted.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["ablation"], row["variant"]), []).append(row)
    specs = {ablation: spec_for(ablation, specs) for ablation, _ in groups}
    numeric = _numeric_columns(rows)

    def order(key):
        ablation, variant = key
        preferred = specs[ablation].variants
        return (ablation, preferred.index(variant) if variant in preferred else len(preferred), variant)

    result = []
    for ablation, variant in sorted(groups, key=order):
        runs = groups[(ablation, variant)]
        ok = [r for r in runs if r["status"] == "ok"]
        spec = specs[ablation]
        entry = {
            "ablation": ablation,
            "variant": variant,
            "question": spec.question,
            "metric": spec.metric,
            "extra_metrics": spec.extra_metrics,
            "n_runs": len(runs),
            "n_ok": len(ok),
            "n_failed": sum(r["status"] == "failed" for r in runs),
            "n_incomplete": sum(r["status"] == "incomplete" for r in runs),
            "failed": [(r["seed"], r["error"]) for r in runs if r["status"] == "failed"],
            "incomplete": [r["seed"] for r in runs if r["status"] == "incomplete"],
        }
        for column in dict.fromkeys(("final_sampled_accuracy", "metric_value", *numeric)):
            stats = mean_ci95(_as_float(r.get(column)) for r in ok)
            entry.update({f"{column}_{name}": value for name, value in stats.items()})
        result.append(entry)
    return result



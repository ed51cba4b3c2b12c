"""The generated tables of the docs, and the ``claims`` command that prints and rewrites them.

``python -m ablations claims RESULTS [--update docs/results.md]``, where RESULTS is a sweep
directory or its ``results.csv``, prints two markdown tables:

- **the lecture-claims table** (`ablations.claims.claims_table`): each registered claim,
  its test, the seed-paired difference with its interval and p-value, and the verdict;
- **the at-a-glance table** (`glance_table`): for every ablation in the sweep and every
  non-base variant, the paired difference from the base variant in the ablation's metric and
  in held-out sampled accuracy, each with the report's verdict
  (`ablations.report_tables.verdict`).

With ``--update FILE`` nothing is printed; instead every generated block of FILE
(`ablations.doc_blocks`: the text between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``) is rewritten from data: `generated_tables` says what each NAME
holds (``claims``, ``glance``, ``table:ABLATION``, ``pairs:ABLATION:VARIANT``, and the
``...:DIR`` blocks read from a sweep committed under docs/results/). Blocks another command
writes (`OTHER_COMMANDS_BLOCKS`) are left alone and named. The doc can then only say what the
data says; `tests/test_claims.py` regenerates every block from the committed data and checks
the doc agrees.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .claims import ACC, RESULTS_DIR, _difference, _style, claims_table, read_results, read_sweep, sweep_claims
from .doc_blocks import block_names, instrument_table, replace_block
from .report_tables import _ablation_table, _paired_table, verdict
from .run_results import AblationSpec, spec_for
from .variant_comparison import paired_differences, summarise


def glance_table(rows: Sequence[dict], specs: dict[str, AblationSpec] | None = None) -> str:
    """One line per (ablation, non-base variant): metric and accuracy differences with verdicts
    (`specs`: the ablations' descriptions, default the registry's)."""
    pairs = {(p["ablation"], p["variant"], p["column"]): p for p in paired_differences(rows, specs=specs)}
    lines = ["| ablation | variant - base | metric: difference (95% CI) | verdict | held-out sampled accuracy: "
             "difference (95% CI) | verdict |", "|---|---|---|---|---|---|"]
    for ablation, variant in dict.fromkeys((a, v) for a, v, _ in pairs):
        metric = spec_for(ablation, specs).metric
        metric_pair = pairs[(ablation, variant, "metric_value")]
        accuracy_pair = metric_pair if metric == ACC else pairs[(ablation, variant, ACC)]  # the metric holds it
        style = _style(metric)
        lines.append(f"| `{ablation}` | `{variant}` - `{metric_pair['base']}` | `{metric}`: "
                     f"{_difference(metric_pair, style)} | {verdict(metric_pair, style)} | "
                     f"{_difference(accuracy_pair, 'acc')} | {verdict(accuracy_pair, 'acc')} |")
    return "\n".join(lines)


# Paired columns shown in docs/results.md (report.md and paired.csv have every one).
DOC_PAIRED_COLUMNS = ("metric_value", "final_sampled_accuracy", "final_greedy_accuracy", "kl_k1",
                      "response_length_correct", "response_length_incorrect")


def _doc_paired_table(chosen: Sequence[dict], ablation: str, base: str | None = None,
                      specs: dict[str, AblationSpec] | None = None) -> str:
    spec = spec_for(ablation, specs)
    columns = DOC_PAIRED_COLUMNS + tuple(c for c in spec.extra_metrics if c not in DOC_PAIRED_COLUMNS)
    return _paired_table(paired_differences(chosen, base, specs), spec.metric, columns)


def ablation_tables(rows: Sequence[dict], ablation: str, specs: dict[str, AblationSpec] | None = None) -> str:
    """One ablation's tables as in its report: per variant (mean ± 95% CI over seeds), then
    the paired differences from the base variant with their verdicts."""
    chosen = [r for r in rows if r["ablation"] == ablation]
    if not chosen:
        return f"(`{ablation}` is not in this sweep)"
    paired = _doc_paired_table(chosen, ablation, specs=specs)
    return _ablation_table(summarise(chosen, specs)) + (f"\n\n{paired}" if paired else "")


def paired_against(rows: Sequence[dict], ablation: str, base: str,
                   specs: dict[str, AblationSpec] | None = None) -> str:
    """The paired table of one ablation against another of its variants, `base` (for a
    comparison the registry's base variant is not part of, e.g. two arms that share a
    setting the base lacks)."""
    chosen = [r for r in rows if r["ablation"] == ablation]
    if not chosen:
        return f"(`{ablation}` is not in this sweep)"
    return _doc_paired_table(chosen, ablation, base, specs) or f"(no paired seeds against `{base}`)"


def generated_tables(rows: Sequence[dict], names: Sequence[str],
                     specs: dict[str, AblationSpec] | None = None) -> dict[str, str]:
    """What each named block must hold: ``claims``, ``glance``, ``table:ABLATION``,
    ``pairs:ABLATION:VARIANT`` (every other variant paired against VARIANT),
    ``glance:DIR`` (the at-a-glance lines of the sweep committed in docs/results/DIR/),
    ``claims:DIR`` (the claims stored with that sweep's definitions, ``DIR/<ablation>/ablation.yaml``,
    tested on its runs),
    ``gains:DIR`` (each variant's gain over its start in that sweep), ``pair_noise:DIR`` (the
    paired sd of its accuracy differences and what 5 seeds detect, `ablations.noise.pair_noise_table`;
    DIR may hold a ``/``), ``extras:DIR`` (each
    variant's metric and extra metrics in that sweep, at the end and over the run), ``starts:DIR`` (the spread
    of its runs' start evaluations), ``budget:DIR`` (the thinking-budget curve in
    docs/results/DIR/budget.csv, `ppo.run.thinking_budget`), ``noise:NAME`` and
    ``aa:NAME`` (the noise budget and A/A check saved in docs/results/data/noise_NAME.json,
    aa_NAME.json)."""
    tables = {}
    for name in names:
        if name == "claims":
            tables[name] = claims_table(rows, sweep_claims(specs))
        elif name == "glance":
            tables[name] = glance_table(rows, specs)
        elif name.startswith("glance:"):  # another committed sweep: docs/results/DIR/results.csv
            tables[name] = glance_table(read_results(RESULTS_DIR / name.split(":", 1)[1] / "results.csv"))
        elif name.startswith("claims:"):  # the claims stored with a committed sweep's definitions, tested on it
            committed, stored = read_sweep(RESULTS_DIR / name.split(":", 1)[1])
            tables[name] = claims_table(committed, tuple(c for spec in stored.values() for c in spec.claims))
        elif name.startswith("gains:"):  # every variant's gain over its start, docs/results/DIR/results.csv
            from .report_tables import gains_table

            tables[name] = gains_table(read_results(RESULTS_DIR / name.split(":", 1)[1] / "results.csv"))
        elif name.startswith("extras:"):  # each variant's metric and extra metrics, docs/results/DIR/results.csv
            from .report_tables import extras_table

            tables[name] = extras_table(*read_sweep(RESULTS_DIR / name.split(":", 1)[1]))
        elif name.startswith("starts:"):  # the warm start's evaluation spread over a sweep's seeds
            from .report_tables import starts_table

            tables[name] = starts_table(read_results(RESULTS_DIR / name.split(":", 1)[1] / "results.csv"))
        elif name.startswith("budget:"):  # a thinking-budget curve committed in docs/results/DIR/budget.csv
            from ppo.run.thinking_budget import read_csv, table

            tables[name] = table(read_csv(RESULTS_DIR / name.split(":", 1)[1] / "budget.csv"))
        elif name.startswith("pair_noise:"):  # what a committed sweep's paired differences can see
            from .noise import pair_noise_table

            tables[name] = pair_noise_table(*read_sweep(RESULTS_DIR / name.split(":", 1)[1]))
        elif name.startswith(("noise:", "aa:")):  # docs/results/data/noise_NAME.json, aa_NAME.json
            kind, label = name.split(":", 1)
            tables[name] = instrument_table(kind, RESULTS_DIR / "data" / f"{kind}_{label}.json")
        elif name.startswith("table:"):
            tables[name] = ablation_tables(rows, name.split(":", 1)[1], specs)
        elif name.startswith("pairs:") and name.count(":") == 2:
            _, ablation, base = name.split(":")
            tables[name] = paired_against(rows, ablation, base, specs)
        else:
            raise ValueError(f"unknown generated block {name!r} (claims, glance, table:ABLATION, "
                             "pairs:ABLATION:VARIANT, glance:DIR, claims:DIR, gains:DIR, pair_noise:DIR, extras:DIR, starts:DIR, "
                             "budget:DIR, "
                             "noise:NAME or aa:NAME)")
    return tables


# Generated blocks another command writes (left alone by --update here, and named when skipped).
OTHER_COMMANDS_BLOCKS = {"power": "python -m ablations power --update FILE",
                         "power:DIR": "python -m ablations power docs/results/DIR/results.csv --update FILE --block power:DIR",
                         "reward_model": "python -m ppo.tasks.rlhf describe --update FILE",
                         "feedback_methods": "python -m ppo.tasks.feedback_methods table DIR --update FILE",
                         "feedback_claims": "python -m ppo.tasks.feedback_methods claims DIR --update FILE",
                         "budget_claims:DIR": "python -m ablations budget-claims docs/results/DIR --update FILE"}


def written_elsewhere(name: str) -> str:
    """The command that writes the generated block `name`, when it is not this one's; else ""."""
    for prefix in ("power:", "budget_claims:"):
        if name.startswith(prefix):
            return OTHER_COMMANDS_BLOCKS[prefix + "DIR"].replace("DIR", name.split(":", 1)[1])
    return OTHER_COMMANDS_BLOCKS.get(name, "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a sweep directory or its results.csv")
    parser.add_argument("--update", metavar="MARKDOWN", help="rewrite the generated blocks of this file")
    args = parser.parse_args(argv)
    try:
        rows, specs = read_sweep(args.results)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.update:
        print(claims_table(rows, sweep_claims(specs)), glance_table(rows, specs), sep="\n\n")
        return 0
    path = Path(args.update)
    text = path.read_text()
    try:
        names = block_names(text)
        tables = generated_tables(rows, [name for name in names if not written_elsewhere(name)], specs)
        for name, content in tables.items():
            text = replace_block(text, name, content)
    except ValueError as error:
        print(f"error: {path}: {error}", file=sys.stderr)
        return 2
    path.write_text(text)
    print(f"updated {len(tables)} generated blocks of {path}: {', '.join(tables)}")
    for name in (name for name in names if written_elsewhere(name)):
        print(f"left {name} alone: {written_elsewhere(name)} writes it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The claims the course makes, tested against a sweep: verdicts computed, never written.

``python -m ablations claims RESULTS [--update docs/results.md]``, where RESULTS is a sweep
directory or its ``results.csv``, prints two markdown tables:

- **the lecture-claims table**: each claim of `CLAIMS` (what the course says, where it comes
  from), the comparison that tests it on this testbed, the seed-paired difference with its
  95% interval, and a verdict computed from that interval (`claim_verdict`);
- **the at-a-glance table**: for every ablation in the sweep and every non-base variant, the
  paired difference from the base variant in the ablation's metric and in held-out sampled
  accuracy, each with the report's verdict (`ablations.report_tables.verdict`).

With ``--update FILE`` nothing is printed; instead every generated block of FILE is
rewritten: the text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``,
where NAME is ``claims``, ``glance``, ``table:ABLATION`` (that ablation's per-variant and
paired tables, `ablation_tables`) or ``pairs:ABLATION:VARIANT`` (its variants paired against
VARIANT instead of the base, `paired_against`). The doc can then only say what the data says;
`tests/test_claims.py` regenerates every block from the committed
``docs/results/data/results.csv`` and checks the doc agrees.

Verdicts. A claim names a direction: +1 (the first quantity is larger), -1 (smaller) or 0
(no difference: "works as well", "does not hurt"). For a direction of +-1 the claim is
*reproduced* when the paired 95% interval excludes 0 on the claimed side, *contradicted*
when it excludes 0 on the other side, and otherwise *not detected at n seeds*, with the
smallest difference those seeds would have detected (80% power). A claim of no difference
is *consistent* while the interval contains 0 (again with the detectable size, since
"no difference detected" is only as strong as the seeds) and *contradicted* when it does not.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .report_tables import _ablation_table, _fmt, _paired_table, verdict
from .run_results import TEXT_COLUMNS, ablation_spec, collect_runs
from .stats import as_float as _as_float
from .stats import paired_difference
from .variant_comparison import paired_differences, summarise


@dataclass(frozen=True)
class Claim:
    """One claim: ``first - second`` (paired by seed) should have the sign of `direction`.

    `first` and `second` are ``(variant, column)`` pairs of one ablation's ``results.csv``
    rows; they may be the same variant (e.g. the logged KL minus the true KL of one run).
    """

    claim: str  # what the course says, in one sentence
    source: str  # where the claim comes from
    ablation: str
    first: tuple[str, str]
    second: tuple[str, str]
    direction: int  # +1, -1, or 0 for "no difference"
    quantity: str  # what is compared, in words

    def comparison(self) -> str:
        (v1, c1), (v2, c2) = self.first, self.second
        if v1 == v2:
            return f"`{v1}`: `{c1}` - `{c2}`"
        return f"`{v1}` - `{v2}`"


ACC = "final_sampled_accuracy"
CLAIMS: tuple[Claim, ...] = (
    Claim("Clamping the per-token KL estimate at zero biases the measured KL upward.",
          "AlpacaFarm's PPO; the course", "kl_clip_at_zero", ("clip", "kl"), ("clip", "kl_k1"), +1,
          "logged KL minus true (k1) KL, nats"),
    Claim("Without the clamp the run blows up (the policy chases negative KL estimates).",
          "AlpacaFarm's PPO; the course", "kl_clip_at_zero", ("no_clip", "kl_k1"), ("clip", "kl_k1"), +1,
          "true (k1) KL, nats"),
    Claim("GAE with gamma = lambda = 1 (a bandit: advantage = final reward-to-go minus value) works as well as "
          "the usual discounting.", "AlpacaFarm's PPO; the course", "gamma_lambda", ("g099_l095", ACC),
          ("g1_l1", ACC), 0, "held-out sampled accuracy"),
    Claim("Dividing by the group std upweights prompts the model almost always solves (the easiest level).",
          "Dr. GRPO", "grpo_std_norm", ("std", "adv_share_level0:all"), ("no_std", "adv_share_level0:all"), +1,
          "share of the absolute advantage on level 0, mean over the run"),
    Claim("... and prompts it almost never solves (the hardest level).", "Dr. GRPO", "grpo_std_norm",
          ("std", "adv_share_level3:all"), ("no_std", "adv_share_level3:all"), +1,
          "share of the absolute advantage on level 3, mean over the run"),
    Claim("GRPO's per-sequence length normalisation makes wrong answers longer than a constant normaliser "
          "(Dr. GRPO) does.", "Dr. GRPO", "length_norm", ("per_sequence", "response_length_incorrect"),
          ("constant", "response_length_incorrect"), +1, "length of incorrect responses, tokens"),
    Claim("Difficulty filtering helps: train only on groups some but not all samples solved (resampled, as "
          "DAPO's dynamic sampling).", "Kimi k1.5; DAPO", "difficulty_filter", ("resample", ACC), ("off", ACC), +1,
          "held-out sampled accuracy"),
    Claim("... (filtered groups dropped, the loss renormalised over the rest).", "Kimi k1.5", "difficulty_filter",
          ("renormalize", ACC), ("off", ACC), +1, "held-out sampled accuracy"),
    Claim("Kimi's in-group length reward shortens correct answers ...", "Kimi k1.5", "kimi_length_reward",
          ("on", "response_length_correct"), ("off", "response_length_correct"), -1,
          "length of correct responses, tokens"),
    Claim("... without costing accuracy.", "Kimi k1.5", "kimi_length_reward", ("on", ACC), ("off", ACC), 0,
          "held-out sampled accuracy"),
    Claim("Optimising a proxy reward model with little KL penalty lowers the true (gold) reward: "
          "over-optimisation.", "AlpacaFarm; the course", "alpacafarm_overoptimization",
          ("kl_0.0", "metric_value"), ("kl_0.2", "metric_value"), -1, "gold reward at the end (beta 0 vs 0.2)"),
    Claim("GRPO needs no value model: it learns as well as PPO at equal samples and optimizer steps.",
          "DeepSeekMath; the course", "ppo_vs_grpo", ("grpo", ACC), ("ppo_1_step", ACC), 0,
          "held-out sampled accuracy"),
    Claim("Dr. GRPO ends close to RLOO (mean-centred advantage, constant normaliser).", "Dr. GRPO; the course",
          "ppo_vs_grpo", ("dr_grpo", ACC), ("rloo", ACC), 0, "held-out sampled accuracy"),
)


# ==========================================================================================
# Data
# ==========================================================================================
def read_results(source: str | Path) -> list[dict]:
    """The per-run rows of a sweep: its directory (`collect_runs`) or a ``results.csv``."""
    source = Path(source)
    if source.is_dir():
        return collect_runs(source)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: neither a sweep directory nor a results.csv")
    rows = []
    with open(source, newline="") as handle:
        for line, raw in enumerate(csv.DictReader(handle), start=2):
            try:
                row = {k: (v if k in TEXT_COLUMNS else _parse_number(v)) for k, v in raw.items()}
                row["seed"] = int(raw["seed"])
            except (KeyError, ValueError) as error:
                raise ValueError(f"{source}, line {line}: bad row ({error})") from error
            rows.append(row)
    return rows


def _parse_number(text: str | None) -> float:
    if text is None or text.strip() in ("", "nan", "None"):
        return float("nan")
    return float(text)


def _values(rows: Sequence[dict], ablation: str, variant: str, column: str) -> dict[int, float]:
    return {r["seed"]: _as_float(r.get(column)) for r in rows
            if r["ablation"] == ablation and r["variant"] == variant and r["status"] == "ok"}


# ==========================================================================================
# Verdicts
# ==========================================================================================
def evaluate_claim(claim: Claim, rows: Sequence[dict]) -> dict:
    """The paired difference ``first - second`` and its verdict (see the module docstring)."""
    first = _values(rows, claim.ablation, *claim.first)
    second = _values(rows, claim.ablation, *claim.second)
    stats = paired_difference(second, first)  # variant - base = first - second
    return {**stats, "verdict": claim_verdict(claim.direction, stats)}


def claim_verdict(direction: int, stats: dict, style: str = "g") -> str:
    """reproduced / contradicted / not detected / consistent, from the paired interval alone."""
    n = stats["n"]
    if n < 2:
        return "not tested: not in this sweep" if n == 0 else "not tested: fewer than 2 paired seeds"
    detectable = f"detectable about {_fmt(stats['detectable'], style)}"
    if direction == 0:
        return "contradicted" if stats["separated"] else f"consistent: no difference detected at {n} seeds ({detectable})"
    if not stats["separated"]:
        return f"not detected at {n} seeds ({detectable})"
    return "reproduced" if math.copysign(1, stats["mean"]) == direction else "contradicted"


def _style(column: str) -> str:
    return "acc" if column.endswith("accuracy") or column.startswith("adv_share") else "g"


def _difference(stats: dict, style: str) -> str:
    if stats["n"] == 0:
        return "n/a"
    interval = "n/a" if stats["n"] < 2 else _fmt(stats["ci"], style)
    return f"{_fmt(stats['mean'], 'signed' if style == 'acc' else 'g')} ± {interval}"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def claims_table(rows: Sequence[dict], claims: Sequence[Claim] = CLAIMS) -> str:
    """The lecture-claims markdown table."""
    lines = ["| claim (source) | ablation: comparison | quantity | difference (mean ± 95% CI, paired) | seeds | verdict |",
             "|---|---|---|---|---|---|"]
    for claim in claims:
        result = evaluate_claim(claim, rows)
        style = _style(claim.first[1])
        lines.append(f"| {_cell(claim.claim)} ({_cell(claim.source)}) | `{claim.ablation}`: {claim.comparison()} | "
                     f"{_cell(claim.quantity)} | {_difference(result, style)} | {result['n']} | "
                     f"{claim_verdict(claim.direction, result, style)} |")
    return "\n".join(lines)


def glance_table(rows: Sequence[dict]) -> str:
    """One line per (ablation, non-base variant): metric and accuracy differences with verdicts."""
    pairs = {(p["ablation"], p["variant"], p["column"]): p for p in paired_differences(rows)}
    lines = ["| ablation | variant - base | metric: difference (95% CI) | verdict | held-out sampled accuracy: "
             "difference (95% CI) | verdict |", "|---|---|---|---|---|---|"]
    for ablation, variant in dict.fromkeys((a, v) for a, v, _ in pairs):
        metric_pair, accuracy_pair = pairs[(ablation, variant, "metric_value")], pairs[(ablation, variant, ACC)]
        metric = ablation_spec(ablation).metric
        style = _style(metric)
        lines.append(f"| `{ablation}` | `{variant}` - `{metric_pair['base']}` | `{metric}`: "
                     f"{_difference(metric_pair, style)} | {verdict(metric_pair, style)} | "
                     f"{_difference(accuracy_pair, 'acc')} | {verdict(accuracy_pair, 'acc')} |")
    return "\n".join(lines)


# Paired columns shown in docs/results.md (report.md and paired.csv have every one).
DOC_PAIRED_COLUMNS = ("metric_value", "final_sampled_accuracy", "final_greedy_accuracy", "kl_k1",
                      "response_length_correct", "response_length_incorrect")


def _doc_paired_table(chosen: Sequence[dict], ablation: str, base: str | None = None) -> str:
    spec = ablation_spec(ablation)
    columns = DOC_PAIRED_COLUMNS + tuple(c for c in spec.extra_metrics if c not in DOC_PAIRED_COLUMNS)
    return _paired_table(paired_differences(chosen, base), spec.metric, columns)


def ablation_tables(rows: Sequence[dict], ablation: str) -> str:
    """One ablation's tables as in its report: per variant (mean ± 95% CI over seeds), then
    the paired differences from the base variant with their verdicts."""
    chosen = [r for r in rows if r["ablation"] == ablation]
    if not chosen:
        return f"(`{ablation}` is not in this sweep)"
    paired = _doc_paired_table(chosen, ablation)
    return _ablation_table(summarise(chosen)) + (f"\n\n{paired}" if paired else "")


def paired_against(rows: Sequence[dict], ablation: str, base: str) -> str:
    """The paired table of one ablation against another of its variants, `base` (for a
    comparison the registry's base variant is not part of, e.g. two arms that share a
    setting the base lacks)."""
    chosen = [r for r in rows if r["ablation"] == ablation]
    if not chosen:
        return f"(`{ablation}` is not in this sweep)"
    return _doc_paired_table(chosen, ablation, base) or f"(no paired seeds against `{base}`)"


# ==========================================================================================
# Generated blocks in a markdown file
# ==========================================================================================
def block_names(text: str) -> list[str]:
    """The names of every generated block in `text`, in order."""
    return re.findall(r"<!-- generated:([\w:.-]+) -->", text)


def generated_tables(rows: Sequence[dict], names: Sequence[str]) -> dict[str, str]:
    """What each named block must hold: ``claims``, ``glance``, ``table:ABLATION`` or
    ``pairs:ABLATION:VARIANT`` (every other variant paired against VARIANT)."""
    tables = {}
    for name in names:
        if name == "claims":
            tables[name] = claims_table(rows)
        elif name == "glance":
            tables[name] = glance_table(rows)
        elif name.startswith("table:"):
            tables[name] = ablation_tables(rows, name.split(":", 1)[1])
        elif name.startswith("pairs:") and name.count(":") == 2:
            _, ablation, base = name.split(":")
            tables[name] = paired_against(rows, ablation, base)
        else:
            raise ValueError(f"unknown generated block {name!r} (claims, glance, table:ABLATION or "
                             "pairs:ABLATION:VARIANT)")
    return tables


def generated_block(text: str, name: str) -> str:
    """The text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``, stripped."""
    match = re.search(rf"<!-- generated:{name} -->\n(.*?)<!-- /generated:{name} -->", text, re.S)
    if match is None:
        raise ValueError(f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> block")
    return match.group(1).strip()


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with the block `name` (see `generated_block`) holding `content`."""
    generated_block(text, name)  # raises if the markers are missing
    return re.sub(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)",
                  lambda m: m.group(1) + content.strip() + "\n" + m.group(2), text, flags=re.S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a sweep directory or its results.csv")
    parser.add_argument("--update", metavar="MARKDOWN", help="rewrite the generated blocks of this file")
    args = parser.parse_args(argv)
    try:
        rows = read_results(args.results)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.update:
        print(claims_table(rows), glance_table(rows), sep="\n\n")
        return 0
    path = Path(args.update)
    text = path.read_text()
    try:
        tables = generated_tables(rows, block_names(text))
        for name, content in tables.items():
            text = replace_block(text, name, content)
    except ValueError as error:
        print(f"error: {path}: {error}", file=sys.stderr)
        return 2
    path.write_text(text)
    print(f"updated {len(tables)} generated blocks of {path}: {', '.join(tables)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

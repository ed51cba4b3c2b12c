"""``python -m ablations power``: how many seeds each registered claim's test needs.

A claim is registered with a quantity, a direction and seeds. Whether those seeds can decide
it depends on the size the test must see and on the noise of the quantity, so each claim also
states a size (`Claim.effect` with `Claim.effect_basis`: the effect its source reports, or a
stated smallest effect of interest; for a claim with a `margin`, the margin), and this module
computes, from a pilot (the claim's own committed runs), the fewest seeds that see that size
with 80% power:

    directed, two-sided t test at 5%:        (t_0.975 + t_0.80) * sd / sqrt(n) <= effect
    no difference, TOST at 5% on each side:  (t_0.95 + t_0.90) * sd / sqrt(n) <= margin
    non-inferiority, one-sided at 5%:        (t_0.95 + t_0.80) * sd / sqrt(n) <= margin

where sd is the seed-to-seed sd of the paired difference ``first - second`` in the pilot
and t has n - 1 degrees of freedom. The equivalence and non-inferiority sizes assume a true
difference of 0, the case those claims assert. A claim whose seeds exceed `SEED_BUDGET`
cannot be decided on the CPU testbed in the budget of a rerun: its row says so, and it is not
a "not detected" waiting for more seeds.

Worked example (directed): sd 0.02, effect 0.025: 7 seeds detect (2.447 + 0.906) * 0.02 /
sqrt(7) = 0.0253, 8 seeds 0.0231: 8 seeds. (Equivalence): sd 0.03, margin 0.03: 10 seeds
give (1.833 + 1.383) * 0.03 / sqrt(10) = 0.0305, 11 give 0.0288: 11 seeds.

The pilot sd is an estimate from few seeds (5 for most claims): the seeds it asks for are a
plan, and the verdict is still the registered test's on the rerun's own data.

Held-out sampled accuracy has a second pilot: the A/A sweep (`ACCURACY_PILOT`, 20 pairs of
GRPO runs that differ only in the seed, scored with the 16-draw instrument). Two arms that
share a seed share their start and first samples, so their paired difference varies no more
than two arms that share nothing (taking the arms' own spreads as alike); and a pilot scored
with one draw per problem overstates the 16-draw noise. Both are upper bounds, and the smaller
sd is used, the table naming which.


    python -m ablations power [RESULTS] [--update docs/results.md]

RESULTS defaults to the committed ``docs/results/data/results.csv``, tested on the registered
`CLAIMS`; a sweep directory brings the claims stored with its ablations' definitions too (an
ablation file's ``claims:``, each with its own ``effect`` / ``effect_basis`` or ``margin``).
``--update`` rewrites the ``generated:power`` block of the file (``--block power:DIR``: the
block that holds the table of the sweep committed in ``docs/results/DIR``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from .definitions import Claim
from .stats import t_quantile_80, t_quantile_90, t_quantile_95, t_quantile_975

SEED_BUDGET = 20  # the most seeds per arm a claim's rerun may take on the 2-core testbed
DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "data" / "results.csv"
ACCURACY_PILOT = DEFAULT_RESULTS.parent.parent / "aa_grpo" / "results.csv"  # python -m ablations aa grpo
ACCURACY_COLUMNS = ("final_sampled_accuracy", "late_sampled_accuracy")


def test_kind(claim: Claim) -> str:
    """``directed``, ``equivalence`` (no difference, with a margin, or an `effect` proposed
    as the margin of its rerun), ``non-inferiority`` (directed, with a margin) or ``no margin``
    (no difference and no size: no test can show it)."""
    if claim.direction == 0:
        return "equivalence" if claim.margin is not None or claim.effect is not None else "no margin"
    return "non-inferiority" if claim.margin is not None else "directed"


def visible_size(kind: str, sd: float, seeds: int) -> float:
    """The size `seeds` seeds see with 80% power, for the test `kind` (module docstring)."""
    if seeds < 2 or not math.isfinite(sd):
        return float("nan")
    df = seeds - 1
    factor = {"directed": t_quantile_975(df) + t_quantile_80(df),
              "equivalence": t_quantile_95(df) + t_quantile_90(df),
              "non-inferiority": t_quantile_95(df) + t_quantile_80(df)}[kind]
    return factor * sd / math.sqrt(seeds)


def seeds_for(kind: str, sd: float, size: float, most: int = 200) -> int | None:
    """The fewest seeds (at least 3) that see `size` with 80% power; None above `most`."""
    if not (math.isfinite(sd) and size > 0) or kind == "no margin":
        return None
    if sd == 0:
        return 3
    for seeds in range(3, most + 1):
        if visible_size(kind, sd, seeds) <= size:
            return seeds
    return None


def accuracy_pilot(path: Path = ACCURACY_PILOT) -> dict:
    """The A/A sweep's paired difference (``b - a``) in each held-out accuracy column: keys
    sd and n per column; {} when the sweep is not there."""
    from .claims import read_results
    from .stats import paired_difference

    if not path.is_file():
        return {}
    rows = read_results(path)
    by_arm = {arm: {r["seed"]: r for r in rows if r["variant"] == arm and r["status"] == "ok"} for arm in ("a", "b")}
    pilot = {}
    for column in ACCURACY_COLUMNS:
        stats = paired_difference({s: r.get(column) for s, r in by_arm["a"].items()},
                                  {s: r.get(column) for s, r in by_arm["b"].items()})
        if stats["n"] >= 2:
            pilot[column] = {"sd": stats["sd"], "n": stats["n"]}
    return pilot


def claim_power(claim: Claim, rows: Sequence[dict], aa: dict | None = None) -> dict:
    """The power analysis of one claim on the pilot `rows` (keys: kind, size, basis, sd,
    pilot_pairs, pilot, seeds, decidable); for held-out accuracy, `aa` (`accuracy_pilot`) is
    the second pilot, used where its sd is the smaller (module docstring)."""
    from .claims import _test

    kind = test_kind(claim)
    size = claim.margin if claim.margin is not None else claim.effect
    own = _test(claim, rows, claim.first, claim.second, None)  # every seed of the pilot
    sd = own.get("sd", float("nan")) if own["n"] >= 2 else float("nan")
    pairs, pilot = own["n"], "own runs"
    second = (aa or {}).get(claim.first[1]) if claim.first[1] == claim.second[1] else None
    if second is not None and not (math.isfinite(sd) and sd <= second["sd"]):
        sd, pairs, pilot = second["sd"], second["n"], "A/A sweep"
    seeds = seeds_for(kind, sd, size) if size is not None else None
    return {"kind": kind, "size": size, "basis": claim.effect_basis, "sd": sd, "pilot_pairs": pairs,
            "pilot": pilot, "seeds": seeds, "decidable": seeds is not None and seeds <= SEED_BUDGET}


def _fmt(value) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}"


def markdown(rows: Sequence[dict], claims: Sequence[Claim], aa: dict | None = None) -> str:
    """The power table: one line per claim (`aa`: the held-out accuracy pilot, `accuracy_pilot`)."""
    lines = ["| claim | quantity | test | size to see (basis) | pilot sd of the paired difference (pairs, pilot) | "
             f"seeds for 80% power | decidable within {SEED_BUDGET} seeds |", "|---|---|---|---|---|---|---|"]
    for claim in claims:
        p = claim_power(claim, rows, aa)
        size = "none registered" if p["size"] is None else f"{_fmt(p['size'])} ({p['basis'] or 'no basis given'})"
        seeds = "-" if p["seeds"] is None else str(p["seeds"])
        if p["kind"] == "no margin":
            decision = "no: a claim of no difference needs a margin"
        elif p["size"] is None:
            decision = "no: no size registered"
        elif p["seeds"] is None:
            seeds, decision = "over 200", "no: left out of the verdicts"
        else:
            decision = "yes" if p["decidable"] else "no: left out of the verdicts"
        text = claim.claim.replace("|", "\\|")
        lines.append(f"| {text} | `{claim.ablation}`: {claim.comparison()} | {p['kind']} | {size} | "
                     f"{_fmt(p['sd'])} ({p['pilot_pairs']}, {p['pilot']}) | {seeds} | {decision} |")
    return "\n".join(lines)


def verdicts_with_power(rows: Sequence[dict], pilot_rows: Sequence[dict], claims: Sequence[Claim],
                        pilot_name: str) -> str:
    """The verdicts of `claims` on `rows` (`ablations.claims.claims_table`), then the power
    analysis they were registered with, on `pilot_rows` (`pilot_name` says which runs)."""
    from .claims import claims_table

    return "\n".join([claims_table(rows, claims), "", f"The power analysis it was registered with, on the pilot "
                      f"({pilot_name}):", "", markdown(pilot_rows, claims)])


def power_table(source: str | Path) -> str:
    """The power table of the claims tested on `source` (a sweep directory or its
    ``results.csv``, the pilot): the registered `CLAIMS` of the ablations it holds, as
    registered now (the registration a rerun will test), the claims the registry gives its
    other ablations, and an ablation file's claims as stored with the sweep. Raises OSError or
    ValueError naming a missing or malformed source."""
    from .claims import CLAIMS, read_sweep, sweep_claims
    from .registry import ABLATIONS

    rows, specs = read_sweep(source)
    chosen = list(CLAIMS) + [claim for claim in sweep_claims(specs) if claim.ablation not in ABLATIONS]
    chosen += [claim for name in specs if name in ABLATIONS for claim in ABLATIONS[name].claims]
    present = {r["ablation"] for r in rows}
    return markdown(rows, [claim for claim in dict.fromkeys(chosen) if claim.ablation in present], accuracy_pilot())


def main(argv: Sequence[str] | None = None) -> int:
    from .doc_blocks import replace_block

    parser = argparse.ArgumentParser(prog="python -m ablations power", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS),
                        help="the pilot: a sweep directory or its results.csv (default: the committed claims data)")
    parser.add_argument("--update", metavar="MARKDOWN", help="rewrite a generated block of this file with the table")
    parser.add_argument("--block", default="power",
                        help="the block --update rewrites (default: power; e.g. power:staleness for the claims of "
                             "the sweep committed in docs/results/staleness)")
    args = parser.parse_args(argv)
    if args.block != "power" and not args.block.startswith("power:"):
        parser.error(f"--block {args.block}: a power block is named power or power:DIR")
    try:
        table = power_table(args.results)
    except (OSError, ValueError) as error:
        print(f"ablations power: {error}", file=sys.stderr)
        return 2
    if args.update:
        path = Path(args.update)
        try:
            path.write_text(replace_block(path.read_text(), args.block, table))
        except (OSError, ValueError) as error:
            print(f"ablations power: {path}: {error}", file=sys.stderr)
            return 2
        print(f"updated the {args.block} block of {path}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

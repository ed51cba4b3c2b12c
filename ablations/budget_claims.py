"""``python -m ablations budget-claims``: Qwen3's thinking-budget scaling as registered claims.

Qwen3 (arXiv 2505.09388, sec. 4.3) reports that accuracy scales with the thinking budget.
`BUDGET_CLAIMS` registers that in three parts: held-out accuracy rises from 8 to 16 to 32
tokens of budget and from 32 to none. Each part is a paired test over trained runs, one
checkpoint per training seed (labelled ``seedN``), every budget of a checkpoint scored on the
same draws (`ppo.run.thinking_budget`), with Holm's correction over the parts
(`ablations.claims`). Seeds 1-3 are the pilot of the power analysis (`ablations.power`, 80%
power for a difference of 0.02); the claims are tested on the seeds registered after it::

    python -m ppo.run.thinking_budget RUN/seed1 RUN/seed2 RUN/seed3 --labels seed1 seed2 seed3 \\
        --budgets 8 16 32 --samples-per-prompt 8 --out DIR/pilot
    python -m ppo.run.thinking_budget RUN/seed4 ... RUN/seed15 --labels seed4 ... seed15 \\
        --budgets 8 16 32 --samples-per-prompt 8 --out DIR
    python -m ablations budget-claims DIR [--update docs/results.md]

``--update`` rewrites the file's ``generated:budget_claims:NAME`` block (NAME: DIR's last
component; DIR/pilot holds the pilot) and plots DIR/budget_mean.png. The committed test is
``docs/results/thinking_budget_claims``; tests/test_thinking_budget.py regenerates the block.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ppo.run.thinking_budget import FULL, mean_curve_plot, read_csv

from .definitions import Claim

# Registered after the pilot and before the tested checkpoints were evaluated. The checkpoints
# are the final policies of the `clip` arm of the powered kl_clip_at_zero rerun (AlpacaFarm's PPO,
# 60 steps, 15 seeds, commit debe9b8): seeds 1-3 the pilot (8 draws per problem, evaluation
# seed 0), seeds 4-15 tested, as many as the noisiest part needs.
BUDGET_SEEDS = tuple(range(4, 16))
BUDGET_SEEDS_BASIS = ("pilot sd 0.0149 (3 pairs): 7 seeds; run at 12", "pilot sd 0.0110 (3 pairs): 5 seeds; run at 12",
                      "pilot sd 0.0215 (3 pairs): 12 seeds")
_SOURCE = "Qwen3 (arXiv 2505.09388, sec. 4.3: performance scales with the thinking budget)"
_BASIS = "stated: a third of the 60-step GRPO gain of the earlier sweep (+0.059)"


def budget_variant(budget) -> str:
    """The variant name of a budget in the claims' rows: ``budget_16``, ``full``."""
    return FULL if budget == FULL else f"budget_{budget}"


BUDGET_CLAIMS: tuple[Claim, ...] = tuple(
    Claim(f"Held-out accuracy rises with the thinking budget: {'no budget' if more == FULL else f'{more} tokens'} "
          f"over {less} tokens.", _SOURCE, "thinking_budget", (budget_variant(more), "sampled_accuracy"),
          (budget_variant(less), "sampled_accuracy"), +1,
          "held-out sampled accuracy of the trained policy (8 draws per problem)", BUDGET_SEEDS,
          family="thinking budget", effect=0.02, effect_basis=_BASIS, seeds_basis=basis)
    for (more, less), basis in zip(((16, 8), (32, 16), (FULL, 32)), BUDGET_SEEDS_BASIS))


def claim_rows(curves: dict[str, dict]) -> list[dict]:
    """Curves (`ppo.run.thinking_budget.read_csv`) as the rows `ablations.claims` tests: one per
    (checkpoint, budget), the checkpoint's label ``seedN`` as the seed. Raises ValueError for
    another label."""
    rows = []
    for label, curve in curves.items():
        if not (label.startswith("seed") and label[4:].isdigit()):
            raise ValueError(f"checkpoint {label!r}: the claims need one checkpoint per training seed, "
                             "labelled seedN (--labels seed1 seed2 ...)")
        rows += [{"ablation": "thinking_budget", "variant": budget_variant(budget), "seed": int(label[4:]),
                  "status": "ok", "sampled_accuracy": summary["accuracy"]} for budget, summary in curve.items()]
    return rows


def claims_markdown(directory: Path, pilot: Path | None = None) -> str:
    """The verdicts of `BUDGET_CLAIMS` on ``DIRECTORY/budget.csv``, the power analysis on the
    pilot's (default ``DIRECTORY/pilot``), and the provenance of both."""
    from .power import verdicts_with_power

    directory = Path(directory)
    pilot = Path(pilot) if pilot is not None else directory / "pilot"
    pilot_rows = claim_rows(read_csv(pilot / "budget.csv"))
    checkpoints = ", ".join(f"seed{s}" for s in sorted({r["seed"] for r in pilot_rows}))
    lines = [verdicts_with_power(claim_rows(read_csv(directory / "budget.csv")), pilot_rows, BUDGET_CLAIMS,
                                 f"checkpoints {checkpoints}"), ""]
    for name, where in (("Tested", directory), ("Pilot", pilot)):
        record = json.loads((where / "provenance.json").read_text())
        lines.append(f"{name}: commit {record['commit'][:7]} (dirty: {record['dirty']}), "
                     f"{record['samples_per_prompt']} draws per problem, evaluation seed {record['seed']}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from .doc_blocks import replace_block

    parser = argparse.ArgumentParser(prog="python -m ablations budget-claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the tested checkpoints' --out directory (budget.csv, provenance.json)")
    parser.add_argument("--pilot", default=None, help="the pilot's --out directory (default: DIRECTORY/pilot)")
    parser.add_argument("--update", default=None, metavar="MARKDOWN",
                        help="rewrite this file's generated:budget_claims:NAME block (NAME: DIRECTORY's name)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    directory = Path(args.directory)
    try:
        text = claims_markdown(directory, args.pilot)
        mean_curve_plot(read_csv(directory / "budget.csv"), directory / "budget_mean.png")
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    if args.update:
        block, page = f"budget_claims:{directory.resolve().name}", Path(args.update)
        page.write_text(replace_block(page.read_text(), block, text))
        print(f"updated the generated:{block} block of {page}; wrote {directory / 'budget_mean.png'}")
    else:
        print(text)
        print(f"wrote {directory / 'budget_mean.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

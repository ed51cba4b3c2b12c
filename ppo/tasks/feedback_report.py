"""The table of AlpacaFarm's method comparison (`ppo.tasks.feedback_methods`) beside AlpacaFarm's own numbers.

``python -m ppo.tasks.feedback_methods table DIR [--update docs/alpacafarm.md]`` reads
``DIR/results.csv`` and writes one row per method: the mean and 95% Student-t interval over
seeds of the gold win rate against the SFT start, the gold and proxy reward, the KL to the
SFT policy and the response length, the budget the method used, and AlpacaFarm's published
simulated win rate against Davinci003 (`ALPACAFARM_SIM_WIN_RATES`). Below the table, the rank
agreement of the two orderings over the methods both have (`spearman`, `kendall_tau_b`).
With ``--update`` the table replaces the ``<!-- generated:feedback_methods -->`` block of
the file; tests/test_feedback_report.py regenerates the block from the committed CSV.

The two win rates measure different things (against the SFT start here, against Davinci003
there), so only their orderings are compared; AlpacaFarm's SFT 10k row stands in for our SFT
start, whose win rate against itself is 1/2 up to sampling noise.

**AlpacaFarm's ranking as registered claims** (`RANKING_CLAIMS`): the orderings of its Table 2
that matter to its argument, each a paired test over seeds of the gold win rate, with Holm's
correction over the parts (`ablations.claims`). Seeds 1-3 of the method table are the pilot
of the power analysis (`ablations.power`, 80% power for `RANKING_EFFECT`); the claims are
tested on fresh seeds, `RANKING_SEEDS`, run after the registration::

    python -m ppo.tasks.feedback_methods run --first-seed 4 --seeds 7 \\
        --methods sft best_of_n expert_iteration feedme ppo --out docs/results/feedback_ranking
    python -m ppo.tasks.feedback_methods claims docs/results/feedback_ranking --update docs/alpacafarm.md
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Sequence

from ablations.definitions import Claim
from ablations.doc_blocks import replace_block
from ablations.stats import mean_ci95
from ablations.tables import markdown_table

BLOCK = "feedback_methods"
# AlpacaFarm's Table 2 (arXiv 2305.14387 v4), simulated win rate (%) against Davinci003, the
# methods trained and evaluated in simulation. Two of them can be checked in AlpacaFarm's own
# files: the README of tatsu-lab/alpaca_farm@0051c9002837 prints, as the output of its
# `alpaca_leaderboard` example, "RLHF PPO" 46.64 and "SFT 10k" 35.85 (one evaluation run of the
# released checkpoints), within a point of Table 2's 46.8 and 36.7; the README lists the released
# checkpoints of the others (expiter-sim, feedme-sim, reward-condition-sim) without win rates.
# The other five numbers are Table 2's as transcribed, not checked against the PDF here (this
# machine reaches no paper server). GRPO and RLOO are not in AlpacaFarm.
ALPACAFARM_SIM_WIN_RATES = {
    "ppo": 46.8,
    "best_of_n": 45.0,  # best-of-1024
    "expert_iteration": 41.9,
    "sft": 36.7,  # SFT 10k, the start of every method
    "feedme": 36.6,  # binary FeedME
    "quark": 35.6,
    "reward_conditioning": 32.4,  # binary reward conditioning
}
LABELS = {
    "sft": "SFT start", "best_of_n": "best-of-n", "expert_iteration": "expert iteration", "quark": "Quark",
    "quark_best_quantile": "Quark, best quantile only", "reward_conditioning": "binary reward conditioning",
    "feedme": "binary FeedME", "ppo": "PPO (`alpacafarm`)",
    "grpo": "GRPO (`grpo`)", "rloo": "RLOO (`rloo`)",
}
CLAIMS_BLOCK = "feedback_claims"
PILOT_DIR = Path(__file__).resolve().parents[2] / "docs" / "results" / "feedback_methods"  # seeds 1-3

# Registered before seeds 4-10 ran, from the pilot (seeds 1-3 of the method table, commit
# d274acc): `python -m ppo.tasks.feedback_methods claims DIR` prints the power table this rests
# on. The size to see is the same for every part, a tenth of the way from a tie to a sure win;
# the most seeds a part needs at the pilot's sd (PPO over expert iteration, sd 0.036) is 7.
RANKING_EFFECT = 0.05
RANKING_SEEDS = tuple(range(4, 11))
_TABLE_2 = "AlpacaFarm (arXiv 2305.14387) Table 2, simulated win rates"
_RANKING_BASIS = "stated: a tenth of the way from a tie (1/2) to a sure win"


def _ranking_claim(text: str, first: str, second: str, direction: int, published: str, seeds_basis: str,
                   margin: float | None = None) -> Claim:
    return Claim(text, f"{_TABLE_2}: {published}", "feedback_methods", (first, "win_rate_vs_sft"),
                 (second, "win_rate_vs_sft"), direction, "gold win rate against the SFT start's samples",
                 RANKING_SEEDS, family="AlpacaFarm's ranking", margin=margin,
                 effect=None if margin is not None else RANKING_EFFECT,
                 effect_basis=_RANKING_BASIS if margin is None else "stated: the directed parts' size, "
                 "a tenth of the way from a tie to a sure win", seeds_basis=seeds_basis)


RANKING_CLAIMS: tuple[Claim, ...] = (
    _ranking_claim("PPO beats the SFT start.", "ppo", "sft", +1, "PPO 46.8, SFT 10k 36.7",
                   "pilot sd 0.020 (3 pairs): 4 seeds; run at 7"),
    _ranking_claim("Best-of-n beats the SFT start.", "best_of_n", "sft", +1, "best-of-1024 45.0, SFT 10k 36.7",
                   "pilot sd 0.0085 (3 pairs): 3 seeds; run at 7"),
    _ranking_claim("Expert iteration beats the SFT start.", "expert_iteration", "sft", +1,
                   "expert iteration 41.9, SFT 10k 36.7", "pilot sd 0.025 (3 pairs): 5 seeds; run at 7"),
    _ranking_claim("PPO beats best-of-n.", "ppo", "best_of_n", +1, "PPO 46.8, best-of-1024 45.0",
                   "pilot sd 0.025 (3 pairs): 5 seeds; run at 7"),
    _ranking_claim("PPO beats expert iteration.", "ppo", "expert_iteration", +1,
                   "PPO 46.8, expert iteration 41.9", "pilot sd 0.036 (3 pairs): 7 seeds"),
    _ranking_claim("Binary FeedME, supervised learning on the preferred responses, does no better than the SFT "
                   "start.", "feedme", "sft", 0, "binary FeedME 36.6, SFT 10k 36.7",
                   "pilot sd 0.018 (3 pairs): 4 seeds; run at 7", margin=RANKING_EFFECT),
)
METRICS = ("win_rate_vs_sft", "gold_reward", "proxy_reward", "kl_to_sft", "response_length")


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ascending, ties sharing their average rank.

    >>> average_ranks([0.3, 0.1, 0.3, 0.2])
    [3.5, 1.0, 3.5, 2.0]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (NaN when a side is constant).

    >>> spearman([1, 2, 3, 4], [10, 30, 20, 40])
    0.8
    """
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"spearman: need two equally long sequences of >= 2 values, got {len(x)} and {len(y)}")
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else float("nan")


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b: (concordant - discordant) pairs over the geometric mean of the pairs
    untied on each side.

    >>> kendall_tau_b([1, 2, 3, 4], [10, 30, 20, 40])  # 5 concordant, 1 discordant of 6
    0.6666666666666666
    """
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"kendall_tau_b: need two equally long sequences of >= 2 values, got {len(x)} and {len(y)}")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx * dy > 0:
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def summarize(rows: Sequence[dict]) -> dict[str, dict]:
    """Per method (in `LABELS` order): `mean_ci95` of each metric over its "ok" seeds, the
    seeds, and the budget columns (equal over seeds, else a range)."""
    summary = {}
    for method in LABELS:
        ok = [r for r in rows if r["method"] == method and r["status"] == "ok"]
        if not ok:
            continue
        entry = {metric: mean_ci95(float(r[metric]) for r in ok) for metric in METRICS}
        entry["seeds"] = sorted(int(r["seed"]) for r in ok)
        for budget in ("rm_queries_train", "rm_queries_per_response", "optimizer_steps"):
            values = sorted({int(float(r[budget])) for r in ok})
            entry[budget] = str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"
        entry["kl_kind"] = ok[0]["kl_kind"]
        summary[method] = entry
    return summary


def _cell(stat: dict, digits: int) -> str:
    if stat["n"] == 0:
        return "—"
    if math.isnan(stat["ci"]):
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['ci']:.{digits}f}"


def rank_agreement(summary: dict[str, dict], quark: str = "quark") -> dict:
    """Spearman and Kendall between our mean win rates and AlpacaFarm's, over the methods both
    have; `quark` names the row that stands for AlpacaFarm's Quark."""
    shared = [m for m in ALPACAFARM_SIM_WIN_RATES if (quark if m == "quark" else m) in summary]
    ours = [summary[quark if m == "quark" else m]["win_rate_vs_sft"]["mean"] for m in shared]
    theirs = [ALPACAFARM_SIM_WIN_RATES[m] for m in shared]
    if len(shared) < 2:
        return {"methods": shared, "spearman": float("nan"), "kendall": float("nan")}
    return {"methods": shared, "spearman": spearman(ours, theirs), "kendall": kendall_tau_b(ours, theirs)}


def provenance_line(rows: Sequence[dict]) -> str:
    commits = sorted({r.get("prov_commit", "") for r in rows})
    dirty = sorted({r.get("prov_dirty", "") for r in rows})
    models = sorted({r.get("prov_reward_model", "") for r in rows})
    starts = sorted({r.get("prov_warm_start", "") for r in rows})
    return (f"Commit {', '.join(c[:7] for c in commits)} (dirty: {', '.join(dirty)}), warm start "
            f"{', '.join(starts)}, reward model {', '.join(models)}, "
            f"{', '.join(sorted({r.get('prov_threads', '') for r in rows}))} thread(s).")


def markdown(rows: Sequence[dict]) -> str:
    """The generated block: the table, the rank agreement and the provenance."""
    summary = summarize(rows)
    seeds = sorted({s for entry in summary.values() for s in entry["seeds"]})
    header = ["method", "win rate vs SFT (gold)", "gold reward", "proxy reward", "KL to SFT", "length (tokens)",
              "RM queries (train)", "RM queries per response", "optimizer steps", "AlpacaFarm sim. win rate (%)"]
    table_rows = []
    for method, entry in summary.items():
        kl = _cell(entry["kl_to_sft"], 2) + (" (formula)" if entry["kl_kind"] == "best_of_n_formula" else "")
        table_rows.append([LABELS[method], _cell(entry["win_rate_vs_sft"], 3), _cell(entry["gold_reward"], 3),
                           _cell(entry["proxy_reward"], 2), kl, _cell(entry["response_length"], 1),
                           entry["rm_queries_train"], entry["rm_queries_per_response"], entry["optimizer_steps"],
                           ALPACAFARM_SIM_WIN_RATES.get(method, "—")])
    agreement = rank_agreement(summary)
    lines = [markdown_table(header, table_rows), "",
             f"Means ± 95% Student-t intervals over seeds {', '.join(map(str, seeds))}. Rank agreement of the win "
             f"rates with AlpacaFarm's over the {len(agreement['methods'])} methods both have: Spearman "
             f"{agreement['spearman']:.2f}, Kendall tau-b {agreement['kendall']:.2f}."]
    if "quark_best_quantile" in summary:
        other = rank_agreement(summary, quark="quark_best_quantile")
        lines[-1] += (f" With the best-quantile Quark in Quark's place: Spearman {other['spearman']:.2f}, "
                      f"Kendall tau-b {other['kendall']:.2f}.")
    lines += ["", provenance_line(rows)]
    return "\n".join(lines)


def read_rows(directory: Path) -> list[dict]:
    path = directory / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results (python -m ppo.tasks.feedback_methods run --out {directory})")
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def claim_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows of a results.csv as `ablations.claims` reads a sweep's: ablation
    ``feedback_methods``, the method as the variant, numbers as floats."""
    converted = []
    for line, row in enumerate(rows, start=2):
        try:
            converted.append({"ablation": "feedback_methods", "variant": row["method"], "seed": int(row["seed"]),
                              "status": row["status"],
                              **{m: float(row[m]) if row.get(m) not in (None, "") else float("nan") for m in METRICS}})
        except (KeyError, ValueError) as error:
            raise ValueError(f"results.csv line {line}: bad row ({error})") from error
    return converted


def claims_markdown(rows: Sequence[dict], pilot: Sequence[dict]) -> str:
    """The generated claims block: the verdicts of `RANKING_CLAIMS` on `rows`, then their power
    analysis on the `pilot` rows (seeds 1-3 of the method table) and the provenance."""
    from ablations.power import verdicts_with_power

    seeds = ", ".join(sorted({r["seed"] for r in pilot}, key=int))
    return "\n".join([verdicts_with_power(claim_rows(rows), claim_rows(pilot), RANKING_CLAIMS,
                                          f"seeds {seeds} of the method table"), "", provenance_line(rows)])


def _print_or_update(text: str, block: str, update: str | None) -> int:
    """Print `text`, or with `update` write it into that file's ``generated:BLOCK`` block."""
    if update:
        page = Path(update)
        page.write_text(replace_block(page.read_text(), block, text))
        print(f"updated the generated:{block} block of {page}")
    else:
        print(text)
    return 0


def main_claims(directory: Path, update: str | None = None, pilot: Path = PILOT_DIR) -> int:
    return _print_or_update(claims_markdown(read_rows(directory), read_rows(pilot)), CLAIMS_BLOCK, update)


def main_table(directory: Path, update: str | None = None) -> int:
    return _print_or_update(markdown(read_rows(directory)), BLOCK, update)

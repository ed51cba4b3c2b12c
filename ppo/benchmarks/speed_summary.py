"""A batch's runs summarized, several batches pooled, and their tables and plot.

A run's time is its median seconds per step over steps 5..N (`median_step`). `summarize`
takes one batch: per system the median over its runs and their range, the ratio of the two,
and the ratio of each adjacent same-seed pair. `pool` takes several batches (`load_batch`
reads each) and adds each batch's own ratio with their mean and its 95% interval;
`pooled_figure` draws them. Runs that evaluated after training add the held-out accuracy,
project minus TRL paired by seed (`quality_of_pairs`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from ablations.stats import mean_ci95, paired_difference

FIRST_TIMED_STEP = 5  # medians over steps 5..N (1-based): the first steps warm caches up


def median_step(step_times: list[float], first_step: int = FIRST_TIMED_STEP) -> float:
    """Median of the per-step times of steps `first_step`..N (1-based)."""
    timed = step_times[first_step - 1:]
    if not timed:
        raise ValueError(f"need at least {first_step} steps, got {len(step_times)}")
    return statistics.median(timed)


# ---- one batch -----------------------------------------------------------------------------
def adjacent_pairs(runs: list[dict], kind: str) -> list[tuple[dict, dict]]:
    """`(trl, project)` for each pair of adjacent runs of `kind` with the same seed, in run
    order (`compare` runs each seed's two systems back to back, so a pair shares the
    machine's state and the start model). A run whose partner never came is left out."""
    waiting: dict = {}  # seed -> a run whose partner has not come yet
    pairs = []
    for run in runs:
        if run["kind"] != kind:
            continue
        other = waiting.pop(run.get("seed"), None)
        if other is None or other["system"] == run["system"]:
            waiting[run.get("seed")] = run
            continue
        pairs.append((other, run) if other["system"] == "trl" else (run, other))
    return pairs


def paired_ratios(runs: list[dict], kind: str) -> list[float]:
    """project / TRL seconds per step for each adjacent same-seed pair (`adjacent_pairs`);
    the ratio of medians over all runs mixes spells."""
    return [run_median(mine) / run_median(trl) for trl, mine in adjacent_pairs(runs, kind)]


QUALITY_KEYS = (("greedy", "after_test_greedy_acc"), ("sampled at T = 1", "after_test_sample_t1_acc"))


def quality_of_pairs(pairs: list[tuple[dict, dict]]) -> dict:
    """Held-out accuracy after training, project minus TRL, over `(trl, project)` pairs
    (`adjacent_pairs`; `pool` takes them per batch) that both evaluated: for greedy and sampled
    decoding, `ablations.stats.paired_difference` (mean, 95% interval, whether it excludes 0,
    and the smallest gap these pairs would detect) and the two systems' means. Empty when no
    pair evaluated."""
    pairs = [(trl, mine) for trl, mine in pairs
             if "after_test_greedy_acc" in trl and "after_test_greedy_acc" in mine]
    if not pairs:
        return {}
    out = {}
    for label, key in QUALITY_KEYS:
        base = {i: trl[key] for i, (trl, _) in enumerate(pairs)}
        variant = {i: mine[key] for i, (_, mine) in enumerate(pairs)}
        out[label] = {**paired_difference(base, variant), "trl_mean": statistics.mean(base.values()),
                      "project_mean": statistics.mean(variant.values())}
    return out


def run_median(run: dict) -> float:
    """A run's median seconds per step: from its step times, or as recorded (`load_batch`)."""
    return run["median"] if "median" in run else median_step(run["step_times_all"])


def summarize(runs: list[dict]) -> dict:
    """Per (kind, system): median step per run, then median / min / max over runs; per kind
    the ratio of the two medians and the ratios of adjacent same-seed pairs."""
    table: dict = {}
    for run in runs:
        entry = table.setdefault(run["kind"], {}).setdefault(run["system"], {"per_run": [], "greedy": []})
        entry["per_run"].append(run_median(run))
        if "after_test_greedy_acc" in run:
            entry["greedy"].append(run["after_test_greedy_acc"])  # every evaluated run, paired or not
    for kind, systems in table.items():
        for entry in systems.values():
            per_run = entry["per_run"]
            entry.update(median=statistics.median(per_run), min=min(per_run), max=max(per_run))
        if "trl" in systems and "project" in systems:
            systems["ratio"] = systems["project"]["median"] / systems["trl"]["median"]
            systems["paired_ratios"] = paired_ratios(runs, kind)
            systems["quality"] = quality_of_pairs(adjacent_pairs(runs, kind))
    return table


def _median_and_range(entry: dict | None) -> str:
    return "-" if entry is None else f"{entry['median']:.4f} ({entry['min']:.4f}-{entry['max']:.4f})"


def format_summary(table: dict) -> str:
    lines = ["| work | TRL s/step (range) | project s/step (range) | project / TRL | per seed (adjacent runs) "
             "| greedy after (TRL / project) |",
             "|---|---|---|---|---|---|"]
    for kind, systems in table.items():
        trl, mine = systems.get("trl"), systems.get("project")

        def quality(entry):
            return "-" if not entry or not entry["greedy"] else f"{statistics.mean(entry['greedy']):.3f}"

        ratio = f"{systems['ratio']:.2f}" if "ratio" in systems else "-"
        paired = ", ".join(f"{r:.2f}" for r in systems.get("paired_ratios", [])) or "-"
        lines.append(f"| {kind} | {_median_and_range(trl)} | {_median_and_range(mine)} | {ratio} | {paired} "
                     f"| {quality(trl)} / {quality(mine)} |")
    return "\n".join(lines + format_quality(table))


def _separated(d: dict) -> str:
    """yes / no, or why there is no verdict (`ablations.stats.MIN_PAIRS`, zero spread)."""
    if d["too_few"]:
        return "too few pairs"
    if d["zero_spread"]:
        return "zero spread"
    return "yes" if d["separated"] else "no"


def format_quality(table: dict) -> list[str]:
    """The lines of the quality table (after a blank line) for a `summarize` or `pool` table's
    ``quality`` entries; none when no pair evaluated."""
    rows = [(kind, label, d) for kind, entry in table.items() if entry
            for label, d in entry.get("quality", {}).items()]
    if not rows:
        return []
    lines = ["", "| work | held-out accuracy after | TRL / project (means) | project - TRL, paired by seed "
             "(95% interval) | pairs | separated (the interval excludes 0, 3+ pairs) | smallest gap these pairs detect |",
             "|---|---|---|---|---|---|---|"]
    for kind, label, d in rows:
        detectable = f"{d['detectable']:.3f}" if math.isfinite(d["detectable"]) else "-"  # none from one pair
        lines.append(f"| {kind} | {label} | {d['trl_mean']:.3f} / {d['project_mean']:.3f} | "
                     f"{_mean_and_interval(d, signed=True)} | {d['n']} | "
                     f"{_separated(d)} | {detectable} |")
    return lines


# ---- several batches pooled ----------------------------------------------------------------
_PRINTED_RUN = re.compile(r"(trl|project)\s+(grpo|ppo) seed (\d+): median ([0-9.]+) s/step")


def load_batch(path: str | Path) -> list[dict]:
    """The runs of one `compare` batch in run order: from the JSON its ``--out`` wrote, or
    from the lines it printed (``trl grpo seed 42: median 0.1193 s/step``, each run's median
    to 0.1 ms), for a batch whose JSON was not kept."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)["runs"]
    runs = [{"system": m[1], "kind": m[2], "seed": int(m[3]), "median": float(m[4])}
            for m in map(_PRINTED_RUN.match, text.splitlines()) if m]
    if not runs:
        raise ValueError(f"{path}: no runs in it (expected the JSON of `compare --out` or the lines compare printed)")
    return runs


def pool(batches: list[list[dict]], kind: str) -> dict | None:
    """`kind`'s runs over several batches as `summarize` gives them (per system the median
    over every run and the range; the ratio of the two medians), with the adjacent same-seed
    pairs taken inside each batch (a pair never spans two batches), how many are at or under
    0.5, and each batch's own ratio with their mean and its 95% interval (`batch_ratio`, Student t
    over the batches: each batch ran in its own spell of the machine, so a batch, not a run, is
    the unit the ratio varies by), and the held-out accuracy after training of the pairs that
    evaluated (`quality_of_pairs`); None without runs of both systems."""
    table = summarize([run for batch in batches for run in batch]).get(kind, {})
    if "ratio" not in table:
        return None
    # the pairs of the runs put together could join two batches' runs: taken per batch instead
    pairs = [ratio for batch in batches for ratio in paired_ratios(batch, kind)]
    per_batch = [summarize(batch).get(kind, {}).get("ratio") for batch in batches]
    quality = quality_of_pairs([pair for batch in batches for pair in adjacent_pairs(batch, kind)])
    return {**table, "paired_ratios": pairs, "pairs_at_or_under_half": sum(r <= 0.5 for r in pairs),
            "per_batch": per_batch, "batch_ratio": mean_ci95(r for r in per_batch if r is not None),
            "quality": quality}


def format_pooled(pooled: dict) -> str:
    lines = ["| work | runs per system | TRL s/step (range) | project s/step (range) | project / TRL "
             "| seed pairs at or under 0.5 | pairs: range, median | per batch | batches: mean (95% interval) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, entry in pooled.items():
        if entry is None:
            continue
        pairs = entry["paired_ratios"]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}, {statistics.median(pairs):.2f}" if pairs else "-"
        per_batch = ", ".join("-" if r is None else f"{r:.2f}" for r in entry["per_batch"])
        runs = f"{len(entry['trl']['per_run'])} / {len(entry['project']['per_run'])}"
        lines.append(f"| {kind} | {runs} | {_median_and_range(entry['trl'])} "
                     f"| {_median_and_range(entry['project'])} | {entry['ratio']:.3f} | {entry['pairs_at_or_under_half']} of {len(pairs)} | "
                     f"{spread} | {per_batch} | {_mean_and_interval(entry['batch_ratio'])} |")
    return "\n".join(lines + format_quality(pooled))


def _mean_and_interval(stats: dict, signed: bool = False) -> str:
    """``0.482 (0.460 to 0.503)``, or with `signed` ``-0.100 (-0.530 to +0.330)``: a
    `mean_ci95` result; the mean alone where there is no interval (one batch, one pair)."""
    cell = "{:+.3f}" if signed else "{:.3f}"
    if not math.isfinite(stats["ci"]):
        return cell.format(stats["mean"])
    low, high = (cell.format(stats["mean"] + side * stats["ci"]) for side in (-1, 1))
    return f"{cell.format(stats['mean'])} ({low} to {high})"


def batch_label(path: str | Path) -> str:
    """The batch's name on a plot: its number for ``batchNN.txt`` / ``.json``, else the file's stem."""
    stem = Path(path).stem
    match = re.fullmatch(r"batch0*(\d+)", stem)
    return match[1] if match else stem


def pooled_figure(labels: list[str], pooled: dict, goal: float = 0.5):
    """Each batch's project / TRL ratio per kind (a point per batch, joined in batch order),
    the mean over the batches with its 95% interval (a line and a band of the kind's colour)
    and the goal as a dashed line: the `pool` table at a glance. Returns a matplotlib
    ``Figure`` (drawn through Agg, no pyplot state)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6.0, 0.28 * len(labels) + 2), 3.8))
    ax = figure.add_subplot()
    positions = range(len(labels))
    for (kind, entry), colour in zip(pooled.items(), ("tab:blue", "tab:orange", "tab:green")):
        if entry is None:
            continue
        points = [(x, r) for x, r in zip(positions, entry["per_batch"]) if r is not None]
        stats = entry["batch_ratio"]
        ax.plot([x for x, _ in points], [r for _, r in points], "o-", color=colour, markersize=4, linewidth=1,
                label=f"{kind}: mean {_mean_and_interval(stats)}")
        if math.isfinite(stats["ci"]):
            ax.axhspan(stats["mean"] - stats["ci"], stats["mean"] + stats["ci"], color=colour, alpha=0.15)
        ax.axhline(stats["mean"], color=colour, linewidth=0.8)
    ax.axhline(goal, color="black", linestyle="--", linewidth=1, label=f"goal: {goal}x")
    ax.set_xticks(list(positions), labels, fontsize=7)
    ax.set_xlabel("batch")
    ax.set_ylabel("project / TRL, seconds per step")
    ax.set_title("Side by side with TRL: each batch's ratio, the mean and its 95% interval", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    return figure

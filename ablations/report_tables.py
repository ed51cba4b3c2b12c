"""The report's markdown: one table per ablation, its paired table and verdicts (`format_table`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .run_results import collect_runs, sweep_specs
from .stats import MIN_PAIRS
from .variant_comparison import paired_differences, summarise


def verdict(entry: dict, style: str = "g") -> str:
    """The verdict cell: computed from the interval, never written by hand. Fewer than
    `ablations.stats.MIN_PAIRS` pairs, or differences with no spread, get no verdict (see
    `ablations.stats`): a zero-width interval says nothing about the noise."""
    if entry["n"] == 0:
        return "n/a (no paired seeds)"
    if entry["zero_spread"] and entry["mean"] == 0:
        return "identical in every pair"
    if entry["too_few"]:
        return f"too few seeds ({entry['n']} pair{'s' if entry['n'] != 1 else ''}; a verdict needs {MIN_PAIRS})"
    if entry["zero_spread"]:
        shift = _fmt(entry["mean"], "signed" if style == "acc" else style)
        return f"no verdict: zero spread (every pair differs by {shift})"
    if entry["separated"]:
        return "separated"
    return f"no difference detected at n={entry['n']} (detectable about {_fmt(entry['detectable'], style)})"


def _fmt(value: float, style: str = "g") -> str:
    """Table cell text: "acc" 0.600, "signed" +0.200, "int" 1234, else 3 significant digits."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if style == "acc":
        return f"{value:.3f}"
    if style == "signed":
        return f"{value:+.3f}"
    if style == "int" or abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _fmt_ci(entry: dict, column: str, style: str) -> str:
    n = entry[f"{column}_n"]
    if n == 0:
        return "n/a"
    interval = "n/a" if n < 2 else _fmt(entry[f"{column}_ci"], "acc" if style == "signed" else style)
    return f"{_fmt(entry[f'{column}_mean'], style)} ± {interval}"


# The fixed columns of an ablation's table: header, row key, number style. A metric that is
# one of these keys is marked in its column rather than shown twice.
TABLE_COLUMNS = (("final sampled acc", "final_sampled_accuracy", "acc"), ("gain", "accuracy_gain", "signed"),
                 ("reward", "reward", "g"), ("KL in use (`kl`)", "kl", "g"), ("true KL (`kl_k1`)", "kl_k1", "g"),
                 ("length correct", "response_length_correct", "g"),
                 ("length incorrect", "response_length_incorrect", "g"))


def _ablation_table(entries: Sequence[dict]) -> str:
    """The markdown table of one ablation (entries: its `summarise` rows)."""
    metric = entries[0]["metric"]
    metric_style = "acc" if metric.endswith("accuracy") else "g"
    columns = [(f"{label} (metric)" if key == metric else label, key if key != metric else "metric_value", style)
               for label, key, style in TABLE_COLUMNS]
    if metric not in {key for _, key, _ in TABLE_COLUMNS}:
        columns.append((f"`{metric}` (metric)", "metric_value", metric_style))
    header = ["variant", "seeds ok", *(label for label, _, _ in columns), "wall s", "samples"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for e in entries:
        cells = [e["variant"], f"{e['n_ok']}/{e['n_runs']}",
                 *(_fmt_ci(e, key, style) for _, key, style in columns),
                 _fmt_ci(e, "wall_seconds", "int"), _fmt(e["samples_mean"], "int")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paired_table(pairs: Sequence[dict], metric: str, columns: Sequence[str] | None = None) -> str:
    """Each variant's seed-paired difference from the base variant, with the verdict
    (only `columns`, in the pairs' order, when given)."""
    if columns is not None:
        pairs = [p for p in pairs if p["column"] in columns]
    pairs = [p for p in pairs if p["n"] > 0]  # a quantity no run logged
    if not pairs:
        return ""
    names = {"metric_value": f"`{metric}`"}
    lines = [f"Paired by seed against `{pairs[0]['base']}`: variant minus base, mean ± 95% interval of the "
             f"per-seed differences. *separated* means the interval excludes 0; otherwise the smallest "
             f"difference these seeds would detect (80% power) is given. Below {MIN_PAIRS} pairs, or when "
             "every pair differs by the same amount, there is no verdict: the interval then reflects too "
             "little data to show its own noise.", "",
             "| variant | quantity | difference (mean ± 95% CI) | pairs | verdict |", "|---|---|---|---|---|"]
    for p in pairs:
        style = "acc" if p["column"].endswith("accuracy") or (p["column"] == "metric_value"
                                                              and metric.endswith("accuracy")) else "g"
        interval = "n/a" if p["n"] < 2 else _fmt(p["ci"], style)
        lines.append(f"| {p['variant']} | {names.get(p['column'], p['column'])} | "
                     f"{_fmt(p['mean'], 'signed' if style == 'acc' else 'g')} ± {interval} | {p['n']} | "
                     f"{verdict(p, style)} |")
    return "\n".join(lines)


def _by_ablation(entries: Sequence[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for entry in entries:
        grouped.setdefault(entry["ablation"], []).append(entry)
    return grouped


def format_table(sweep_dir: str | Path) -> str:
    """The markdown tables of every ablation in the sweep, for printing to a terminal."""
    rows = collect_runs(sweep_dir)
    specs = sweep_specs(sweep_dir, (r["ablation"] for r in rows))
    grouped = _by_ablation(summarise(rows, specs))
    if not grouped:
        return f"(no run directories under {sweep_dir})"
    pairs = paired_differences(rows, specs=specs)
    parts = []
    for ablation, entries in grouped.items():
        paired = _paired_table([p for p in pairs if p["ablation"] == ablation], entries[0]["metric"])
        parts.append(f"## {ablation}\n\n{_ablation_table(entries)}" + (f"\n\n{paired}" if paired else ""))
    return "\n\n".join(parts)

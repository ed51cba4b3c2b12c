"""The report's markdown: one table per ablation, its paired table and verdicts (`format_table`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .run_results import collect_runs, sweep_specs
from .stats import MIN_PAIRS, paired_difference
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


def gain_over_start(rows: Sequence[dict], end_column: str = "final_sampled_accuracy") -> dict[tuple[str, str], dict]:
    """(ablation, variant) -> `paired_difference` of `end_column` minus the initial held-out
    sampled accuracy (the final evaluation by default; ``late_sampled_accuracy`` for the late mean).

    Each run is paired with its own start: the same warm start, scored with the same seed's
    evaluation draws before and after training, so the difference keeps little evaluation noise.
    """
    starts_and_ends: dict[tuple[str, str], tuple[dict, dict]] = {}
    for row in rows:
        if row["status"] != "ok":
            continue
        start, end = starts_and_ends.setdefault((row["ablation"], row["variant"]), ({}, {}))
        start[row["seed"]] = row["initial_sampled_accuracy"]
        end[row["seed"]] = row.get(end_column, float("nan"))
    return {key: paired_difference(start, end) for key, (start, end) in starts_and_ends.items()}


def gain_lines(rows: Sequence[dict], ablation: str) -> str:
    """One line per variant: its gain over the start with interval and verdict."""
    lines = []
    for (name, variant), entry in gain_over_start(rows).items():
        if name != ablation:
            continue
        interval = "n/a" if entry["n"] < 2 else _fmt(entry["ci"], "acc")
        if entry["separated"]:
            word = "gains over its start" if entry["mean"] > 0 else "ends below its start"
            text = f"separated: {word}"
        else:
            text = verdict(entry, "acc")
        lines.append(f"- {variant}: {_fmt(entry['mean'], 'signed')} ± {interval} ({entry['n']} seeds): {text}")
    if not lines:
        return ""
    return ("Gain over the start (final minus initial held-out sampled accuracy of each run, "
            "mean ± 95% interval over seeds):\n" + "\n".join(lines))


def gains_table(rows: Sequence[dict]) -> str:
    """Each variant's gain over its start (final, and the mean of the late evaluations, minus the
    initial held-out sampled accuracy), with 95% intervals, how many seeds gained, and the verdict."""
    late = gain_over_start(rows, "late_sampled_accuracy")
    lines = ["| ablation | variant | seeds | start | final | gain (95% CI) | seeds gaining | late gain (95% CI) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (ablation, variant), entry in gain_over_start(rows).items():
        ok = [row for row in rows if row["status"] == "ok" and (row["ablation"], row["variant"]) == (ablation, variant)]
        start = np.mean([float(row["initial_sampled_accuracy"]) for row in ok])
        final = np.mean([float(row["final_sampled_accuracy"]) for row in ok])
        gaining = sum(float(row["final_sampled_accuracy"]) > float(row["initial_sampled_accuracy"]) for row in ok)
        late_entry = late[(ablation, variant)]
        word = ("gains" if entry["mean"] > 0 else "falls") if entry["separated"] else verdict(entry, "acc")
        lines.append(f"| {ablation} | {variant} | {entry['n']} | {_fmt(start, 'acc')} | {_fmt(final, 'acc')} "
                     f"| {_fmt(entry['mean'], 'signed')} ± {_fmt(entry['ci'], 'acc')} | {gaining} of {len(ok)} "
                     f"| {_fmt(late_entry['mean'], 'signed')} ± {_fmt(late_entry['ci'], 'acc')} | {word} |")
    return "\n".join(lines)


def extras_table(rows: Sequence[dict], specs: dict | None = None) -> str:
    """Per variant, the ablation's metric and its extra metrics, mean ± 95% interval over seeds:
    each at the end of the run (its last-10% window, for an evaluation key the last
    evaluation) and, for the held-out evaluation keys (``eval_*``), also its mean over every
    evaluation of the run (the ``:all`` column: the area under the held-out curve), so a
    reader sees both where a run ends and what it earned on the way."""
    from .columns import WHOLE_RUN_SUFFIX
    from .variant_comparison import summarise

    entries = summarise(rows, specs)
    parts = []
    for ablation in dict.fromkeys(e["ablation"] for e in entries):
        chosen = [e for e in entries if e["ablation"] == ablation]
        keys = list(dict.fromkeys((chosen[0]["metric"], *chosen[0]["extra_metrics"])))
        columns = []
        for key in keys:
            # The metric is a column of the row only when it is a logged key; else its value is metric_value.
            columns.append((f"`{key}` (end)", key if f"{key}_n" in chosen[0] else "metric_value"))
            if key.startswith("eval_") and f"{key}{WHOLE_RUN_SUFFIX}_n" in chosen[0]:
                columns.append((f"`{key}` (run mean)", key + WHOLE_RUN_SUFFIX))
        header = ["variant", "seeds ok", *(label for label, _ in columns)]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for e in chosen:
            cells = [e["variant"], f"{e['n_ok']}/{e['n_runs']}",
                     *(_fmt_ci(e, column, "g") if f"{column}_n" in e else "n/a" for _, column in columns)]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append(("" if len(chosen) == len(entries) else f"`{ablation}`:\n\n") + "\n".join(lines))
    return "\n\n".join(parts)


def starts_table(rows: Sequence[dict]) -> str:
    """The spread of the start's held-out sampled accuracy over the runs' evaluation seeds:
    every run of a sweep evaluates the same warm start before training, each with its own
    seed's draws, so the spread of those starts is the evaluation's own noise."""
    starts = [float(row["initial_sampled_accuracy"]) for row in rows if row["status"] == "ok"]
    if len(starts) < 2:
        return "(fewer than two finished runs)"
    warm = sorted({row.get("prov_warm_start", "") for row in rows if row["status"] == "ok"})
    return ("| runs (evaluation seeds) | warm start | mean | sd | min | max |\n|---|---|---|---|---|---|\n"
            f"| {len(starts)} | {', '.join(w or '?' for w in warm)} | {np.mean(starts):.4f} | "
            f"{np.std(starts, ddof=1):.4f} | {min(starts):.4f} | {max(starts):.4f} |")


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
        gains = gain_lines(rows, ablation)
        parts.append(f"## {ablation}\n\n{_ablation_table(entries)}" + (f"\n\n{paired}" if paired else "")
                     + (f"\n\n{gains}" if gains else ""))
    return "\n\n".join(parts)

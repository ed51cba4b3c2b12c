"""The ablation report: a sweep directory in, a CSV, a markdown table and PNG plots out.

A sweep is laid out as ``SWEEP_DIR/<ablation>/<variant>/seed<k>/``, each leaf an ordinary
run directory (``config.yaml``, ``metrics.jsonl``, ``summary.json`` once the run finished,
``error.txt`` if it failed). This module only reads; it never re-runs anything, so it can
be pointed at a sweep that is still running.

What it answers, per ablation: did the variants differ by more than seed noise? Every
number in the table is therefore a mean over seeds with, for the headline numbers, a 95%
Student-t interval (``mean +- t_{0.975, n-1} * sd / sqrt(n)``). With 3 seeds t is 4.30, so
intervals are wide: that is the honest answer for 3 seeds, not a bug.

Per-run numbers (`collect_runs`, one row per run directory, also written to ``results.csv``):

    ablation, variant, seed     where the run sits in the sweep
    status                      "ok" (summary.json for all of config.total_steps),
                                "failed" (error.txt and no complete summary),
                                "incomplete" (still running, killed, or stopped early)
    error                       first line of error.txt ("" if none)
    path                        run directory relative to the sweep directory
    steps, total_steps          last logged training step / the configured number
    initial_sampled_accuracy    held-out accuracy at temperature 1 before training
    final_sampled_accuracy      ... after training (the last evaluation for unfinished runs)
    final_greedy_accuracy       held-out greedy accuracy after training
    accuracy_gain               final - initial sampled accuracy
    reward, kl, kl_k1, entropy  training means over the last 10% of steps (``kl`` is the
                                configured, possibly clipped, estimator; ``kl_k1`` the
                                unclipped k1 estimate, i.e. the "true" sampled KL)
    response_length_correct,
    response_length_incorrect   training response lengths, same last-10% window
    wall_seconds, samples       from summary.json (wall time of the last session only)
    metric, metric_value        the ablation's own metric (name, last-10% mean)
    reused_from                 for a run copied from an identical run (see the runner):
                                that run's path; "" for a run that trained
    <extra metric keys>         each extra metric of the ablation, last-10% mean
    <extra metric key>:all      ... and its mean over every training step (`run_mean`)

"Last 10% of steps" means the last ``ceil(n / 10)`` (at least one) of the training steps
(step >= 1) on which the key was logged. Averaging a window rather than reading the last
step damps single-step noise; restricting to steps that logged the key makes the same rule
work for sparse keys such as ``eval_*`` (then it is the last evaluation(s)).

Plots (``plots/``), per ablation: held-out sampled accuracy vs step at every evaluation;
the ablation's metric vs step (moving average over 5 logged points for per-step keys);
one small-multiple figure for the extra metrics. Lines are means over seeds; the shaded
band is the min-max over seeds, which with 3 seeds shows every seed rather than pretending
to estimate a standard deviation.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .stats import as_float as _as_float
from .stats import mean_ci95, paired_difference

DEFAULT_METRIC = "eval_sampled_accuracy"
TAIL_FRACTION_DENOMINATOR = 10  # "last 10% of steps"
SMOOTHING_WINDOW = 5  # moving-average width (logged points) for per-step curves
SEED_DIR = re.compile(r"^seed(\d+)$")
WHOLE_RUN_SUFFIX = ":all"  # results.csv column "<extra metric>:all": its mean over every step

# Columns compared between variants seed by seed (`paired_differences`).
PAIRED_COLUMNS = ("final_sampled_accuracy", "final_greedy_accuracy", "metric_value", "reward", "kl", "kl_k1",
                  "entropy", "response_length_correct", "response_length_incorrect", "wall_seconds")

# Fixed per-run columns, in CSV order; extra-metric columns follow.
RUN_COLUMNS = (
    "ablation", "variant", "seed", "status", "error", "path", "steps", "total_steps",
    "initial_sampled_accuracy", "final_sampled_accuracy", "final_greedy_accuracy", "accuracy_gain",
    "reward", "kl", "kl_k1", "entropy", "response_length_correct", "response_length_incorrect",
    "wall_seconds", "samples", "metric", "metric_value", "reused_from",
)
# Training-metric columns that are last-10% means of the metrics.jsonl key of the same name.
TAIL_COLUMNS = ("reward", "kl", "kl_k1", "entropy", "response_length_correct", "response_length_incorrect")
# Non-numeric per-run columns: never averaged over seeds.
TEXT_COLUMNS = ("ablation", "variant", "seed", "status", "error", "path", "metric", "reused_from")


# ==========================================================================================
# The ablation's description (registry, or a fallback for sweeps the registry doesn't know)
# ==========================================================================================
@dataclass(frozen=True)
class AblationSpec:
    """What the report needs to know about one ablation."""

    name: str
    question: str = ""
    metric: str = DEFAULT_METRIC
    extra_metrics: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()  # preferred display order; variants on disk but not here go last


def ablation_spec(name: str) -> AblationSpec:
    """The registry's description of `name`, or a neutral default when it has none.

    The registry is imported lazily so the report works on any sweep directory (copied from
    another machine, made by hand, or of an ablation since renamed) and without the registry.
    """
    try:
        from ablations.registry import get_ablation
    except ImportError:
        return AblationSpec(name)
    try:
        ablation = get_ablation(name)
    except (LookupError, ValueError):  # unknown name: report it with the defaults
        return AblationSpec(name)
    except Exception as error:  # a registry bug should not cost the results of a finished sweep
        warnings.warn(f"ablation registry failed on {name!r} ({error!r}); reporting it with defaults")
        return AblationSpec(name)
    variants = tuple(getattr(v, "name", str(v)) for v in (getattr(ablation, "variants", None) or ()))
    return AblationSpec(
        name=name,
        question=getattr(ablation, "question", "") or "",
        metric=getattr(ablation, "metric", None) or DEFAULT_METRIC,
        extra_metrics=tuple(getattr(ablation, "extra_metrics", None) or ()),
        variants=variants,
    )


# ==========================================================================================
# Reading run directories
# ==========================================================================================
def _whole(value: float) -> int | float:
    """Counts as ints (``320`` rather than ``320.0`` in the CSV); NaN stays NaN."""
    return int(value) if np.isfinite(value) and float(value).is_integer() else value


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl as a list of rows sorted by step (the last row wins for a repeated step).

    Python's json reads the ``NaN`` the trainer writes for undefined values (e.g. the length
    of correct responses when none was correct). A line that does not parse (a run killed
    mid-write) is skipped rather than failing the whole report.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            by_step[int(row["step"])] = row
    return [by_step[step] for step in sorted(by_step)]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _configured_total_steps(run_dir: Path) -> float:
    """``total_steps`` from config.yaml (NaN when unknown), to tell a finished run from one
    stopped early with ``stop_after`` (which also writes a summary.json)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return float("nan")
    import yaml

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return float("nan")
    return _as_float(config.get("total_steps")) if isinstance(config, dict) else float("nan")


def series(rows: Sequence[dict], key: str, min_step: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key` over the rows that logged it, from `min_step` on; NaN kept."""
    points = [(int(r["step"]), _as_float(r[key])) for r in rows if key in r and r["step"] >= min_step]
    steps = np.array([p[0] for p in points], dtype=int)  # [n_logged]
    values = np.array([p[1] for p in points], dtype=float)  # [n_logged]
    return steps, values


def tail_mean(rows: Sequence[dict], key: str) -> float:
    """Mean of `key` over the last 10% (at least one) of the training steps that logged it.

    NaN entries inside the window are ignored; NaN when the key was never logged after step 0
    or is NaN throughout the window. Worked example: 20 steps logging kl, the window is steps
    19 and 20, so kl = [..., 0.01, 0.03] gives 0.02.
    """
    _, values = series(rows, key, min_step=1)
    if len(values) == 0:
        return float("nan")
    window = values[-max(1, -(-len(values) // TAIL_FRACTION_DENOMINATOR)):]  # ceil(n/10), integer-exact
    finite = window[np.isfinite(window)]
    return float(finite.mean()) if len(finite) else float("nan")


def run_mean(rows: Sequence[dict], key: str) -> float:
    """Mean of `key` over every training step (step >= 1) that logged a finite value.

    For per-step diagnostics whose claim is about the whole run (where the gradient weight
    went during training) rather than its end; far less noisy than the last 10%.
    """
    _, values = series(rows, key, min_step=1)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def _last_logged(rows: Sequence[dict], key: str, min_step: int = 0) -> float:
    _, values = series(rows, key, min_step=min_step)
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if len(finite) else float("nan")


def _run_dirs(sweep_dir: Path) -> Iterable[tuple[str, str, int, Path]]:
    """(ablation, variant, seed, path) for every ``<ablation>/<variant>/seed<k>/`` directory."""
    for ablation_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name != "plots"):
        for variant_dir in sorted(p for p in ablation_dir.iterdir() if p.is_dir()):
            seeds = []
            for run_dir in variant_dir.iterdir():
                match = SEED_DIR.match(run_dir.name)
                if run_dir.is_dir() and match:
                    seeds.append((int(match.group(1)), run_dir))
            for seed, run_dir in sorted(seeds):
                yield ablation_dir.name, variant_dir.name, seed, run_dir


def _reused_from(sweep_dir: Path, run_dir: Path) -> str:
    """The identical run a copied run came from (first line of reused_from.txt), else ''."""
    marker = run_dir / "reused_from.txt"
    if not marker.is_file():
        return ""
    lines = marker.read_text(errors="replace").splitlines()
    source = Path(lines[0].strip()) if lines else Path()
    try:
        return str(source.relative_to(sweep_dir.resolve()))
    except ValueError:
        return str(source)


def _run_row(sweep_dir: Path, ablation: str, variant: str, seed: int, run_dir: Path,
             spec: AblationSpec) -> dict:
    rows = read_metrics(run_dir)
    summary = _read_json(run_dir / "summary.json")
    error_path = run_dir / "error.txt"
    error_lines = error_path.read_text(errors="replace").strip().splitlines() if error_path.is_file() else []
    total_steps = _configured_total_steps(run_dir)
    steps = max((int(r["step"]) for r in rows), default=0)

    summary_steps = _as_float(summary.get("steps"))
    complete = bool(summary) and (math.isnan(total_steps) or summary_steps >= total_steps)
    # A complete summary wins over a stale error.txt: the training itself finished.
    status = "ok" if complete else ("failed" if error_path.is_file() else "incomplete")

    initial_eval = summary.get("initial_eval") or {}
    final_eval = summary.get("final_eval") or {}
    # Fall back to the logged eval rows: summaries of resumed runs may lack initial_eval,
    # and unfinished runs have no summary at all.
    initial = _as_float(initial_eval.get("sampled_accuracy"))
    if math.isnan(initial):
        initial = _last_logged([r for r in rows if r["step"] == 0], "eval_sampled_accuracy")
    final = _as_float(final_eval.get("sampled_accuracy"))
    if math.isnan(final):
        final = _last_logged(rows, "eval_sampled_accuracy", min_step=1)
    final_greedy = _as_float(final_eval.get("greedy_accuracy"))
    if math.isnan(final_greedy):
        final_greedy = _last_logged(rows, "eval_greedy_accuracy", min_step=1)
    gain = _as_float(summary.get("sampled_accuracy_gain"))
    if math.isnan(gain):
        gain = final - initial

    row = {
        "ablation": ablation,
        "variant": variant,
        "seed": seed,
        "status": status,
        "error": error_lines[0].strip() if error_lines else "",
        "path": str(run_dir.relative_to(sweep_dir)),
        "steps": steps,
        "total_steps": _whole(total_steps),
        "initial_sampled_accuracy": initial,
        "final_sampled_accuracy": final,
        "final_greedy_accuracy": final_greedy,
        "accuracy_gain": gain,
        **{key: tail_mean(rows, key) for key in TAIL_COLUMNS},
        "wall_seconds": _as_float(summary.get("wall_seconds_this_session")),
        "samples": _whole(_as_float(summary.get("samples"))),
        "metric": spec.metric,
        "metric_value": tail_mean(rows, spec.metric),
        "reused_from": _reused_from(sweep_dir, run_dir),
    }
    for key in spec.extra_metrics:
        row.setdefault(key, tail_mean(rows, key))
    for key in spec.extra_metrics:
        row.setdefault(key + WHOLE_RUN_SUFFIX, run_mean(rows, key))
    return row


def collect_runs(sweep_dir: str | Path) -> list[dict]:
    """One row per run directory of the sweep (columns: see the module docstring)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such sweep directory")
    specs: dict[str, AblationSpec] = {}
    result = []
    for ablation, variant, seed, run_dir in _run_dirs(sweep_dir):
        spec = specs.setdefault(ablation, ablation_spec(ablation))
        result.append(_run_row(sweep_dir, ablation, variant, seed, run_dir, spec))
    return result


def base_variant(ablation: str, variants: Sequence[str]) -> str:
    """The variant others are compared with: the registry's first variant present, else the
    first in sorted order."""
    for name in ablation_spec(ablation).variants:
        if name in variants:
            return name
    return sorted(variants)[0]


def paired_differences(rows: Sequence[dict], base: str | None = None) -> list[dict]:
    """For every ablation, every non-base variant and every `PAIRED_COLUMNS` column plus the
    ablation's extra metrics: the seed-paired difference from the base variant (ok runs only).
    `base` names another variant to compare with instead (for rows of one ablation)."""
    values: dict[tuple[str, str], dict[int, dict]] = {}
    for row in rows:
        if row["status"] == "ok":
            values.setdefault((row["ablation"], row["variant"]), {})[row["seed"]] = row
    result = []
    for ablation in sorted({a for a, _ in values}):
        variants = [v for a, v in values if a == ablation]
        if base is not None and base not in variants:
            raise ValueError(f"{ablation}: no variant {base!r} with a finished run (have {', '.join(sorted(variants))})")
        reference = base if base is not None else base_variant(ablation, variants)
        spec = ablation_spec(ablation)
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


def verdict(entry: dict, style: str = "g") -> str:
    """The verdict cell: computed from the interval, never written by hand."""
    if entry["n"] < 2:
        return "n/a (fewer than 2 paired seeds)"
    if entry["separated"]:
        return "separated"
    if entry["mean"] == 0 and entry["sd"] == 0:
        return "identical in every pair"
    return f"no difference detected at n={entry['n']} (detectable about {_fmt(entry['detectable'], style)})"


def _numeric_columns(rows: Sequence[dict]) -> list[str]:
    columns = [c for c in RUN_COLUMNS if c not in TEXT_COLUMNS]
    for row in rows:
        columns += [k for k in row if k not in TEXT_COLUMNS and k not in columns]
    return columns


def summarise(rows: Sequence[dict]) -> list[dict]:
    """One row per (ablation, variant): statistics over its ok seeds.

    Keys: ablation, variant, question, metric, n_runs, n_ok, n_failed, n_incomplete,
    failed (list of (seed, error) pairs), incomplete (list of seeds);
    ``final_sampled_accuracy_{mean,sd,ci,n}`` and ``metric_value_{mean,sd,ci,n}`` where ``ci``
    is the 95% half-width (NaN for n < 2); and ``<column>_mean`` for every other numeric
    column. Failed and incomplete runs are counted but never averaged: a crashed seed's
    partial numbers are not a sample of the variant's result.
    Ablations are sorted by name; variants follow the registry's order, then the rest sorted.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["ablation"], row["variant"]), []).append(row)
    specs = {ablation: ablation_spec(ablation) for ablation, _ in groups}
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


# ==========================================================================================
# Markdown
# ==========================================================================================
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


def _ablation_table(entries: Sequence[dict]) -> str:
    """The markdown table of one ablation (entries: its `summarise` rows)."""
    metric = entries[0]["metric"]
    header = ["variant", "seeds ok", "final sampled acc", "gain", "reward", "KL", "true KL (k1)",
              "length correct", "length incorrect", f"`{metric}`", "wall s", "samples"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for e in entries:
        metric_style = "acc" if metric.endswith("accuracy") else "g"
        cells = [
            e["variant"],
            f"{e['n_ok']}/{e['n_runs']}",
            _fmt_ci(e, "final_sampled_accuracy", "acc"),
            _fmt_ci(e, "accuracy_gain", "signed"),
            _fmt_ci(e, "reward", "g"),
            _fmt_ci(e, "kl", "g"),
            _fmt_ci(e, "kl_k1", "g"),
            _fmt_ci(e, "response_length_correct", "g"),
            _fmt_ci(e, "response_length_incorrect", "g"),
            _fmt_ci(e, "metric_value", metric_style),
            _fmt_ci(e, "wall_seconds", "int"),
            _fmt(e["samples_mean"], "int"),
        ]
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
             "per-seed differences. *separated* means the interval excludes 0; otherwise the smallest "
             "difference these seeds would detect (80% power) is given.", "",
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
    grouped = _by_ablation(summarise(rows))
    if not grouped:
        return f"(no run directories under {sweep_dir})"
    pairs = paired_differences(rows)
    parts = []
    for ablation, entries in grouped.items():
        paired = _paired_table([p for p in pairs if p["ablation"] == ablation], entries[0]["metric"])
        parts.append(f"## {ablation}\n\n{_ablation_table(entries)}" + (f"\n\n{paired}" if paired else ""))
    return "\n\n".join(parts)


# ==========================================================================================
# Plots
# ==========================================================================================
def moving_average(values: np.ndarray, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """Centred moving average over `window` points, the window shrinking at the ends and
    ignoring NaN, so the curve keeps its length and is not shifted right by the smoothing.

    Example: [0, 0, 3, 0, 0] with window 3 -> [0, 1, 1, 1, 0].
    """
    half = window // 2
    out = np.full(len(values), np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        chunk = chunk[np.isfinite(chunk)]
        if len(chunk):
            out[i] = chunk.mean()
    return out


@dataclass
class Curve:
    """One variant's line: mean over seeds at each step with the min-max band."""

    steps: np.ndarray  # [n_steps]  union of the steps the seeds logged
    mean: np.ndarray  # [n_steps]
    low: np.ndarray  # [n_steps]  min over seeds
    high: np.ndarray  # [n_steps]  max over seeds
    n_seeds: int
    label_suffix: str = ""


def seed_curve(metrics_by_seed: Sequence[list[dict]], key: str, smooth: bool) -> Curve | None:
    """Align each seed's (step, value) points of `key` on the union of steps and reduce over seeds.

    A step that only some seeds logged is averaged over those seeds. None when no seed logged
    a finite value of `key` (e.g. ``vf_loss`` in a GRPO variant).
    """
    per_seed = []
    for rows in metrics_by_seed:
        steps, values = series(rows, key)
        keep = np.isfinite(values)
        steps, values = steps[keep], values[keep]
        if len(values):
            per_seed.append((steps, moving_average(values) if smooth else values))
    if not per_seed:
        return None
    all_steps = np.unique(np.concatenate([s for s, _ in per_seed]))  # [n_steps]
    grid = np.full((len(per_seed), len(all_steps)), np.nan)  # [n_seeds, n_steps]
    for i, (steps, values) in enumerate(per_seed):
        grid[i, np.searchsorted(all_steps, steps)] = values
    # Every column has at least one seed's value, so the nan-reductions are well defined.
    return Curve(all_steps, np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0), len(per_seed))


def _draw(ax, curves: dict[str, Curve], colours: dict[str, str], markers: bool) -> None:
    for variant, curve in curves.items():
        colour = colours[variant]
        ax.plot(curve.steps, curve.mean, color=colour, marker="o" if markers else None, markersize=3,
                label=f"{variant}{curve.label_suffix} (n={curve.n_seeds})")
        ax.fill_between(curve.steps, curve.low, curve.high, color=colour, alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def _curves(runs_by_variant: dict[str, tuple[list[list[dict]], str]], key: str, smooth: bool) -> dict[str, Curve]:
    curves = {}
    for variant, (metrics_by_seed, suffix) in runs_by_variant.items():
        curve = seed_curve(metrics_by_seed, key, smooth)
        if curve is not None:
            curve.label_suffix = suffix
            curves[variant] = curve
    return curves


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def _figure(width: float, height: float):
    # The object-oriented Figure renders through Agg without pyplot, so making plots never
    # changes the caller's matplotlib backend or opens a window.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _plot_ablation(spec: AblationSpec, runs_by_variant, colours, plot_dir: Path) -> list[tuple[str, str]]:
    """Write this ablation's figures; return (relative path, caption) for each one written."""
    written = []
    band = "shaded band: min–max over seeds"
    base = _safe_name(spec.name)

    curves = _curves(runs_by_variant, "eval_sampled_accuracy", smooth=False)
    if curves:
        figure = _figure(6, 4)
        ax = figure.add_subplot()
        _draw(ax, curves, colours, markers=True)
        ax.set_ylabel("held-out sampled accuracy")
        ax.set_title(f"{spec.name}: learning curves")
        ax.legend(fontsize=8)
        _save(figure, plot_dir / f"{base}_learning_curves.png")
        written.append((f"plots/{base}_learning_curves.png",
                        "Held-out sampled accuracy (temperature 1) at every evaluation step, step 0 = before "
                        f"training. Line: mean over seeds; {band}."))

    # Eval keys are logged every eval_every steps: smoothing 5 of them would blur most of a run.
    smooth_metric = not spec.metric.startswith("eval_")
    curves = _curves(runs_by_variant, spec.metric, smooth=smooth_metric)
    if curves and spec.metric != "eval_sampled_accuracy":  # otherwise it repeats the learning curves
        figure = _figure(6, 4)
        ax = figure.add_subplot()
        _draw(ax, curves, colours, markers=not smooth_metric)
        ax.set_ylabel(spec.metric)
        ax.set_title(f"{spec.name}: {spec.metric}")
        ax.legend(fontsize=8)
        _save(figure, plot_dir / f"{base}_metric.png")
        smoothing = f"moving average over {SMOOTHING_WINDOW} logged steps, " if smooth_metric else ""
        written.append((f"plots/{base}_metric.png",
                        f"`{spec.metric}` vs step ({smoothing}mean over seeds); {band}."))

    if spec.extra_metrics:
        n = len(spec.extra_metrics)
        ncols = min(3, n)
        nrows = -(-n // ncols)
        figure = _figure(4 * ncols, 3 * nrows)
        handles = {}
        for i, key in enumerate(spec.extra_metrics):
            ax = figure.add_subplot(nrows, ncols, i + 1)
            smooth = not key.startswith("eval_")
            curves = _curves(runs_by_variant, key, smooth=smooth)
            _draw(ax, curves, colours, markers=not smooth)
            ax.set_title(key, fontsize=9)
            ax.set_ylabel(key, fontsize=8)
            if not curves:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        if handles:
            figure.axes[0].legend(list(handles.values()), list(handles), fontsize=7)
        _save(figure, plot_dir / f"{base}_extras.png")
        written.append((f"plots/{base}_extras.png",
                        f"Extra metrics vs step (per-step keys: moving average over {SMOOTHING_WINDOW} logged "
                        f"steps), mean over seeds; {band}. An empty panel: no variant logged that key."))
    return written


def _runs_for_plots(sweep_dir: Path, rows: Sequence[dict], variants: Sequence[str]):
    """variant -> (metrics of each seed, legend suffix), using ok runs.

    A variant without a single finished seed falls back to its unfinished runs (labelled
    "incomplete"), so a sweep still in progress already shows its curves.
    """
    result = {}
    for variant in variants:
        runs = [r for r in rows if r["variant"] == variant]
        chosen, suffix = [r for r in runs if r["status"] == "ok"], ""
        if not chosen:
            chosen, suffix = [r for r in runs if r["status"] == "incomplete"], " (incomplete)"
        metrics = [read_metrics(sweep_dir / r["path"]) for r in chosen]
        if any(metrics):
            result[variant] = ([m for m in metrics if m], suffix)
    return result


# ==========================================================================================
# The report
# ==========================================================================================
def _write_csv(path: Path, rows: Sequence[dict], first_columns: Sequence[str]) -> None:
    columns = list(first_columns)
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("; ".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
                             for k, v in row.items()})


def _run_list(entries: Sequence[dict], kind: str) -> str | None:
    items = []
    for e in entries:
        if kind == "failed":
            items += [f"`{e['variant']}/seed{seed}`" + (f" ({error})" if error else "") for seed, error in e["failed"]]
        else:
            items += [f"`{e['variant']}/seed{seed}`" for seed in e["incomplete"]]
    if not items:
        return None
    label = "Failed runs" if kind == "failed" else "Incomplete runs (not in the statistics)"
    return f"**{label} ({len(items)}):** " + "; ".join(items)


def build_report(sweep_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``results.csv``, ``summary.csv``, ``report.md`` and ``plots/*.png``; return report.md's path.

    `out_dir` defaults to the sweep directory, so the report's relative image links work
    wherever the sweep is copied.
    """
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir is not None else sweep_dir
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)

    rows = collect_runs(sweep_dir)
    entries = summarise(rows)
    pairs = paired_differences(rows)
    _write_csv(out_dir / "results.csv", rows, RUN_COLUMNS)
    _write_csv(out_dir / "paired.csv", [{k: v for k, v in p.items() if k != "seeds"} for p in pairs],
               ("ablation", "variant", "base", "column"))
    _write_csv(out_dir / "summary.csv",
               [{**e, "failed": [f"seed{seed}: {error}" for seed, error in e["failed"]],
                 "incomplete": [f"seed{seed}" for seed in e["incomplete"]]} for e in entries],
               ("ablation", "variant"))

    counts = {status: sum(r["status"] == status for r in rows) for status in ("ok", "failed", "incomplete")}
    lines = [
        "# Ablation report",
        "",
        f"Sweep `{sweep_dir}`: {len(rows)} runs ({counts['ok']} ok, {counts['failed']} failed, "
        f"{counts['incomplete']} incomplete). Per-run numbers: `results.csv`; per-variant: `summary.csv`.",
        "",
        "Columns: *final sampled acc* is held-out accuracy at temperature 1 after training, mean over "
        "the ok seeds ± the 95% Student-t half-width (n/a for one seed); *gain* is final minus "
        "initial sampled accuracy; *reward*, *KL* (the configured estimator, possibly clipped), "
        "*true KL (k1)*, *length* (training responses, correct / incorrect) and the ablation's "
        "metric are means over the last 10% of training steps, then over seeds; *wall s* is the "
        "wall time of a run's last session. Every cell is the mean over seeds ± the 95% half-width.",
        "",
        "Conclusions rest on the **paired** tables: variants share seeds, so each variant's difference "
        "from the ablation's base variant is taken seed by seed, and a difference is *separated* only "
        "when its 95% interval excludes 0 (`paired.csv` has every number). The unpaired intervals above "
        "overlap far more often, because they carry the seed-to-seed spread both variants share.",
    ]
    if not rows:
        lines += ["", "No run directories (`<ablation>/<variant>/seed<k>/`) found."]
    reused = [r for r in rows if r.get("reused_from")]
    if reused:
        lines += ["", f"{len(reused)} runs had a config identical to another run's (same seed, every "
                  "field but the output directory) and copy its outputs instead of training again; "
                  "`results.csv` names the source in `reused_from`."]

    for ablation, ablation_entries in _by_ablation(entries).items():
        spec = ablation_spec(ablation)
        variants = [e["variant"] for e in ablation_entries]
        colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
        lines += ["", f"## {ablation}", ""]
        if spec.question:
            lines += [spec.question, ""]
        lines += [f"Metric: `{spec.metric}`.", "", _ablation_table(ablation_entries)]
        paired = _paired_table([p for p in pairs if p["ablation"] == ablation], spec.metric)
        if paired:
            lines += ["", paired]
        for kind in ("failed", "incomplete"):
            listed = _run_list(ablation_entries, kind)
            if listed:
                lines += ["", listed]
        ablation_rows = [r for r in rows if r["ablation"] == ablation]
        plots = _plot_ablation(spec, _runs_for_plots(sweep_dir, ablation_rows, variants), colours, plot_dir)
        if not plots:
            lines += ["", "(no logged metrics to plot)"]
        for relative, caption in plots:
            lines += ["", f"![{Path(relative).stem}]({relative})", "", f"*{caption}*"]

    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ablations.report SWEEP_DIR``: build the report and print the tables."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ablations.report SWEEP_DIR", file=sys.stderr)
        return 2
    report = build_report(args[0])
    print(format_table(args[0]))
    print(f"\nreport: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ablation report: a sweep directory in, a CSV, a markdown table and PNG plots out.

A sweep is laid out as ``SWEEP_DIR/<ablation>/<variant>/seed<k>/``, each leaf an ordinary
run directory (``config.yaml``, ``metrics.jsonl``, ``summary.json`` once the run finished,
``error.txt`` if it failed). This module only reads; it never re-runs anything, so it can
be pointed at a sweep that is still running.

What it answers, per ablation: did the variants differ by more than seed noise? Every
number in the table is therefore a mean over seeds with, for the headline numbers, a 95%
Student-t interval (``mean +- t_{0.975, n-1} * sd / sqrt(n)``). With 3 seeds t is 4.30, so
intervals are wide: that is the honest answer for 3 seeds, not a bug.

The per-run numbers (`collect_runs`) and their columns are described in
`ablations.run_results`; the statistics over seeds and the seed-paired differences live in
`ablations.variant_comparison`, the markdown tables in `ablations.report_tables` and the
plots in `ablations.report_plots`. This module writes them all into the sweep directory
(`build_report`).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Sequence

from .report_plots import SMOOTHING_WINDOW, Curve, _plot_ablation, _runs_for_plots, moving_average, seed_curve
from .report_tables import _ablation_table, _by_ablation, _paired_table, format_table, gain_lines, verdict
from .run_results import (DEFAULT_METRIC, RUN_COLUMNS, SEED_DIR, TAIL_COLUMNS, TAIL_FRACTION_DENOMINATOR,
                          TEXT_COLUMNS, WHOLE_RUN_SUFFIX, AblationSpec, _run_dirs, ablation_spec, collect_runs,
                          read_metrics, run_mean, series, sweep_specs, tail_mean)
from .stats import MIN_PAIRS
from .variant_comparison import PAIRED_COLUMNS, base_variant, paired_differences, summarise


class MixedProvenanceError(ValueError):
    """The runs a report would pool come from different commits or warm starts."""

# What callers import from this module, wherever it is defined now.
__all__ = [
    "DEFAULT_METRIC", "TAIL_FRACTION_DENOMINATOR", "SMOOTHING_WINDOW", "SEED_DIR", "WHOLE_RUN_SUFFIX",
    "PAIRED_COLUMNS", "RUN_COLUMNS", "TAIL_COLUMNS", "TEXT_COLUMNS",
    "AblationSpec", "ablation_spec", "read_metrics", "series", "tail_mean", "run_mean", "collect_runs",
    "base_variant", "paired_differences", "verdict", "summarise", "format_table",
    "moving_average", "Curve", "seed_curve", "build_report", "main", "MixedProvenanceError", "pooled_provenance",
]


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


def pooled_provenance(rows: Sequence[dict], allow_mixed: bool = False) -> str:
    """One line saying what the report pools: commit(s), warm start(s), libraries, threads, CPU.

    Raises `MixedProvenanceError`, unless `allow_mixed`, when the ok runs (those the
    statistics pool) come from more than one commit, or when the runs of one ablation come
    from more than one warm start (its variants are paired by seed, so they must share their
    start). Different ablations may start from different warm starts on purpose (e.g.
    `length_norm_room`'s weak start); the line names each. Runs that recorded no provenance
    count as "unrecorded".
    """
    ok = [r for r in rows if r["status"] == "ok"]

    def recorded(r: dict, column: str) -> str:
        return str(r.get(column, "")) or "unrecorded"

    def values(column: str) -> list[str]:
        return sorted({recorded(r, column) for r in ok})

    combos: dict[tuple, list[str]] = {}
    starts: dict[str, set] = {}
    for r in ok:
        combos.setdefault((recorded(r, "prov_commit"), recorded(r, "prov_warm_start")), []).append(r["path"])
        starts.setdefault(r.get("ablation", ""), set()).add(recorded(r, "prov_warm_start"))
    mixed_starts = sorted(name for name, warm in starts.items() if len(warm) > 1)
    mixed = len(values("prov_commit")) > 1 or bool(mixed_starts)
    if mixed and not allow_mixed:
        listed = "; ".join(f"commit {commit[:12]}, warm start {warm}: {len(paths)} runs (e.g. {paths[0]})"
                           for (commit, warm), paths in sorted(combos.items()))
        within = f" (ablation {', '.join(mixed_starts)} from more than one warm start)" if mixed_starts else ""
        raise MixedProvenanceError(
            f"the runs to pool come from {len(combos)} different (commit, warm start) combinations{within}: "
            f"{listed}. Rerun the older runs on one commit (delete their directories and run the sweep again), "
            "or pass --allow-mixed to pool them anyway (the report then says so)")
    dirty = sum(str(r.get("prov_dirty", "")) == "True" for r in ok)
    reward_models = sorted({str(r.get("prov_reward_model", "")) for r in ok} - {""})  # none for a verifiable task
    line = (f"Pooled {len(ok)} ok runs: commit {', '.join(c[:12] for c in values('prov_commit'))}"
            + (f" ({dirty} with uncommitted changes)" if dirty else "")
            + f"; warm start {', '.join(values('prov_warm_start'))}; torch {', '.join(values('prov_torch'))}, "
            f"transformers {', '.join(values('prov_transformers'))}; threads {', '.join(values('prov_threads'))}; "
            f"CPU {', '.join(values('prov_cpu'))}"
            + (f"; reward model {', '.join(reward_models)}" if reward_models else "") + ".")
    return ("MIXED PROVENANCE (pooled with --allow-mixed). " + line) if mixed else line


class NotASweepError(ValueError):
    """A directory the report refuses: empty, a single run's directory, or no sweep layout."""


# Files at the top of a single run's directory (ppo-train), never of a sweep directory.
RUN_DIR_MARKERS = ("run_files.txt", "metrics.jsonl", "config.yaml", "checkpoints")


def check_sweep_dir(sweep_dir: Path) -> None:
    """Refuse a directory that is not a sweep (before the report writes anything into it).

    A sweep directory holds ``sweep.json`` (written by ``python -m ablations run``) or at
    least one ``<ablation>/<variant>/seed<k>/`` run; a single run's directory is named as such.
    """
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such sweep directory")
    markers = [name for name in RUN_DIR_MARKERS if (sweep_dir / name).exists()]
    if markers:
        above = sweep_dir.resolve().parents[2] if SEED_DIR.match(sweep_dir.name) else None
        raise NotASweepError(
            f"{sweep_dir}: a single run's directory (it holds {', '.join(markers)}), not a sweep; nothing was "
            "written. Point the report at the sweep directory that holds <ablation>/<variant>/seed<k>/ folders"
            + (f" ({above}?)" if above is not None else " (the --out of python -m ablations run)"))
    if not (sweep_dir / "sweep.json").is_file() and not any(True for _ in _run_dirs(sweep_dir)):
        present = sorted(p.name for p in sweep_dir.iterdir())
        held = f"it holds {', '.join(present[:6])}" if present else "it is empty"
        raise NotASweepError(
            f"{sweep_dir}: not a sweep directory ({held}: no sweep.json and no <ablation>/<variant>/seed<k>/ run); "
            "nothing was written. Run a sweep there first (python -m ablations run NAME --out DIR), or point the "
            "report at an existing sweep")


def missing_planned_runs(sweep_dir: Path, rows: Sequence[dict]) -> list[str]:
    """``ablation/variant/seed<k>`` for each run ``sweep.json`` plans that has no directory yet.

    The plan is the recorded ablations x their variants (the registry's, for sweeps recorded
    before sweep.json listed variants) x seeds 1..seeds; a name that is not a plain folder
    name is refused, as where it is registered.
    """
    try:
        plan = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(plan, dict) or type(plan.get("seeds")) is not int:
        return []
    from .registry import ABLATIONS, check_name

    recorded = plan.get("variants") if isinstance(plan.get("variants"), dict) else {}
    first = plan.get("first_seed") if type(plan.get("first_seed")) is int else 1
    present = {(r["ablation"], r["variant"], r["seed"]) for r in rows}
    missing = []
    for ablation in plan.get("ablations", []):
        check_name("sweep.json: ablation", ablation)
        variants = recorded.get(ablation)
        if variants is None and ablation in ABLATIONS:
            variants = [v.name for v in ABLATIONS[ablation].variants]
        for variant in variants or []:
            check_name(f"sweep.json: ablation {ablation!r}: variant", variant)
            missing += [f"{ablation}/{variant}/seed{seed}" for seed in range(first, first + plan["seeds"])
                        if (ablation, variant, seed) not in present]
    return missing


def _definition_line(spec: AblationSpec, variants: Sequence[str]) -> str:
    """Where the ablation's base, metric and variants come from, in one sentence."""
    base = spec.base or sorted(variants)[0]
    if spec.origin == "sweep":
        return f"Base: `{base}`. Definition stored with the sweep: `{spec.name}/ablation.yaml`."
    if spec.origin == "registry":
        return (f"Base: `{base}`. Definition from the registry (`python -m ablations list`): none is stored "
                "with this sweep.")
    return (f"No definition: `{spec.name}` is neither stored with this sweep nor registered, so the metric is "
            f"the default `{DEFAULT_METRIC}` and every variant is paired with `{base}`, the first by name.")


def build_report(sweep_dir: str | Path, out_dir: str | Path | None = None, allow_mixed: bool = False) -> Path:
    """Write ``results.csv``, ``summary.csv``, ``report.md`` and ``plots/*.png``; return report.md's path.

    `out_dir` defaults to the sweep directory, so the report's relative image links work
    wherever the sweep is copied. Runs from different commits or warm starts are refused
    (`pooled_provenance`) unless `allow_mixed`.
    """
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir is not None else sweep_dir
    plot_dir = out_dir / "plots"
    check_sweep_dir(sweep_dir)  # before anything is written there
    rows = collect_runs(sweep_dir)
    provenance_line = pooled_provenance(rows, allow_mixed)
    missing = missing_planned_runs(sweep_dir, rows)
    plot_dir.mkdir(parents=True, exist_ok=True)
    specs = sweep_specs(sweep_dir, (r["ablation"] for r in rows))
    entries = summarise(rows, specs)
    pairs = paired_differences(rows, specs=specs)
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
        provenance_line,
        "",
        "Columns: *final sampled acc* is held-out accuracy at temperature 1 after training, mean over "
        "the ok seeds ± the 95% Student-t half-width (n/a for one seed); *gain* is final minus "
        "initial sampled accuracy; *reward*, *KL in use* (`kl`: the configured estimator, possibly "
        "clipped, the KL the run was penalised with), *true KL* (`kl_k1`: the unclipped k1 estimate), "
        "*length* (training responses, correct / incorrect) and the ablation's metric (marked "
        "*(metric)*) are means over the last 10% of training steps, then over seeds; *wall s* is the "
        "wall time of a run's last session. Every cell is the mean over seeds ± the 95% half-width.",
        "",
        "Conclusions rest on the **paired** tables: variants share seeds, so each variant's difference "
        "from the ablation's base variant is taken seed by seed, and a difference is *separated* only "
        f"when its 95% interval excludes 0 (`paired.csv` has every number). A verdict needs at least {MIN_PAIRS} "
        "seed pairs (2 pairs estimate the spread from one degree of freedom: two equal differences give "
        "a ± 0 interval) and differences that are not all equal; otherwise it reads *too few seeds* or "
        "*zero spread*. The unpaired intervals above "
        "overlap far more often, because they carry the seed-to-seed spread both variants share.",
    ]
    if not rows:
        lines += ["", "No run directories (`<ablation>/<variant>/seed<k>/`) found."]
    if missing:
        lines += ["", f"**Planned runs not started ({len(missing)}; `sweep.json` plans them, no directory "
                  "exists; rerun the sweep's command to run them):** " + "; ".join(f"`{m}`" for m in missing)]
    reused = [r for r in rows if r.get("reused_from")]
    if reused:
        lines += ["", f"{len(reused)} runs had a config identical to another run's (same seed, every "
                  "field but the output directory) and copy its outputs instead of training again; "
                  "`results.csv` names the source in `reused_from`."]

    for ablation, ablation_entries in _by_ablation(entries).items():
        spec = specs[ablation]
        variants = [e["variant"] for e in ablation_entries]
        colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
        lines += ["", f"## {ablation}", ""]
        if spec.question:
            lines += [spec.question, ""]
        lines += [f"Metric: `{spec.metric}`. {_definition_line(spec, variants)}", "", _ablation_table(ablation_entries)]
        if not any(e["metric_value_n"] for e in ablation_entries):
            lines += ["", f"No run has a value of the metric `{spec.metric}`: it is neither a column of "
                      "`results.csv` nor a key any run logged to metrics.jsonl (or no run finished)."]
        paired = _paired_table([p for p in pairs if p["ablation"] == ablation], spec.metric)
        if paired:
            lines += ["", paired]
        else:
            base = base_variant(ablation, variants, spec)
            if not any(e["variant"] == base and e["n_ok"] for e in ablation_entries):
                lines += ["", f"No paired table: the base variant `{base}` has no finished run."]
        gains = gain_lines(rows, ablation)
        if gains:
            lines += ["", gains]
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
    allow_mixed = "--allow-mixed" in args
    args = [a for a in args if a != "--allow-mixed"]
    if len(args) != 1:
        print("usage: python -m ablations.report SWEEP_DIR [--allow-mixed]", file=sys.stderr)
        return 2
    report = build_report(args[0], allow_mixed=allow_mixed)
    print(format_table(args[0]))
    print(f"\nreport: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reading a sweep's run directories: one row of numbers per run (`collect_runs`).

A sweep is laid out as ``SWEEP_DIR/<ablation>/<variant>/seed<k>/``, each leaf an ordinary
run directory (``config.yaml``, ``metrics.jsonl``, ``summary.json`` once the run finished,
``error.txt`` if it failed). Reading never re-runs anything, so it can be pointed at a sweep
that is still running. Each ablation's description (`ablation_spec`: the definition stored
with the sweep, else the registry's) says which metrics a row carries.

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
    late_sampled_accuracy       mean held-out sampled accuracy over the evaluations in the
                                second half of the run (step >= total_steps / 2, the final
                                one included): averages evaluation and late-training noise
    late_accuracy_gain          late_sampled_accuracy - initial sampled accuracy
    reward, kl, kl_k1, entropy  training means over the last 10% of steps (``kl`` is the
                                configured, possibly clipped, estimator; ``kl_k1`` the
                                unclipped k1 estimate, i.e. the "true" sampled KL)
    response_length_correct,
    response_length_incorrect   training response lengths, same last-10% window
    wall_seconds, samples       from summary.json (wall time of the last session only)
    metric, metric_value        the ablation's own metric: its name, and its value (the row's
                                column of that name, else the key's last-10% mean)
    reused_from                 for a run copied from an identical run (see the runner):
                                that run's path relative to the sweep directory (``../SWEEP/...``
                                for a run of another sweep); "" for a run that trained
    warnings                    summary.json's warnings, one per line: settings the run
                                accepted but never read ("" for none)
    prov_commit, prov_dirty, prov_warm_start, prov_torch, prov_transformers, prov_python,
    prov_threads, prov_cpu, prov_processes, prov_reward_model
                                the run's provenance from summary.json (`ppo.run.provenance`):
                                which code, warm start, libraries, threads, machine and
                                reward model
                                ("" for runs that recorded none)
    <extra metric keys>         each extra metric of the ablation, last-10% mean
    <extra metric key>:all      ... and its mean over every training step (`run_mean`)

"Last 10% of steps" means the last ``ceil(n / 10)`` (at least one) of the training steps
(step >= 1) on which the key was logged. Averaging a window rather than reading the last
step damps single-step noise; restricting to steps that logged the key makes the same rule
work for sparse keys such as ``eval_*`` (then it is the last evaluation(s)).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ppo.run.provenance import FIELDS as PROVENANCE_FIELDS

from .columns import RUN_COLUMNS, TAIL_COLUMNS, TEXT_COLUMNS, WHOLE_RUN_SUFFIX  # noqa: F401  (imported from here too)
from .stats import as_float as _as_float

DEFAULT_METRIC = "eval_sampled_accuracy"
TAIL_FRACTION_DENOMINATOR = 10  # "last 10% of steps"
SEED_DIR = re.compile(r"^seed(\d+)$")
# ==========================================================================================
# The ablation's description (stored with the sweep, the registry's, or a named fallback)
# ==========================================================================================
@dataclass(frozen=True)
class AblationSpec:
    """What the report needs to know about one ablation, and where that came from."""

    name: str
    question: str = ""
    metric: str = DEFAULT_METRIC
    extra_metrics: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()  # preferred display order; variants on disk but not here go last
    base: str = ""  # the variant the others are paired with ("": the first by name, for a sweep no one described)
    origin: str = "default"  # "sweep" (stored with it), "registry", or "default" (neither knew it)
    claims: tuple = ()  # claims stored with the sweep's definition (`ablations.claims.Claim`)


def _spec_of(ablation, origin: str) -> AblationSpec:
    variants = tuple(getattr(v, "name", str(v)) for v in (getattr(ablation, "variants", None) or ()))
    return AblationSpec(
        name=ablation.name,
        question=getattr(ablation, "question", "") or "",
        metric=getattr(ablation, "metric", None) or DEFAULT_METRIC,
        extra_metrics=tuple(getattr(ablation, "extra_metrics", None) or ()),
        variants=variants,
        base=variants[0] if variants else "",
        origin=origin,
        claims=tuple(getattr(ablation, "claims", None) or ()) if origin == "sweep" else (),
    )


def ablation_spec(name: str, sweep_dir: str | Path | None = None) -> AblationSpec:
    """The description of ablation `name`: the definition stored in `sweep_dir`
    (``<name>/ablation.yaml``, `ablations.ablation_files`), else the registry's, else a neutral
    default (metric `DEFAULT_METRIC`, base the first variant by name) that the report names.

    A stored definition wins over the registry: it is what the sweep ran, even if the
    registry has changed since. One that cannot be read raises `ValueError` naming the file:
    its results are never reported against another base or metric. The registry is imported
    lazily so the report works on any sweep directory (copied from another machine, made by
    hand, or of an ablation since renamed) and without the registry.
    """
    if sweep_dir is not None:
        from .ablation_files import read_stored

        stored = read_stored(sweep_dir, name)
        if stored is not None:
            return _spec_of(stored, "sweep")
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
    return _spec_of(ablation, "registry")


def sweep_specs(source: str | Path, names: Iterable[str]) -> dict[str, AblationSpec]:
    """`ablation_spec` of each of `names` for a sweep directory or its ``results.csv`` (whose
    folder is the sweep directory)."""
    source = Path(source)
    directory = source if source.is_dir() else source.parent
    return {name: ablation_spec(name, directory) for name in dict.fromkeys(names)}


def seed_values(rows: Sequence[dict], ablation: str, variant: str, column: str,
                seeds: Sequence[int] | None = None) -> dict[int, float]:
    """Seed -> `column` (a float, NaN if blank) of the finished runs of one arm, optionally only at `seeds`."""
    return {r["seed"]: _as_float(r.get(column)) for r in rows
            if r["ablation"] == ablation and r["variant"] == variant and r["status"] == "ok"
            and (seeds is None or r["seed"] in seeds)}


def spec_for(name: str, specs: "dict[str, AblationSpec] | None") -> AblationSpec:
    """`specs[name]` when given, else `ablation_spec(name)` (the registry's description)."""
    if specs is not None and name in specs:
        return specs[name]
    return ablation_spec(name)


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


def late_mean(rows: Sequence[dict], key: str, total_steps: float) -> float:
    """Mean of `key` over the steps in the second half of the run (step >= total_steps / 2, and
    step >= 1) that logged a finite value: for sparse held-out keys, the late evaluations.

    Worked example: 60 steps evaluated every 10: steps 30, 40, 50 and 60 count, so accuracies
    [..., 0.40, 0.42, 0.44, 0.46] give 0.43. NaN when no such step logged it.
    """
    steps, values = series(rows, key, min_step=1)
    if not math.isfinite(total_steps):
        total_steps = float(steps.max()) if len(steps) else 0.0
    window = values[(steps >= total_steps / 2) & np.isfinite(values)]
    return float(window.mean()) if len(window) else float("nan")


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
    return os.path.relpath(source, sweep_dir.resolve())  # no machine's absolute path in results.csv


def _run_row(sweep_dir: Path, ablation: str, variant: str, seed: int, run_dir: Path,
             spec: AblationSpec) -> dict:
    rows = read_metrics(run_dir)
    summary = _read_json(run_dir / "summary.json")
    error_path = run_dir / "error.txt"
    error_lines = error_path.read_text(errors="replace").strip().splitlines() if error_path.is_file() else []
    total_steps = _configured_total_steps(run_dir)
    steps = max((int(r["step"]) for r in rows), default=0)

    summary_steps = _as_float(summary.get("steps"))
    # The runner's rule (ablations.sweep_plan.complete_summary): a summary of the planned steps
    # with a final evaluation; a summary.json that is truncated, empty or not an object is none.
    complete = (isinstance(summary.get("final_eval"), dict) and not math.isnan(summary_steps)
                and (math.isnan(total_steps) or summary_steps >= total_steps))
    if complete:
        steps = int(summary_steps)  # the steps the run really ran
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
    late = late_mean(rows, "eval_sampled_accuracy", total_steps)
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
        "late_sampled_accuracy": late,
        "late_accuracy_gain": late - initial,
        **{key: tail_mean(rows, key) for key in TAIL_COLUMNS},
        "wall_seconds": _as_float(summary.get("wall_seconds_this_session")),
        "samples": _whole(_as_float(summary.get("samples"))),
        "metric": spec.metric,
        "metric_value": float("nan"),  # below: a column of this row, or a logged key
        "reused_from": _reused_from(sweep_dir, run_dir),
        # Settings the run accepted but never read (ppo/settings/config_checks.py), one per line.
        "warnings": "\n".join(summary.get("warnings") or []),
        **{f"prov_{name}": (summary.get("provenance") or {}).get(name, "") for name in PROVENANCE_FIELDS},
    }
    # A metric that is a column of the row (final_sampled_accuracy, accuracy_gain ...) is that
    # column; any other is a metrics.jsonl key, averaged over the last 10% of steps.
    row["metric_value"] = (_as_float(row[spec.metric]) if spec.metric in row and spec.metric not in TEXT_COLUMNS
                           else tail_mean(rows, spec.metric))
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
        if ablation not in specs:
            specs[ablation] = ablation_spec(ablation, sweep_dir)
        result.append(_run_row(sweep_dir, ablation, variant, seed, run_dir, specs[ablation]))
    return result


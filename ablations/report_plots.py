"""The report's PNG plots (``plots/``), drawn through matplotlib's Agg without pyplot.

Per ablation: held-out sampled accuracy vs step at every evaluation;
the ablation's metric vs step (moving average over 5 logged points for per-step keys);
one small-multiple figure for the extra metrics. Lines are means over seeds; the shaded
band is the min-max over seeds, which with 3 seeds shows every seed rather than pretending
to estimate a standard deviation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .run_results import AblationSpec, read_metrics, series

SMOOTHING_WINDOW = 5  # moving-average width (logged points) for per-step curves


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



"""A run directory between attempts: resumed from its checkpoint or cleared, or filled from
an identical complete run instead of training (`copy_run`).

A run whose directory holds a complete checkpoint written under the same config (the
fields in `ablations.sweep_plan.RESUME_IGNORED_FIELDS` aside) continues with ``--resume``;
any other leftovers are cleared, ``stdout.log`` kept (`prepare_run_dir`). A run whose config
equals a complete run's (`config_fingerprint`) gets that run's outputs and ``reused_from.txt``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ppo.config import PPOConfig

from .sweep_plan import (REUSE_IGNORED_FIELDS, RESUME_IGNORED_FIELDS, RunOutcome, RunSpec, complete_summary,
                         config_fingerprint)

# Written into a run directory whose outputs were copied from an identical run.
REUSED_FROM = "reused_from.txt"


def _has_resumable_checkpoint(spec: RunSpec) -> bool:
    """A complete checkpoint (state.json is written last) made under the same config."""
    checkpoints = [c for c in (spec.run_dir / "checkpoints").glob("step_*") if (c / "state.json").is_file()]
    saved = spec.run_dir / "config.yaml"
    if not checkpoints or not saved.is_file():
        return False
    try:
        previous = PPOConfig.from_yaml(saved)
    except (ValueError, TypeError, OSError):
        return False
    return config_fingerprint(previous, RESUME_IGNORED_FIELDS) == config_fingerprint(spec.config, RESUME_IGNORED_FIELDS)


def check_inside_sweep(spec: RunSpec) -> None:
    """Refuse a run directory that leads out of its sweep through a symbolic link (the sweep
    clears a run's leftovers, and would clear whatever the link points to)."""
    sweep_dir = spec.run_dir.parents[2]
    expected = Path(os.path.realpath(sweep_dir), spec.ablation, spec.variant, f"seed{spec.seed}")
    real = Path(os.path.realpath(spec.run_dir))
    if real != expected:
        raise OSError(f"{spec.run_dir}: leads to {real} through a symbolic link; the sweep clears and writes only "
                      "its own folders, so this run is left alone. Replace the link with a folder")


def prepare_run_dir(spec: RunSpec) -> bool:
    """Make `spec.run_dir` ready for an attempt; True when the attempt should ``--resume``.

    Leftovers of an earlier attempt are cleared (the trainer refuses to start over an
    existing metrics.jsonl), except stdout.log, which is appended to across attempts.
    """
    check_inside_sweep(spec)
    resume = spec.run_dir.is_dir() and _has_resumable_checkpoint(spec)
    if spec.run_dir.is_dir() and not resume:
        for entry in spec.run_dir.iterdir():
            if entry.name == "stdout.log":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    (spec.run_dir / "error.txt").unlink(missing_ok=True)
    spec.config.to_yaml(spec.run_dir / "requested_config.yaml")
    return resume


def completed_runs_by_fingerprint(sweep_dir: Path) -> dict[str, Path]:
    """Fingerprint -> run directory for every complete run under `sweep_dir` (any ablation).

    Runs that are themselves copies are indexed too (their config.yaml is rewritten with
    their own output_dir), so a copy of a copy still names a complete run. A config.yaml that
    no longer parses (written by an older version) is ignored: that run is never reused.
    """
    index: dict[str, Path] = {}
    for summary in sorted(Path(sweep_dir).glob("*/*/seed*/summary.json")):
        run_dir = summary.parent
        if complete_summary(run_dir) is None:  # a damaged summary, or a run stopped early: never copied
            continue
        index.setdefault(config_fingerprint(PPOConfig.from_yaml(run_dir / "config.yaml")), run_dir)
    return index


def copy_run(source: Path, spec: RunSpec) -> RunOutcome:
    """Fill `spec.run_dir` with the outputs of the identical complete run in `source`.

    Checkpoints stay behind (a complete run never resumes). summary.json, the marker of a
    complete run, is copied last, through a temporary name, so an interrupted copy is an
    incomplete run that the next sweep redoes.
    """
    start = time.perf_counter()
    try:
        prepare_run_dir(spec)
        skip = {"checkpoints", "summary.json", "stdout.log", "requested_config.yaml", "error.txt", REUSED_FROM}
        for entry in source.iterdir():
            if entry.name in skip:
                continue
            if entry.is_dir():
                shutil.copytree(entry, spec.run_dir / entry.name)
            else:
                shutil.copy2(entry, spec.run_dir / entry.name)
        spec.config.to_yaml(spec.run_dir / "config.yaml")  # same config, this run's output_dir
        (spec.run_dir / REUSED_FROM).write_text(
            f"{source.resolve()}\nThis run's config equals that run's in every field but "
            f"{', '.join(REUSE_IGNORED_FIELDS)}; its outputs were copied instead of training again.\n")
        partial = spec.run_dir / "summary.json.partial"
        shutil.copy2(source / "summary.json", partial)
        os.replace(partial, spec.run_dir / "summary.json")
    except OSError as error:
        return RunOutcome(spec, "failed", None, error=f"could not copy identical run {source}: {error}")
    return RunOutcome(spec, "reused", 0, seconds=time.perf_counter() - start, reused_from=source)

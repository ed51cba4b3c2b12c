"""What a sweep runs: one `RunSpec` per (ablation, variant, seed), and what came of each.

`plan_runs` lays the runs out (``SWEEP_DIR/<ablation>/<variant>/seed<k>/``, seeds from 1),
`refuse_identical_arms` refuses variants that would train the same run (`effective_config`),
`sweep_config` gives each the config a sweep trains it with, `tracked_config` the labels a
tracker groups it by, and `config_fingerprint` says
when two configs compute the same thing (a run resumed from a checkpoint, or copied from an
identical run). `RunOutcome` and `SweepResult` are what `ablations.runner.run_sweep` returns.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ppo.config import PPOConfig

if TYPE_CHECKING:
    from .registry import Ablation

DEFAULT_SEEDS = 3  # seeds of a sweep whose command and ablation name none

# Config fields that may differ between a checkpoint and a resumed attempt: they change how
# fast a run goes, what it prints, or how its (same) directory is spelled, not what it computes.
# ``compile_forward`` is one of them: compiled kernels round differently, as threads do.
# Where a run reports (`TRACKER_FIELDS`) is among them too.
TRACKER_FIELDS = ("report_to", "tracker_project", "run_name", "run_group", "run_tags")
RESUME_IGNORED_FIELDS = ("threads", "compile_forward", "retain_freed_memory", "progress", "output_dir", *TRACKER_FIELDS)
# Config fields that may differ between two runs that compute the same thing (for reuse).
# ``threads`` is not among them: reductions split over a different number of threads round
# differently, and over many sampled steps that changes the run. A run copied from an
# identical one is not sent to the trackers (``run --no-reuse`` trains and sends every run).
REUSE_IGNORED_FIELDS = ("output_dir", "progress", *TRACKER_FIELDS)


@dataclass
class RunSpec:
    """One run of a sweep: which variant and seed, where it lives, and its full config."""

    ablation: str
    variant: str
    seed: int
    run_dir: Path
    config: PPOConfig

    @property
    def label(self) -> str:
        return f"{self.ablation}/{self.variant}/seed{self.seed}"

    @property
    def complete(self) -> bool:
        """Whether the run finished as planned: a valid summary of this config's steps
        (`complete_summary`), not merely a file called summary.json."""
        return complete_summary(self.run_dir, self.config) is not None


@dataclass
class RunOutcome:
    """What happened to one run in this invocation: 'ok', 'failed', 'skipped' or 'reused'."""

    spec: RunSpec
    status: str
    returncode: int | None = None
    error: str = ""  # first line of error.txt for failed runs
    seconds: float = 0.0
    resumed: bool = False
    reused_from: Path | None = None  # for 'reused': the run directory the outputs came from


@dataclass
class SweepResult:
    sweep_dir: Path
    outcomes: list[RunOutcome] = field(default_factory=list)

    def _with(self, status: str) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def completed(self) -> list[RunOutcome]:
        return self._with("ok")

    @property
    def skipped(self) -> list[RunOutcome]:
        return self._with("skipped")

    @property
    def failed(self) -> list[RunOutcome]:
        return self._with("failed")

    @property
    def reused(self) -> list[RunOutcome]:
        return self._with("reused")

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        lines = [f"sweep {self.sweep_dir}: {len(self.completed)} completed, {len(self.skipped)} skipped "
                 f"(already complete), {len(self.reused)} copied from an identical run, "
                 f"{len(self.failed)} failed, {len(self.outcomes)} runs in all"]
        for outcome in self.failed:
            lines.append(f"  FAILED {outcome.spec.run_dir}: {outcome.error}")
        if self.failed:
            lines.append("  (see error.txt and stdout.log in each run dir; rerun the same command to retry)")
        return "\n".join(lines)


def complete_summary(run_dir: Path, planned: PPOConfig | None = None) -> dict | None:
    """The run's summary when the run in `run_dir` is complete, else None.

    Complete: ``summary.json`` is a JSON object recording ``steps`` equal to the run's
    ``total_steps`` and a final evaluation, and, given the `planned` config, the run's
    ``config.yaml`` equals it (`RESUME_IGNORED_FIELDS` aside: threads, trackers, the spelling of
    the directory). A truncated, empty or ``[]`` summary, a run stopped early, or one trained
    under another ``--steps`` or config is incomplete and is run again.
    """
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
        stored = PPOConfig.from_yaml(Path(run_dir) / "config.yaml")
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(summary, dict) or not isinstance(summary.get("final_eval"), dict):
        return None
    if type(summary.get("steps")) is not int or summary["steps"] != stored.total_steps:
        return None
    if planned is not None and (config_fingerprint(stored, RESUME_IGNORED_FIELDS)
                                != config_fingerprint(planned, RESUME_IGNORED_FIELDS)):
        return None
    return summary


# ---------------------------------------------------------------------------------- planning
def resolve_ablation(ablation: "str | Ablation") -> "Ablation":
    """A registry name or an `Ablation` object -> the `Ablation`."""
    if isinstance(ablation, str):
        from .registry import get_ablation

        return get_ablation(ablation)
    return ablation


def plan_runs(ablation: "str | Ablation", seeds: int, steps: int | None, sweep_dir: str | Path,
              first_seed: int = 1) -> list[RunSpec]:
    """Every (variant, seed) of `ablation` for `seeds` seeds from `first_seed` (default 1:
    seeds 1..`seeds`), variant-major.

    Seeds start at 1 so that seed 0 (the PPOConfig default, used by tests and quick runs)
    never silently doubles as a sweep seed. A later `first_seed` gives fresh seeds, e.g. for
    a claim re-registered to be tested on seeds no earlier test saw.
    """
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer (got {seeds!r})")
    if not isinstance(first_seed, int) or first_seed < 1:
        raise ValueError(f"first_seed must be a positive integer (got {first_seed!r})")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer or None (got {steps!r})")
    from .registry import check_name

    ablation = resolve_ablation(ablation)
    check_name("ablation", ablation.name)  # names become folders: never a path out of the sweep
    specs = []
    for variant in ablation.variants:
        check_name(f"ablation {ablation.name!r}: variant", variant.name)
        for seed in range(first_seed, first_seed + seeds):
            run_dir = Path(sweep_dir) / ablation.name / variant.name / f"seed{seed}"
            config = ablation.config(variant, seed=seed, output_dir=str(run_dir), steps=steps)
            specs.append(RunSpec(ablation.name, variant.name, seed, run_dir, config))
    return specs


# ---------------------------------------------------------------------------------- configs
def sweep_config(config: PPOConfig, threads: int, compile_forward: bool = False) -> PPOConfig:
    """A run's config as a sweep trains it: `threads` torch threads and, with
    `compile_forward` (``run --compile``), PPOConfig.compile_forward for every run that uses
    the lean forward it compiles (the others keep their module calls)."""
    config = config.replace(threads=threads)
    if compile_forward and config.lean_forward:
        config = config.replace(compile_forward=True)
    return config


def tracked_config(spec: RunSpec, sweep_name: str, report_to: list[str] | None = None) -> PPOConfig:
    """`spec`'s config labelled for experiment trackers: named ``<sweep>/<ablation>/<variant>/seed<k>``,
    grouped by ``<sweep>/<ablation>/<variant>`` and tagged with sweep, ablation, variant and seed,
    so a tracker's UI can group and filter the sweep's runs by variant (ppo/run/trackers.py).
    `report_to` (``run --report-to``) replaces the config's own list when given."""
    config = spec.config.replace(
        run_name=f"{sweep_name}/{spec.label}", run_group=f"{sweep_name}/{spec.ablation}/{spec.variant}",
        run_tags={**spec.config.run_tags, "sweep": sweep_name, "ablation": spec.ablation, "variant": spec.variant,
                  "seed": spec.seed})
    return config if report_to is None else config.replace(report_to=list(report_to))


def config_fingerprint(config: PPOConfig, ignored: tuple[str, ...] = REUSE_IGNORED_FIELDS) -> str:
    """A canonical string of every config field but `ignored`: equal strings, same computation.

    The default ignores what two identical runs may differ in (reuse); resuming a run passes
    `RESUME_IGNORED_FIELDS`.
    """
    values = config.to_dict()
    for name in ignored:
        values.pop(name, None)
    return json.dumps(values, sort_keys=True, default=str)


def effective_config(config: PPOConfig) -> dict:
    """What `config` computes, as a dict: every field but those that cannot change a run
    (outputs, logging, trackers: `ppo.settings.liveness.NO_EFFECT_BY_NATURE`), and every setting the
    configuration never reads (`ppo.settings.config_checks.inert_settings`) put back to its default.
    Two configs with equal effective configs train the same run."""
    from ppo.settings.config_checks import inert_settings
    from ppo.settings.liveness import NO_EFFECT_BY_NATURE

    values = config.to_dict()
    defaults = PPOConfig().to_dict()
    for name, _ in inert_settings(config):
        values[name] = defaults[name]
    for name in (*NO_EFFECT_BY_NATURE, "seed"):
        values.pop(name, None)
    return values


def refuse_identical_arms(specs: list[RunSpec]) -> None:
    """Raise ValueError when two variants of one ablation resolve to the same effective
    configuration (after the preset, the testbed scaling and inert settings): comparing
    them could only report "no difference" for a detail that never acted. Names the
    variants, the fields they differ in on paper, and why those do nothing."""
    from ppo.settings.config_checks import inert_settings
    from ppo.settings.liveness import NO_EFFECT_BY_NATURE

    arms: dict[tuple[str, str], RunSpec] = {}
    for spec in specs:
        arms.setdefault((spec.ablation, spec.variant), spec)  # one seed per variant says it
    seen: dict[tuple[str, str], RunSpec] = {}
    clashes = []
    for (ablation, variant), spec in arms.items():
        # Arms that differ in their seed offset (`Variant.seed_offset`: an A/A pair) are distinct on purpose.
        offset = spec.config.seed - spec.seed
        key = (ablation, offset, json.dumps(effective_config(spec.config), sort_keys=True, default=str))
        other = seen.setdefault(key, spec)
        if other is spec:
            continue
        mine, theirs = spec.config.to_dict(), other.config.to_dict()
        differing = sorted(name for name in mine if mine[name] != theirs[name] and name not in REUSE_IGNORED_FIELDS)
        reasons = {**{name: f"{name} sets {what}, which trains nothing" for name, what in NO_EFFECT_BY_NATURE.items()},
                   **dict(inert_settings(other.config)), **dict(inert_settings(spec.config))}
        why = "; ".join(reasons[name] for name in differing if name in reasons)
        clashes.append(f"{ablation}: variants {other.variant!r} and {variant!r} resolve to the same effective "
                       f"configuration; they differ only in {differing or 'nothing'}" + (f" ({why})" if why else ""))
    if clashes:
        raise ValueError("identical arms, refused before any run:\n  " + "\n  ".join(clashes)
                         + "\nmake the variants differ in a setting that acts, or drop one of them")


def select_variants(ablations: list, wanted: "list[str] | None") -> list:
    """`ablations` keeping only the `wanted` variants plus each one's base (first) variant,
    and only the claims whose two arms both run: a claim on a variant left out cannot be
    tested on this sweep, and the definition the sweep stores must name only its own variants.

    A name no selected ablation has is an error, so a typo does not silently run nothing.
    """
    if not wanted:
        return ablations
    known = {variant.name for ablation in ablations for variant in ablation.variants}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValueError(f"--variants: no ablation given has {', '.join(unknown)} (variants: {', '.join(sorted(known))})")
    selected = []
    for ablation in ablations:
        variants = tuple(v for i, v in enumerate(ablation.variants) if i == 0 or v.name in wanted)
        names = {v.name for v in variants}
        claims = tuple(c for c in ablation.claims if c.first[0] in names and c.second[0] in names)
        selected.append(dataclasses.replace(ablation, variants=variants, claims=claims))
    return selected

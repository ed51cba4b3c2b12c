"""Rebuild docs/results.md from scratch: every sweep behind it, then every generated table.

``python -m ablations reproduce [--dry-run] [--workers 2] [--out sweeps/results]``

1. Prints the plan (`PLAN`: which ablations, variants and seeds) and its projected time:
   the runs already complete in the sweep directory cost nothing (the runner skips them), nor
   do runs identical to another of the plan (copied); each distinct config still to train is
   built and timed for a few steps (`ablations.estimate`, a minute or two in all).
   ``--dry-run`` stops here.
2. Builds the reward model of ``alpacafarm_overoptimization`` if the cache lacks it
   (``python -m ppo.tasks.rlhf build``; before the timing, so its runs are timed too), then runs
   each step of the plan into one sweep directory (`ablations.runner.run_sweep`: complete
   runs skipped, identical runs copied, failed ones retried on the next call), and builds
   that directory's report.
3. Only when every run is complete: copies the sweep's ``results.csv`` over the committed
   data and its report and plots to docs/results/reruns/, and rewrites every generated
   block of docs/results.md from it (``python -m ablations claims DATA --update
   docs/results.md``). A sweep with failures changes no doc.

Every run starts from the pinned warm start and records its provenance (commit, warm start,
library versions, threads, CPU) in ``results.csv``; the report refuses to pool runs of
different commits unless ``--allow-mixed`` is given, so a partly rerun sweep says so.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "results" / "data" / "results.csv"
DOC = ROOT / "docs" / "results.md"
REPORT_DIR = ROOT / "docs" / "results" / "reruns"  # the sweep's report, linked from docs/results.md
STEPS = 60  # every run of the plan: 60 steps x 64 samples = 3840 samples


@dataclass(frozen=True)
class SweepStep:
    """One `run` command of the plan: these ablations (only `variants` and each one's base
    when given) at seeds 1..`seeds`."""

    ablations: tuple[str, ...]
    seeds: int = 5
    variants: tuple[str, ...] | None = None

    def command(self, out: str) -> str:
        variants = f" --variants {' '.join(self.variants)}" if self.variants else ""
        return (f"python -m ablations run {' '.join(self.ablations)}{variants} --seeds {self.seeds} "
                f"--steps {STEPS} --out {out}")


# What docs/results.md's generated tables rest on: every arm of every claim of
# ablations/claims.py with its registered seeds, and amended seeds (tests/test_claims.py
# checks it); --variants keeps to those arms where an ablation has more. The sweeps of the
# implementation details have reports of their own, each with its command.
PLAN: tuple[SweepStep, ...] = (
    SweepStep(("grpo_std_norm",), seeds=10, variants=("no_std",)),  # the amended std-division test: 10 seeds
    SweepStep(("length_norm", "length_norm_room", "kimi_length_reward", "kl_clip_at_zero")),
    SweepStep(("ppo_vs_grpo",), variants=("grpo", "dr_grpo", "grpo_critic", "dr_grpo_rloo")),
    SweepStep(("difficulty_filter",), variants=("renormalize", "resample")),
    SweepStep(("gamma_lambda",), variants=("g099_l095",)),
    SweepStep(("alpacafarm_overoptimization",), variants=("kl_0.2",)),
)


def planned_specs(sweep_dir: Path, plan: tuple[SweepStep, ...] = PLAN) -> list:
    """Every run of the plan as the runner would make it (`RunSpec`s, complete ones marked),
    each (ablation, variant, seed) once."""
    from .registry import ABLATIONS
    from .sweep_plan import plan_runs, select_variants

    specs, seen = [], set()
    for step in plan:
        for ablation in select_variants([ABLATIONS[name] for name in step.ablations],
                                        list(step.variants) if step.variants else None):
            for spec in plan_runs(ablation, step.seeds, STEPS, sweep_dir):
                if spec.label not in seen:
                    seen.add(spec.label)
                    specs.append(spec)
    return specs


def projected_seconds(specs: list, threads: int = 1, timed_steps: int = 2) -> list:
    """`ablations.estimate.RunEstimate`s of the runs still to train, one per distinct config.

    Runs the runner would copy (the same config as another run of the plan) are not counted;
    each distinct config is built and timed here, at seed 1, for a few steps
    (`ablations.estimate.time_run`), so the projection is this code's on this machine."""
    import importlib
    import time

    from .estimate import time_run
    from .sweep_plan import config_fingerprint, sweep_config

    start = time.perf_counter()
    importlib.import_module("ppo.trainer")
    startup = time.perf_counter() - start
    trained: dict[str, object] = {}
    for spec in specs:
        if not spec.complete:
            trained.setdefault(config_fingerprint(spec.config), spec)
    groups: dict[str, list] = {}
    for spec in trained.values():
        groups.setdefault(config_fingerprint(spec.config.replace(seed=1)), []).append(spec)
    estimates = []
    for done, group in enumerate(groups.values(), start=1):
        first = group[0]
        config = sweep_config(first.config.replace(seed=1), threads)
        try:
            estimates.append(time_run(first.ablation, first.variant, config, len(group), timed_steps, startup))
        except Exception as error:  # e.g. the reward model not built yet (--dry-run builds nothing)
            print(f"  not timed {done}/{len(groups)}: {first.ablation}/{first.variant} ({len(group)} runs, left "
                  f"out of the projection): {type(error).__name__}: {str(error)[:160]}", flush=True)
            continue
        print(f"  timed {done}/{len(groups)}: {first.ablation}/{first.variant} "
              f"{estimates[-1].run_seconds:.0f} s per run", flush=True)
    return estimates


def plan_text(specs: list, estimates: list, workers: int, out: str) -> str:
    """The plan and its projected time, as printed before anything runs."""
    done = sum(spec.complete for spec in specs)
    trained = sum(e.runs for e in estimates)
    lines = ["The sweeps behind docs/results.md:", ""]
    lines += [f"    {step.command(out)}" for step in PLAN]
    lines += ["", f"{len(specs)} runs: {done} complete, {trained} to train, "
                  f"{len(specs) - done - trained} to copy from an identical run."]
    if estimates:
        lines += ["", markdown_table(["ablation", "variant", "runs to train", "projected s per run"],
                                     [[e.ablation, e.variant, e.runs, f"{e.run_seconds:.0f}"] for e in estimates])]
        serial = sum(e.seconds for e in estimates)
        lines.append(f"\nProjected: {serial / 60:.0f} min of runs, about {serial / 60 / workers:.0f} min on "
                     f"{workers} workers (runs sharing a machine are slower than alone).")
    return "\n".join(lines)


def copy_report(sweep_dir: Path, out: Path) -> None:
    """The sweep's report.md, paired.csv, summary.csv and plots/ into `out` (same names
    replaced; nothing else there removed). The per-run data is the committed results.csv."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("report.md", "paired.csv", "summary.csv"):
        shutil.copyfile(sweep_dir / name, out / name)
    shutil.copytree(sweep_dir / "plots", out / "plots", dirs_exist_ok=True)


def clean_tree_or_override(allow_dirty: bool, report_dir: Path) -> bool:
    """True when the source tree is a clean commit, or `allow_dirty` says to go on anyway (then
    ``reproduce.json`` in `report_dir` records that these results came from uncommitted code).

    Results written for the docs must name code a reader can check out: every run records its
    commit, and a dirty tree's commit is not the code that ran.
    """
    import json

    from ppo.run.provenance import source_version

    commit, dirty = source_version()
    if dirty and not allow_dirty:
        print(f"reproduce: the working tree has uncommitted changes (at {commit[:12]}): results for the docs "
              "must come from a commit. Commit or stash them, or pass --allow-dirty (recorded).", file=sys.stderr)
        return False
    if dirty:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "reproduce.json").write_text(json.dumps({"commit": commit, "dirty": True,
                                                               "allow_dirty": True}, indent=1) + "\n")
        print(f"reproduce: --allow-dirty: running uncommitted code at {commit[:12]} (recorded in "
              f"{report_dir / 'reproduce.json'})", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations reproduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="sweeps/results", help="the sweep directory (default: sweeps/results)")
    parser.add_argument("--workers", type=int, default=2, help="concurrent runs (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its projected time, run nothing")
    parser.add_argument("--data", default=str(DATA), help="the committed results.csv the tables are made from")
    parser.add_argument("--doc", default=str(DOC), help="the markdown file whose generated blocks are rewritten")
    parser.add_argument("--report-dir", default=str(REPORT_DIR),
                        help="where the sweep's report.md, paired.csv, summary.csv and plots/ are copied")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="report runs of different commits or warm starts together (refused by default)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run from a working tree with uncommitted changes (refused by default: the docs' "
                             "results must name a commit; the override is recorded in the report directory)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        parser.error("--workers and --threads must be at least 1")
    if not args.dry_run and not clean_tree_or_override(args.allow_dirty, Path(args.report_dir)):
        return 2
    from ppo.tasks.rlhf import is_built, reward_model_path
    from ppo.tasks.rlhf import main as build_reward_model

    if not args.dry_run and not is_built(reward_model_path()):  # shipped: built only where not pinned
        build_reward_model(["build"])  # alpacafarm_overoptimization's reward model (cached)
    sweep_dir = Path(args.out)
    specs = planned_specs(sweep_dir.absolute())
    print("Timing each distinct run still to train (a few steps each) ...", flush=True)
    print(plan_text(specs, projected_seconds(specs, args.threads), args.workers, args.out), flush=True)
    if args.dry_run:
        return 0

    from . import claims
    from .report import MixedProvenanceError, build_report
    from .runner import run_sweep
    from .sweep_plan import select_variants
    from .registry import ABLATIONS

    failed = []
    for step in PLAN:
        print(f"\n$ {step.command(args.out)}", flush=True)
        ablations = select_variants([ABLATIONS[name] for name in step.ablations],
                                    list(step.variants) if step.variants else None)
        result = run_sweep(ablations, sweep_dir, seeds=step.seeds, steps=STEPS, workers=args.workers,
                           threads=args.threads)
        failed += [outcome.spec.label for outcome in result.failed]
    if failed:
        print(f"\n{len(failed)} runs failed ({', '.join(failed)}): docs unchanged. Run the same command again "
              f"to retry them.", file=sys.stderr)
        return 1
    try:
        build_report(sweep_dir, allow_mixed=args.allow_mixed)
    except MixedProvenanceError as error:
        print(f"error: {error}: docs unchanged", file=sys.stderr)
        return 1
    shutil.copyfile(sweep_dir / "results.csv", args.data)
    copy_report(sweep_dir, Path(args.report_dir))
    print(f"\ncopied {sweep_dir / 'results.csv'} -> {args.data}, its report -> {args.report_dir}")
    status = claims.main([args.data, "--update", args.doc])
    if status == 0 and "power" in claims.block_names(Path(args.doc).read_text()):
        from . import power

        status = power.main([args.data, "--update", args.doc])  # the new runs are the next pilot
    return status


if __name__ == "__main__":
    raise SystemExit(main())

"""Rebuild docs/results.md from scratch: every sweep behind its claims, then every generated table.

``python -m ablations reproduce [--dry-run] [--workers 2] [--out sweeps/results]``

The plan (`PLAN`) is one sweep per ablation of the registered claims (ablations/claims.py), at
the seeds its claims were registered with. Each step's results are committed on their own, in
``docs/results/reruns/<ablation>/``, so a rerun that takes several sittings keeps what it has:

1. Prints the plan and its projected time. A step whose committed results already hold every
   planned run (clean provenance, the samples the plan's config trains) is done and costs
   nothing; in the others, runs already complete in the sweep directory cost nothing (the
   runner skips them), nor do runs identical to another of the plan (copied); each distinct
   config still to train is built and timed for
   a few steps (`ablations.estimate`, a minute or two in all). ``--dry-run`` stops here.
2. Builds the reward model of ``alpacafarm_overoptimization`` if the cache lacks it
   (``python -m ppo.tasks.rlhf build``; before the timing, so its runs are timed too), then runs
   each step still to do into ``OUT/<ablation>`` (`ablations.runner.run_sweep`: complete runs
   skipped, runs identical to a complete one of any step copied, failed ones retried on the
   next call). A step whose runs
   all finished gets its report, and its ``results.csv``, report and plots are copied to
   ``docs/results/reruns/<ablation>/`` (commit them: the next call skips that step).
3. Only when every step is done: writes the union of the steps' ``results.csv`` over the
   committed data, the index ``docs/results/reruns/README.md``, and rewrites every generated
   block of docs/results.md from it (``python -m ablations claims DATA --update docs/results.md``,
   then the power table with the new runs as the next pilot).

Every run starts from the pinned warm start and records its provenance (commit, warm start,
library versions, threads, CPU) in ``results.csv``. A step's report refuses to pool runs of
different commits unless ``--allow-mixed`` is given; steps committed at different commits are
different sweeps, each of one commit, which the index lists.
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
REPORT_DIR = ROOT / "docs" / "results" / "reruns"  # one directory per step, indexed by its README.md
STEPS = 60  # every run of the plan: 60 steps x 64 samples = 3840 (ppo_vs_grpo: x 128 = 7680)


@dataclass(frozen=True)
class SweepStep:
    """One `run` command of the plan: `ablation` (only `variants` and its base when given) at
    seeds 1..`seeds`, into its own sweep directory ``OUT/<ablation>``."""

    ablation: str
    seeds: int = 5
    variants: tuple[str, ...] | None = None

    def command(self, out: str) -> str:
        variants = f" --variants {' '.join(self.variants)}" if self.variants else ""
        return (f"python -m ablations run {self.ablation}{variants} --seeds {self.seeds} "
                f"--steps {STEPS} --out {out}/{self.ablation}")


# What docs/results.md's generated tables rest on: every arm of every claim of
# ablations/claims.py up to the highest seed its claims registered (tests/test_claims.py checks it);
# --variants keeps to those arms where an ablation has more. Cheapest first, so that a sitting
# cut short has finished whole steps. The sweeps of the implementation details have reports
# of their own, each with its command.
PLAN: tuple[SweepStep, ...] = (
    SweepStep("grpo_std_norm", seeds=14, variants=("no_std",)),
    SweepStep("length_norm_room", seeds=5),
    SweepStep("kimi_length_reward", seeds=7),
    SweepStep("difficulty_filter", seeds=6, variants=("renormalize", "resample")),
    SweepStep("gamma_lambda", seeds=7, variants=("g099_l095",)),
    SweepStep("length_norm", seeds=10),
    SweepStep("ppo_vs_grpo", seeds=7, variants=("grpo", "dr_grpo", "grpo_critic", "dr_grpo_rloo")),
    SweepStep("alpacafarm_overoptimization", seeds=8, variants=("kl_0.2",)),
    SweepStep("kl_clip_at_zero", seeds=15),
)


def step_ablation(step: SweepStep):
    """The registry's ablation of `step`, kept to its variants (and their base) when it names some."""
    from .registry import ABLATIONS
    from .sweep_plan import select_variants

    (ablation,) = select_variants([ABLATIONS[step.ablation]], list(step.variants) if step.variants else None)
    return ablation


def step_specs(step: SweepStep, sweep_dir: Path) -> list:
    """Every run of one step as the runner would make it in ``sweep_dir`` (`RunSpec`s,
    complete ones marked)."""
    from .sweep_plan import plan_runs

    return plan_runs(step_ablation(step), step.seeds, STEPS, sweep_dir)


def planned_specs(sweep_dir: Path, plan: tuple[SweepStep, ...] = PLAN) -> list:
    """Every run of the plan as the runner would make it (`RunSpec`s, complete ones marked),
    each step in its own ``sweep_dir/<ablation>``."""
    return [spec for step in plan for spec in step_specs(step, sweep_dir / step.ablation)]


def committed_step(step: SweepStep, report_dir: Path = REPORT_DIR) -> str | None:
    """Why `step` is done (its committed ``results.csv`` in ``report_dir/<ablation>`` holds every
    planned run, finished, from a clean commit, with the samples the plan's config trains:
    a run at another rollout batch or length is not the planned run), else None."""
    from .claims import read_results

    path = report_dir / step.ablation / "results.csv"
    if not path.is_file():
        return None
    rows = read_results(path)
    ablation = step_ablation(step)
    configs = {variant.name: ablation.config(variant, 1, "unused") for variant in ablation.variants}
    done = {(r["variant"], r["seed"]) for r in rows if r["status"] == "ok" and str(r.get("prov_dirty")) == "False"
            and r["variant"] in configs and _planned_samples(r.get("samples"), configs[r["variant"]])}
    planned = {(variant.name, seed) for variant in ablation.variants for seed in range(1, step.seeds + 1)}
    if not planned <= done:
        return None
    commits = sorted({str(r.get("prov_commit", ""))[:12] for r in rows})
    return f"{len(planned)} runs committed in {path} (commit {', '.join(commits)})"


def _planned_samples(recorded, config) -> bool:
    """Whether a run that recorded `recorded` samples trained what `config` plans: `STEPS` rollout
    batches, or more responses where the config resamples groups (it generates extra rounds)."""
    planned = STEPS * config.rollout_batch_size
    try:
        recorded = float(recorded)
    except (TypeError, ValueError):
        return False
    resamples = config.difficulty_filter and config.difficulty_filter_mode == "resample"
    return recorded >= planned if resamples else recorded == planned


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


def plan_text(specs: list, estimates: list, workers: int, out: str, done: dict[str, str] | None = None) -> str:
    """The plan and its projected time, as printed before anything runs; `done` maps a step's
    ablation to why it is skipped (`committed_step`)."""
    done = done or {}
    lines = ["The sweeps behind docs/results.md:", ""]
    lines += [f"    {step.command(out)}" + (f"    # done: {done[step.ablation]}" if step.ablation in done else "")
              for step in PLAN]
    complete = sum(spec.complete for spec in specs)
    trained = sum(e.runs for e in estimates)
    lines += ["", f"{len(done)} of {len(PLAN)} steps done; {len(specs)} runs in the others: {complete} complete, "
                  f"{trained} to train, {len(specs) - complete - trained} to copy from an identical run."]
    if estimates:
        lines += ["", markdown_table(["ablation", "variant", "runs to train", "projected s per run"],
                                     [[e.ablation, e.variant, e.runs, f"{e.run_seconds:.0f}"] for e in estimates])]
        serial = sum(e.seconds for e in estimates)
        lines.append(f"\nProjected: {serial / 60:.0f} min of runs, about {serial / 60 / workers:.0f} min on "
                     f"{workers} workers (runs sharing a machine are slower than alone).")
    return "\n".join(lines)


def copy_report(sweep_dir: Path, out: Path) -> None:
    """The sweep's results.csv, report.md, paired.csv, summary.csv, plots/ and each ablation's
    stored definition (``<ablation>/ablation.yaml``) into `out` (same names replaced; nothing
    else there removed)."""
    from .ablation_files import DEFINITION_FILE

    out.mkdir(parents=True, exist_ok=True)
    for name in ("results.csv", "report.md", "paired.csv", "summary.csv"):
        shutil.copyfile(sweep_dir / name, out / name)
    shutil.copytree(sweep_dir / "plots", out / "plots", dirs_exist_ok=True)
    for definition in sweep_dir.glob(f"*/{DEFINITION_FILE}"):
        (out / definition.parent.name).mkdir(exist_ok=True)
        shutil.copyfile(definition, out / definition.parent.name / DEFINITION_FILE)


def merge_results(paths: list[Path], out: Path) -> int:
    """The rows of every ``results.csv`` in `paths`, in order, as one ``results.csv`` at `out`
    (the union of their columns, in order of first appearance; a column a file lacks is
    empty); returns the row count."""
    import csv

    columns: list[str] = []
    rows: list[dict] = []
    for path in paths:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            columns += [c for c in reader.fieldnames or () if c not in columns]
            rows += list(reader)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def index_text(report_dir: Path) -> str:
    """``docs/results/reruns/README.md``: each step's report with its runs and commit."""
    from .claims import read_results

    lines = ["# The claims' sweeps", "",
             "One sweep per ablation of the registered claims (`ablations/claims.py`), written by "
             "`python -m ablations reproduce`; [results.md](../../results.md) tests the claims on their union, "
             "[`../data/results.csv`](../data/results.csv).", "",
             "| ablation | command | runs | commit | report |", "|---|---|---|---|---|"]
    for step in PLAN:
        rows = read_results(report_dir / step.ablation / "results.csv")
        commits = ", ".join(sorted({str(r.get("prov_commit", ""))[:12] for r in rows}))
        lines.append(f"| `{step.ablation}` | `{step.command('sweeps/results')}` | {len(rows)} | {commits} | "
                     f"[report]({step.ablation}/report.md) |")
    return "\n".join(lines) + "\n"


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
    sweep_dir, report_dir = Path(args.out), Path(args.report_dir)
    try:
        done = {step.ablation: why for step in PLAN if (why := committed_step(step, report_dir))}
    except ValueError as error:  # a damaged committed results.csv: named, nothing run
        print(f"error: {error}", file=sys.stderr)
        return 2
    todo = [step for step in PLAN if step.ablation not in done]
    specs = planned_specs(sweep_dir.absolute(), tuple(todo))
    print("Timing each distinct run still to train (a few steps each) ...", flush=True)
    print(plan_text(specs, projected_seconds(specs, args.threads), args.workers, args.out, done), flush=True)
    if args.dry_run:
        return 0

    from . import doc_tables
    from .doc_blocks import block_names
    from .report import MixedProvenanceError, build_report
    from .runner import run_sweep

    failed = []
    for step in todo:
        print(f"\n$ {step.command(args.out)}", flush=True)
        step_dir = sweep_dir / step.ablation
        others = [sweep_dir / other.ablation for other in PLAN if other != step and (sweep_dir / other.ablation).is_dir()]
        result = run_sweep([step_ablation(step)], step_dir, seeds=step.seeds, steps=STEPS, workers=args.workers,
                           threads=args.threads, reuse_from=others)  # a run identical to another step's is copied
        if result.failed:
            failed += [outcome.spec.label for outcome in result.failed]
            continue
        try:
            build_report(step_dir, allow_mixed=args.allow_mixed)
        except MixedProvenanceError as error:
            print(f"error: {step.ablation}: {error}: not copied", file=sys.stderr)
            failed.append(step.ablation)
            continue
        copy_report(step_dir, report_dir / step.ablation)
        print(f"copied {step_dir}'s results and report -> {report_dir / step.ablation} (commit it: the next "
              f"call skips this step)", flush=True)
    if failed:
        print(f"\n{len(failed)} runs or steps failed ({', '.join(failed)}): their steps are not done and docs are "
              f"unchanged. Run the same command again to retry them.", file=sys.stderr)
        return 1
    count = merge_results([report_dir / step.ablation / "results.csv" for step in PLAN], Path(args.data))
    (report_dir / "README.md").write_text(index_text(report_dir))
    print(f"\nwrote {count} runs of {len(PLAN)} steps -> {args.data}, their index -> {report_dir / 'README.md'}")
    status = doc_tables.main([args.data, "--update", args.doc])
    if status == 0 and "power" in block_names(Path(args.doc).read_text()):
        from . import power

        status = power.main([args.data, "--update", args.doc])  # the new runs are the next pilot
    return status

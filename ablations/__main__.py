"""``python -m ablations``: list the named ablations, sweep them over seeds, report them.

Commands::

    python -m ablations list
    python -m ablations run NAME|FILE.yaml [...] [--seeds 3] [--steps N] [--workers N] [--threads N] [--out DIR] [--no-reuse]
                            [--variants VARIANT ...] [--compile]
                            [--backend local|ray|slurm] [--address auto] [--cpus-per-run N] [--gpus-per-run N]
    python -m ablations report DIR
    python -m ablations claims RESULTS [--update docs/results.md]
    python -m ablations estimate NAME|FILE.yaml|all [--seeds 3] [--timed-steps 2] [--json FILE] [--compile]
    python -m ablations noise SWEEP_DIR [--draws 4] [--samples-per-prompt 1,16] [--seeds 5] [--json FILE]
    python -m ablations aa SWEEP_DIR [--verdict-seeds 5] [--json FILE]
    python -m ablations power [RESULTS] [--update docs/results.md]
    python -m ablations budget-claims DIR [--update docs/results.md]

``run`` takes registered ablations or ablation files (YAML/TOML, `ablations.ablation_files`)
and writes one ``ppo-train`` run directory per variant x seed under ``DIR/<ablation>/``
(default ``DIR = sweeps/<first NAME>``), with the ablation's definition beside them
(``DIR/<ablation>/ablation.yaml``, which ``report`` and ``claims`` read), skips runs that are already complete and retries
failed ones (see `ablations.runner`), then builds the report: ``results.csv``,
``report.md`` (mean and spread over seeds) and ``plots/`` in DIR. ``--backend ray`` runs each
run as a task on a Ray cluster, ``--backend slurm`` as a Slurm job (`ablations.backends`).

The speed and memory benchmarks moved to ``python -m ppo.benchmarks bench|speed|memory``
(`ppo.benchmarks`); ``python -m ablations bench|speed|memory`` says so and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ppo.settings.suggest import SuggestingParser, did_you_mean

# Exit code for a bad command line (unknown ablation, missing directory), as argparse uses.
USAGE_ERROR = 2


def _known_ablations() -> dict:
    """Name -> Ablation, from the registry (imported here so ``bench`` does not need it)."""
    from .registry import ABLATIONS

    return ABLATIONS


def _unknown_names_message(unknown: list[str], known: dict) -> str:
    listing = "\n".join(f"  {name}" for name in sorted(known))
    return (f"unknown ablation{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}\n"
            f"known ablations (python -m ablations list):\n{listing}")


def cmd_list(args: argparse.Namespace) -> int:
    ablations = _known_ablations()
    if not ablations:
        print("no ablations registered")
        return 0
    width = max(len(name) for name in ablations)
    for name, ablation in ablations.items():
        count = len(ablation.variants)
        print(f"{name:<{width}}  {count:>2} variant{'s' if count != 1 else ' '}  {ablation.question}")
    from .registry import DATA_PARALLEL_ONLY

    print("\nacting only across processes (each run of a sweep is one process), shown by a test instead:")
    for field, test in DATA_PARALLEL_ONLY.items():
        print(f"  {field}: {test}")
    return 0


def _build_and_show_report(sweep_dir: Path, allow_mixed: bool = False) -> int:
    """Build results.csv, report.md and plots/; print the tables, what they pool, and where the files are."""
    from .report import build_report, collect_runs, format_table, missing_planned_runs, pooled_provenance

    try:
        report_path = Path(build_report(sweep_dir, allow_mixed=allow_mixed))
    except (ValueError, FileNotFoundError) as error:  # e.g. a directory with no finished runs, mixed runs
        print(f"report: {error}", file=sys.stderr)
        return 1
    print(format_table(sweep_dir))
    missing = missing_planned_runs(sweep_dir, collect_runs(sweep_dir))
    if missing:
        print(f"\nplanned runs not started ({len(missing)}): {', '.join(missing)}")
    print("\n" + pooled_provenance(collect_runs(sweep_dir), allow_mixed))
    print(f"\nreport: {report_path}")
    print(f"plots:  {report_path.parent / 'plots'}")
    return 0


def _resolve(names: list[str], out: str | None) -> tuple[list, Path]:
    """The ablations a ``run`` names, and the sweep directory.

    Each NAME is an ablation file (``.yaml``, ``.yml``, ``.toml``: read, checked and
    registered), a registered ablation, or one whose definition the sweep directory stores
    (``--out``, default ``sweeps/<first NAME>``): an ablation file's sweep continues by name.
    Raises ValueError for an unusable file, LookupError for unknown names (the known ones
    listed, the closest suggested).
    """
    from .ablation_files import is_ablation_file, load_ablation_file, read_stored

    files = {name: load_ablation_file(name) for name in names if is_ablation_file(name)}
    first = files[names[0]].name if names[0] in files else names[0]
    sweep_dir = Path(out) if out else Path("sweeps") / first
    known = _known_ablations()
    ablations, unknown = [], []
    for name in names:
        if name in files:
            ablations.append(files[name])
        elif name in known:
            ablations.append(known[name])
        elif (stored := read_stored(sweep_dir, name) if sweep_dir.is_dir() else None) is not None:
            ablations.append(stored)
        else:
            unknown.append(name)
    if unknown:
        hints = "".join(f"\n{name}{did_you_mean(name, known)}" for name in unknown if did_you_mean(name, known))
        raise LookupError(_unknown_names_message(unknown, known) + hints
                          + "\nan ablation file is named by its path (e.g. my_ablation.yaml)")
    return ablations, sweep_dir


def cmd_run(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.names))
    try:
        from .sweep_plan import select_variants

        ablations, sweep_dir = _resolve(names, args.out)
        ablations = select_variants(ablations, args.variants)
    except LookupError as error:
        print(error, file=sys.stderr)
        return USAGE_ERROR
    except ValueError as error:
        print(f"run: {error}", file=sys.stderr)
        return USAGE_ERROR
    from ppo.run.trackers import TrackerError

    from .backends import BackendUnavailable, SweepDirNotShared, make_backend
    from .runner import run_sweep

    try:
        backend = make_backend(args.backend, workers=args.workers, address=args.address,
                               cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run,
                               partition=args.partition, time_min=args.time_min)
        result = run_sweep(ablations, sweep_dir, seeds=args.seeds, steps=args.steps,
                           workers=args.workers, threads=args.threads, timeout=args.timeout, progress=True, reuse=not args.no_reuse,
                           backend=backend, compile_forward=args.compile, report_to=_tracker_names(args.report_to),
                           first_seed=args.first_seed)
    except (ValueError, BackendUnavailable, TrackerError) as error:
        print(f"run: {error}", file=sys.stderr)
        return USAGE_ERROR
    except SweepDirNotShared as error:
        print(f"run: sweep stopped: {error}\nComplete runs are kept; rerun the same command once every "
              f"node sees the directory.", file=sys.stderr)
        return 1
    if not result.completed and not result.skipped:
        print("no run completed: nothing to report", file=sys.stderr)
        return 1
    print()
    status = _build_and_show_report(sweep_dir, args.allow_mixed)
    # A sweep with failed runs still gets its report (from the runs that finished), but the
    # exit code says it is incomplete so scripts do not mistake it for a full result.
    return 1 if result.failed else status


def _tracker_names(values: list[str] | None) -> list[str] | None:
    """``--report-to mlflow wandb`` or ``--report-to mlflow,wandb`` -> the list; 'none' -> []."""
    if values is None:
        return None
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    return [] if names == ["none"] else names


def cmd_report(args: argparse.Namespace) -> int:
    sweep_dir = Path(args.dir)
    if not sweep_dir.is_dir():
        print(f"{sweep_dir}: no such sweep directory", file=sys.stderr)
        return USAGE_ERROR
    return _build_and_show_report(sweep_dir, args.allow_mixed)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text})")
    return value


def _positive_seconds(text: str) -> float:
    """A number of seconds > 0 (a limit of 0 or less would kill every run at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}; leave --timeout out for no limit")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(prog="python -m ablations", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="the named ablations: variants and the question each asks")
    listing.set_defaults(handler=cmd_list)

    run = commands.add_parser("run", help="sweep ablations over variants x seeds, then build the report")
    run.add_argument("names", nargs="+", metavar="NAME", help="ablation name(s) (see `list`) or ablation file(s) "
                     "(my.yaml / my.toml: docs/sweeps.md, 'Your own ablation')")
    run.add_argument("--seeds", type=_positive_int, default=None,
                     help="seeds per variant (1..N; default: the ablation file's `seeds`, else 3)")
    run.add_argument("--first-seed", type=_positive_int, default=1,
                     help="the first seed (default 1): --first-seed 7 --seeds 8 runs seeds 7-14, fresh seeds for "
                          "a claim re-registered after an earlier test (its pilot) used seeds 1-6")
    run.add_argument("--steps", type=_positive_int, default=None,
                     help="RL steps per run (default: the ablation's own, else the preset's testbed value)")
    run.add_argument("--workers", type=_positive_int, default=None,
                     help="concurrent runs (local default: one per CPU core, each with cpu_count // workers "
                          "threads; ray default: as many as the cluster fits; slurm default: 32 jobs)")
    run.add_argument("--threads", type=_positive_int, default=None,
                     help="torch threads per run (default: cpu_count // workers); set it on a machine shared with other jobs")
    run.add_argument("--compile", action="store_true",
                     help="compile every run's forward passes (PPOConfig.compile_forward): about 40 s per run with "
                          "inductor's disk cache warm (2-3 minutes for the first run on a machine; needs a C++ "
                          "compiler), then faster steps; pays on long runs of the AlpacaFarm preset "
                          "(docs/performance.md; `estimate --compile` projects it)")
    run.add_argument("--timeout", type=_positive_seconds, default=None, help="seconds before a run is killed and marked failed")
    run.add_argument("--variants", nargs="+", metavar="VARIANT", default=None,
                     help="run only these variants (of every NAME that has them); each ablation's base variant, "
                          "its first, always runs, since the report compares every variant with it")
    run.add_argument("--no-reuse", action="store_true",
                     help="train every run, even one whose config equals a complete run's in the sweep dir "
                          "(by default such a run copies that run's outputs)")
    run.add_argument("--report-to", nargs="+", metavar="TRACKER", default=None,
                     help="send every run to these trackers (PPOConfig.report_to: tensorboard, wandb, mlflow, "
                          "trackio; 'none' for metrics.jsonl only), grouped by sweep/ablation/variant and tagged "
                          "with sweep, ablation, variant and seed (default: each run's own report_to)")
    run.add_argument("--out", default=None, help="sweep directory (default: sweeps/<first NAME>); on a "
                     "cluster it must be on a filesystem every node sees at the same path")
    run.add_argument("--backend", choices=("local", "ray", "slurm"), default="local",
                     help="where runs execute: local processes (default), Ray tasks on a Ray cluster, "
                          "or Slurm jobs through submitit")
    run.add_argument("--address", default=None,
                     help="ray: the cluster to join ('auto': the one `ray start` made on this node); "
                          "default: start a local one")
    run.add_argument("--cpus-per-run", type=_positive_int, default=None,
                     help="ray/slurm: CPUs reserved for each run, also its torch threads (default 1)")
    run.add_argument("--gpus-per-run", type=int, default=None,
                     help="ray/slurm: GPUs reserved for each run (default: 1 if the run's config says "
                          "device: cuda, else 0)")
    run.add_argument("--partition", default=None, help="slurm: the partition to submit to")
    run.add_argument("--time-min", type=_positive_int, default=None,
                     help="slurm: each job's time limit in minutes (default 120)")
    run.add_argument("--allow-mixed", action="store_true",
                     help="report even when the runs come from different commits or warm starts (refused by default)")
    run.set_defaults(handler=cmd_run)

    report = commands.add_parser("report", help="build results.csv, report.md and plots/ for a sweep directory")
    report.add_argument("dir", metavar="DIR")
    report.add_argument("--allow-mixed", action="store_true",
                        help="pool runs from different commits or warm starts (refused by default; the report says so)")
    report.set_defaults(handler=cmd_report)

    # Listed for --help only: main() hands these and everything after them to their modules (DELEGATED).
    commands.add_parser("claims", help="the lecture's claims and the at-a-glance lines, verdicts computed from a "
                        "sweep (python -m ablations claims --help)", add_help=False)
    commands.add_parser("estimate", help="a sweep's serial time, projected from a few timed steps of each run "
                        "(python -m ablations estimate --help)", add_help=False)
    commands.add_parser("noise", help="split a sweep's variance into evaluation and training noise; the smallest "
                        "difference N seeds detect (python -m ablations noise --help)", add_help=False)
    commands.add_parser("aa", help="the verdicts' false-positive rate from an A/A sweep (python -m ablations aa --help)",
                        add_help=False)
    commands.add_parser("power", help="the seeds each registered claim's test needs for 80%% power, from a pilot "
                        "(python -m ablations power --help)", add_help=False)
    commands.add_parser("budget-claims", help="Qwen3's thinking-budget scaling as registered claims, tested on "
                        "checkpoints' budget curves (python -m ablations budget-claims --help)", add_help=False)
    commands.add_parser("reproduce", help="rerun (or find complete) every sweep behind docs/results.md and "
                        "regenerate its tables (python -m ablations reproduce --help)", add_help=False)
    return parser


# Commands with their own parser: main() hands everything after the name to the module's main.
DELEGATED = {"claims": "doc_tables", "estimate": "estimate", "reproduce": "reproduce", "noise": "noise", "aa": "aa",
             "power": "power", "budget-claims": "budget_claims"}
# Commands that moved to `python -m ppo.benchmarks` (the benchmarks measure the loop, not a toggle).
MOVED_TO_BENCHMARKS = ("bench", "speed", "memory")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in MOVED_TO_BENCHMARKS:
        print(f"python -m ablations {argv[0]} moved: run python -m ppo.benchmarks {argv[0]} (same arguments)",
              file=sys.stderr)
        return USAGE_ERROR
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(f".{DELEGATED[argv[0]]}", __package__)
        return module.main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the runs are stopped; say so, no traceback
        what = "SIGTERM" if type(stop).__name__ == "SweepInterrupted" else "interrupted"
        print(f"\nablations: {what}: stopped; every running run was stopped and complete runs are kept. "
              "Run the same command again to go on from here.", file=sys.stderr)
        return 130 if what == "interrupted" else 143


if __name__ == "__main__":
    sys.exit(main())

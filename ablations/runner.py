"""The sweep runner: every variant of one or more ablations x seeds, one process per run.

A sweep directory holds one ordinary ``ppo-train`` run directory per (ablation, variant, seed)::

    SWEEP_DIR/sweep.json                          what was asked for (ablations, seeds, steps, command,
                                                  the backend and the threads every run was given)
    SWEEP_DIR/<ablation>/ablation.yaml            the ablation's definition: base, metric, variants,
                                                  claims (`ablations.ablation_files`)
    SWEEP_DIR/<ablation>/<variant>/seed<k>/       one run: config.yaml, metrics.jsonl, summary.json ...
        requested_config.yaml                     the config the runner launched it with
        stdout.log                                everything the run printed, appended per attempt
        error.txt                                 only after a failed attempt: exit code + stderr tail

Each run is a separate ``python -m ppo.cli`` process, so a crash, an out-of-memory kill or a
hung run costs one run, not the sweep, and each run gets a fresh interpreter (no state shared
between runs through torch's global RNG or thread settings). Where that process runs is the
backend's business (`ablations.backends`): on this machine by default, where the runs share
the CPU evenly (each gets ``threads = max(1, cpu_count // workers)`` torch threads, unless ``threads``
is given: a machine shared with other jobs), or on
the nodes of a Ray cluster or as Slurm jobs (each gets ``cpus_per_run`` threads). Everything
below is decided here, in the driver, once for all backends.

Rerunning the same command continues a sweep:

- a run whose ``summary.json`` records the planned steps under the planned config is
  complete and is skipped (`ablations.sweep_plan.complete_summary`); a truncated or empty
  summary, or a run of another ``--steps`` or config, is incomplete and runs again;
- a run that failed (``error.txt``) or was interrupted is redone. If its directory holds a
  complete checkpoint written under the same config (``threads``, ``progress`` and the
  spelling of ``output_dir`` aside, which do not change the algorithm), it continues with
  ``--resume``; otherwise its directory is cleared (``stdout.log`` kept, so earlier attempts
  stay readable) and it starts from scratch, because a half-written ``metrics.jsonl`` from
  another config would silently mix two runs.

A failing run never stops the sweep: it gets ``error.txt`` and is listed as failed in the
`SweepResult`. A run whose worker or node died is failed the same way (the driver writes its
``error.txt``), after Ray's own retries. A killed sweep (Ctrl-C, a killed driver, a dead node)
is finished by rerunning the same command: complete runs are skipped, the rest resume or
restart. A run's process dies with the process that started it (``PR_SET_PDEATHSIG`` on
Linux), so a killed sweep leaves no run training in the background.

Identical runs are trained once. Ablations share variants (the unmodified preset is the base
row of many of them), and a run is a deterministic function of its config: same config,
same seed, same thread count, same numbers. So before launching a run the runner looks for
a complete run anywhere in the sweep directory whose ``config.yaml`` equals the requested
config in every field except ``output_dir`` and ``progress`` (`config_fingerprint`). If it
finds one it copies that run's outputs (all but checkpoints) into the new run directory and
writes ``reused_from.txt`` naming the source; the report lists such runs. Two identical runs
planned in the same sweep are trained once: the second waits for the first and copies it
(or trains itself if the first failed). ``reuse=False`` turns this off.

The pieces live in modules of their own: planning runs and their outcomes in
`ablations.sweep_plan`, a run directory's resume-or-clear rule and the copying of identical
runs in `ablations.run_dirs`, a run process's lifetime (dying with its parent, being
stopped) in `ablations.run_process`, one attempt at a run as every backend executes it
(lock, resume or clear, launch) in `ablations.run_attempt`. This module drives the sweep.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .run_attempt import STDERR_TAIL_LINES, attempt_run, launch_run, run_command
from .run_dirs import REUSED_FROM, completed_runs_by_fingerprint, copy_run, prepare_run_dir
from .run_process import PR_SET_PDEATHSIG, STOP_GRACE_SECONDS, SweepInterrupted, _raise_interrupted, code_roots
from .sweep_plan import (DEFAULT_SEEDS, RESUME_IGNORED_FIELDS, REUSE_IGNORED_FIELDS, RunOutcome, RunSpec, SweepResult,
                         config_fingerprint, plan_runs, refuse_identical_arms, resolve_ablation, sweep_config,
                         tracked_config)

if TYPE_CHECKING:
    from .backends import Backend
    from .registry import Ablation

# What callers import from this module, wherever it is defined now.
__all__ = [
    "STDERR_TAIL_LINES", "RESUME_IGNORED_FIELDS", "REUSE_IGNORED_FIELDS", "REUSED_FROM", "PR_SET_PDEATHSIG",
    "STOP_GRACE_SECONDS", "RunSpec", "RunOutcome", "SweepResult", "SweepInterrupted", "resolve_ablation",
    "plan_runs", "sweep_config", "config_fingerprint", "prepare_run_dir", "run_command", "code_roots",
    "launch_run", "attempt_run", "completed_runs_by_fingerprint", "copy_run", "run_sweep",
]

# ---------------------------------------------------------------------------------- the sweep
def _command_line() -> str:
    """How this process was started, as a user would type it (``python -m ablations run ...``)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    head = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*head, *sys.argv[1:]])


def _write_sweep_json(sweep_dir: Path, names: list[str], seeds: int | dict, steps: int | None, workers: int | None,
                      backend: dict, compile_forward: bool = False, report_to: list[str] | None = None,
                      variants: dict[str, list[str]] | None = None, first_seed: int = 1) -> None:
    """Record what was asked for; ablations (and each one's variants) accumulate so one dir can
    hold several sweeps. The report lists the planned runs it finds no directory for."""
    path = sweep_dir / "sweep.json"
    previous = {}
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            previous = {}
    previous = previous if isinstance(previous, dict) else {}
    ablations = [name for name in previous.get("ablations", []) if isinstance(name, str)]
    ablations += [name for name in names if name not in ablations]
    planned = previous.get("variants") if isinstance(previous.get("variants"), dict) else {}
    for name, chosen in (variants or {}).items():
        planned[name] = list(dict.fromkeys([*planned.get(name, []), *chosen]))
    record = {
        "ablations": ablations,
        "variants": planned,
        "seeds": seeds,
        "first_seed": first_seed,
        "steps": steps,
        "workers": workers,
        "compile_forward": compile_forward,
        "report_to": report_to,
        "backend": backend,
        "started": datetime.now().isoformat(timespec="seconds"),
        "command": _command_line(),
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


def _failed_by_backend(spec: RunSpec, backend_name: str, error: BaseException) -> RunOutcome:
    """A run whose attempt never reported back (its worker or node died, Ray gave up on it).

    The worker could not write error.txt, so the driver does, and the sweep goes on.
    """
    headline = f"{backend_name} backend: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    try:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        (spec.run_dir / "error.txt").write_text(f"{headline}\n--- full error ---\n{error}\n")
    except OSError:
        pass  # the outcome still carries the headline
    return RunOutcome(spec, "failed", None, error=headline)


def make_sweep_dir(sweep_dir: Path) -> None:
    """Create the sweep directory, or say in one sentence why it cannot be used."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ValueError(f"--out {sweep_dir}: a file, not a directory; name a directory for the sweep")
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        probe = sweep_dir / f".write_test_{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(f"--out {sweep_dir}: cannot write the sweep there ({reason}); name a directory "
                         "you can write to") from None


def run_sweep(ablation_names: "Iterable[str | Ablation]", sweep_dir: str | Path, seeds: int | None = None,
              steps: int | None = None, workers: int | None = None, timeout: float | None = None,
              progress: bool = True, reuse: bool = True, backend: "Backend | None" = None,
              threads: int | None = None, compile_forward: bool = False,
              report_to: list[str] | None = None, reuse_from: "Iterable[str | Path]" = (),
              first_seed: int = 1) -> SweepResult:
    """Run every variant x seed of the named ablations into `sweep_dir`; see the module doc.

    `seeds` runs that many seeds of every variant, from `first_seed` (default: seeds
    1..seeds; None: each ablation's own `seeds`, else `DEFAULT_SEEDS`). Before any run, each ablation's definition is stored in the sweep
    directory, or checked against the one stored there (`store_definitions`: a changed base,
    metric or variant is refused); an unusable `sweep_dir` raises ValueError naming it.
    `backend` says where the runs execute (`ablations.backends`); the default is a local
    process pool of `workers` concurrent runs (default: one per CPU core); each run gets
    `threads` torch threads (default: the backend's share); `compile_forward` compiles the
    lean forward of every run (`sweep_config`); `report_to` replaces every run's trackers
    (`PPOConfig.report_to`), and every run carries its sweep, ablation, variant and seed as
    the trackers' group and tags (`tracked_config`). `timeout` seconds
    per run (None: no limit). Complete runs are skipped, failed ones retried; with `reuse`, a
    run identical to a complete one is copied instead of trained, the complete ones of this
    sweep first, then those of the sweep directories `reuse_from`. All of this happens here,
    in the driver, the same for every backend: a backend only executes `attempt_run`.
    Returns the outcomes; with `progress`, shows a progress bar and prints the summary.
    Raises `SweepDirNotShared` (after stopping the sweep) when a worker cannot see the sweep
    directory.
    """
    from tqdm.auto import tqdm

    from .backends import LocalBackend, SweepDirNotShared

    ablations = [resolve_ablation(a) for a in ablation_names]
    names = list(dict.fromkeys(a.name for a in ablations))
    ablations = [next(a for a in ablations if a.name == name) for name in names]  # drop repeats
    if not ablations:
        raise ValueError("run_sweep: no ablations given")
    backend = backend or LocalBackend(workers)
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 (got {threads})")
    if timeout is not None and not (0 < timeout < float("inf")):
        raise ValueError(f"timeout must be a number of seconds > 0 or None for no limit (got {timeout!r})")
    threads = threads or backend.threads_per_run()
    if report_to is not None:
        from ppo.run.trackers import check_installed

        check_installed(report_to)  # once here, rather than once per run

    # Absolute, so a run's paths mean the same thing on a worker with another working directory.
    sweep_dir = Path(sweep_dir).absolute()
    seeds_of = {a.name: seeds if seeds is not None else getattr(a, "seeds", None) or DEFAULT_SEEDS for a in ablations}
    specs = [spec for ablation in ablations for spec in plan_runs(ablation, seeds_of[ablation.name], steps, sweep_dir, first_seed)]
    for spec in specs:
        spec.config = tracked_config(spec, sweep_dir.name, report_to)
        spec.config = sweep_config(spec.config, threads, compile_forward)
    refuse_identical_arms(specs)  # before anything is written or run
    make_sweep_dir(sweep_dir)
    # The sweep remembers what it is: report, claims and a later run read the definitions here.
    # (Only `Ablation`s have one; if the registry module was never imported, nothing is one.)
    registry = sys.modules.get("ablations.registry")
    described = [a for a in ablations if registry is not None and isinstance(a, registry.Ablation)]
    if described:
        from .ablation_files import store_definitions

        store_definitions(sweep_dir, described)
    # The threads every run was given (its provenance records the same), not the backend's default.
    _write_sweep_json(sweep_dir, names, seeds if seeds is not None else seeds_of, steps, workers,
                      {**backend.describe(), "threads_per_run": threads}, compile_forward, report_to,
                      {a.name: [v.name for v in a.variants] for a in ablations}, first_seed)

    result = SweepResult(sweep_dir)
    pending = []
    for spec in specs:
        if spec.complete:
            result.outcomes.append(RunOutcome(spec, "skipped"))
        else:
            pending.append(spec)

    bar = tqdm(total=len(specs), desc=f"sweep {', '.join(names)}", unit="run", disable=not progress,
               dynamic_ncols=True)
    running: dict = {}  # future -> (fingerprint, spec): submitted to the backend, not yet back

    def show_counts():
        bar.set_postfix(ok=len(result.completed), reused=len(result.reused), failed=len(result.failed),
                        skipped=len(result.skipped), running=len(running))

    bar.update(len(result.skipped))
    show_counts()
    done = {}
    for directory in (sweep_dir, *(Path(d).absolute() for d in reuse_from)) if reuse else ():
        for key, run_dir in completed_runs_by_fingerprint(directory).items():
            done.setdefault(key, run_dir)
    # Identical pending runs: the first (the leader) trains or copies, the rest follow it.
    followers: dict[str, list[RunSpec]] = {}
    leaders: list[tuple[str, RunSpec]] = []
    for spec in pending:
        key = config_fingerprint(spec.config) if reuse else spec.label  # labels are unique
        if key in followers:
            followers[key].append(spec)
        else:
            followers[key] = []
            leaders.append((key, spec))

    def record(outcome: RunOutcome) -> None:
        result.outcomes.append(outcome)
        if outcome.status == "failed" and progress:
            bar.write(f"failed: {outcome.spec.label}: {outcome.error}")
        show_counts()
        bar.update(1)

    to_train: deque[tuple[str, RunSpec]] = deque()
    for key, spec in leaders:
        if key in done:  # a complete identical run exists: this run and its followers copy it
            for copy in [spec, *followers.pop(key)]:
                record(copy_run(done[key], copy))
        else:
            to_train.append((key, spec))

    opened = False
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main_thread else None
    try:
        while to_train or running:
            if to_train and not opened:  # connect (start a Ray cluster ...) only if there is work
                backend.open(sweep_dir)
                opened = True
            # Submit only what can run now, so that `running` counts running runs and a
            # failed leader's follower is not stuck behind the rest of the queue.
            while to_train and len(running) < backend.capacity():
                key, spec = to_train.popleft()
                running[backend.submit(spec, timeout)] = (key, spec)
            show_counts()
            finished, _ = wait(running, timeout=backend.poll_seconds, return_when=FIRST_COMPLETED)
            for future in finished:
                key, spec = running.pop(future)
                try:
                    outcome = future.result()
                    outcome.spec = spec  # a remote backend hands back a copy; the report orders by identity
                except SweepDirNotShared:
                    raise
                except Exception as error:  # the backend lost the run, not the run failed
                    outcome = _failed_by_backend(spec, backend.name, error)
                record(outcome)
                waiting = followers.pop(key)
                if outcome.status == "ok":
                    for follower in waiting:
                        record(copy_run(spec.run_dir, follower))
                elif waiting:  # the leader failed: the next identical run trains itself
                    leader, *rest = waiting
                    followers[key] = rest
                    to_train.appendleft((key, leader))
    except BaseException:
        # Ctrl-C, or a worker that cannot see the sweep dir: queued runs must not start and
        # running ones must not outlive the sweep. Rerunning the command picks up from here.
        bar.close()
        if opened:
            backend.close(abort=True)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_sigterm)
    if opened:
        backend.close(abort=False)
    bar.close()
    # Report in plan order (variant-major), not completion order.
    order = {id(spec): i for i, spec in enumerate(specs)}
    result.outcomes.sort(key=lambda o: order[id(o.spec)])
    if progress:
        print(result.summary())
    return result

"""The sweep runner: every variant of one or more ablations x seeds, one process per run.

A sweep directory holds one ordinary ``ppo-train`` run directory per (ablation, variant, seed)::

    SWEEP_DIR/sweep.json                          what was asked for (ablations, seeds, steps, command)
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

- a run whose directory holds ``summary.json`` is complete and is skipped;
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
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ppo.config import PPOConfig
from ppo.run_dir import RunLock

if TYPE_CHECKING:
    from .backends import Backend
    from .registry import Ablation

# Lines of stderr kept in error.txt: enough for a full Python traceback.
STDERR_TAIL_LINES = 60
# Config fields that may differ between a checkpoint and a resumed attempt: they change how
# fast a run goes, what it prints, or how its (same) directory is spelled, not what it computes.
# ``compile_forward`` is one of them: compiled kernels round differently, as threads do.
RESUME_IGNORED_FIELDS = ("threads", "compile_forward", "retain_freed_memory", "progress", "output_dir")
# Config fields that may differ between two runs that compute the same thing (for reuse).
# ``threads`` is not among them: reductions split over a different number of threads round
# differently, and over many sampled steps that changes the run.
REUSE_IGNORED_FIELDS = ("output_dir", "progress")
# Written into a run directory whose outputs were copied from an identical run.
REUSED_FROM = "reused_from.txt"


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
        """The trainer writes summary.json last, so its presence means the run finished."""
        return (self.run_dir / "summary.json").is_file()


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


# ---------------------------------------------------------------------------------- planning
def resolve_ablation(ablation: "str | Ablation") -> "Ablation":
    """A registry name or an `Ablation` object -> the `Ablation`."""
    if isinstance(ablation, str):
        from .registry import get_ablation

        return get_ablation(ablation)
    return ablation


def plan_runs(ablation: "str | Ablation", seeds: int, steps: int | None, sweep_dir: str | Path) -> list[RunSpec]:
    """Every (variant, seed) of `ablation` for seeds 1..`seeds`, variant-major.

    Seeds start at 1 so that seed 0 (the PPOConfig default, used by tests and quick runs)
    never silently doubles as a sweep seed.
    """
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer (got {seeds!r})")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer or None (got {steps!r})")
    ablation = resolve_ablation(ablation)
    specs = []
    for variant in ablation.variants:
        for seed in range(1, seeds + 1):
            run_dir = Path(sweep_dir) / ablation.name / variant.name / f"seed{seed}"
            config = ablation.config(variant, seed=seed, output_dir=str(run_dir), steps=steps)
            specs.append(RunSpec(ablation.name, variant.name, seed, run_dir, config))
    return specs


# ---------------------------------------------------------------------------------- one run
def sweep_config(config: PPOConfig, threads: int, compile_forward: bool = False) -> PPOConfig:
    """A run's config as a sweep trains it: `threads` torch threads and, with
    `compile_forward` (``run --compile``), PPOConfig.compile_forward for every run that uses
    the lean forward it compiles (the others keep their module calls)."""
    config = config.replace(threads=threads)
    if compile_forward and config.lean_forward:
        config = config.replace(compile_forward=True)
    return config


def config_fingerprint(config: PPOConfig, ignored: tuple[str, ...] = REUSE_IGNORED_FIELDS) -> str:
    """A canonical string of every config field but `ignored`: equal strings, same computation.

    The default ignores what two identical runs may differ in (reuse); resuming a run passes
    `RESUME_IGNORED_FIELDS`.
    """
    values = config.to_dict()
    for name in ignored:
        values.pop(name, None)
    return json.dumps(values, sort_keys=True, default=str)


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


def prepare_run_dir(spec: RunSpec) -> bool:
    """Make `spec.run_dir` ready for an attempt; True when the attempt should ``--resume``.

    Leftovers of an earlier attempt are cleared (the trainer refuses to start over an
    existing metrics.jsonl), except stdout.log, which is appended to across attempts.
    """
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


def run_command(spec: RunSpec, resume: bool = False) -> list[str]:
    command = [sys.executable, "-m", "ppo.cli", "--config", str(spec.run_dir / "requested_config.yaml"),
               "--output-dir", str(spec.run_dir)]
    return command + ["--resume"] if resume else command


def code_roots() -> list[str]:
    """The directories this process imports the project's four packages from.

    A run's ``python -m ppo.cli`` must import the same code as the runner that launched it:
    the checkout the sweep was started from, or on a Ray worker the copy Ray unpacked there
    (each package may then sit in a directory of its own).
    """
    import ablations
    import gae
    import ppo
    import value_model

    packages = (ppo, value_model, gae, ablations)
    return list(dict.fromkeys(str(Path(package.__file__).resolve().parents[1]) for package in packages))


# Linux's prctl, looked up once here: a preexec_fn runs between fork and exec, where loading a
# library could deadlock on a lock held by another thread of the runner.
_PRCTL = None
if sys.platform.startswith("linux"):
    import ctypes

    try:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _PRCTL = None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to kill it when the thread that launched it dies.

    A sweep driver or Ray worker killed with SIGKILL cannot stop its children; without this a
    run would go on training in the background and write into the directory that the rerun of
    the sweep is clearing or resuming. Elsewhere than Linux this does nothing.
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


# Processes still running, so an interrupted sweep can stop its own children.
_live_processes: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
# The lock file descriptor of each run directory an attempt holds; its run process
# inherits it, so the directory stays locked while that process lives, even if the sweep
# itself is killed with SIGKILL and cannot stop it.
_run_lock_fds: dict[Path, int] = {}
# Seconds a run gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_SECONDS = 5.0


def _stop_process_group(process: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the run's process group (the run and anything it started), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


class SweepInterrupted(KeyboardInterrupt):
    """SIGTERM reached the sweep: stop like Ctrl-C (queued runs cancelled, running ones stopped)."""


def _raise_interrupted(signum, frame):
    raise SweepInterrupted(f"signal {signum}")


def launch_run(spec: RunSpec, resume: bool = False, timeout: float | None = None) -> RunOutcome:
    """Run one ``ppo.cli`` process to completion; stdout and stderr go to stdout.log.

    stderr is read line by line (and copied to the log) so the tail of it, where Python puts
    the traceback, can go to error.txt if the run fails.
    """
    command = run_command(spec, resume)
    threads = str(spec.config.threads)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [*code_roots(), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",  # keeps stdout and stderr lines in order in the shared log
        # BLAS/OpenMP pools start before torch.set_num_threads runs; without these every run
        # would briefly grab all cores and the concurrent runs would oversubscribe the CPU.
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
    }
    stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    timed_out = threading.Event()
    start = time.perf_counter()
    with open(spec.run_dir / "stdout.log", "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.now().isoformat(timespec='seconds')} {shlex.join(command)}\n")
        log.flush()
        # Its own process group, so stopping the sweep stops the run and its children; the
        # run directory's lock descriptor goes with it (see `attempt_run`).
        lock_fd = _run_lock_fds.get(spec.run_dir)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.PIPE, text=True, errors="replace",
                                   env=env, start_new_session=True, preexec_fn=_die_with_parent,
                                   pass_fds=() if lock_fd is None else (lock_fd,))
        with _live_lock:
            _live_processes.add(process)

        def kill_on_timeout():
            timed_out.set()
            _stop_process_group(process, grace=0.0)

        timer = threading.Timer(timeout, kill_on_timeout) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            for line in process.stderr:
                log.write(line)
                log.flush()
                stderr_tail.append(line.rstrip("\n"))
            returncode = process.wait()
        finally:
            if timer:
                timer.cancel()
            with _live_lock:
                _live_processes.discard(process)
    seconds = time.perf_counter() - start
    if returncode == 0 and spec.complete:
        return RunOutcome(spec, "ok", returncode, seconds=seconds, resumed=resume)

    last_line = next((line.strip() for line in reversed(stderr_tail) if line.strip()), "")
    if timed_out.is_set():
        headline = f"timed out after {timeout:g} s (killed; exit code {returncode})"
    elif returncode == 0:
        headline = "exit code 0 but no summary.json was written"
    else:
        headline = f"exit code {returncode}" + (f": {last_line}" if last_line else "")
    (spec.run_dir / "error.txt").write_text(
        f"{headline}\ncommand: {shlex.join(command)}\n"
        f"--- last {len(stderr_tail)} lines of stderr ---\n" + "\n".join(stderr_tail) + "\n")
    return RunOutcome(spec, "failed", returncode, error=headline, seconds=seconds, resumed=resume)


def attempt_run(spec: RunSpec, timeout: float | None) -> RunOutcome:
    """One attempt at `spec`: resume it or clear its directory (`prepare_run_dir`), then train.

    This is all a backend runs, wherever it runs it, so the resume-or-restart rule is the
    same on every backend. A run directory another live process still writes (a run
    orphaned by a killed sweep, a second sweep over the same directory) is left alone:
    clearing it would pull the files from under that process.
    """
    lock = RunLock(spec.run_dir)
    try:
        if not lock.acquire():
            return RunOutcome(spec, "failed", None, error=f"{spec.run_dir} is in use by another live process "
                              f"(lock {lock.path}); left untouched")
        resume = prepare_run_dir(spec)
    except OSError as error:  # e.g. an unwritable sweep dir: a failed run, not a dead sweep
        lock.release()
        return RunOutcome(spec, "failed", None, error=f"could not prepare run dir: {error}")
    _run_lock_fds[spec.run_dir] = lock.fd
    try:
        return launch_run(spec, resume=resume, timeout=timeout)
    finally:
        _run_lock_fds.pop(spec.run_dir, None)
        lock.release()


# ---------------------------------------------------------------------------------- reuse
def completed_runs_by_fingerprint(sweep_dir: Path) -> dict[str, Path]:
    """Fingerprint -> run directory for every complete run under `sweep_dir` (any ablation).

    Runs that are themselves copies are indexed too (their config.yaml is rewritten with
    their own output_dir), so a copy of a copy still names a complete run. A config.yaml that
    no longer parses (written by an older version) is ignored: that run is never reused.
    """
    index: dict[str, Path] = {}
    for summary in sorted(Path(sweep_dir).glob("*/*/seed*/summary.json")):
        run_dir = summary.parent
        try:
            config = PPOConfig.from_yaml(run_dir / "config.yaml")
        except (ValueError, TypeError, OSError):
            continue
        index.setdefault(config_fingerprint(config), run_dir)
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


# ---------------------------------------------------------------------------------- the sweep
def _command_line() -> str:
    """How this process was started, as a user would type it (``python -m ablations run ...``)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    head = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*head, *sys.argv[1:]])


def _write_sweep_json(sweep_dir: Path, names: list[str], seeds: int, steps: int | None, workers: int | None,
                      backend: dict, compile_forward: bool = False) -> None:
    """Record what was asked for; ablations accumulate so one dir can hold several sweeps."""
    path = sweep_dir / "sweep.json"
    previous = {}
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except json.JSONDecodeError:
            previous = {}
    ablations = list(previous.get("ablations", []))
    ablations += [name for name in names if name not in ablations]
    record = {
        "ablations": ablations,
        "seeds": seeds,
        "steps": steps,
        "workers": workers,
        "compile_forward": compile_forward,
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


def run_sweep(ablation_names: "Iterable[str | Ablation]", sweep_dir: str | Path, seeds: int = 3,
              steps: int | None = None, workers: int | None = None, timeout: float | None = None,
              progress: bool = True, reuse: bool = True, backend: "Backend | None" = None,
              threads: int | None = None, compile_forward: bool = False) -> SweepResult:
    """Run every variant x seed of the named ablations into `sweep_dir`; see the module doc.

    `backend` says where the runs execute (`ablations.backends`); the default is a local
    process pool of `workers` concurrent runs (default: one per CPU core); each run gets
    `threads` torch threads (default: the backend's share); `compile_forward` compiles the
    lean forward of every run (`sweep_config`). `timeout` seconds
    per run (None: no limit). Complete runs are skipped, failed ones retried; with `reuse`, a
    run identical to a complete one is copied instead of trained. All of this happens here,
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
    threads = threads or backend.threads_per_run()

    # Absolute, so a run's paths mean the same thing on a worker with another working directory.
    sweep_dir = Path(sweep_dir).absolute()
    specs = [spec for ablation in ablations for spec in plan_runs(ablation, seeds, steps, sweep_dir)]
    for spec in specs:
        spec.config = sweep_config(spec.config, threads, compile_forward)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    _write_sweep_json(sweep_dir, names, seeds, steps, workers, backend.describe(), compile_forward)

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
    done = completed_runs_by_fingerprint(sweep_dir) if reuse else {}
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

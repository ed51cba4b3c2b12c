"""Where the runs of a sweep execute: a local process pool, a Ray cluster, or Slurm (submitit).

The sweep runner (`ablations.runner.run_sweep`) keeps every guarantee of a sweep in the
driver, the same for every backend: which runs are complete and skipped, which identical
runs are copied instead of trained, which failed run is retried and when, the progress bar
and the report. A backend only executes `ablations.run_attempt.attempt_run` for one run at a time,
somewhere, and hands back its `RunOutcome` through a `concurrent.futures.Future`:

- `LocalBackend`: a thread per concurrent run on this machine, each starting one
  ``python -m ppo.cli`` process (the default; `workers` concurrent runs).
- `RayBackend`: each run is a Ray task on any node of a Ray cluster (``ray.init(address)``
  joins one; without an address a local one is started). The task asks Ray for
  `cpus_per_run` CPUs (also the run's torch threads) and `gpus_per_run` GPUs. Ray ships this
  package's code to every node (``runtime_env`` ``py_modules``); on the node the task starts
  ``python -m ppo.cli`` exactly as the local backend does, so a run computes the same numbers
  wherever it runs.
- `SlurmBackend`: each run is a Slurm job through submitit (``cluster="local"`` runs the
  jobs as local processes through submitit's own local executor, which is how it is tested).

What must be shared between nodes: the sweep directory (every run is read and written there
by whichever node trains it, and the driver reads all of them for skipping, reuse and the
report) and the SFT warm-start cache (``.cache/`` of the checkout, or ``$PPO_CACHE_DIR``),
both at the same path on every node, plus the same Python environment (torch, transformers,
ray). Before each run a worker checks that it sees the sweep directory the driver wrote
(`SWEEP_ID_FILE`); a worker that does not stops the sweep with `SweepDirNotShared`.

Nothing here schedules: Ray and Slurm place the runs, and the runner only keeps about as many
runs submitted as the backend can run at once (`Backend.capacity`), so that the progress bar's
"running" count means running.
"""

from __future__ import annotations

import importlib
import os
import shlex
import socket
import time
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import run_process
from .run_attempt import attempt_run
from .sweep_plan import RunOutcome, RunSpec

BACKENDS = ("local", "ray", "slurm")
# Written by the driver into the sweep directory at the start of every sweep, read by each
# worker before it touches a run: a worker that reads another id sees another directory.
SWEEP_ID_FILE = ".sweep_id"
# How long a worker waits for the id file to appear: shared filesystems (NFS) may cache a
# directory listing for a few seconds, so a file written a moment ago can look absent.
SHARED_DIR_GRACE_SECONDS = 30.0
# Ray retries a task whose worker process or node died (not one whose run failed: that is a
# RunOutcome). The retried attempt resumes or restarts by the same rule as a rerun.
RAY_MAX_RETRIES = 3


class BackendUnavailable(RuntimeError):
    """The backend's library (ray, submitit) is not installed."""


class SweepDirNotShared(RuntimeError):
    """A worker cannot see the sweep directory the driver writes to."""


# ---------------------------------------------------------------------------------- the shared dir
def mark_sweep_dir(sweep_dir: Path) -> str:
    """Write a fresh id into `sweep_dir`/SWEEP_ID_FILE and return it."""
    sweep_id = uuid.uuid4().hex
    path = Path(sweep_dir) / SWEEP_ID_FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(sweep_id + "\n")
    os.replace(partial, path)  # atomic: a worker never reads half an id
    return sweep_id


def check_sweep_dir_visible(sweep_dir: str | Path, sweep_id: str,
                            grace_seconds: float = SHARED_DIR_GRACE_SECONDS) -> None:
    """Raise `SweepDirNotShared` unless `sweep_dir` holds the id the driver wrote.

    Run on the worker. A missing directory, a missing id file or another sweep's id all
    mean the same thing: this node's path leads to another directory than the driver's.
    """
    path = Path(sweep_dir) / SWEEP_ID_FILE
    deadline = time.monotonic() + grace_seconds
    while True:
        try:
            if path.read_text().strip() == sweep_id:
                return
            seen = "another sweep's id"
        except FileNotFoundError:
            seen = "no such file" if Path(sweep_dir).is_dir() else "no such directory"
        except OSError as error:
            seen = str(error)
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, grace_seconds))
    raise SweepDirNotShared(
        f"node {socket.gethostname()} cannot see the sweep directory {sweep_dir} ({path}: {seen}). "
        f"Every node that runs a sweep's runs must see the sweep directory at the same path: put it "
        f"on a filesystem shared by all nodes (NFS, a cluster filesystem) and pass that path as --out.")


def attempt_on_worker(spec: RunSpec, timeout: float | None, sweep_dir: str,
                      sweep_id: str) -> "RunOutcome | SweepDirNotShared":
    """What a Ray task or a Slurm job runs: check the shared directory, then one attempt.

    A worker that cannot see the directory returns the `SweepDirNotShared` instead of raising
    it: Ray and submitit each wrap a raised exception in their own type, a returned one comes
    back as it was (`_outcome_or_raise` raises it in the driver).
    """
    try:
        check_sweep_dir_visible(sweep_dir, sweep_id)
    except SweepDirNotShared as error:
        return error
    return attempt_run(spec, timeout)


def _outcome_or_raise(value: "RunOutcome | SweepDirNotShared") -> RunOutcome:
    if isinstance(value, SweepDirNotShared):
        raise value
    return value


def _require(module: str, backend: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise BackendUnavailable(
            f"the {backend} backend needs the '{module}' package, an optional extra of this project: "
            f"pip install -e '.[{backend}]'") from error


def _package_dirs() -> list[str]:
    """The four packages' source directories, for Ray to ship to every node."""
    import ablations
    import gae
    import ppo
    import value_model

    return [str(Path(package.__file__).resolve().parent) for package in (ppo, value_model, gae, ablations)]


def _worker_env() -> dict[str, str]:
    """Environment that a run on another node needs to find what the driver's runs find."""
    from ppo.models.sft import DEFAULT_CACHE_DIR

    # The warm start is cached next to the code by default; on a worker the code is Ray's
    # unpacked copy, so point the run at the driver's cache explicitly.
    return {"PPO_CACHE_DIR": str(Path(DEFAULT_CACHE_DIR).resolve()), "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------------- backends
class Backend(ABC):
    """Executes single run attempts for `run_sweep`.

    The runner calls `threads_per_run` while planning, `open` once before the first submit
    (so a sweep with nothing to train never starts a cluster), `capacity` and `submit` while
    it runs, and `close` at the end (`abort=True` after an error or Ctrl-C: stop whatever
    still runs).
    """

    name = "base"
    # Seconds between checks for finished runs even when none finished: lets the capacity of
    # a cluster that gains nodes be re-read. None: wait for the next finished run.
    poll_seconds: float | None = None

    @abstractmethod
    def threads_per_run(self) -> int:
        """torch threads each run gets (its config's `threads`; part of what makes it reproducible)."""

    def describe(self) -> dict:
        """What sweep.json records about the backend."""
        return {"name": self.name, "threads_per_run": self.threads_per_run()}

    @abstractmethod
    def open(self, sweep_dir: Path) -> None:
        """Start the pool, or connect to the cluster; `sweep_dir` is absolute."""

    @abstractmethod
    def capacity(self) -> int:
        """How many runs may be submitted at once now (at least 1)."""

    @abstractmethod
    def submit(self, spec: RunSpec, timeout: float | None) -> Future:
        """Start ``attempt_run(spec, timeout)`` somewhere; the future holds its `RunOutcome`."""

    @abstractmethod
    def close(self, abort: bool = False) -> None:
        """Release the pool or the cluster; with `abort`, first stop every run still going."""


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer (got {value!r})")


class LocalBackend(Backend):
    """Today's process pool: `workers` concurrent runs on this machine, sharing its cores."""

    name = "local"

    def __init__(self, workers: int | None = None):
        _positive("workers", workers)
        self.cpu_count = os.cpu_count() or 1
        self.workers = workers or self.cpu_count
        self._executor: ThreadPoolExecutor | None = None

    def threads_per_run(self) -> int:
        return max(1, self.cpu_count // self.workers)

    def describe(self) -> dict:
        return {**super().describe(), "workers": self.workers}

    def open(self, sweep_dir: Path) -> None:
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sweep-run")

    def capacity(self) -> int:
        return self.workers

    def submit(self, spec: RunSpec, timeout: float | None) -> Future:
        return self._executor.submit(attempt_run, spec, timeout)

    def close(self, abort: bool = False) -> None:
        if self._executor is None:
            return
        if abort:
            self._executor.shutdown(wait=False, cancel_futures=True)
            with run_process._live_lock:
                live = list(run_process._live_processes)
            for process in live:  # the run and anything it started (its own process group)
                run_process._stop_process_group(process)
        self._executor.shutdown(wait=True)
        self._executor = None


class RayBackend(Backend):
    """Each run a Ray task on any node of a Ray cluster.

    `address`: None starts a local cluster (with `num_cpus` CPUs, default all); ``"auto"`` joins
    the cluster that ``ray start`` made on this node (``"HEAD_IP:6379"`` names its head).
    `cpus_per_run`: CPUs Ray reserves for a run, and the run's torch threads. `gpus_per_run`:
    GPUs reserved for a run; None gives one to runs whose config says ``device: cuda`` and none
    to the others. `workers`: at most this many runs at once (default: as many as the
    cluster's CPUs and GPUs allow, re-read as nodes join or leave).
    """

    name = "ray"
    poll_seconds = 5.0

    def __init__(self, address: str | None = None, cpus_per_run: int = 1, gpus_per_run: int | None = None,
                 workers: int | None = None, num_cpus: int | None = None):
        _positive("cpus_per_run", cpus_per_run)
        _positive("workers", workers)
        _positive("num_cpus", num_cpus)
        if gpus_per_run is not None and (not isinstance(gpus_per_run, int) or gpus_per_run < 0):
            raise ValueError(f"gpus_per_run must be a non-negative integer (got {gpus_per_run!r})")
        self.address, self.cpus_per_run, self.gpus_per_run = address, cpus_per_run, gpus_per_run
        self.workers, self.num_cpus = workers, num_cpus
        self._ray = None
        self._started_cluster = False
        self._refs: dict[Future, object] = {}

    def threads_per_run(self) -> int:
        return self.cpus_per_run

    def describe(self) -> dict:
        return {**super().describe(), "address": self.address, "cpus_per_run": self.cpus_per_run,
                "gpus_per_run": self.gpus_per_run, "workers": self.workers}

    def open(self, sweep_dir: Path) -> None:
        ray = self._ray = _require("ray", "ray")
        self._sweep_dir = str(sweep_dir)
        self._sweep_id = mark_sweep_dir(sweep_dir)
        runtime_env = {"py_modules": _package_dirs(), "env_vars": _worker_env()}
        task_options = {}
        if ray.is_initialized():  # the caller connected already: ship the code with each task
            task_options["runtime_env"] = runtime_env
        else:
            local = self.address is None
            # Runs log to their own stdout.log; Ray's INFO lines would only push the progress bar around.
            ray.init(address=self.address, num_cpus=self.num_cpus if local else None, include_dashboard=False,
                     log_to_driver=False, logging_level="WARNING", runtime_env=runtime_env)
            self._started_cluster = True
        self._task_options = task_options
        self._remote = ray.remote(max_retries=RAY_MAX_RETRIES)(attempt_on_worker)

    def _gpus(self, spec: RunSpec) -> int:
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1 if spec.config.device == "cuda" else 0

    def capacity(self) -> int:
        if self.workers:
            return self.workers
        resources = self._ray.cluster_resources()
        slots = int(resources.get("CPU", 0) // self.cpus_per_run)
        if self.gpus_per_run:
            slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_run))
        # At least one: a run the cluster cannot place yet waits in Ray's queue, and Ray says so.
        return max(1, slots)

    def submit(self, spec: RunSpec, timeout: float | None) -> Future:
        remote = self._remote.options(num_cpus=self.cpus_per_run, num_gpus=self._gpus(spec), **self._task_options)
        ref = remote.remote(spec, timeout, self._sweep_dir, self._sweep_id)
        future = Future()
        self._refs[future] = ref

        def settle(ray_future: Future) -> None:
            self._refs.pop(future, None)
            try:
                future.set_result(_outcome_or_raise(ray_future.result()))
            except BaseException as error:  # a lost worker or node (after Ray's retries), or not shared
                future.set_exception(error)

        ref.future().add_done_callback(settle)
        return future

    def close(self, abort: bool = False) -> None:
        if self._ray is None:
            return
        if abort:  # force: kill the workers, and with them (PR_SET_PDEATHSIG) their ppo.cli processes
            for ref in list(self._refs.values()):
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:  # already finished, or the cluster is gone
                    pass
        if self._started_cluster:
            self._ray.shutdown()
        self._ray = None


class SlurmBackend(Backend):
    """Each run a Slurm job, submitted through submitit.

    submitit pickles the attempt and writes its logs under ``<sweep dir>/.submitit/``, which
    the compute nodes must see anyway (the sweep directory is shared). `cluster`: None lets
    submitit pick Slurm where ``sbatch`` exists; ``"local"`` runs each job as a process on this
    machine (submitit's local executor, how this backend is tested without Slurm).
    `partition`, `time_min` (the job's time limit), `cpus_per_run` and `gpus_per_run` become
    the job's Slurm request; `workers` jobs are kept submitted at once (default 32).
    """

    name = "slurm"
    poll_seconds = 10.0
    DEFAULT_WORKERS = 32

    def __init__(self, cpus_per_run: int = 1, gpus_per_run: int | None = None, workers: int | None = None,
                 partition: str | None = None, time_min: int = 120, cluster: str | None = None):
        _positive("cpus_per_run", cpus_per_run)
        _positive("workers", workers)
        _positive("time_min", time_min)
        self.cpus_per_run, self.gpus_per_run = cpus_per_run, gpus_per_run
        self.workers = workers or self.DEFAULT_WORKERS
        self.partition, self.time_min, self.cluster = partition, time_min, cluster
        self._executor = None
        self._waiters: ThreadPoolExecutor | None = None
        self._jobs: dict[Future, object] = {}

    def threads_per_run(self) -> int:
        return self.cpus_per_run

    def describe(self) -> dict:
        return {**super().describe(), "cpus_per_run": self.cpus_per_run, "gpus_per_run": self.gpus_per_run,
                "workers": self.workers, "partition": self.partition, "time_min": self.time_min,
                "cluster": self.cluster}

    def open(self, sweep_dir: Path) -> None:
        submitit = _require("submitit", "slurm")
        self._sweep_dir = str(sweep_dir)
        self._sweep_id = mark_sweep_dir(sweep_dir)
        self._executor = submitit.AutoExecutor(folder=Path(sweep_dir) / ".submitit", cluster=self.cluster)
        parameters = {"timeout_min": self.time_min, "cpus_per_task": self.cpus_per_run, "name": "ppo-sweep"}
        if self.gpus_per_run:
            parameters["gpus_per_node"] = self.gpus_per_run
        if self.partition:
            parameters["slurm_partition"] = self.partition
        # The job's Python must import this checkout (submitit unpickles the attempt by module
        # name) and find the driver's warm-start cache: shell lines run before the job starts.
        setup = [f"export PYTHONPATH={shlex.quote(os.pathsep.join(run_process.code_roots()))}${{PYTHONPATH:+:$PYTHONPATH}}"]
        setup += [f"export {name}={shlex.quote(value)}" for name, value in _worker_env().items()]
        parameters[f"{self._executor.cluster}_setup"] = setup  # slurm_setup, or local_setup
        self._executor.update_parameters(**parameters)
        # One thread per submitted job waits on it; submitit polls Slurm for all of them at once.
        self._waiters = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="slurm-job")

    def capacity(self) -> int:
        return self.workers

    def submit(self, spec: RunSpec, timeout: float | None) -> Future:
        job = self._executor.submit(attempt_on_worker, spec, timeout, self._sweep_dir, self._sweep_id)
        future = self._waiters.submit(lambda: _outcome_or_raise(job.result()))
        self._jobs[future] = job
        future.add_done_callback(lambda done: self._jobs.pop(done, None))
        return future

    def close(self, abort: bool = False) -> None:
        if self._waiters is None:
            return
        if abort:
            for job in list(self._jobs.values()):
                try:
                    job.cancel(check=False)
                except Exception:  # already finished, or Slurm is unreachable
                    pass
        self._waiters.shutdown(wait=not abort, cancel_futures=abort)
        self._waiters = None


def make_backend(name: str, workers: int | None = None, address: str | None = None, cpus_per_run: int | None = None,
                 gpus_per_run: int | None = None, partition: str | None = None, time_min: int | None = None) -> Backend:
    """The backend `name` ('local', 'ray', 'slurm') from the command line's options.

    An option that the chosen backend does not use is an error, not silently ignored.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    given = {"--address": address, "--cpus-per-run": cpus_per_run, "--gpus-per-run": gpus_per_run,
             "--partition": partition, "--time-min": time_min}
    used = {"local": (), "ray": ("--address", "--cpus-per-run", "--gpus-per-run"),
            "slurm": ("--cpus-per-run", "--gpus-per-run", "--partition", "--time-min")}[name]
    unused = [option for option, value in given.items() if value is not None and option not in used]
    if unused:
        raise ValueError(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply to the {name} "
                         f"backend" + (" (each local run gets cpu_count // workers threads)" if name == "local" else ""))
    if name == "local":
        return LocalBackend(workers)
    if name == "ray":
        return RayBackend(address=address, cpus_per_run=cpus_per_run or 1, gpus_per_run=gpus_per_run,
                          workers=workers)
    return SlurmBackend(cpus_per_run=cpus_per_run or 1, gpus_per_run=gpus_per_run, workers=workers,
                        partition=partition, time_min=time_min or 120)

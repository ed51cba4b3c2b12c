"""One attempt at one sweep run, as every backend executes it: lock, resume or clear, train.

`attempt_run` is the whole of what a backend runs for a `RunSpec` (``ablations.backends``),
locally, on a Ray worker or in a Slurm job; `launch_run` starts the run's own ``python -m
ppo.cli`` process and turns its exit into a `RunOutcome` (error.txt with the tail of stderr
when it fails). The sweep's planning and bookkeeping stay in ``ablations.runner``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from datetime import datetime
from pathlib import Path

from ppo.run.run_lock import LOCK_FD_VARIABLE, RunLock

from .run_dirs import prepare_run_dir
from .run_process import _die_with_parent, _live_lock, _live_processes, _stop_process_group, code_roots
from .sweep_plan import RunOutcome, RunSpec

# Lines of stderr kept in error.txt: enough for a full Python traceback.
STDERR_TAIL_LINES = 60
# The lock file descriptor of each run directory an attempt holds; its run process
# inherits it, so the directory stays locked while that process lives, even if the sweep
# itself is killed with SIGKILL and cannot stop it.
_run_lock_fds: dict[Path, int] = {}


# ---------------------------------------------------------------------------------- one run
def run_command(spec: RunSpec, resume: bool = False) -> list[str]:
    command = [sys.executable, "-m", "ppo.cli", "--config", str(spec.run_dir / "requested_config.yaml"),
               "--output-dir", str(spec.run_dir)]
    return command + ["--resume"] if resume else command


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
        if lock_fd is not None:  # the run's trainer takes this lock as its own instead of waiting on it
            env[LOCK_FD_VARIABLE] = str(lock_fd)
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

"""A run's process from outside: the code it imports, dying with its parent, being stopped.

Each run is its own ``python -m ppo.cli`` process in its own process group (started by
`ablations.run_attempt.launch_run`). What lives here keeps such a process from outliving the
sweep: Linux's ``PR_SET_PDEATHSIG`` for a driver killed with SIGKILL, the set of live
processes and `_stop_process_group` for an interrupted sweep (Ctrl-C, or SIGTERM raised as
`SweepInterrupted`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


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

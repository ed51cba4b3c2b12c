"""The launcher's death ends its workers: ``kill -9`` of torchrun / ``accelerate launch``.

A killed launcher cannot stop the workers it started; without a watch they would go on
training as orphans and write ``summary.json`` into a run nobody watches. This module imports
nothing heavy, so ``ppo-train`` starts the watch (`watch_launcher`) before it loads torch:
a launcher killed while its workers are still importing ends them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

# Seconds between two looks at whether the launcher is still this worker's parent.
LAUNCHER_POLL_SECONDS = 0.1
_watched_launcher: int | None = None

# The watcher process (`watch_launcher`): tied to its worker by Linux's parent-death signal,
# it polls the worker's parent in /proc and kills the worker once the launcher is gone.
_WATCHER = r"""
import ctypes, os, sys, time
launcher, worker, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
try:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: this watcher ends with its worker
except (OSError, AttributeError):
    pass

def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None

while os.getppid() == worker:
    if parent(worker) != launcher:
        sys.stderr.write(f"ppo: the launcher (process {launcher}) is gone; worker {worker} stops\n")
        sys.stderr.flush()
        os.kill(worker, 9)
        break
    time.sleep(interval)
"""


def launched_as_worker() -> bool:
    """Whether torchrun (``accelerate launch`` runs it) started this process as one of its workers."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def watch_launcher() -> None:
    """In a launched worker, end the worker as soon as the launcher that started it is gone.

    A killed launcher's workers are handed to another parent. On Linux a small watcher
    process compares the worker's parent with the launcher every `LAUNCHER_POLL_SECONDS`
    and kills the worker when they differ. It acts from outside: a thread inside the worker
    runs only when the interpreter lets it, and a worker inside a collective whose peer had
    just died was seen to take seconds to stop that way. Linux's parent-death signal on the
    worker itself is no answer either: it fires when the launching *thread* ends. Elsewhere
    a daemon thread does the same check. A worker whose launcher died before the watch began (its parent is
    already init) stops at once. Does nothing outside a launched worker; idempotent.
    """
    global _watched_launcher
    if not launched_as_worker() or _watched_launcher is not None:
        return
    launcher = _watched_launcher = os.getppid()
    if launcher == 1:
        print(f"ppo: the launcher is gone; worker {os.getpid()} stops", file=sys.stderr, flush=True)
        os._exit(1)
    if os.path.isdir(f"/proc/{os.getpid()}"):
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(launcher), str(os.getpid()),
                          str(LAUNCHER_POLL_SECONDS)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         close_fds=True)
        return

    def watch():
        while os.getppid() == launcher:
            time.sleep(LAUNCHER_POLL_SECONDS)
        print(f"ppo: the launcher (process {launcher}) is gone; worker {os.getpid()} stops", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()

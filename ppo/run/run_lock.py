"""The run directory's lock: one writer per run, whatever the directory is called.

`lock_run` takes an exclusive ``flock`` on ``.NAME.lock`` beside the (resolved) run
directory for as long as a run trains, so a second start, resume or sweep worker on the same
run fails at once naming the holder; the sweep runner passes its lock down to the run it
launches (`LOCK_FD_VARIABLE`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ppo.run.run_dir import RunDirectoryError, not_writable, resolve, run_started

# With this variable set, the process inherited the lock of its run directory on that file
# descriptor from the sweep runner that launched it (ablations/runner.py).
LOCK_FD_VARIABLE = "PPO_RUN_LOCK_FD"


def lock_run(output_dir: Path) -> RunLock:
    """Take the run directory's lock for this process, or fail naming the process that holds it."""
    output_dir = resolve(output_dir)
    lock = RunLock(output_dir)
    try:
        taken = lock.acquire()
    except OSError as error:
        raise lock_not_writable(output_dir, lock.path, error) from None
    if not taken:
        holder = lock.holder()
        who = f"process {holder}" if holder else "another live process"
        raise RunDirectoryError(f"{output_dir}: {who} is writing this run (lock {lock.path}); two writers would mix "
                                "their steps in one metrics.jsonl. Wait for it to finish or stop it, or choose "
                                "another output_dir")
    return lock


def lock_not_writable(output_dir: Path, lock_path: Path, error: OSError) -> RunDirectoryError:
    """The message when the lock file cannot be made: its folder (the run directory's parent)
    may be read-only while the run directory itself is writable."""
    if output_dir.is_dir() and os.access(output_dir, os.W_OK) and lock_path.parent != output_dir:
        return RunDirectoryError(
            f"{lock_path}: cannot create the run's lock file ({error.strerror or error}); it lives beside the run "
            f"directory, in {lock_path.parent}, which this process cannot write, although {output_dir} itself is "
            f"writable. Make {lock_path.parent} writable, or choose an output_dir inside a writable folder")
    return not_writable(output_dir, error)


class RunLock:
    """An exclusive lock on ``.NAME.lock`` beside the run directory ``NAME`` (outside it, so
    clearing the directory never touches the lock; ``flock``: released when every holder exits,
    kill -9 included). `fd` can be passed to a child process, which then holds it too, so the
    directory stays locked while the child writes even if the parent is killed.

    The directory is resolved first (`resolve`), so every spelling of it, a symbolic link
    included, shares one lock file. A lock file this process created for a directory that
    holds no run when the lock is released is removed (a refused ``/`` or home directory
    keeps nothing beside it); an acquirer checks that the file it locked is still the one in
    place, so removing it never lets two processes hold the lock.
    """

    def __init__(self, run_dir: Path):
        run_dir = resolve(run_dir)
        self.run_dir = run_dir
        self.path = run_dir.parent / f".{run_dir.name}.lock"  # "/" (no name): "/..lock"
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> bool:
        """True when taken (or inherited from the sweep runner); False when another live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._inherited()
            created = False
            if fd is None:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    created = True
                except FileExistsError:
                    try:
                        fd = os.open(self.path, os.O_RDWR)
                    except FileNotFoundError:  # removed in between by its creator: try again
                        continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if not self._still_in_place(fd):  # its creator removed it after we opened it
                os.close(fd)
                continue
            break
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd, self.created = fd, created
        return True

    def _still_in_place(self, fd: int) -> bool:
        try:
            held, current = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)

    def _inherited(self) -> int | None:
        """A duplicate of the descriptor of this very lock file that the launching runner passed
        down (flock is held per open file, so locking it again succeeds), else None."""
        value = os.environ.get(LOCK_FD_VARIABLE)
        if not value or not value.isdigit() or not self.path.exists():
            return None
        try:
            held, wanted = os.fstat(int(value)), os.stat(self.path)
        except OSError:
            return None
        if (held.st_dev, held.st_ino) != (wanted.st_dev, wanted.st_ino):
            return None
        return os.dup(int(value))

    def holder(self) -> int | None:
        """The process id written in the lock file by its holder (None if unreadable)."""
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def release(self) -> None:
        """Close this process's handle; the lock ends when no child holds it either. A lock
        file this process created beside a directory that holds no run is removed first."""
        if self.fd is None:
            return
        if self.created and not run_started(self.run_dir) and self._still_in_place(self.fd):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None

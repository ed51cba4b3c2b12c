"""The run directory on resume: what survives a kill, a damaged file or a changed config.

A run may be killed at any moment (kill -9, a lost node, a full disk), and a user may
resume it with other settings. What this module guarantees, one function per case:

- `resume_changes`: the resuming config equals the run's ``config.yaml`` except in
  `ppo.config.RESUMABLE_FIELDS`, or each other changed field was explicitly allowed; allowed
  changes are appended to ``resume_history.jsonl`` (`record_resume`), so ``config.yaml``
  (the settings now in force) plus that history never claim a setting that was not used.
- `checkpoint_candidates`: complete checkpoints newest first; the trainer skips a damaged
  one with a warning and loads the newest intact one.
- `truncate_jsonl`: ``metrics.jsonl`` / ``samples.jsonl`` cut back to the resumed step, with
  partial, garbage or non-UTF-8 lines (a kill in the middle of a write) dropped.
- `prune_events`: tensorboard event files cut back to the resumed step, so the raw files
  hold no duplicate (tag, step) once the steps after it are redone.
- `remove_stale_tmp`: ``.tmp_step_*`` folders of interrupted saves are removed.
- `clear_outputs`: ``--restart`` removes what an earlier attempt wrote.
- `RunLock`: a lock file beside the run directory, held while a process writes it (the sweep runner
  holds it for each run it launches, and hands it to the run's process).

Only the main process calls the functions that write; every rank may read.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import warnings
from pathlib import Path

from .config import RENAMED_FIELDS, RESUMABLE_FIELDS, PPOConfig, read_yaml_mapping, renamed, resume_conflicts

# What a run writes into its directory (--restart removes these and nothing else).
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "initial_eval.json",
               "resume_history.jsonl", "checkpoints")


class RunDirectoryError(RuntimeError):
    """A run directory that cannot be resumed as asked (changed config, no intact checkpoint)."""


def resume_changes(output_dir: Path, config: PPOConfig, allowed: list[str] | tuple[str, ...] = ()) -> dict:
    """``{field: (stored, requested)}`` for the changes a resume makes; raises if any is not allowed.

    `allowed` names fields outside `RESUMABLE_FIELDS` the user explicitly lets change.
    """
    path = Path(output_dir) / "config.yaml"
    if not path.is_file():
        return {}  # killed before config.yaml was written: nothing to compare with
    try:
        stored = PPOConfig.from_dict(read_yaml_mapping(path))
    except (ValueError, FileNotFoundError) as error:
        raise RunDirectoryError(f"{path}: cannot be read ({error}); repair it, or pass --restart to start over")
    allowed = [renamed(name) if name in RENAMED_FIELDS else name for name in allowed]
    unknown = sorted(set(allowed) - set(stored.to_dict()))
    if unknown:
        raise RunDirectoryError(f"--allow-change: unknown field(s) {unknown}")
    if "model_path" in allowed and stored.model_path != config.model_path:
        raise RunDirectoryError("PPOConfig.model_path cannot change on resume: the checkpoint holds the weights "
                                f"({stored.model_path!r} -> {config.model_path!r}); start a new run instead")
    conflicts = resume_conflicts(stored, config)
    refused = {name: values for name, values in conflicts.items() if name not in allowed}
    if refused:
        listed = "; ".join(f"{name}: {old!r} in the run, {new!r} requested" for name, (old, new) in refused.items())
        raise RunDirectoryError(
            f"{path}: the resumed config differs from the run's ({listed}). Resume with the run's own settings, "
            f"or accept the change explicitly with " + " ".join(f"--allow-change {name}" for name in refused)
            + " (it is recorded in resume_history.jsonl). Fields that may always change: "
            + ", ".join(RESUMABLE_FIELDS))
    return conflicts


def record_resume(output_dir: Path, step: int, changes: dict) -> None:
    """Append one line to ``resume_history.jsonl``: the step resumed from and what changed."""
    entry = {"resumed_at_step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "changed": {name: {"before": old, "after": new} for name, (old, new) in changes.items()}}
    with open(Path(output_dir) / "resume_history.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def checkpoint_candidates(output_dir: Path) -> list[Path]:
    """Complete checkpoints (``state.json`` is written last), newest first."""
    root = Path(output_dir) / "checkpoints"
    return sorted((c for c in root.glob("step_*") if (c / "state.json").is_file()), reverse=True)


def remove_stale_tmp(output_dir: Path) -> list[Path]:
    """Remove ``checkpoints/.tmp_*`` folders left by saves that were interrupted."""
    stale = sorted((Path(output_dir) / "checkpoints").glob(".tmp_*"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def truncate_jsonl(path: Path, last_step: int) -> int:
    """Keep the lines of `path` whose ``step`` is at most `last_step`; return how many were dropped.

    A kill in the middle of a write leaves a partial last line; such lines, and any line
    that is not a JSON object with a step (garbage, bytes that are not UTF-8), are dropped
    with a warning naming the file, instead of making the run unresumable.
    """
    path = Path(path)
    if not path.exists():
        return 0
    kept, damaged, later = [], 0, 0
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
            step = row["step"]
            if not isinstance(step, int):
                raise TypeError
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            damaged += 1
            continue
        if step <= last_step:
            kept.append(raw.decode("utf-8"))
        else:
            later += 1
    if damaged:
        warnings.warn(f"{path}: dropped {damaged} damaged line(s) (partial writes of an interrupted run)",
                      stacklevel=2)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return damaged + later


def prune_events(output_dir: Path, last_step: int) -> None:
    """Rewrite the tensorboard event files with only the events up to `last_step`.

    The resumed run logs the later steps again; without this the raw event files would hold
    two values for each (tag, step) (TensorBoard's own purge only hides them in its UI).
    A truncated last record (a kill mid-write) ends the file there. Files left empty are
    removed.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    for path in sorted(Path(output_dir).glob("events.out.tfevents.*")):
        kept = []
        try:
            for record in RawEventFileLoader(str(path)).Load():
                if Event.FromString(record).step <= last_step:
                    kept.append(record)
        except Exception as error:  # a damaged record: keep what came before it
            warnings.warn(f"{path}: event file damaged after {len(kept)} records ({error}); kept those",
                          stacklevel=2)
        if not any(Event.FromString(r).HasField("summary") for r in kept):
            path.unlink()
            continue
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            writer = RecordWriter(handle)
            for record in kept:
                writer.write(record)
            writer.flush()
        os.replace(tmp, path)


def open_run(output_dir: Path, config: PPOConfig, resumed: bool, last_step: int, changes: dict) -> None:
    """Make the directory ready for the steps after `last_step` (main process only).

    A resume cuts the logs and event files back to `last_step` (-1: no checkpoint, the run
    starts again from step 0), removes interrupted saves and records the resume.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if resumed:
        remove_stale_tmp(output_dir)
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_jsonl(output_dir / name, last_step)
        prune_events(output_dir, last_step)
        if last_step < 0:
            (output_dir / "initial_eval.json").unlink(missing_ok=True)
        record_resume(output_dir, max(last_step, 0), changes)
    config.to_yaml(output_dir / "config.yaml")


def clear_outputs(output_dir: Path) -> None:
    """Remove what a run wrote (for ``--restart``); other files in the directory stay."""
    output_dir = Path(output_dir)
    for name in RUN_OUTPUTS:
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for path in output_dir.glob("events.out.tfevents.*"):
        path.unlink()


class RunLock:
    """An exclusive lock on ``.NAME.lock`` beside the run directory ``NAME`` (outside it, so
    clearing the directory never touches the lock; ``flock``: released when every holder exits,
    kill -9 included). `fd` can be passed to a child process, which then holds it too, so the
    directory stays locked while the child writes even if the parent is killed.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir).parent / f".{Path(run_dir).name}.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        """True when taken; False when another live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def release(self) -> None:
        """Close this process's handle; the lock ends when no child holds it either."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

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
- `check_fresh_start`: a new run refuses a directory that holds anything but the sweep
  runner's own files, naming what is there: it never overwrites a user's ``config.yaml``.
- `record_written` / `clear_outputs`: every file the run writes is listed in ``run_files.txt``
  (the manifest); ``--restart`` removes exactly those and nothing else.
- `check_run_files`: a run file that became a directory, or a checkpoint folder that is a
  symbolic link, is named instead of failing deep inside a write or an ``rmtree``.
- `ppo.run.run_lock` (`lock_run` / `RunLock`): one writer per run directory. The trainer holds an OS lock for the
  whole of ``train``; a second start or resume fails at once naming the live process. The
  sweep runner takes the same lock and hands it to the run's process (``PPO_RUN_LOCK_FD``).
  A directory refused before anything was written keeps no lock file beside it.
- `resolve`: the run directory as the filesystem sees it (``realpath``), taken once at the
  start, so a relative spelling, a trailing ``/``, ``.`` or a symbolic link to a live run all
  name the same directory, the same lock and the same manifest. The manifest holds paths
  relative to the run directory; `clear_outputs` removes only regular files inside it,
  whatever an edited manifest names.

Only the main process calls the functions that write; every rank may read.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import yaml

from ppo.config import RENAMED_FIELDS, RESUMABLE_FIELDS, PPOConfig, read_yaml_mapping, renamed, resume_conflicts

# The files a run writes at the top of its directory (besides tensorboard's event files and
# the checkpoints); each is recorded in the manifest when the run opens the directory.
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "initial_eval.json",
             "resume_history.jsonl")
RUN_OUTPUTS = RUN_FILES + ("checkpoints",)  # runs from before the manifest: what --restart removes
# Every file the run wrote, one path (relative to the run directory) a line.
MANIFEST = "run_files.txt"
# The sweep runner's own files beside a run (ablations/run_dirs.py): a fresh run may start there.
SWEEP_FILES = ("requested_config.yaml", "stdout.log", "error.txt", "reused_from.txt")


class RunDirectoryError(RuntimeError):
    """A run directory that cannot be resumed as asked (changed config, no intact checkpoint)."""


def resolve(output_dir: str | Path) -> Path:
    """`output_dir` as the filesystem sees it: absolute, symbolic links and ``..`` resolved.

    Resolved once when a run starts: every later path (lock, manifest, checkpoints) derives
    from it, so two spellings of one directory can never be two runs.
    """
    return Path(os.path.realpath(os.fspath(output_dir)))


def resume_changes(output_dir: Path, config: PPOConfig, allowed: list[str] | tuple[str, ...] = ()) -> dict:
    """``{field: (stored, requested)}`` for the changes a resume makes; raises if any is not allowed.

    `allowed` names fields outside `RESUMABLE_FIELDS` the user explicitly lets change.
    """
    path = Path(output_dir) / "config.yaml"
    allowed = [renamed(name) if name in RENAMED_FIELDS else name for name in allowed]
    if not path.is_file():
        if not run_started(output_dir) or UNCHECKED in allowed:
            return {}  # killed before config.yaml was written (nothing to compare with), or allowed
        raise RunDirectoryError(
            f"{path}: missing, so the resumed config cannot be compared with the run's; restore it, or pass "
            f"--allow-change {UNCHECKED} to resume with the config given here (recorded as unchecked in "
            "resume_history.jsonl)")
    try:
        data = read_config_file(path)
        if not data:
            raise ValueError("empty: it holds no settings, and reading it as the defaults would resume another run")
        stored = PPOConfig.from_dict(data)
    except (ValueError, FileNotFoundError) as error:
        raise RunDirectoryError(f"{path}: cannot be read ({error}); repair it, or pass --restart to start over")
    allowed = [name for name in allowed if name != UNCHECKED]
    unknown = sorted(set(allowed) - set(stored.to_dict()))
    if unknown:
        raise RunDirectoryError(f"--allow-change: unknown field(s) {unknown}")
    if same_model_path(stored.model_path, config.model_path):  # one directory, spelled two ways
        stored = stored.replace(model_path=config.model_path)
    elif stored.model_path != config.model_path:
        raise RunDirectoryError(
            f"{path}: PPOConfig.model_path cannot change on resume ({stored.model_path!r} in the run, "
            f"{config.model_path!r} requested): the checkpoints hold weights trained from the run's model, and no "
            "--allow-change can swap it. Resume with the run's model_path (or leave --model-path out), or start a "
            "new run in another output_dir")
    conflicts = resume_conflicts(stored, config)
    refused = {name: values for name, values in conflicts.items() if name not in allowed}
    if refused:
        listed = "; ".join(f"{name}: {old!r} in the run, {new!r} requested" for name, (old, new) in refused.items())
        raise RunDirectoryError(
            f"{path}: the resumed config differs from the run's ({listed}). Resume with the run's own settings, "
            f"or accept the change explicitly with " + " ".join(f"--allow-change {name}" for name in refused)
            + " (it is recorded in resume_history.jsonl). Fields that may always change: "
            + ", ".join(RESUMABLE_FIELDS))
    structural = {name: (old, new) for name, (old, new) in structure(stored, config).items() if old != new}
    if structural:
        listed = "; ".join(f"{name}: {old!r} in the run, {new!r} requested" for name, (old, new) in structural.items())
        raise RunDirectoryError(
            f"{path}: " + " ".join(f"--allow-change {name}" for name in conflicts) + " cannot resume this run: the "
            f"changed config builds other models than its checkpoints hold ({listed}). The checkpoints are intact; "
            "resume with the run's settings, or start a new run in another output_dir")
    return conflicts


# `--allow-change all`: resume although config.yaml is missing (nothing to compare with).
UNCHECKED = "all"


def same_model_path(stored: str | None, requested: str | None) -> bool:
    """Whether two spellings name one model: equal, or one existing local directory (relative
    or absolute, with or without a trailing ``/``)."""
    if stored == requested:
        return True
    if not stored or not requested:
        return False
    if os.path.isdir(stored) and os.path.isdir(requested):
        return os.path.samefile(stored, requested)
    return stored.rstrip("/") == requested.rstrip("/")


def structure(stored: PPOConfig, requested: PPOConfig) -> dict:
    """What a checkpoint's files are made of, under each config: ``{what: (stored, requested)}``.
    A change here cannot load (a critic the run never had, adapters of another shape)."""
    def shape(config: PPOConfig) -> dict:
        return {"critic (advantage_estimator / value model)": config.uses_value_model,
                "lora_r": config.lora_r, "lora_target_modules": config.lora_target_modules if config.lora_r else None,
                "lora_critic": config.lora_critic,
                "separate_value_optimizer": config.separate_value_optimizer if config.uses_value_model else None}
    old, new = shape(stored), shape(requested)
    return {name: (old[name], new[name]) for name in old}


def read_config_file(path: Path) -> dict:
    """`read_yaml_mapping`, refusing a key that appears twice (YAML would silently keep the last)."""
    data = read_yaml_mapping(path)
    duplicates = duplicate_keys(Path(path).read_text(encoding="utf-8"))
    if duplicates:
        raise ValueError(f"{path}: " + "; ".join(f"line {line}: {key!r} is set twice (first on line {first})"
                                                 for key, first, line in duplicates))
    return data


def duplicate_keys(text: str) -> list[tuple[str, int, int]]:
    """``(key, first line, repeated line)`` for each key repeated within one YAML mapping."""
    found = []

    def walk(node):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        found.append((key.value, seen[key.value], line))
                    seen.setdefault(key.value, line)
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)

    walk(yaml.compose(text, Loader=yaml.SafeLoader))
    return found


def record_resume(output_dir: Path, step: int, changes: dict | str, extends: dict | None = None) -> None:
    """Append one line to ``resume_history.jsonl``: the step resumed from and what changed
    (a string when the changes could not be checked); `extends`, the summary of a finished
    run this resume trains further (its wall time and evaluations would otherwise be lost)."""
    changed = changes if isinstance(changes, str) else {
        name: {"before": old, "after": new} for name, (old, new) in changes.items()}
    entry = {"resumed_at_step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": changed}
    if extends is not None:
        entry["extends_finished_run"] = extends
    with open(Path(output_dir) / "resume_history.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def checkpoint_candidates(output_dir: Path) -> list[Path]:
    """Complete checkpoints (``state.json`` is written last), newest first."""
    root = Path(output_dir) / "checkpoints"
    check_checkpoint_links(output_dir)
    return sorted((c for c in root.glob("step_*") if (c / "state.json").is_file()), reverse=True)


def check_checkpoint_links(output_dir: Path) -> None:
    """Refuse checkpoint folders that are symbolic links: the run writes real folders, and it
    would have to follow (and on pruning, remove) what the link points to."""
    links = sorted(p for p in (Path(output_dir) / "checkpoints").glob("step_*") if p.is_symlink())
    if links:
        raise RunDirectoryError(
            f"{links[0]}: a symbolic link (to {os.readlink(links[0])}), not a checkpoint folder this run wrote; the "
            "run never follows or removes links it did not make. Replace it with a copy of what it points to, or "
            "move it out of the run directory")


def check_run_files(output_dir: Path) -> None:
    """Refuse a run directory where a run file's name is taken by a directory (the run could
    neither append to it nor cut it back on resume)."""
    output_dir = Path(output_dir)
    for name in RUN_FILES + (MANIFEST,):
        path = output_dir / name
        if path.is_dir():
            raise RunDirectoryError(f"{path}: a directory, where the run keeps its file {name}; move it away")
    checkpoints = output_dir / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        raise RunDirectoryError(f"{checkpoints}: a file, where the run keeps its checkpoint folders; move it away")
    check_checkpoint_links(output_dir)


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


def open_run(output_dir: Path, config: PPOConfig, resumed: bool, last_step: int, changes: dict | str,
             extends: dict | None = None) -> None:
    """Make the directory ready for the steps after `last_step` (main process only).

    A resume cuts the logs and event files back to `last_step` (-1: no checkpoint, the run
    starts again from step 0), removes interrupted saves and records the resume. The
    manifest lists the run's files first, before any is written.
    """
    output_dir = Path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if resumed and not (output_dir / MANIFEST).exists():
            adopt_earlier_run(output_dir)
        record_written(output_dir, *RUN_FILES)
    except OSError as error:
        raise not_writable(output_dir, error) from None
    if resumed:
        remove_stale_tmp(output_dir)
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_jsonl(output_dir / name, last_step)
        prune_events(output_dir, last_step)
        if last_step < 0:
            (output_dir / "initial_eval.json").unlink(missing_ok=True)
        record_resume(output_dir, max(last_step, 0), changes, extends)
    config.to_yaml(output_dir / "config.yaml")


def finished_summary(output_dir: Path, step: int) -> dict | None:
    """The run's ``summary.json`` when it says the run finished at `step` (the checkpoint just
    loaded): all of its planned steps done. None for a run stopped earlier or still going."""
    try:
        summary = json.loads((Path(output_dir) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("steps") != step:
        return None
    planned = summary.get("total_steps")
    if planned is None:  # written before summaries named their plan: the run's config.yaml does
        try:
            planned = read_config_file(Path(output_dir) / "config.yaml").get("total_steps")
        except (OSError, ValueError):
            return None
    return summary if planned == step else None


def check_resume_end(output_dir: Path, step: int, total_steps: int, finished: dict | None) -> None:
    """Refuse a resume whose `total_steps` lies below the checkpoint it continues (it would
    train nothing and rewrite the summary as if the run had ended there)."""
    if step <= total_steps:
        return
    state = f"finished at step {step}" if finished is not None else f"has its newest checkpoint at step {step}"
    raise RunDirectoryError(
        f"{output_dir}: --total-steps {total_steps} lies below the run's last step: it {state}, and a resume "
        f"cannot undo steps. Nothing was changed. Resume with --total-steps {step} or more, or start a new run "
        "in another output_dir")


def not_writable(output_dir: Path, error: OSError) -> RunDirectoryError:
    """The message for a run directory that cannot be written (read-only disk, no permission)."""
    reason = {errno.EROFS: "a read-only file system", errno.EACCES: "no permission to write there",
              errno.EPERM: "no permission to write there", errno.ENOSPC: "the disk is full"}.get(
        error.errno, error.strerror or str(error))
    return RunDirectoryError(f"{output_dir}: cannot write the run directory ({reason}: {error}); choose another "
                             "output_dir")


def run_started(output_dir: Path) -> bool:
    """Whether `output_dir` holds a run of this project (its manifest, or the logs of a run
    from before the manifest)."""
    output_dir = Path(output_dir)
    return (output_dir / MANIFEST).is_file() or (output_dir / "metrics.jsonl").exists()


def check_fresh_start(output_dir: Path) -> None:
    """Refuse to start a new run in a directory that already holds something (main process)."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirectoryError(f"{output_dir}: a file, not a directory; choose another output_dir")
    if run_started(output_dir):
        raise FileExistsError(f"{output_dir}: a run already exists here; pass resume=True (--resume) to continue it, "
                              "restart=True (--restart) to start it over, or choose another output_dir")
    if not output_dir.exists():
        return
    present = sorted(p.name + ("/" if p.is_dir() else "") for p in output_dir.iterdir() if p.name not in SWEEP_FILES)
    if present:
        shown = ", ".join(present[:8]) + (f" and {len(present) - 8} more" if len(present) > 8 else "")
        raise RunDirectoryError(f"{output_dir}: not empty and not a run of this project (it holds {shown}); a new "
                                "run would overwrite or mix with those files. Choose an empty or new output_dir")


def record_written(output_dir: Path, *paths: str | Path) -> None:
    """Add `paths` (relative to `output_dir`, or absolute inside it) to the run's manifest, each
    stored relative to the run directory so the manifest means the same from any working
    directory. A path outside the run directory is a bug of the caller: refused."""
    output_dir = resolve(output_dir)
    manifest = output_dir / MANIFEST
    listed = set(written_files(output_dir)) if manifest.exists() else set()
    new = [MANIFEST] if not listed else []
    for path in paths:
        path = Path(path)
        if path.is_absolute():
            absolute = Path(os.path.normpath(path))
            if output_dir not in absolute.parents:
                raise RunDirectoryError(f"{path}: outside the run directory {output_dir}; not recorded as its file")
            relative = str(absolute.relative_to(output_dir))
        else:
            relative = os.path.normpath(path)
            if relative.startswith(".."):
                raise RunDirectoryError(f"{path}: outside the run directory {output_dir}; not recorded as its file")
        if relative not in listed and relative not in new:
            new.append(relative)
    if new:
        with open(manifest, "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in new))


def written_files(output_dir: Path) -> list[str]:
    """The manifest's paths as written, relative to `output_dir` (`clear_outputs` checks each)."""
    manifest = Path(output_dir) / MANIFEST
    try:
        text = manifest.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise RunDirectoryError(
            f"{manifest}: not a manifest this project wrote (byte {error.start} is not UTF-8 text), so which files "
            "belong to the run is unknown; nothing was removed. Restore it, or delete it: --restart then removes "
            f"only the run's known files ({', '.join(RUN_FILES)}, event files, checkpoints/step_*)") from None
    return [line for line in text.splitlines() if line.strip()]


def manifest_path(output_dir: Path, entry: str) -> Path | None:
    """Where manifest `entry` lies, or None when it is not a path inside the run directory.

    Absolute names, ``..`` and names that pass through a symbolic link (to anywhere) are
    None: whatever an edited manifest says, nothing outside the run directory is touched.
    Manifests of earlier versions listed paths as spelled from the working directory
    (``runs/a/checkpoints/...`` for the run ``runs/a``); such an entry is read relative to
    the run directory once that spelling's prefix is taken off.
    """
    if os.path.isabs(entry) or ".." in Path(entry).parts:
        return None
    path = output_dir / entry
    parts = Path(entry).parts
    if not os.path.lexists(path):
        for cut in range(1, len(parts)):
            if output_dir.parts[-cut:] == parts[:cut] and os.path.lexists(output_dir.joinpath(*parts[cut:])):
                path = output_dir.joinpath(*parts[cut:])
                break
    if os.path.realpath(path) != os.path.normpath(path):  # a link on the way: it leads elsewhere
        return None
    return path


def adopt_earlier_run(output_dir: Path) -> None:
    """List the files of a run written before the manifest existed (resuming it), so a later
    ``--restart`` removes them and nothing else."""
    files = [name for name in RUN_FILES if (output_dir / name).is_file()]
    files += [p.name for p in output_dir.glob("events.out.tfevents.*") if p.is_file()]
    for folder in (output_dir / "checkpoints").glob("step_*"):
        if folder.is_dir() and not folder.is_symlink():
            files += [str(f.relative_to(output_dir)) for f in folder.rglob("*") if f.is_file()]
    record_written(output_dir, *files)


def clear_outputs(output_dir: Path) -> list[Path]:
    """Remove exactly what the run wrote (for ``--restart``), as its manifest lists it, and the
    folders that leaves empty; other files stay. Returns what was removed.

    Only regular files inside the run directory are removed (`manifest_path`): an entry
    naming ``../x``, an absolute path or a file behind a symbolic link is left alone with a
    warning. A run from before the manifest loses its known files, event files and
    checkpoint folders (``step_*``, ``.tmp_step_*``); other files in ``checkpoints/`` stay.
    """
    output_dir = resolve(output_dir)
    removed = []
    if (output_dir / MANIFEST).is_file():
        listed = [name for name in written_files(output_dir) if name != MANIFEST]
        paths, outside = [], []
        for name in listed:
            path = manifest_path(output_dir, name)
            (outside if path is None else paths).append(path or name)
        if outside:
            warnings.warn(f"{output_dir / MANIFEST}: left alone {len(outside)} listed path(s) outside the run "
                          f"directory or behind a symbolic link ({', '.join(outside[:5])}); the run never writes "
                          "there, so it removes nothing there", stacklevel=2)
        paths.append(output_dir / MANIFEST)
    else:
        paths = [output_dir / name for name in RUN_FILES] + list(output_dir.glob("events.out.tfevents.*"))
        for folder in (output_dir / "checkpoints").glob("step_*"):
            if folder.is_dir() and not folder.is_symlink():
                paths += [f for f in folder.rglob("*") if f.is_file()]
    for path in paths:
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    # Interrupted saves: folders only the run names .tmp_step_*.
    checkpoints = output_dir / "checkpoints"
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        for tmp in checkpoints.glob(".tmp_step_*"):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp)
                removed.append(tmp)
    # Folders the removal emptied (deepest first); never the run directory itself.
    folders = {parent for path in removed for parent in path.parents
               if output_dir in parent.parents}
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
    return removed

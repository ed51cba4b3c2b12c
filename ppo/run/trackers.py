"""Experiment trackers beside the run directory: TensorBoard, Weights & Biases, MLflow, Trackio.

`PPOConfig.report_to` names them (default ``["tensorboard"]``). TensorBoard is the run's own
event files in ``output_dir`` (one event per step; ppo/run/run_dir.py cuts them back on resume).
W&B, MLflow and Trackio go through accelerate's tracker classes (`accelerate.tracking`); each
is an optional extra (``pip install -e '.[wandb]'``, ``'.[mlflow]'``, ``'.[trackio]'``),
imported only when a run names it, and a run naming one that is not installed stops before
training with `MissingExtraError`, which names the extra.

What a tracker receives, from the main process only (data parallel):

- the run's config: every `PPOConfig` field, and the run's provenance (`ppo.run.provenance`:
  commit, warm start, libraries, threads, machine) under ``provenance`` (MLflow: as the
  run's tags ``provenance.<field>``, its parameters being the config);
- every row of ``metrics.jsonl`` at its step, under the same names (the held-out
  evaluations are its ``eval_*`` entries); NaN entries are left out, as in TensorBoard;
- the decoded samples of each step (``samples.jsonl``) as a table: a ``samples`` table in
  W&B and Trackio, a JSON artifact ``samples/step_NNNNNN.json`` (columns and rows) in MLflow;
- its name (`run_name`, default ``output_dir``), group (`run_group`) and labels (`run_tags`);
  a sweep (``python -m ablations run ... --report-to``) sets these to the sweep, ablation,
  variant and seed, so its runs can be grouped and filtered by variant.

Nothing leaves the machine unless the tracker is configured to send it: each reads its own
settings from the environment. Offline use: ``WANDB_MODE=offline`` (``wandb sync`` uploads
later), ``MLFLOW_TRACKING_URI=file:./mlruns`` (MLflow 3 also wants
``MLFLOW_ALLOW_FILE_STORE=true`` for a file store; or ``sqlite:///mlflow.db`` with the full
``mlflow`` package), Trackio keeps a local database under ``TRACKIO_DIR`` unless given a Space.
A resumed run opens a new tracker run under the same name, logging from the step after its
checkpoint.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from ppo.settings.choices import TRACKERS  # tracker name -> (the module it imports, the extra that installs it)

SAMPLE_COLUMNS = ("step", "rank", "prompt", "response", "score", "correct", "has_eos")
WANDB_TAG_LENGTH = 64  # W&B refuses longer tags


class TrackerError(RuntimeError):
    """A tracker named in report_to could not start (not installed, not configured)."""


class MissingExtraError(TrackerError, ImportError):
    """A tracker named in report_to is not installed."""


def check_installed(report_to: list[str]) -> None:
    """Raise `MissingExtraError` naming the extra for each tracker of `report_to` not installed.

    Only looks the packages up (no import): every process checks, only the main one imports.
    """
    for name in report_to:
        module, extra = TRACKERS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module blocked or half-imported
            found = False
        if not found:
            install = f"pip install -e '.[{extra}]' (or pip install {module})" if extra else f"pip install {module}"
            raise MissingExtraError(f"PPOConfig.report_to: {name!r} needs the {module} package, which is not "
                                    f"installed: {install}, or leave {name!r} out of report_to")


def tracker_config(config, provenance_record: dict) -> dict:
    """What a tracker stores as the run's configuration: every field, and the provenance."""
    return {**config.to_dict(), "provenance": dict(provenance_record)}


class RunTrackers:
    """The open trackers of one run (main process): TensorBoard's writer and accelerate's trackers."""

    def __init__(self, writer=None, trackers: dict | None = None):
        self.writer = writer  # torch SummaryWriter, or None without 'tensorboard'
        self.trackers = trackers or {}  # name -> accelerate GeneralTracker, started

    def log(self, metrics: dict) -> None:
        """One row of metrics.jsonl, at its step: every finite number under its own name."""
        scalars = {key: float(value) for key, value in metrics.items()
                   if key != "step" and isinstance(value, (int, float)) and not math.isnan(value)}
        step = int(metrics["step"])
        if self.writer is not None:
            write_scalars(self.writer, scalars, step)
        for tracker in self.trackers.values():
            tracker.log(scalars, step=step)

    def log_samples(self, samples: list[dict], step: int) -> None:
        """The step's decoded samples as a table, where the tracker has one."""
        if not samples or not self.trackers:
            return
        columns = [c for c in SAMPLE_COLUMNS if c in samples[0]] + [c for c in samples[0] if c not in SAMPLE_COLUMNS]
        rows = [[sample.get(column) for column in columns] for sample in samples]
        for name, tracker in self.trackers.items():
            if name == "wandb":
                tracker.log_table("samples", columns=columns, data=rows, step=step)
            elif name == "trackio":
                import trackio

                tracker.log({"samples": trackio.Table(columns=columns, data=rows)}, step=step)
            elif name == "mlflow":
                import mlflow

                mlflow.log_dict({"columns": columns, "data": rows}, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for tracker in self.trackers.values():
            tracker.finish()
        self.trackers = {}


def open_trackers(config, output_dir: Path, provenance_record: dict, first_step: int) -> RunTrackers:
    """Start every tracker of `config.report_to` (main process); a failure raises `TrackerError`.

    `first_step` 0 is a fresh run: TensorBoard gets the config table as text at step 0.
    """
    check_installed(config.report_to)
    opened = RunTrackers()
    try:
        if "tensorboard" in config.report_to:
            from torch.utils.tensorboard import SummaryWriter

            from ppo.run import run_dir
            from ppo.config import describe

            opened.writer = SummaryWriter(str(output_dir))
            run_dir.record_written(output_dir, *Path(output_dir).glob("events.out.tfevents.*"))
            if first_step == 0:
                opened.writer.add_text("config", describe(config), 0)
        for name in config.report_to:
            if name != "tensorboard":
                opened.trackers[name] = _start(name, config, provenance_record)
    except BaseException:
        opened.close()
        raise
    return opened


def _start(name: str, config, provenance_record: dict):
    """Make and start accelerate's tracker `name`, its failures as `TrackerError` with a hint."""
    run_name = config.run_name or config.output_dir
    values = tracker_config(config, provenance_record)
    tags = {key: str(value) for key, value in config.run_tags.items()}
    hints = {"wandb": "run `wandb login`, or set WANDB_MODE=offline to keep the run on this machine",
             "mlflow": "set MLFLOW_TRACKING_URI (a file store: file:./mlruns with MLFLOW_ALLOW_FILE_STORE=true)",
             "trackio": "check TRACKIO_DIR, or the Space the run was sent to"}
    try:
        if name == "wandb":
            from accelerate.tracking import WandBTracker

            tracker = WandBTracker(config.tracker_project, name=run_name, group=config.run_group, config=values,
                                   tags=[f"{key}:{value}"[:WANDB_TAG_LENGTH] for key, value in tags.items()])
            tracker.start()
        elif name == "mlflow":
            from accelerate.tracking import MLflowTracker

            labels = {**tags, **({"group": config.run_group} if config.run_group else {}),
                      **{f"provenance.{key}": str(value) for key, value in provenance_record.items()}}
            _create_mlflow_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", config.tracker_project))
            tracker = MLflowTracker(experiment_name=config.tracker_project, run_name=run_name, tags=labels)
            tracker.start()
            tracker.store_init_configuration(config.to_dict())
        else:
            from accelerate.tracking import TrackioTracker

            # The config goes in through init: accelerate's store_init_configuration would also
            # store its own keyword argument as a config entry.
            tracker = TrackioTracker(config.tracker_project, name=run_name, group=config.run_group, config=values,
                                     embed=False)
            tracker.start()
    except Exception as error:
        raise TrackerError(f"PPOConfig.report_to: {name} could not start the run ({type(error).__name__}: "
                           f"{error}); {hints[name]}") from error
    return tracker


def _create_mlflow_experiment(name: str) -> None:
    """Create MLflow experiment `name` unless it exists, tolerating another process creating it
    at the same moment (a sweep's parallel runs each start one; accelerate's tracker looks the
    name up and creates it if missing, so two runs starting together could both try, and the
    second would fail with "already exists")."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if mlflow.get_experiment_by_name(name) is not None:
        return
    try:
        mlflow.create_experiment(name)
    except MlflowException:
        if mlflow.get_experiment_by_name(name) is None:  # failed for another reason than the race
            raise


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    """Write `scalars` as one tensorboard event at `step` (the same tags, values and step as
    one add_scalar call each, at a fraction of the cost)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()])
    writer._get_file_writer().add_summary(summary, step)

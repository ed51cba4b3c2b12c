"""report_to: W&B (offline), MLflow (a file store) and Trackio (local) get what metrics.jsonl holds.

Each tracker's store is read back after a real run (W&B's offline run file, MLflow's file
store through its client, Trackio's local database) and compared with the run directory:
the config and provenance, every step metric under its name at its step, the sampled
responses. Also: a missing extra stops the run naming it; a 2-process run logs once; a
sweep's runs are grouped by variant in the tracker. Nothing here reaches the network:
WANDB_MODE=offline, a file: MLflow URI, no Trackio Space.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ppo.run import trackers
from ppo.config import PPOConfig

ROOT = Path(__file__).resolve().parents[1]
CLI_TINY = ["--rollout-batch-size", "4", "--response-length", "8", "--eval-size", "2", "--ppo-epochs", "1",
            "--progress", "false", "--threads", "1", "--device", "cpu", "--lr", "0.001", "--log-samples", "2"]
FLOAT_TOLERANCE = dict(rel=1e-6, abs=1e-7)  # MLflow and Trackio keep doubles; W&B's JSON keeps them exactly


def offline_env(root: Path) -> dict:
    """Every tracker kept on this machine, its files under `root`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
            "WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
            "MLFLOW_TRACKING_URI": f"file:{root / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
            "TRACKIO_DIR": str(root / "trackio")}


def expected_steps(run: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as step -> {name: value} for every finite number (what trackers get)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: float(v) for k, v in row.items()
                          if k != "step" and isinstance(v, (int, float)) and not math.isnan(v)} for row in rows}


def assert_same_steps(logged: dict[int, dict], expected: dict[int, dict], tracker: str) -> None:
    assert sorted(logged) == sorted(expected), tracker
    for step, metrics in expected.items():
        got = {k: v for k, v in logged[step].items() if k in metrics}
        assert set(got) == set(metrics), (tracker, step, sorted(set(metrics) - set(got)))
        for name, value in metrics.items():
            assert got[name] == pytest.approx(value, **FLOAT_TOLERANCE), (tracker, step, name)


# --------------------------------------------------------------------------- reading each store back
def wandb_records(path: Path) -> list:
    """The records of a W&B run file (``run-ID.wandb``): a 7-byte header, then LevelDB-log
    records in 32 KiB blocks (crc32 4 bytes, length 2, type 1: full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending, records = 7, 32768, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # the tail of a block too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def read_wandb(root: Path) -> tuple[dict, dict, dict[int, dict]]:
    """(run record fields, config, step -> logged values) of the one offline W&B run under `root`."""
    files = list(root.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    run, config, steps = {}, {}, {}
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"name": record.run.display_name, "group": record.run.run_group, "tags": list(record.run.tags),
                   "project": record.run.project}
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            steps.setdefault(values["_step"], {}).update(values)
    return run, config, steps


def mlflow_runs(root: Path, experiment: str = "ppo-details") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def mlflow_steps(root: Path, run) -> dict[int, dict]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")
    steps: dict[int, dict] = {}
    for name in run.data.metrics:
        for point in client.get_metric_history(run.info.run_id, name):
            assert name not in steps.get(point.step, {}), f"{name} logged twice at step {point.step}"
            steps.setdefault(point.step, {})[name] = point.value
    return steps


@pytest.fixture(autouse=True)
def mlflow_file_store(monkeypatch):
    """MLflow 3 opens a file store only when told to, for reading it back too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


# ------------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="session")
def tracked_run(tmp_path_factory, tiny_model_dir):
    """One 2-step run (held-out evaluation after each step) reporting to all four trackers."""
    root = tmp_path_factory.mktemp("trackers")
    run = root / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ppo.cli", "--model-path", str(tiny_model_dir), "--output-dir", str(run),
         "--total-steps", "2", "--eval-every", "1", "--report-to", "tensorboard,wandb,mlflow,trackio",
         "--run-group", "g1", "--run-tags", "{variant: base, seed: 3}", *CLI_TINY],
        env=offline_env(root), cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return root, run


def test_wandb_offline_gets_the_config_every_step_metric_and_the_samples(tracked_run):
    root, run = tracked_run
    meta, config, steps = read_wandb(root)
    assert meta == {"name": str(run), "group": "g1", "tags": ["variant:base", "seed:3"], "project": "ppo-details"}
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: config[k] for k in saved} == saved
    assert config["provenance"] == json.loads((run / "summary.json").read_text())["provenance"]
    assert_same_steps({step: values for step, values in steps.items()}, expected_steps(run), "wandb")
    # The samples of steps 1 and 2 as tables, written beside the run file.
    assert all(steps[step]["samples/_type"] == "table-file" and steps[step]["samples/nrows"] == 2 for step in (1, 2))
    table = json.loads(next(root.glob("wandb/offline-run-*/files/media/table/samples_2_*.table.json")).read_text())
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [dict(zip(table["columns"], row)) for row in table["data"]] == [s for s in samples if s["step"] == 2]


def test_mlflow_file_store_gets_the_config_every_step_metric_and_the_samples(tracked_run):
    from mlflow.tracking import MlflowClient

    root, run = tracked_run
    [logged] = mlflow_runs(root)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert logged.data.params == {k: str(v) for k, v in saved.items()}
    provenance = json.loads((run / "summary.json").read_text())["provenance"]
    tags = logged.data.tags
    assert {k: tags[f"provenance.{k}"] for k in provenance} == {k: str(v) for k, v in provenance.items()}
    assert (tags["mlflow.runName"], tags["group"], tags["variant"], tags["seed"]) == (str(run), "g1", "base", "3")
    assert_same_steps(mlflow_steps(root, logged), expected_steps(run), "mlflow")
    client = MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")
    table = json.loads(Path(client.download_artifacts(logged.info.run_id, "samples/step_000001.json",
                                                      str(root / "download"))).read_text())
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [dict(zip(table["columns"], row)) for row in table["data"]] == [s for s in samples if s["step"] == 1]


def test_trackio_local_gets_the_config_every_step_metric_and_the_samples(tracked_run, monkeypatch):
    from trackio import sqlite_storage

    root, run = tracked_run
    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", root / "trackio")  # read at import from the environment
    storage = sqlite_storage.SQLiteStorage
    assert storage.get_runs("ppo-details") == [str(run)]
    config = storage.get_run_config("ppo-details", str(run))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: config[k] for k in saved} == saved and config["_Group"] == "g1"
    assert config["provenance"] == json.loads((run / "summary.json").read_text())["provenance"]
    steps: dict[int, dict] = {}
    for row in storage.get_logs("ppo-details", str(run)):
        steps.setdefault(row["step"], {}).update(row)
    assert_same_steps(steps, expected_steps(run), "trackio")
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert steps[2]["samples"]["_value"] == [s for s in samples if s["step"] == 2]


def test_tensorboard_still_gets_every_step_and_the_policy_explains_itself(tracked_run, tiny_model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, run = tracked_run
    events = EventAccumulator(str(run)).Reload()
    expected = expected_steps(run)
    assert {e.step: e.value for e in events.Scalars("kl")} == pytest.approx(
        {step: metrics["kl"] for step, metrics in expected.items() if "kl" in metrics})
    card = (run / "checkpoints" / "step_000002" / "policy" / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert "after 2 of 2 RL steps" in card and f"| base model | `{tiny_model_dir}` |" in card
    assert f"| commit | `{summary['provenance']['commit']}` |" in card
    assert "## Held-out evaluation (final, after step 2)" in card
    assert f"| sampled_accuracy | {summary['final_eval']['sampled_accuracy']:.4f} |" in card
    assert "the PPOConfig defaults (no preset)" in card and "| `total_steps` | `100` | `2` |" in card
    assert "checkpoints/step_000002/policy/README.md" in (run / "run_files.txt").read_text()  # --restart removes it


def test_a_missing_extra_stops_the_run_naming_it(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from ablations.registry import Ablation, Variant
    from ablations.runner import run_sweep
    from ppo.cli import main

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    out = tmp_path / "run"
    assert main(["--model-path", str(tiny_model_dir), "--output-dir", str(out), "--total-steps", "1",
                 "--report-to", "tensorboard,mlflow", *CLI_TINY]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1:]  # after the model's loading bar
    assert error == ["ppo-train: error: PPOConfig.report_to: 'mlflow' needs the mlflow package, which is not "
                     "installed: pip install -e '.[mlflow]' (or pip install mlflow), or leave 'mlflow' out of "
                     "report_to"]
    assert not out.exists()  # refused before anything was written
    ablation = Ablation("toy", "?", (Variant("a", "grpo", {}),), metric="accuracy")
    with pytest.raises(trackers.MissingExtraError, match=r"\.\[mlflow\]"):
        run_sweep([ablation], tmp_path / "sweep", seeds=1, progress=False, report_to=["mlflow"])
    assert not (tmp_path / "sweep").exists()


def test_report_to_is_checked_and_spelled_like_trl():
    assert PPOConfig().report_to == ["tensorboard"]
    assert PPOConfig(report_to="wandb, mlflow").report_to == ["wandb", "mlflow"]
    assert PPOConfig(report_to="none").report_to == []
    with pytest.raises(ValueError, match=r"PPOConfig\.report_to: unknown tracker\(s\) \['comet'\]"):
        PPOConfig(report_to=["wandb", "comet"])
    with pytest.raises(ValueError, match=r"PPOConfig\.run_tags"):
        PPOConfig(run_tags={"seed": [1, 2]})


@pytest.mark.slow  # a 2-process launch: about 20 s (make test-all)
def test_two_processes_log_once(tmp_path, tiny_model_dir):
    """accelerate launch with 2 CPU processes: one MLflow run, each step once, as in metrics.jsonl."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(ROOT / "configs/accelerate/cpu-2proc.yaml"), "--main_process_port", str(port), "-m", "ppo.cli",
         "--model-path", str(tiny_model_dir), "--output-dir", str(run), "--total-steps", "2", "--eval-every", "0",
         "--report-to", "mlflow", *CLI_TINY], env=offline_env(tmp_path), cwd=tmp_path, capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    [logged] = mlflow_runs(tmp_path)
    assert logged.data.tags["provenance.processes"] == "2"
    assert_same_steps(mlflow_steps(tmp_path, logged), expected_steps(run), "mlflow")  # each (name, step) once


@pytest.mark.slow  # a sweep of tracked runs: about 25 s (make test-all)
def test_a_sweep_reports_its_runs_grouped_by_variant(tmp_path, tiny_model_dir, monkeypatch):
    from ablations.registry import Ablation, Variant
    from ablations.runner import run_sweep

    for name, value in offline_env(tmp_path).items():
        monkeypatch.setenv(name, value)  # the runs' processes inherit them
    tiny = dict(rollout_batch_size=8, group_size=4, response_length=8, total_steps=1, eval_size=2, eval_every=0,
                model_path=str(tiny_model_dir))
    ablation = Ablation("toy", "Grouped?", (Variant("a", "grpo", tiny), Variant("b", "grpo", {**tiny, "grpo_scale": "none"})),
                        metric="accuracy")
    result = run_sweep([ablation], tmp_path / "sw", seeds=2, workers=2, threads=1, progress=False,
                       report_to=["mlflow"])
    assert result.ok and len(result.completed) == 4, result.summary()
    runs = mlflow_runs(tmp_path)
    labels = sorted((r.data.tags["group"], r.data.tags["variant"], r.data.tags["seed"], r.data.tags["mlflow.runName"])
                    for r in runs)
    assert labels == [(f"sw/toy/{v}", v, str(s), f"sw/toy/{v}/seed{s}") for v in "ab" for s in (1, 2)]
    assert {r.data.tags["sweep"] for r in runs} == {"sw"} and {r.data.tags["ablation"] for r in runs} == {"toy"}
    for logged in runs:  # each run's metrics are its own run directory's
        run_dir = tmp_path / logged.data.tags["mlflow.runName"]
        assert logged.data.params["grpo_scale"] == ("none" if logged.data.tags["variant"] == "b" else "group")
        assert_same_steps(mlflow_steps(tmp_path, logged), expected_steps(run_dir), "mlflow")


def test_mlflow_experiment_created_by_another_process_at_the_same_moment(tmp_path, monkeypatch):
    """Two sweep runs starting together both find no experiment and both create it: the second's
    "already exists" must not stop its run (it failed about one sweep in three before)."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from ppo.run.trackers import _create_mlflow_experiment

    for name, value in offline_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    real_create = mlflow.create_experiment

    def create_after_the_other_process(name):
        real_create(name)  # the other process wins the race
        raise MlflowException(f"Experiment '{name}' already exists.")

    monkeypatch.setattr(mlflow, "create_experiment", create_after_the_other_process)
    _create_mlflow_experiment("raced")
    assert mlflow.get_experiment_by_name("raced") is not None
    monkeypatch.setattr(mlflow, "create_experiment", lambda name: (_ for _ in ()).throw(MlflowException("disk full")))
    with pytest.raises(MlflowException, match="disk full"):
        _create_mlflow_experiment("not-raced")

"""Sweep backends: the runner's guarantees hold whether runs execute locally, on Ray or on Slurm.

The first tests use a stand-in backend (no cluster, no training) to pin down what the driver
does when a backend loses a run or a worker cannot see the sweep directory. The last ones
run one tiny sweep (2 variants x 2 seeds, 2 steps of the tiny model) on the local backend,
and (marked slow: ``make test-all``) its seed-1 runs on a 2-CPU local Ray cluster and through
submitit's local executor, and the whole sweep on Ray with its driver killed half-way, then
rerun; all must give the same results.csv. Those are skipped when the optional extra (``pip install -e
'.[ray]'``, ``'.[slurm]'``) is missing.
"""

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

import ablations.backends as backends
import ablations.run_attempt as run_attempt
import ablations.runner as runner
from ablations.backends import (LocalBackend, RayBackend, SweepDirNotShared, check_sweep_dir_visible, make_backend,
                                mark_sweep_dir)
from ablations.registry import Ablation, Variant
from ablations.runner import RunOutcome, run_sweep
from test_ablation_runner import finish

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Two steps of GRPO on the tiny model, a checkpoint after each (so a killed run can resume).
TINY = dict(rollout_batch_size=8, group_size=4, response_length=8, total_steps=2, eval_size=4, eval_every=0,
            save_every=1)


def toy_ablation(model_dir) -> Ablation:
    base = {**TINY, "model_path": str(model_dir)}
    return Ablation("toy", "Same numbers on every backend?",
                    (Variant("a", "grpo", base), Variant("b", "grpo", {**base, "grpo_scale": "none"})),
                    metric="accuracy")


# ---------------------------------------------------------------------------------- the driver's side
class StandInBackend(backends.Backend):
    """Runs attempts in the calling thread; `lose` labels come back as a lost worker."""

    name = "stand-in"

    def __init__(self, lose=(), unshared=(), fail_open=False):
        self.lose, self.unshared, self.fail_open = set(lose), set(unshared), fail_open
        self.opened, self.closed = 0, []

    def threads_per_run(self):
        return 1

    def open(self, sweep_dir):
        if self.fail_open:
            pytest.fail("the backend was opened although nothing needed to run")
        self.opened += 1

    def capacity(self):
        return 1

    def submit(self, spec, timeout):
        future = Future()
        if spec.label in self.lose:
            future.set_exception(RuntimeError("the node running this task died"))
        elif spec.label in self.unshared:
            future.set_exception(SweepDirNotShared(f"node n2 cannot see the sweep directory {spec.run_dir.parents[2]}"))
        else:
            future.set_result(runner.attempt_run(spec, timeout))
        return future

    def close(self, abort=False):
        self.closed.append(abort)


@pytest.fixture
def fake_launch(monkeypatch):
    """Training replaced by writing what a finished run writes, so only the bookkeeping runs."""
    launched = []

    def launch(spec, resume=False, timeout=None):
        launched.append(spec.label)
        finish(spec)  # what a finished run writes: a complete sweep run
        return RunOutcome(spec, "ok", 0)

    monkeypatch.setattr(run_attempt, "launch_run", launch)
    return launched


def test_a_run_the_backend_loses_is_failed_with_error_txt_and_the_sweep_goes_on(tmp_path, fake_launch):
    backend = StandInBackend(lose={"toy/a/seed2"})
    result = run_sweep([toy_ablation(tmp_path)], tmp_path / "sweep", seeds=2, progress=False, backend=backend)
    assert [o.spec.label for o in result.failed] == ["toy/a/seed2"]
    assert sorted(fake_launch) == ["toy/a/seed1", "toy/b/seed1", "toy/b/seed2"]
    error = (tmp_path / "sweep" / "toy" / "a" / "seed2" / "error.txt").read_text()
    assert error.startswith("stand-in backend: RuntimeError: the node running this task died")
    assert backend.opened == 1 and backend.closed == [False]
    # The rerun tries the lost run again, and only it.
    fake_launch.clear()
    again = run_sweep([toy_ablation(tmp_path)], tmp_path / "sweep", seeds=2, progress=False, backend=StandInBackend())
    assert fake_launch == ["toy/a/seed2"] and len(again.skipped) == 3 and again.ok


def test_a_worker_that_cannot_see_the_sweep_dir_stops_the_sweep(tmp_path, fake_launch):
    backend = StandInBackend(unshared={"toy/a/seed2"})
    with pytest.raises(SweepDirNotShared, match="cannot see the sweep directory"):
        run_sweep([toy_ablation(tmp_path)], tmp_path / "sweep", seeds=2, progress=False, backend=backend)
    assert backend.closed == [True]  # aborted: nothing queued may start
    assert fake_launch == ["toy/a/seed1"]  # capacity 1: the runs after the unshared one never started
    assert not (tmp_path / "sweep" / "toy" / "a" / "seed2" / "error.txt").exists()  # not a failed run


def test_a_complete_sweep_never_starts_the_backend(tmp_path, fake_launch):
    run_sweep([toy_ablation(tmp_path)], tmp_path / "sweep", seeds=1, progress=False, backend=StandInBackend())
    again = run_sweep([toy_ablation(tmp_path)], tmp_path / "sweep", seeds=1, progress=False,
                      backend=StandInBackend(fail_open=True))
    assert len(again.skipped) == 2 and len(fake_launch) == 2


def test_check_sweep_dir_visible(tmp_path):
    shared, other = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir()
    other.mkdir()
    sweep_id = mark_sweep_dir(shared)
    check_sweep_dir_visible(shared, sweep_id, grace_seconds=0)  # the driver's directory: fine
    with pytest.raises(SweepDirNotShared, match=f"cannot see the sweep directory {other}.*no such file"):
        check_sweep_dir_visible(other, sweep_id, grace_seconds=0)
    with pytest.raises(SweepDirNotShared, match="no such directory.*shared by all nodes"):
        check_sweep_dir_visible(tmp_path / "missing", sweep_id, grace_seconds=0)
    mark_sweep_dir(shared)  # a newer sweep wrote its own id: this worker's id is stale
    with pytest.raises(SweepDirNotShared, match="another sweep's id"):
        check_sweep_dir_visible(shared, sweep_id, grace_seconds=0)


def test_make_backend_rejects_options_the_backend_does_not_use():
    assert isinstance(make_backend("local", workers=2), LocalBackend)
    ray_backend = make_backend("ray", address="auto", cpus_per_run=2, gpus_per_run=1)
    assert (ray_backend.address, ray_backend.threads_per_run(), ray_backend.gpus_per_run) == ("auto", 2, 1)
    with pytest.raises(ValueError, match="--address, --cpus-per-run do not apply to the local backend"):
        make_backend("local", address="auto", cpus_per_run=2)
    with pytest.raises(ValueError, match="--partition does not apply to the ray backend"):
        make_backend("ray", partition="gpu")
    with pytest.raises(ValueError, match="unknown backend 'k8s'"):
        make_backend("k8s")


def test_a_missing_extra_names_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(backends.BackendUnavailable, match=r"pip install -e '\.\[ray\]'"):
        RayBackend().open(tmp_path)
    # Through the command line: exit code 2 and the same message, before any run starts.
    from ablations.__main__ import main

    assert main(["run", "quick", "--seeds", "1", "--steps", "1", "--backend", "ray",
                 "--out", str(tmp_path / "sweep")]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
    assert not list((tmp_path / "sweep").glob("*/*/seed*/summary.json"))
    assert main(["run", "quick", "--backend", "local", "--cpus-per-run", "2"]) == 2
    assert "--cpus-per-run does not apply to the local backend" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- real sweeps
def _installed(module: str) -> bool:
    """Checked at collection, so a missing extra skips before the shared local sweep is run."""
    return importlib.util.find_spec(module) is not None


def results_without_timing(sweep_dir: Path) -> list[dict]:
    """results.csv of a sweep, less the wall time (the only column allowed to differ)."""
    from ablations.report import build_report

    build_report(sweep_dir)
    with open(sweep_dir / "results.csv", newline="") as handle:
        rows = [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(handle)]
    assert rows and all(row["status"] == "ok" for row in rows), rows
    return rows


@pytest.fixture(scope="session")
def local_results(tmp_path_factory, tiny_model_dir):
    """The toy sweep on the local backend: the numbers every other backend must reproduce.

    One thread per run (workers = cpu_count), as every Ray or Slurm run below gets.
    """
    sweep = tmp_path_factory.mktemp("local") / "sweep"
    result = run_sweep([toy_ablation(tiny_model_dir)], sweep, seeds=2, workers=os.cpu_count() or 1, progress=False)
    assert result.ok and len(result.completed) == 4
    rows = results_without_timing(sweep)
    # The comparisons have teeth: the two seeds' numbers differ, so a run given another seed
    # would not match. (The variants agree here: two steps from a random model earn no
    # reward, so both scale zero advantages.)
    assert [row["seed"] for row in rows] == ["1", "2", "1", "2"] and rows[0]["entropy"] != rows[1]["entropy"]
    return rows


DRIVER = """
import sys
from ablations.backends import RayBackend
from ablations.registry import Ablation, Variant
from ablations.runner import run_sweep
TINY = {tiny!r}
base = dict(TINY, model_path={model!r})
toy = Ablation("toy", "q", (Variant("a", "grpo", base), Variant("b", "grpo", dict(base, grpo_scale="none"))),
               metric="accuracy")
run_sweep([toy], {sweep!r}, seeds=2, progress=False, backend=RayBackend(num_cpus=2))
"""


def _complete_runs(sweep: Path) -> set[Path]:
    return {path.parent for path in sweep.glob("toy/*/seed*/summary.json")}


def _started_runs(sweep: Path) -> set[Path]:
    return {path.parent for path in sweep.glob("toy/*/seed*/stdout.log")}


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


needs_ray = pytest.mark.skipif(not _installed("ray"), reason="the ray extra is not installed: pip install -e '.[ray]'")


@pytest.mark.slow  # a Ray cluster per test: about 2 minutes (make test-all)
@needs_ray
def test_ray_sweep_matches_local(tmp_path, tiny_model_dir, local_results):
    """The toy sweep's seed-1 runs on a 2-CPU local Ray cluster give the local numbers (the
    kill-and-rerun test below, marked slow, covers the rest of the sweep on Ray)."""
    sweep = tmp_path / "sweep"
    result = run_sweep([toy_ablation(tiny_model_dir)], sweep, seeds=1, progress=False, backend=RayBackend(num_cpus=2))
    assert result.ok and len(result.completed) == 2, result.summary()
    assert results_without_timing(sweep) == [row for row in local_results if row["seed"] == "1"]


@needs_ray
@pytest.mark.slow
def test_ray_sweep_matches_local_survives_a_killed_driver_and_skips_on_rerun(tmp_path, tiny_model_dir,
                                                                              local_results, monkeypatch):
    sweep = tmp_path / "sweep"
    script = DRIVER.format(tiny=TINY, model=str(tiny_model_dir), sweep=str(sweep))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    # Its own session, so Ray's helper processes that outlive a SIGKILLed driver can be reaped.
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Kill once a run is complete and another is training (its stdout.log is written as
        # its process starts): the sweep then has complete, interrupted and unstarted runs.
        deadline = time.monotonic() + 300
        while not (_complete_runs(sweep) and _started_runs(sweep) - _complete_runs(sweep)):
            assert driver.poll() is None, f"the Ray driver exited early:\n{driver.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no run finished on the Ray cluster within 300 s"
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)  # the driver dies mid-sweep, as with a lost head node
        driver.wait()
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # No run goes on training for the dead driver: its process dies with its Ray worker (give
    # a loaded machine a few seconds to deliver the kills).
    deadline = time.monotonic() + 30
    while _processes_mentioning(f"--output-dir {sweep}") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(f"--output-dir {sweep}") == []
    complete = {run_dir: (run_dir / "summary.json").stat().st_mtime_ns for run_dir in _complete_runs(sweep)}
    interrupted = _started_runs(sweep) - set(complete)
    # Mid-sweep: some runs complete, others not. A run that was training at the kill usually
    # stays interrupted, but Ray stops its worker only after noticing the dead driver, and
    # on an idle machine a tiny run can finish in that window; the rerun must cope either way.
    assert 1 <= len(complete) < 4, "the kill should have come mid-sweep"

    rerun = run_sweep([toy_ablation(tiny_model_dir)], sweep, seeds=2, progress=False,
                      backend=RayBackend(num_cpus=2))
    assert rerun.ok and {o.spec.run_dir for o in rerun.skipped} == set(complete)
    assert len(rerun.completed) == 4 - len(complete)
    for run_dir, mtime in complete.items():  # complete runs were not trained again
        assert (run_dir / "summary.json").stat().st_mtime_ns == mtime
        assert (run_dir / "stdout.log").read_text().count("\n=== ") == 1
    for run_dir in interrupted:  # the killed attempt, then the one that finished it
        assert (run_dir / "stdout.log").read_text().count("\n=== ") == 2
    assert results_without_timing(sweep) == local_results

    # A rerun of a complete sweep skips everything and never connects to Ray.
    monkeypatch.setattr(RayBackend, "open", lambda self, sweep_dir: pytest.fail("must not start Ray"))
    again = run_sweep([toy_ablation(tiny_model_dir)], sweep, seeds=2, progress=False, backend=RayBackend(num_cpus=2))
    assert len(again.skipped) == 4 and not again.completed


@pytest.mark.skipif(not _installed("submitit"),
                    reason="the slurm extra is not installed: pip install -e '.[slurm]'")
@pytest.mark.slow  # about 35 s of submitit jobs (make test-all)
def test_slurm_backend_through_submitits_local_executor_matches_local(tmp_path, tiny_model_dir, local_results):
    sweep = tmp_path / "sweep"
    backend = backends.SlurmBackend(cluster="local", workers=2, time_min=10)
    # Seed 1 only (two jobs): the Ray test covers interruption; this one checks the numbers.
    result = run_sweep([toy_ablation(tiny_model_dir)], sweep, seeds=1, progress=False, backend=backend)
    assert result.ok and len(result.completed) == 2, result.summary()
    assert results_without_timing(sweep) == [row for row in local_results if row["seed"] == "1"]
    assert list((sweep / ".submitit").iterdir())  # the jobs went through submitit

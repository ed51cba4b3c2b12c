"""kill -9 at a random step, and once inside a checkpoint save, then --resume: the run ends
with the same weights and logs as a run that was never interrupted.

The runs are real ``python -m ppo.cli`` processes on the tiny model. The kill moments are
random but reproducible: drawn from ``PPO_KILL_SEED`` (default 0), printed on failure. Each
killed process is held at its kill moment (it hangs there and leaves a marker file), so the
kill never races a run that is faster than the test's polling.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ppo.config import PPOConfig
from ppo.trainer import RLTrainer

ROOT = Path(__file__).resolve().parent.parent
TOTAL_STEPS = 4
CONFIG = dict(rollout_batch_size=4, response_length=8, eval_size=2, eval_every=0, total_steps=TOTAL_STEPS,
              save_every=1, keep_checkpoints=2, progress=False, log_samples=2, lr=1e-3, ppo_epochs=2, threads=1)
# Runs ppo.cli held at one moment, where it writes a marker file and hangs:
#   "log" STEP: just after step STEP's line reaches metrics.jsonl, before its samples and
#     checkpoint are written (the logs run ahead of the newest checkpoint);
#   "save" STEP: inside the checkpoint save of step STEP, when the temp folder holds the
#     weights and trainer_state.pt but not yet state.json.
HELD_RUN = '''
import sys, time, pathlib, torch
from ppo.run import run_loop
moment, step, marker = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
def hang():
    marker.write_text(moment)
    time.sleep(600)
real_save, real_log = torch.save, run_loop.TrainingRun.log
def held_save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    if moment == "save" and ".tmp_step_%06d" % step in str(f):
        hang()
def held_log(run, metrics):
    real_log(run, metrics)
    if moment == "log" and metrics["step"] == step:
        hang()
torch.save, run_loop.TrainingRun.log = held_save, held_log
from ppo.cli import main
sys.exit(main(sys.argv[4:]))
'''


def launch(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def wait_for(condition, process: subprocess.Popen, what: str, log: Path, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"the run exited before {what}:\n{log.read_text()[-3000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def logged_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:  # the line being written right now
            pass
    return steps


@pytest.mark.slow  # three runs and a kill: about 35 s (make test-all); test_reliability kills runs in the default suite
def test_kill_9_at_a_random_step_and_inside_a_save_resumes_to_the_straight_run(tmp_path, tiny_model_dir):
    seed = int(os.environ.get("PPO_KILL_SEED", "0"))
    draw = random.Random(seed)
    kill_step = draw.randint(1, TOTAL_STEPS - 2)  # kill -9 once this step is logged
    save_step = draw.randint(kill_step + 1, TOTAL_STEPS - 1)  # kill -9 inside this step's save
    context = f"PPO_KILL_SEED={seed}: kill at step {kill_step}, inside the save of step {save_step}"

    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "straight"), **CONFIG)
    straight = RLTrainer(config)
    straight.train()

    run, log = tmp_path / "killed", tmp_path / "killed.log"
    config_file = tmp_path / "config.yaml"
    config.replace(output_dir=str(run)).to_yaml(config_file)
    cli = ["--config", str(config_file), "--output-dir", str(run)]

    logged = tmp_path / "step_logged"
    first = launch(["-c", HELD_RUN, "log", str(kill_step), str(logged), *cli], log)
    wait_for(logged.exists, first, f"step {kill_step}", log)
    assert kill_step in logged_steps(run), context
    first.send_signal(signal.SIGKILL)
    first.wait()

    marker = tmp_path / "inside_save"
    second = launch(["-c", HELD_RUN, "save", str(save_step), str(marker), *cli, "--resume"], log)
    wait_for(marker.exists, second, f"the save of step {save_step}", log)
    second.send_signal(signal.SIGKILL)
    second.wait()
    assert list((run / "checkpoints").glob(".tmp_step_*")), context  # the save really was cut short

    third = launch(["-m", "ppo.cli", *cli, "--resume"], log)
    assert third.wait(timeout=600) == 0, f"{context}\n{log.read_text()[-3000:]}"

    final = load_file(str(run / "checkpoints" / f"step_{TOTAL_STEPS:06d}" / "policy" / "model.safetensors"))
    expected = straight.policy.state_dict()
    assert all(torch.equal(final[name], expected[name]) for name in final), context
    assert logged_steps(run) == list(range(TOTAL_STEPS + 1)), context
    assert not list((run / "checkpoints").glob(".tmp_*")), context
    history = [json.loads(line) for line in (run / "resume_history.jsonl").read_text().splitlines()]
    assert len(history) == 2 and all(entry["changed"] == {} for entry in history), context

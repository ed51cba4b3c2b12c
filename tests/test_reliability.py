"""Bad inputs a hostile but realistic user gives: each is refused with a clear message naming
what is wrong, never a raw library traceback or a silent run. docs/reliability.md lists
every case with the test that checks it.
"""

from __future__ import annotations

import json
import math
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ppo.config import PPOConfig
from ppo.run.run_dir import RunDirectoryError
from ppo.run import guards
from ppo.run.guards import (NonFiniteError, RewardTypeError, check_parameters, check_scores, check_update,
                        drop_nonfinite_scores, reward_values)
from ppo.trainer import RLTrainer

# Smaller than test_trainer's TINY (one epoch, 4 responses of 8 tokens): these runs check
# plumbing, not learning, and must stay a few seconds each.
TINY = dict(rollout_batch_size=4, response_length=8, eval_size=2, eval_every=0, total_steps=3, save_every=1,
            progress=False, log_samples=2, lr=1e-3, ppo_epochs=1)
PROMPTS = ["1+1=", "2+3=", "9+9=", "4+4="]
FLOAT_FIELDS = ["lr", "kl_coef", "vf_coef", "entropy_coef", "temperature", "gamma", "lam", "cliprange", "adam_eps",
                "top_p", "kl_target", "grpo_eps", "missing_eos_penalty", "missing_eos_value", "weight_decay",
                "length_reward_coef", "filter_min_pass_rate", "filter_max_pass_rate", "reward_clip", "max_grad_norm",
                "cliprange_high", "cliprange_value", "dual_clip", "target_kl", "value_lr"]


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


def assert_checkpoint_is_live_and_finite(checkpoint, trainer):
    """The checkpoint's weights are finite and equal to the trainer's (no update after it)."""
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint / "policy" / "model.safetensors"))
    live = trainer.policy.state_dict()
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    assert all(torch.equal(saved[name], live[name]) for name in saved)


# ---------------------------------------------------------------- config: NaN, inf, seeds
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "-inf"])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_config_rejects_non_finite_floats(name, value):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{name}: must be a finite number"):
        PPOConfig(**{name: value})


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70])
def test_config_rejects_seeds_torch_cannot_take(seed):
    with pytest.raises(ValueError, match=r"PPOConfig\.seed: must be in \[0, "):
        PPOConfig(seed=seed)


@pytest.mark.parametrize("text, message", [
    ("lr: [1, 2\n", "not valid YAML"), ("- 1\n- 2\n", "mapping of field: value"), (b"lr: \xff\xfe\n", "not UTF-8"),
    ("lr: nan\n", r"PPOConfig\.lr: must be a finite number"), ("bogus_field: 1\n", "unknown field")])
def test_broken_config_file_names_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=message) as error:
        PPOConfig.from_yaml(path)
    assert str(path) in str(error.value)


def test_cli_broken_config_file_is_a_usage_error(tmp_path, capsys):
    from ppo.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("lr: [1, 2\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(path), "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err and "not valid YAML" in err and "Traceback" not in err


# ---------------------------------------------------------------- reward functions
@pytest.mark.parametrize("returned, message", [
    (None, "returned NoneType"), ("1010", "returned a string"), (b"10", "returned a string"), (1.0, "returned float"),
    (3, "returned int"), (torch.ones(2, 2), r"shape \(2, 2\)"), (np.ones((2, 1)), r"shape \(2, 1\)"),
    (torch.tensor(1.0), r"shape \(\)"), ({"a": 1}, "returned dict"), ([1.0], "1 rewards for 2 responses"),
    ([1.0, 2.0, 3.0], "3 rewards for 2 responses"), ([1.0, "x"], "returned str 'x' as the reward of prompt 1"),
    ([None, 1.0], "returned NoneType None as the reward of prompt 0"), ([1.0, [2.0]], "returned list"),
    ([True, 1.0], "returned bool"), ([1.0, 1j], "returned complex")])
def test_reward_fn_must_return_one_real_number_per_response(returned, message):
    def my_reward(prompts, responses):
        return returned

    with pytest.raises(RewardTypeError, match=message) as error:
        reward_values(my_reward(None, None), ["p0", "p1"], ["r0", "r1"], my_reward)
    assert "my_reward" in str(error.value)


@pytest.mark.parametrize("returned", [[1, 0.5], (1, 0.5), torch.tensor([1.0, 0.5]), np.array([1.0, 0.5]),
                                      [torch.tensor(1.0), np.float32(0.5)]])
def test_reward_fn_accepts_lists_tuples_and_1d_arrays(returned):
    assert reward_values(returned, ["p0", "p1"], ["r0", "r1"]) == [1.0, 0.5]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_score_names_prompt_response_and_source(bad):
    scores = torch.tensor([1.0, bad, 0.0])
    with pytest.raises(NonFiniteError, match=r"my_fn gave .* for prompt 1 'p1' response 'r1'"):
        check_scores(scores, ["p0", "p1", "p2"], ["r0", "r1", "r2"], "my_fn")
    assert check_scores(scores, ["p0", "p1", "p2"], ["r0", "r1", "r2"], "my_fn", drop=True).tolist() == [
        True, False, True]


def test_dropped_score_takes_its_group_mean():
    """Group [1, NaN] -> NaN becomes 1 (advantage 0); group [NaN, NaN] -> 0."""
    scores = torch.tensor([1.0, math.nan, math.nan, math.inf])
    dropped = drop_nonfinite_scores(scores, torch.isfinite(scores), 2)
    assert dropped.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_nan_reward_on_step_k_keeps_newest_checkpoint_finite_and_equal_to_step_k_minus_1(tmp_path, tiny_model_dir):
    """A NaN reward for one sample on step 3: the run stops before the update of step 3; the
    newest checkpoint is step 2's, finite and equal to the weights after step 2."""
    holder = {}

    def sometimes_nan(prompts, responses):
        rewards = count_ones(prompts, responses)
        if holder["trainer"].step == 2 and len(responses) == 4:  # training batch of step 3
            rewards[2] = math.nan
        return rewards

    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **TINY)
    trainer = holder["trainer"] = RLTrainer(config, prompts=PROMPTS, reward_fn=sometimes_nan)
    with pytest.raises(NonFiniteError, match=r"reward_fn .*sometimes_nan gave nan for prompt 2 .* stopped before"):
        trainer.train()
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step_000001", "step_000002"]
    assert_checkpoint_is_live_and_finite(tmp_path / "run" / "checkpoints" / "step_000002", trainer)
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [
        0, 1, 2]


def test_drop_mode_trains_on_and_counts_dropped_samples(tmp_path, tiny_model_dir):
    def first_is_nan(prompts, responses):
        return [math.nan] + count_ones(prompts, responses)[1:]

    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"),
                       nonfinite_rewards="drop", advantage_estimator="grpo", group_size=2, kl_placement="loss",
                       **{**TINY, "total_steps": 2})
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=first_is_nan)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["dropped_sample_frac"] for r in rows[1:]] == [1 / 4, 1 / 4]
    assert all(math.isfinite(r["pg_loss"]) for r in rows[1:])
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())


def test_nan_loss_stops_before_the_optimizer_step(tmp_path, tiny_model_dir, monkeypatch):
    """A NaN loss on step 2 stops before the optimizer step; step 1's checkpoint stays the newest."""
    import ppo.trainer as trainer_module

    original, holder = trainer_module.policy_loss, {}

    def nan_on_step_2(*args, **kwargs):
        loss, metrics = original(*args, **kwargs)
        return (loss * math.nan if holder["trainer"].step == 1 else loss), metrics

    monkeypatch.setattr(trainer_module, "policy_loss", nan_on_step_2)
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **TINY)
    trainer = holder["trainer"] = RLTrainer(config)
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite loss=nan.*before the optimizer step"):
        trainer.train()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")) == ["step_000001"]
    assert_checkpoint_is_live_and_finite(tmp_path / "run" / "checkpoints" / "step_000001", trainer)


@pytest.mark.parametrize("values, message", [
    ({"loss": math.nan, "policy_grad_norm": 1.0}, "loss=nan"), ({"loss": 0.1, "policy_grad_norm": math.inf},
                                                               "policy_grad_norm=inf"),
    ({"loss": 0.1, "value_grad_norm": -math.inf}, "value_grad_norm=-inf")])
def test_check_update_names_the_non_finite_value(values, message):
    with pytest.raises(NonFiniteError, match=rf"step 7: non-finite {message}"):
        check_update(values, 7)
    check_update({"loss": 0.1, "policy_grad_norm": 2.0}, 7)


def test_check_parameters_catches_overflowed_weights():
    """A finite but huge learning rate can overflow weights without any NaN gradient."""
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.tensor([1.0, math.inf]))]
    with pytest.raises(NonFiniteError, match="step 3: the optimizer step made weights non-finite"):
        check_parameters(weights, 3)
    check_parameters(weights[:1], 3)


@pytest.mark.parametrize("where", [0, 5, 9])
def test_check_parameters_reads_weights_stored_side_by_side_as_one_block(where):
    """Weights tiling one storage (a paired policy and critic: ppo/speed/model_pairs.py) are checked
    as one block, and a NaN anywhere in it, or in a weight outside it, still stops the run;
    huge but finite weights (a block norm that overflows) do not."""
    rows = torch.zeros(2, 5)
    weights = [torch.nn.Parameter(torch.empty(0)) for _ in range(4)]
    for w, (row, cols) in zip(weights, [(0, slice(0, 2)), (0, slice(2, 5)), (1, slice(0, 2)), (1, slice(2, 5))]):
        w.data = rows[row, cols]
    apart = torch.nn.Parameter(torch.ones(3))
    blocks, rest = guards.contiguous_blocks(weights + [apart, weights[0]])
    assert len(blocks) == 1 and blocks[0].data_ptr() == rows.data_ptr() and blocks[0].numel() == 10
    assert len(rest) == 1 and rest[0] is apart
    check_parameters(weights + [apart], 1)
    rows.view(-1)[where] = 3e38  # finite, but its square overflows the block's norm
    check_parameters(weights + [apart], 1)
    rows.view(-1)[where] = math.nan
    with pytest.raises(NonFiniteError):
        check_parameters(weights + [apart], 2)
    rows.view(-1)[where] = 0.0
    apart.data[1] = math.inf
    with pytest.raises(NonFiniteError):
        check_parameters(weights + [apart], 3)
    # a gap between two tensors of one storage: each is checked on its own
    blocks, rest = guards.contiguous_blocks([rows[0, :2], rows[1, :2]])
    assert blocks == [] and len(rest) == 2


# ---------------------------------------------------------------- the sweep runner's children
RUNNER_DRIVER = '''
import sys
from types import SimpleNamespace
import ablations.run_attempt as run_attempt
import ablations.runner as runner
from ppo.config import PPOConfig

def sleeper(spec, resume=False):  # stands in for ppo.cli: records its pid, then sleeps
    code = ("import os, pathlib, time; pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(120)"
            % str(spec.run_dir / "child.pid"))
    return [sys.executable, "-c", code]

run_attempt.run_command = sleeper  # what launch_run starts
# An ablation without the registry's imports (torch, transformers): the driver starts fast.
ablation = SimpleNamespace(name="toy", variants=[SimpleNamespace(name="a")],
                           config=lambda variant, seed, output_dir, steps: PPOConfig(seed=seed, output_dir=output_dir))
runner.run_sweep([ablation], sys.argv[1], seeds=1, workers=1, progress=False, reuse=False)
'''


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it if it exited
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _start_driver(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(RUNNER_DRIVER)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path / "sweep")], env=env, cwd=root)
    pid_file = tmp_path / "sweep" / "toy" / "a" / "seed1" / "child.pid"
    deadline = time.time() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    return driver, int(pid_file.read_text()), pid_file.parent


def test_runner_stops_its_runs_on_sigterm(tmp_path):
    driver, child, _ = _start_driver(tmp_path)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) != 0
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_runner_killed_with_sigkill_takes_its_runs_with_it(tmp_path):
    """SIGKILL cannot be caught, but every run is started to die with the process that
    launched it (Linux PR_SET_PDEATHSIG): no orphan keeps writing, and its lock is gone."""
    from ppo.run.run_lock import RunLock

    driver, child, run_dir = _start_driver(tmp_path)
    driver.kill()
    driver.wait(timeout=30)
    deadline = time.time() + 20
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    lock = RunLock(run_dir)
    assert lock.acquire()  # the lock died with the last process holding it
    lock.release()


def test_a_run_directory_locked_by_a_live_process_is_left_untouched(tmp_path):
    """A second sweep over the same directory (or any live holder of the run's lock) makes
    the attempt fail without clearing the directory under the process that writes it."""
    import ablations.runner as runner
    from ablations.runner import RunSpec

    run_dir = tmp_path / "sweep" / "toy" / "a" / "seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    holder_code = ("import sys, time; from pathlib import Path; from ppo.run.run_lock import RunLock; "
                   "lock = RunLock(Path(sys.argv[1])); assert lock.acquire(); print('held', flush=True); "
                   "time.sleep(120)")
    root = Path(__file__).resolve().parent.parent
    holder = subprocess.Popen([sys.executable, "-c", holder_code, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert holder.stdout.readline().strip() == "held"
        spec = RunSpec("toy", "a", 1, run_dir, PPOConfig(output_dir=str(run_dir)))
        outcome = runner.attempt_run(spec, timeout=None)
        assert outcome.status == "failed" and "in use by another live process" in outcome.error
        assert (run_dir / "metrics.jsonl").read_text() == '{"step": 0}\n'  # not cleared
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- resume: changed configs, damaged directories
def event_tag_steps(run):
    """Every (tag, step) of scalar summaries in the run's raw tensorboard event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    pairs = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            pairs += [(value.tag, event.step) for value in event.summary.value]
    return pairs


def run_steps(run, name="metrics.jsonl"):
    return [json.loads(line)["step"] for line in (run / name).read_text().splitlines()]


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A 3-step run (checkpoints kept: steps 2 and 3) and its final weights."""
    run = tmp_path_factory.mktemp("finished") / "run"
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(run), **TINY)
    trainer = RLTrainer(config)
    trainer.train()
    return run, config, {k: v.clone() for k, v in trainer.policy.state_dict().items()}


def copy_run(finished_run, tmp_path):
    import shutil

    run, config, weights = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy, config.replace(output_dir=str(copy)), weights


def resume(config, **kwargs):
    trainer = RLTrainer(config)
    trainer.train(resume=True, **kwargs)
    return trainer


@pytest.mark.parametrize("change, listed", [
    (dict(lr=0.5), "lr: 0.001 in the run, 0.5 requested"),
    (dict(advantage_estimator="rloo", group_size=2), "advantage_estimator: 'gae' in the run, 'rloo' requested"),
    (dict(seed=3), "seed: 0 in the run, 3 requested"),
    (dict(kl_coef=0.0), "kl_coef: 0.05 in the run, 0.0 requested"),
    (dict(response_length=9), "response_length: 8 in the run, 9 requested")])
def test_resume_refuses_a_changed_config(finished_run, tmp_path, change, listed):
    run, config, _ = copy_run(finished_run, tmp_path)
    before = (run / "config.yaml").read_text()
    with pytest.raises(RunDirectoryError, match=listed) as error:
        resume(config.replace(total_steps=4, **change))
    assert "--allow-change " + next(iter(change)) in str(error.value)
    assert (run / "config.yaml").read_text() == before  # the run's record is untouched


def test_resume_refuses_another_model_even_when_allowed(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    from ppo.run.run_dir import resume_changes

    with pytest.raises(RunDirectoryError, match="model_path cannot change on resume"):
        resume_changes(run, config.replace(model_path=str(tmp_path)), ["model_path"])
    with pytest.raises(RunDirectoryError, match=r"unknown field\(s\) \['bogus'\]"):
        resume_changes(run, config, ["bogus"])
    assert resume_changes(run, config.replace(total_steps=9, eval_every=1, threads=1)) == {}


def test_allowed_change_is_used_and_recorded(finished_run, tmp_path):
    """--resume --lr 0.5 --allow-change lr: the restored optimizer really uses 0.5 (not the
    saved 1e-3), config.yaml says 0.5 and resume_history.jsonl says from which step."""
    run, config, _ = copy_run(finished_run, tmp_path)
    trainer = resume(config.replace(total_steps=5, lr=0.5), allow_changes=["lr"], stop_after=4)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The row of step 4 logs the rate after 4 scheduler steps of a 5-step linear decay.
    assert rows[-1]["step"] == 4 and rows[-1]["lr"] == pytest.approx(0.5 * (1 - 4 / 5))
    assert trainer.schedulers[0].base_lrs == [0.5]
    assert PPOConfig.from_yaml(run / "config.yaml").lr == 0.5
    history = [json.loads(line) for line in (run / "resume_history.jsonl").read_text().splitlines()]
    # The run had finished at step 3: training it further keeps that summary in the history.
    finished = history[0].pop("extends_finished_run")
    assert finished["steps"] == 3 and finished["total_steps"] == 3
    assert history == [{"resumed_at_step": 3, "time": history[0]["time"],
                        "changed": {"lr": {"before": 0.001, "after": 0.5}}}]


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


class _Crafted:
    """A pickle that runs a shell command when unpickled without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("damage", ["truncated_weights", "truncated_trainer_state", "garbage_state_json",
                                    "empty_weights", "crafted_pickle"])
def test_damaged_newest_checkpoint_and_logs_resume_from_the_intact_one(finished_run, tmp_path, damage):
    """The newest checkpoint (step 3) is damaged, metrics.jsonl ends in a partial line,
    samples.jsonl holds bytes that are not UTF-8 and an interrupted save left a .tmp folder:
    the resume warns, loads step 2, redoes step 3 to the same weights, and leaves no
    duplicate log line or (tag, step) event."""
    run, config, weights = copy_run(finished_run, tmp_path)
    newest = run / "checkpoints" / "step_000003"
    marker = tmp_path / "pwned"
    if damage == "truncated_weights":
        truncate(newest / "policy" / "model.safetensors")
    elif damage == "empty_weights":
        (newest / "policy" / "model.safetensors").write_bytes(b"")
    elif damage == "truncated_trainer_state":
        truncate(newest / "trainer_state.pt")
    elif damage == "garbage_state_json":
        (newest / "state.json").write_text('{"step": 3, "kl_contr')
    else:
        torch.save({"policy_optimizer": _Crafted(marker)}, newest / "trainer_state.pt")
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "score": 0.')
    with open(run / "samples.jsonl", "ab") as handle:
        handle.write(b'{"step": 2, "response": "\xff\xfe"}\n')
    (run / "checkpoints" / ".tmp_step_000004_999").mkdir()
    with pytest.warns(UserWarning, match="step_000003: damaged checkpoint skipped"):
        trainer = resume(config)
    assert not marker.exists()  # the crafted pickle was refused, not run
    assert run_steps(run) == [0, 1, 2, 3]
    assert run_steps(run, "samples.jsonl") == [1, 1, 2, 2, 3, 3]
    assert not list((run / "checkpoints").glob(".tmp_*"))
    pairs = event_tag_steps(run)
    assert len(pairs) == len(set(pairs)) and ("score", 3) in pairs
    assert all(torch.equal(weights[k], v) for k, v in trainer.policy.state_dict().items())


def test_every_checkpoint_damaged_is_an_error_not_a_silent_restart(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    for checkpoint in (run / "checkpoints").glob("step_*"):
        truncate(checkpoint / "trainer_state.pt")
    with pytest.warns(UserWarning), pytest.raises(RunDirectoryError, match="no intact checkpoint.*--restart"):
        resume(config)


def test_broken_config_yaml_on_resume_names_the_file(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / "config.yaml").write_text("lr: [0.1\n")
    with pytest.raises(RunDirectoryError, match=r"config\.yaml: cannot be read .*not valid YAML.*--restart"):
        resume(config)


def test_run_killed_before_its_first_checkpoint_resumes_from_step_0(finished_run, tmp_path):
    """save_every=0 and a kill before the end: logs, events and config.yaml but no
    checkpoint. --resume starts again from step 0 (same final weights); a plain start is
    refused with a message naming --resume and --restart; --restart starts over."""
    import shutil

    run, config, weights = copy_run(finished_run, tmp_path)
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(FileExistsError, match="--restart"):
        RLTrainer(config).train()
    with pytest.warns(UserWarning, match="no checkpoint yet; the run starts again from step 0"):
        trainer = resume(config)
    assert run_steps(run) == [0, 1, 2, 3]
    pairs = event_tag_steps(run)
    assert len(pairs) == len(set(pairs))
    assert all(torch.equal(weights[k], v) for k, v in trainer.policy.state_dict().items())
    (run / "resume_history.jsonl").unlink()
    RLTrainer(config.replace(total_steps=1)).train(restart=True)
    assert run_steps(run) == [0, 1] and not (run / "resume_history.jsonl").exists()


# ---------------------------------------------------------------- smaller: files, the CLI
def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    from ppo.tasks import TaskDataError, load_gsm8k_jsonl
    from ppo.tasks.preferences import load_preferences

    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "\xff", "answer": "#### 2"}\n')
    with pytest.raises(TaskDataError, match=rf"{path}:2: not UTF-8"):
        load_gsm8k_jsonl(path)
    path.write_bytes(b'\n\xff\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not UTF-8"):
        load_preferences(path)


@pytest.mark.parametrize("argv, message", [
    (["--seed", str(2**70)], r"PPOConfig\.seed: must be in"),
    (["--lr", ".nan"], r"PPOConfig\.lr: must be a finite number"),
    (["--temperature", ".inf"], r"PPOConfig\.temperature: must be a finite number"),
    (["--resume", "--restart"], "pass one"),
    (["--allow-change", "lr"], "only applies with --resume"),
    (["--config", "/nonexistent/config.yaml"], "no such config file"),
])
def test_cli_usage_errors_are_one_line(tmp_path, capsys, argv, message):
    from ppo.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and re.search(message, err) and "Traceback" not in err


def test_cli_errors_inside_the_trainer_print_no_traceback(tmp_path, capsys, finished_run):
    from ppo.cli import main

    assert main(["--model-path", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppo-train: error: ") and "model directory does not exist" in err and "Traceback" not in err
    run, config, _ = copy_run(finished_run, tmp_path)
    assert main(["--resume", "--output-dir", str(run), "--lr", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "lr: 0.001 in the run, 0.5 requested" in err and "Traceback" not in err


def test_sigterm_to_the_sweep_command_prints_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    """`python -m ablations run` stopped by SIGTERM (or Ctrl-C) says what happened in one line."""
    from ablations import runner
    from ablations.__main__ import main
    from ablations.run_process import SweepInterrupted

    def stopped(*args, **kwargs):
        raise SweepInterrupted()

    monkeypatch.setattr(runner, "run_sweep", stopped)
    assert main(["run", "quick", "--seeds", "1", "--out", str(tmp_path / "s")]) == 143
    err = capsys.readouterr().err
    assert "SIGTERM: stopped" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr(runner, "run_sweep", interrupted)
    assert main(["run", "quick", "--seeds", "1", "--out", str(tmp_path / "s")]) == 130
    assert "interrupted: stopped" in capsys.readouterr().err

"""A run directory nobody can corrupt, and evaluation as guarded as training.

One writer per run directory (a second start or resume fails naming the live process, with
real processes); nothing the run did not write is overwritten or removed (fresh starts,
``--restart`` and its manifest); the launcher's death ends its workers (a real 2-process
launch); damaged but parseable checkpoint state, full and read-only disks, symbolic links
and odd files get named errors or fall back; evaluation applies training's non-finite and
truncation rules; reward functions that raise are named with the step and batch; and the
model-side cases (pad ids past the embedding, two accelerate precisions in one process, the
reference's forward path, special tokens spelled in prompts). docs/reliability.md lists
each case with its test.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ppo.run import checkpoints, run_dir, run_lock
from ppo.cli import build_parser, config_from_args, main
from ppo.config import PPOConfig
from ppo.run.guards import NonFiniteError, RewardFunctionError, check_scores, reward_values
from ppo.run.run_dir import RunDirectoryError
from ppo.trainer import RLTrainer

from test_reliability import TINY, PROMPTS, copy_run, count_ones, finished_run, resume  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
CLI_TINY = ["--rollout-batch-size", "4", "--response-length", "8", "--eval-size", "2", "--eval-every", "0",
            "--ppo-epochs", "1", "--progress", "false", "--threads", "1", "--device", "cpu", "--lr", "0.001"]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.split(")")[-1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ one writer per directory
@pytest.mark.slow  # holds a live run while two more start: about 30 s (make test-all)
def test_a_second_start_or_resume_of_a_live_run_fails_naming_the_process(tmp_path, tiny_model_dir):
    """Two writers would mix steps [0,0,1,1,...] in one metrics.jsonl: the second fails at once."""
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "ppo.cli", "--model-path", str(tiny_model_dir), "--output-dir",
                              str(run), "--total-steps", "1000", "--save-every", "0", *CLI_TINY],
                             env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        _wait_for(lambda: (run / "metrics.jsonl").exists() or first.poll() is not None, 120, "the first run")
        assert first.poll() is None, first.stderr.read()
        config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(run), **TINY)
        for kwargs in ({}, {"resume": True}):
            before = (run / "config.yaml").read_text()
            with pytest.raises(RunDirectoryError, match=rf"process {first.pid} is writing this run"):
                RLTrainer(config).train(**kwargs)
            assert (run / "config.yaml").read_text() == before
        # A second writer through a symbolic link to the live run, and through a spelling with
        # '..' and a trailing '/': one directory, one lock (a real second process for the link).
        (tmp_path / "link").symlink_to(run)
        second = subprocess.run([sys.executable, "-m", "ppo.cli", "--output-dir", str(tmp_path / "link"), "--resume"],
                                env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr[-2000:]
        assert f"process {first.pid} is writing this run" in second.stderr
        with pytest.raises(RunDirectoryError, match=rf"process {first.pid} is writing this run"):
            RLTrainer(config.replace(output_dir=f"{tmp_path}/link/../run/")).train(resume=True)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(len(steps)))  # one writer: no step twice
    assert RLTrainer(config).train(resume=True, stop_after=1)  # the lock died with its holder


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path, tiny_model_dir, monkeypatch):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **TINY)
    trainer = RLTrainer(config)
    seen = []
    real_step = trainer.train_step

    def step():
        probe = run_lock.RunLock(config.output_dir)
        seen.append(probe.acquire())
        probe.release()
        return real_step()

    monkeypatch.setattr(trainer, "train_step", step)
    trainer.train(stop_after=1)
    assert seen == [False]
    probe = run_lock.RunLock(config.output_dir)
    assert probe.acquire() and probe.holder() == os.getpid()
    probe.release()


def test_a_lock_inherited_from_the_sweep_runner_is_taken_over(tmp_path, monkeypatch):
    runner = run_lock.RunLock(tmp_path / "run")
    assert runner.acquire()
    try:
        with pytest.raises(RunDirectoryError, match="is writing this run"):
            run_lock.lock_run(tmp_path / "run")
        monkeypatch.setenv(run_lock.LOCK_FD_VARIABLE, str(runner.fd))
        run_lock.lock_run(tmp_path / "run").release()
    finally:
        runner.release()


# ------------------------------------------------------- never touch what the run did not write
def test_a_fresh_start_refuses_a_folder_that_is_not_a_run(tmp_path, tiny_model_dir):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "config.yaml").write_text("my: own settings\n")
    (run / "notes.txt").write_text("keep me")
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(run), **TINY)
    with pytest.raises(RunDirectoryError, match=r"not empty and not a run of this project \(it holds "
                                                r"config.yaml, notes.txt\)"):
        RLTrainer(config).train()
    with pytest.raises(RunDirectoryError, match="not a run of this project"):
        RLTrainer(config).train(restart=True)  # nothing here is the run's to remove
    assert (run / "config.yaml").read_text() == "my: own settings\n"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "notes.txt"]


def test_the_sweep_runners_own_files_do_not_block_a_fresh_start(tmp_path):
    (tmp_path / "stdout.log").write_text("")
    (tmp_path / "requested_config.yaml").write_text("seed: 1\n")
    run_dir.check_fresh_start(tmp_path)
    with pytest.raises(FileExistsError, match="a run already exists here"):
        (tmp_path / run_dir.MANIFEST).write_text("config.yaml\n")
        run_dir.check_fresh_start(tmp_path)


def test_restart_removes_exactly_the_files_the_run_wrote(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    listed = run_dir.written_files(run)
    assert "config.yaml" in listed and any(name.startswith("events.out.tfevents.") for name in listed)
    assert "checkpoints/step_000003/policy/model.safetensors" in listed
    (run / "checkpoints" / "my_model.bin").write_text("mine")
    (run / "notes.txt").write_text("mine")
    run_dir.clear_outputs(run)
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert left == ["checkpoints", "checkpoints/my_model.bin", "notes.txt"]


def test_restart_starts_the_run_over_beside_the_users_files(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / "checkpoints" / "my_model.bin").write_text("mine")
    RLTrainer(config).train(restart=True, stop_after=1)
    assert (run / "checkpoints" / "my_model.bin").read_text() == "mine"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["my_model.bin", "step_000001"]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_restart_of_a_run_from_before_the_manifest_keeps_other_files(finished_run, tmp_path):
    run, _, _ = copy_run(finished_run, tmp_path)
    (run / run_dir.MANIFEST).unlink()
    (run / "checkpoints" / "my_model.bin").write_text("mine")
    run_dir.clear_outputs(run)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == ["checkpoints", "checkpoints/my_model.bin"]


# ------------------------------------------------------------------- launcher death, real processes
@pytest.mark.parametrize("when", ["training", "loading"])
def test_killing_the_launcher_ends_its_workers(tmp_path, tiny_model_dir, when):
    """kill -9 of `accelerate launch` (2 CPU processes), while they train (one blocked in a
    collective, waiting for the other) or while they still import: both workers are gone
    within a second and none writes summary.json."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(ROOT / "configs/accelerate/cpu-2proc.yaml"), "--main_process_port", str(port), "-m", "ppo.cli",
         "--model-path", str(tiny_model_dir), "--output-dir", str(run), "--total-steps", "1000", "--save-every", "0",
         *CLI_TINY], env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    workers = []
    try:
        if when == "training":
            _wait_for(lambda: (run / "metrics.jsonl").exists() or launcher.poll() is not None, 180, "training")
        else:
            _wait_for(lambda: len(_children(launcher.pid)) == 2 or launcher.poll() is not None, 60, "the workers")
            time.sleep(0.5)  # inside their imports
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in workers), 1.0, "the workers to exit within a second")
        assert not (run / "summary.json").exists()
    finally:
        for pid in [launcher.pid, *workers]:  # workers left by a failure: torchrun gives them their own group
            try:
                os.killpg(pid, signal.SIGKILL) if pid == launcher.pid else os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -------------------------------------------------------------------- checkpoints: disk, state, links
@pytest.mark.parametrize("failure", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"),
    OSError(errno.ENOSPC, "No space left on device")])
def test_a_full_disk_during_a_save_names_the_disk_and_keeps_the_previous_checkpoint(
        tmp_path, tiny_model_dir, monkeypatch, failure):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **TINY)
    trainer = RLTrainer(config)
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if "step_000002" in str(path):
            raise failure
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "save", save)
    with pytest.raises(checkpoints.CheckpointWriteError) as error:
        trainer.train()
    message = str(error.value)
    assert "step_000002: could not write the checkpoint of step 2" in message
    assert "the disk is full: the disk mounted at /" in message and "MiB free" in message
    assert "step_000001 is intact" in message
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]  # no partial folder left
    monkeypatch.setattr(checkpoints.torch, "save", real_save)
    assert resume(config.replace(total_steps=2)).step == 2


def test_a_read_only_output_dir_is_named(tmp_path, tiny_model_dir, monkeypatch):
    def read_only(self):
        raise OSError(errno.EROFS, "Read-only file system", str(self.path))

    monkeypatch.setattr(run_lock.RunLock, "acquire", read_only)
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **TINY)
    with pytest.raises(RunDirectoryError, match=r"run: cannot write the run directory \(a read-only file system"):
        RLTrainer(config).train()


@pytest.mark.parametrize("field, value, message", [
    ("step", "3", "step is '3', not the step 3"), ("step", 10**9, "step is 1000000000, not the step 3"),
    ("step", -5, "step is -5, not the step 3"), ("step", 3.0, "step is 3.0"),
    ("kl_controller", {"value": "x"}, "kl_controller"), ("kl_controller", {"value": float("nan")}, "kl_controller"),
    ("kl_controller", [], "kl_controller"), ("world_size", 0, "world_size is 0"),
    ("samples_generated", -1, "samples_generated is -1"), ("retired_prompts", 5, "retired_prompts is 5")])
def test_wrong_typed_or_out_of_range_state_values_are_refused(tmp_path, field, value, message):
    folder = tmp_path / "step_000003"
    info = {"step": 3, "kl_controller": {"value": 0.05}, "world_size": 1, "samples_generated": 12,
            "retired_prompts": []}
    checkpoints.check_state(info, folder)
    with pytest.raises(ValueError, match=message):
        checkpoints.check_state({**info, field: value}, folder)


def test_damaged_but_parseable_state_falls_back_to_the_previous_checkpoint(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    state = run / "checkpoints" / "step_000003" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "step": 10**9}))
    with pytest.warns(UserWarning, match=r"step_000003: damaged checkpoint skipped \(ValueError: .*step is 1000000000"):
        trainer = resume(config, stop_after=2)
    assert trainer.step == 2  # loaded step 2: nothing to train before stop_after


def test_a_symlinked_checkpoint_folder_is_named(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    target = tmp_path / "elsewhere"
    shutil.move(run / "checkpoints" / "step_000003", target)
    (run / "checkpoints" / "step_000003").symlink_to(target)
    with pytest.raises(RunDirectoryError, match=r"step_000003: a symbolic link \(to .*elsewhere\)"):
        resume(config.replace(total_steps=4))
    assert (target / "state.json").exists()


def test_metrics_jsonl_that_is_a_directory_is_named(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    with pytest.raises(RunDirectoryError, match=r"metrics.jsonl: a directory, where the run keeps its file"):
        resume(config.replace(total_steps=4))


# --------------------------------------------------------------------- resume: config.yaml cases
def test_allow_change_of_a_field_the_checkpoints_cannot_follow_says_so(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    with pytest.raises(RunDirectoryError) as error:
        run_dir.resume_changes(run, config.replace(advantage_estimator="grpo", group_size=2),
                               ["advantage_estimator", "group_size"])
    message = str(error.value)
    assert "--allow-change advantage_estimator" in message and "cannot resume this run" in message
    assert "checkpoints are intact" in message and "no intact checkpoint" not in message


def test_an_empty_config_yaml_is_refused_on_resume(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / "config.yaml").write_text("")
    with pytest.raises(RunDirectoryError, match=r"config.yaml: cannot be read \(empty"):
        run_dir.resume_changes(run, config)
    with pytest.raises(SystemExit):
        main(["--resume", "--output-dir", str(run)])


def test_resume_without_config_yaml_is_refused_unless_allowed(finished_run, tmp_path):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / "config.yaml").unlink()
    with pytest.raises(RunDirectoryError, match=r"config.yaml: missing.*--allow-change all"):
        resume(config.replace(lr=0.5, total_steps=4))
    resume(config.replace(total_steps=4), allow_changes=["all"])
    history = [json.loads(line) for line in (run / "resume_history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"].startswith("unchecked")


def test_duplicate_yaml_keys_are_refused(finished_run, tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("lr: 0.1\nseed: 1\nlr: 0.2\n")
    assert run_dir.duplicate_keys(path.read_text()) == [("lr", 1, 3)]
    with pytest.raises(SystemExit):
        main(["--config", str(path), "--output-dir", str(tmp_path / "x")])
    assert "line 3: 'lr' is set twice (first on line 1)" in capsys.readouterr().err
    run, config, _ = copy_run(finished_run, tmp_path)
    with open(run / "config.yaml", "a") as handle:
        handle.write("seed: 4\n")
    with pytest.raises(RunDirectoryError, match="'seed' is set twice"):
        run_dir.resume_changes(run, config)


def test_resumable_fields_keep_the_runs_value_when_not_repeated(finished_run, tmp_path):
    run, _, _ = copy_run(finished_run, tmp_path)
    argv = ["--preset", "grpo", "--resume", "--output-dir", str(run), "--model-path", "m"]
    assert config_from_args(build_parser().parse_args(argv)).save_every == 1  # the run's, not the preset's 0
    assert config_from_args(build_parser().parse_args(argv + ["--save-every", "2"])).save_every == 2


# ------------------------------------------------------------------------ rewards and prompts
def test_a_reward_too_large_for_a_float_is_a_named_non_finite_reward():
    values = reward_values([1.0, 10**400], ["a", "b"], ["x", "y"])
    assert values == [1.0, float("inf")]
    with pytest.raises(NonFiniteError, match=r"gave inf for prompt 1 'b' response 'y'"):
        check_scores(torch.tensor(values), ["a", "b"], ["x", "y"], "reward_fn f")


def test_a_prompt_that_is_not_valid_text_is_named():
    from ppo.tasks.custom import CustomTask

    with pytest.raises(ValueError, match=r"CustomTask prompts\[1\] 'a\\ud800b': not valid text"):
        CustomTask(prompts=["ok", "a\ud800b"], reward_fn=count_ones)


def test_a_reward_fn_that_raises_is_named_with_step_and_batch(tmp_path, tiny_model_dir):
    calls = []

    def flaky(prompts, responses):
        calls.append(1)
        if len(calls) == 4:  # the initial evaluation makes 2 calls, step 1 the third
            raise ZeroDivisionError("bad luck")
        return count_ones(prompts, responses)

    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), task="custom", **TINY)
    with pytest.raises(RewardFunctionError, match=r"step 2 \(training rollout\): reward_fn .*flaky raised "
                                                  r"ZeroDivisionError: bad luck while scoring a batch of 4 responses"
                       ) as error:
        RLTrainer(config, prompts=PROMPTS, reward_fn=flaky).train()
    assert isinstance(error.value.__cause__, ZeroDivisionError)

    def broken(prompts, responses):
        raise KeyError("x")

    with pytest.raises(RewardFunctionError, match=r"held-out evaluation after step 0: reward_fn .*broken raised"):
        RLTrainer(config.replace(output_dir=str(tmp_path / "r2")), prompts=PROMPTS, reward_fn=broken).train()


# --------------------------------------------------------------------------- evaluation's guards
def nan_for_nine(prompts, responses):
    return [float("nan") if p == "9+9=" else float(r.count("1")) for p, r in zip(prompts, responses)]


def test_a_nan_reward_in_evaluation_stops_the_run(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), task="custom",
                       **{**TINY, "eval_size": 4})
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=nan_for_nine)
    with pytest.raises(NonFiniteError, match=r"held-out evaluation after step 0: reward_fn .*nan_for_nine "
                                             r"\(held-out evaluation\) gave nan for prompt \d '9\+9='"):
        trainer.train()


def test_a_nan_reward_in_evaluation_is_dropped_and_counted_in_drop_mode(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), task="custom",
                       nonfinite_rewards="drop", **{**TINY, "eval_size": 4})
    metrics = RLTrainer(config, prompts=PROMPTS, reward_fn=nan_for_nine).evaluate()
    assert metrics["greedy_dropped_nonfinite"] == 1.0 and metrics["sampled_dropped_nonfinite"] == 1.0


def test_evaluation_truncates_long_prompts_as_training_does(tmp_path, tiny_model_dir):
    from ppo.models.rollout import PromptTooLongError

    long_prompts = ["1+1+1+1+1+1+1+1=", "2+3=", "9+9=", "4+4="]
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), task="custom",
                       max_prompt_length=6, **TINY)
    assert RLTrainer(config, prompts=long_prompts, reward_fn=count_ones).evaluate()["greedy_length"] > 0
    strict = config.replace(prompt_truncation="error")
    with pytest.raises(PromptTooLongError, match="prompts\\[0\\] has 17 tokens"):
        RLTrainer(strict, prompts=long_prompts, reward_fn=count_ones).evaluate()


# ------------------------------------------------------------------------------- the model side
def test_special_tokens_spelled_in_a_prompt_follow_split_special_tokens(tmp_path, tiny_model_dir):
    from ppo.models.rollout import encode_queries

    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), task="custom", **TINY)
    for split in (False, True):
        trainer = RLTrainer(config.replace(split_special_tokens=split), prompts=PROMPTS, reward_fn=count_ones)
        ids, _, _ = encode_queries(trainer.tokenizer, ["1+1<eos>=2"], None)
        assert (trainer.tokenizer.eos_token_id in ids[0].tolist()) is (not split)


def test_a_pad_id_past_the_embedding_is_resized_or_refused(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = AutoModelForCausalLM.from_pretrained(model_dir).get_input_embeddings().weight.shape[0]
    tokenizer.add_special_tokens({"pad_token": "<mypad>"})
    assert tokenizer.pad_token_id >= rows
    tokenizer.save_pretrained(model_dir)
    config = PPOConfig(model_path=str(model_dir), output_dir=str(tmp_path / "run"), task="custom", **TINY)
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)  # loaded here: the matrix grows
    assert trainer.policy.get_input_embeddings().weight.shape[0] == len(trainer.tokenizer)
    trainer.train_step()
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match=rf"pad id {tokenizer.pad_token_id} lies past the policy's embedding "
                                         rf"matrix \({rows} rows\)"):
        RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones, policy=policy, tokenizer=tokenizer)


def test_two_trainers_with_different_mixed_precision_get_a_clear_message(tmp_path, tiny_model_dir):
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"), task="custom", **TINY)
        RLTrainer(config.replace(mixed_precision="bf16"), prompts=PROMPTS, reward_fn=count_ones)
        with pytest.raises(ValueError, match=r"mixed_precision='no': this process already set up accelerate with "
                                             r"mixed_precision='bf16'.*own process"):
            RLTrainer(config.replace(output_dir=str(tmp_path / "b")), prompts=PROMPTS, reward_fn=count_ones)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _tiny_gpt2_dir(path: Path, char_tokenizer) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(char_tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=char_tokenizer.bos_token_id, eos_token_id=char_tokenizer.eos_token_id,
                        pad_token_id=char_tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(config).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_step_1_kl_is_exactly_zero_with_gradient_checkpointing(tmp_path, tiny_model_dir, char_tokenizer,
                                                               architecture):
    """The policy's passes take the HF forward under gradient checkpointing; so must the
    reference's, or rounding fakes a KL at step 1."""
    model_dir = tiny_model_dir if architecture == "llama" else _tiny_gpt2_dir(tmp_path / "gpt2", char_tokenizer)
    config = PPOConfig(model_path=str(model_dir), output_dir=str(tmp_path / "run"), task="custom",
                       gradient_checkpointing=True, **TINY)
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)
    from ppo.speed import lean_forward

    assert lean_forward.lean_backbone(trainer.ref_policy) is None
    metrics = trainer.train_step()
    assert metrics["kl_k1"] == 0.0 and metrics["kl"] == 0.0

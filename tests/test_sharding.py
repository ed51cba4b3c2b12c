"""Sharded models (PPOConfig.sharding="fsdp", ppo/parallel/sharding.py) with real processes: 1 vs 2
CPU processes over gloo.

- one update on a fixed rollout batch gives the same weights and metrics sharded over 2
  processes as in 1 (alpacafarm: reward model, critic, GAE, whitening, adaptive KL; GRPO
  with the frozen reference offloaded; GRPO distilling from a frozen teacher, sharded and
  offloaded like the reference; alpacafarm with LoRA on policy and critic), all four
  models sharded;
- each process holds half the parameters, gradients and AdamW state that DDP holds;
- the consolidated checkpoint loads with from_pretrained and scores as the sharded models do;
- kill -9 of a 2-process sharded run (``accelerate launch`` with
  configs/accelerate/cpu-2proc-fsdp.yaml), then --resume, ends with the straight run's
  weights; a resume under another sharding is refused.

All launches start together (one thread per process); only the resume waits for the kill.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ppo.config import PPOConfig, preset
from tests.test_data_parallel import assert_metrics_close

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("sharding_worker.py")
TOTAL_STEPS = 3
KILL_STEP = 2
RUN = dict(rollout_batch_size=4, response_length=8, eval_size=2, eval_every=0, total_steps=TOTAL_STEPS, save_every=1,
           keep_checkpoints=2, progress=False, log_samples=2, lr=1e-3, ppo_epochs=2, threads=1, device="cpu",
           missing_eos="penalty",  # the penalty is the learning signal of an untrained model
           ref_update_every=1, offload_frozen_models=True)  # a moving, offloaded reference is training state
# The CLI runs are launched by accelerate with this config, which switches sharding on.
FSDP_LAUNCH = ROOT / "configs" / "accelerate" / "cpu-2proc-fsdp.yaml"
# ppo.cli under torch.distributed.run, held (sleeping, a marker file written) once step
# KILL_STEP is logged when the first argument is "log"; "none" runs straight through.
HELD_RUN = '''
import sys, time, pathlib
from ppo.run import run_loop
moment, step, marker = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
real_log = run_loop.TrainingRun.log
def held_log(run, metrics):
    real_log(run, metrics)
    if moment == "log" and metrics["step"] == step:
        marker.write_text(moment)
        time.sleep(600)
run_loop.TrainingRun.log = held_log
from ppo.cli import main
sys.exit(main(sys.argv[4:]))
'''


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(processes: int, script: list[str], log: Path, accelerate_config: Path | None = None) -> subprocess.Popen:
    """`script` on `processes` CPU processes, by torchrun or by ``accelerate launch`` with `accelerate_config`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "TOKENIZERS_PARALLELISM": "false"}
    if accelerate_config is None:
        launcher = ["torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr", "127.0.0.1"]
    else:
        launcher = ["accelerate.commands.launch", "--config_file", str(accelerate_config), "--num_processes",
                    str(processes), "--main_process_ip", "127.0.0.1"]
    command = [sys.executable, "-m", *launcher, "--master_port" if accelerate_config is None else "--main_process_port",
               str(_free_port()), *script]
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path) -> None:
    try:
        assert process.wait(timeout=600) == 0, log.read_text()[-6000:]
    finally:
        process.kill()


@pytest.fixture(scope="session")
def runs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("sharding")
    held = root / "held_run.py"
    held.write_text(HELD_RUN)
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(root / "straight"), **RUN)
    cli = {}
    for name in ("straight", "killed"):
        config.replace(output_dir=str(root / name)).to_yaml(root / f"{name}.yaml")
        cli[name] = ["--config", str(root / f"{name}.yaml"), "--output-dir", str(root / name)]
    marker = root / "step_logged"
    launches = {
        "one": launch(1, [str(WORKER), str(tiny_model_dir), str(root / "one"), "update"], root / "one.log"),
        "two": launch(2, [str(WORKER), str(tiny_model_dir), str(root / "two"), "update", "checkpoint"],
                      root / "two.log"),
        "straight": launch(2, [str(held), "none", "0", str(marker), *cli["straight"]], root / "straight.log",
                           FSDP_LAUNCH),
        "killed": launch(2, [str(held), "log", str(KILL_STEP), str(marker), *cli["killed"]], root / "killed.log",
                         FSDP_LAUNCH),
    }
    try:
        killed = launches.pop("killed")
        deadline = time.time() + 600
        while not marker.exists():
            assert killed.poll() is None, (root / "killed.log").read_text()[-6000:]
            assert time.time() < deadline, "timed out waiting for the run to log its step"
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)  # the launcher; its workers see it gone and stop
        killed.wait()
        launches["resumed"] = launch(2, [str(held), "none", "0", str(marker), *cli["killed"], "--resume"],
                                     root / "killed.log", FSDP_LAUNCH)
        for name, process in launches.items():
            finish(process, root / f"{'killed' if name == 'resumed' else name}.log")
    finally:
        for process in launches.values():
            process.kill()
    return root


@pytest.mark.parametrize("name", ["gae", "grpo", "distill", "lora"])
def test_sharded_update_equals_one_process(runs, name):
    one = torch.load(runs / "one" / f"update_{name}_weights.pt", weights_only=True)
    two = torch.load(runs / "two" / f"update_{name}_weights.pt", weights_only=True)
    assert set(one) == set(two) and len(one) > 10
    for key in one:
        assert torch.allclose(one[key], two[key], atol=1e-5, rtol=0), key
    metrics_one = json.loads((runs / "one" / f"update_{name}_metrics.json").read_text())
    metrics_two = json.loads((runs / "two" / f"update_{name}_metrics.json").read_text())
    assert_metrics_close(metrics_one, metrics_two)
    assert metrics_one["policy_grad_norm"] > 0 and metrics_one["advantage_abs_mean"] > 0  # the update did move
    if name not in ("grpo", "distill"):  # the GRPO runs have no critic
        assert metrics_one["value_grad_norm"] > 0
    if name == "distill":  # the teacher's term was in the update, the same sharded as whole
        assert metrics_one["distill_kl"] > 1e-4 and "distill_kl" not in json.loads(
            (runs / "one" / "update_grpo_metrics.json").read_text())
    if name == "lora":
        assert any("lora_A" in key for key in one) and any(key.startswith("value.") and "lora_B" in key for key in one)


def test_all_four_models_are_sharded_and_frozen_ones_offloaded_when_asked(runs):
    """Every model is an FSDP module on 2 processes (OffloadPolicy: the shards stay on the device);
    with offload_frozen_models the GRPO reference's (and a distillation teacher's) shards live in
    CPU memory. In one process nothing is sharded."""
    placement = {name: json.loads((runs / "two" / f"placement_{name}.json").read_text())
                 for name in ("gae", "grpo", "distill", "lora", "gae_ddp")}
    sharded = "OffloadPolicy"
    assert placement["gae"] == dict.fromkeys(("policy", "value", "reference", "reward_model"), sharded)
    assert placement["grpo"] == {"policy": sharded, "reference": "CPUOffloadPolicy"}
    assert placement["distill"] == {"policy": sharded, "reference": "CPUOffloadPolicy", "teacher": "CPUOffloadPolicy"}
    assert placement["lora"] == {"policy": sharded, "value": sharded, "reference": "adapter-disabled policy",
                                 "reward_model": sharded}
    assert set(placement["gae_ddp"].values()) == {"whole"}
    assert set(json.loads((runs / "one" / "placement_gae.json").read_text()).values()) == {"whole"}


def test_each_process_holds_half_of_what_ddp_holds(runs):
    sharded = json.loads((runs / "two" / "memory_gae.json").read_text())
    whole = json.loads((runs / "two" / "memory_gae_ddp.json").read_text())
    for kind in ("parameters", "gradients", "optimizer_state"):
        assert whole[0][kind] == whole[1][kind] > 0  # DDP: every rank a full copy
        for rank in (0, 1):
            assert 0.45 < sharded[rank][kind] / whole[rank][kind] < 0.55, kind
        assert sum(r[kind] for r in sharded) == whole[0][kind]  # the shards add up to one copy


def test_consolidated_checkpoint_loads_and_scores_like_the_sharded_model(runs):
    report = json.loads((runs / "two" / "checkpoint.json").read_text())
    for name in ("gae", "lora"):
        checked = report[name]
        assert checked["logprob_max_diff"] < 1e-5 and checked["logprob_abs_mean"] > 1.0, name
        assert checked["value_max_diff"] < 1e-5 and checked["value_abs_mean"] > 1e-3, name
        assert {"policy/model.safetensors", "value/model.safetensors", "sharded/.metadata", "sharded/__0_0.distcp",
                "sharded/__1_0.distcp"} <= set(checked["files"])
    assert "policy/adapter/adapter_model.safetensors" in report["lora"]["files"]


def test_sampling_from_the_sharded_policy_equals_the_whole_model(runs):
    """Plain generate on the sharded policy, the ranks finishing at different steps, samples
    what the whole model samples with the same seed."""
    sampled = json.loads((runs / "two" / "checkpoint.json").read_text())["sampling"]
    assert sampled["sharded"] == sampled["whole"]
    assert [len(rows[0]) for rows in sampled["sharded"]] == [3, 10]  # rank 0 stopped early and kept in step


def test_kill_9_and_resume_of_a_sharded_run_equals_the_straight_run(runs):
    final = f"checkpoints/step_{TOTAL_STEPS:06d}"
    for part in ("policy/model.safetensors", "value/model.safetensors", "value/scalar_head.safetensors"):
        straight = load_file(str(runs / "straight" / final / part))
        resumed = load_file(str(runs / "killed" / final / part))
        assert set(straight) == set(resumed)
        assert all(torch.equal(straight[k], resumed[k]) for k in straight), part
    assert PPOConfig.from_yaml(runs / "killed" / "config.yaml").sharding == "fsdp"  # from the launch config
    assert (runs / "killed" / final / "sharded" / "__1_0.distcp").is_file()
    history = [json.loads(line) for line in (runs / "killed" / "resume_history.jsonl").read_text().splitlines()]
    assert len(history) == 1
    rows = [json.loads(line) for line in (runs / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(TOTAL_STEPS + 1))
    assert all(r["policy_grad_norm"] > 0 and r["value_grad_norm"] > 0 for r in rows[1:])  # every step trained
    # Policy and reference take the same (Hugging Face) path through sharded weights: no fake KL.
    assert rows[1]["kl_k1"] == 0.0 and rows[1]["kl"] == 0.0
    second = load_file(str(runs / "straight" / "checkpoints" / "step_000002" / "policy" / "model.safetensors"))
    assert any(not torch.equal(second[k], v) for k, v in straight_policy(runs, final).items())  # and moved


def straight_policy(runs: Path, final: str) -> dict:
    return load_file(str(runs / "straight" / final / "policy" / "model.safetensors"))


def test_resume_under_another_sharding_is_refused(runs, tmp_path):
    from ppo.run.run_dir import RunDirectoryError
    from ppo.trainer import RLTrainer

    shutil.copytree(runs / "straight", tmp_path / "run")
    config = PPOConfig.from_yaml(tmp_path / "run" / "config.yaml").replace(output_dir=str(tmp_path / "run"))
    trainer = RLTrainer(config)  # one process: nothing to shard
    with pytest.raises(RunDirectoryError, match=r"written with sharding='fsdp' on 2 processes, resumed with "
                                                r"sharding='none' on 1 process; a checkpoint resumes only under the "
                                                r"sharding that wrote it"):
        trainer.train(resume=True)


def test_resume_layouts(monkeypatch, tmp_path):
    """Which checkpoint layouts a run resumes from (`ppo.parallel.sharding.check_resume_layout`)."""
    from ppo.parallel import distributed, sharding
    from ppo.run.run_dir import RunDirectoryError

    config = PPOConfig(sharding="fsdp")
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(sharding, "sharded", lambda config: True)  # as in a 2-process run
    sharding.check_resume_layout({"sharding": "fsdp", "world_size": 2}, config, tmp_path)
    for saved, written in (({"sharding": "fsdp", "world_size": 4}, "sharding='fsdp' on 4 processes"),
                           ({"world_size": 2}, "sharding='none' on 2 processes")):  # before sharding existed
        with pytest.raises(RunDirectoryError, match=f"written with {written}, resumed with sharding='fsdp' on 2"):
            sharding.check_resume_layout(saved, config, tmp_path)
    monkeypatch.setattr(sharding, "sharded", lambda config: False)  # DDP: any number of processes
    sharding.check_resume_layout({"sharding": "none", "world_size": 4}, config, tmp_path)


def test_sharding_settings_are_checked():
    with pytest.raises(ValueError, match=r"PPOConfig.sharding: must be one of"):
        PPOConfig(sharding="zero3")
    with pytest.raises(ValueError, match=r"PPOConfig.offload_frozen_models: .*set sharding='fsdp'"):
        PPOConfig(offload_frozen_models=True).validate_for_run()
    PPOConfig(offload_frozen_models=True, sharding="fsdp").validate_for_run()
    with pytest.raises(ValueError, match=r"PPOConfig.mixed_precision: 'fp16' needs a loss scaler"):
        PPOConfig(sharding="fsdp", mixed_precision="fp16")
    with pytest.raises(ValueError, match=r"PPOConfig.generation_backend: 'vllm' loads the whole policy"):
        PPOConfig(sharding="fsdp", generation_backend="vllm")
    with pytest.raises(ValueError, match=r"PPOConfig.difficulty_filter_mode: 'resample'"):
        preset("grpo", sharding="fsdp", difficulty_filter=True, difficulty_filter_mode="resample")


def test_sharded_evaluation_scores_each_shard_in_one_call():
    from ppo.run.run_loop import sharded_eval_batch

    class Task:
        eval_batch_size = 2

    task = Task()
    assert sharded_eval_batch(task, 7, 2) == {"batch_size": 4} and task.eval_batch_size == 4
    with pytest.raises(ValueError, match=r"PPOConfig.eval_size: 1 held-out problems cannot be shared by 2"):
        sharded_eval_batch(task, 1, 2)


def test_lora_merge_from_a_gathered_state_dict_equals_peft_merge(tiny_model_dir):
    """A sharded LoRA policy is saved merged from its gathered state dict: the same weights as
    peft's own merge of the module (`ppo.models.lora.merged_state_dict`)."""
    from ppo.models.lora import apply_lora, merged_state_dict
    from ppo.models.policy import load_policy

    torch.manual_seed(0)
    policy, _ = load_policy(str(tiny_model_dir))
    model = apply_lora(policy, 4, 16.0, "all-linear")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # B starts at zero: give the merge something to add
    from_module = merged_state_dict(model)
    from_state = merged_state_dict(model, {k: v.clone() for k, v in model.state_dict().items()})
    assert set(from_module) == set(from_state) and "model.layers.0.self_attn.q_proj.weight" in from_state
    for key, value in from_module.items():
        torch.testing.assert_close(from_state[key], value, rtol=1e-6, atol=1e-6)
    base = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.allclose(from_state["model.layers.0.self_attn.q_proj.weight"], base)  # the adapter is in it

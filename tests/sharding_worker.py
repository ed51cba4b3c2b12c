"""Run by tests/test_sharding.py under ``torch.distributed.run`` (1 or 2 CPU processes, gloo).

Not a test module itself: each process runs the scenarios named on the command line and the
main process writes what the test compares into ``OUT``.

    python -m torch.distributed.run --nproc_per_node 2 tests/sharding_worker.py MODEL OUT update checkpoint

- ``update``: one train_step on a fixed global rollout batch for the alpacafarm preset
  (reward model, critic started from it, GAE, whitening, adaptive KL), GRPO (its reference
  offloaded), GRPO with on-policy distillation (a teacher, offloaded too) and alpacafarm
  with LoRA (policy and critic),
  every config with ``sharding="fsdp"``: in one process that is the plain run. Writes the
  whole weights after the step, the metrics, and each process's bytes of parameters,
  gradients and optimizer state; with 2 processes also for a DDP run of the same update.
- ``checkpoint`` (after ``update``): the sharded trainers save a checkpoint; its ``policy/``
  and ``value/`` load with ``from_pretrained`` and give the sharded models' log-probs and values.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch
from data_parallel_worker import BATCH, PROMPTS, TINY, reward_fn

from ppo.parallel import distributed, sharding
from ppo import trainer as trainer_module
from ppo.config import preset
from ppo.models.forward_passes import rollout_args
from ppo.models.logprobs import response_logprobs, response_values
from ppo.models.policy import load_policy
from ppo.models.rollout import Rollout, generate
from ppo.trainer import RLTrainer

TRAINERS: dict[str, RLTrainer] = {}
ROLLOUTS: dict[str, Rollout] = {}


def whole_state(model) -> dict[str, torch.Tensor]:
    """Every weight of `model`, gathered from its shards when it is sharded (on the main process)."""
    if sharding.is_sharded(model):
        return sharding.consolidated_state_dict(model)
    return {k: v.detach().clone() for k, v in getattr(model, "module", model).state_dict().items()}


def fixed_rollout(model_dir: str, config, problems) -> Rollout:
    """The global rollout batch, sampled by a fresh unsharded copy of the warm start with the
    Hugging Face sampler: the same on every rank, whatever the number of processes."""
    policy, tokenizer = load_policy(model_dir)
    prompts = [p.prompt for p in problems for _ in range(config.group_size)]
    torch.manual_seed(7)
    stops = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["3", "7"])]  # responses of several lengths
    full = generate(policy, tokenizer, prompts, config.response_length, stop_token_ids=stops)
    assert len(set(full.response_lengths.tolist())) > 1
    return full


def measure_memory(trainer: RLTrainer, rollout: Rollout) -> dict[str, int]:
    """This process's bytes of parameters, gradients (one backward through policy and critic)
    and optimizer state; the gradients are dropped again."""
    args = rollout_args(rollout)
    loss = response_logprobs(trainer.policy, *args).sum()
    if trainer.value_model is not None:
        loss = loss + response_values(trainer.value_model, *args).sum()
    loss.backward()
    memory = sharding.training_memory([trainer.policy, trainer.value_model],
                                      [trainer.policy_optimizer, trainer.value_optimizer])
    for optimizer in (trainer.policy_optimizer, trainer.value_optimizer):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
    return memory


def placement(model) -> str:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return type(model._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
    return "adapter-disabled policy" if hasattr(model, "peft_model") else "whole"


def fixed_batch_update(model_dir: str, out: Path, name: str, config) -> None:
    """One train_step on the fixed global batch; each rank holds its contiguous share."""
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=reward_fn)
    rank, world = distributed.rank(), distributed.world_size()
    problems = trainer.task.sample_problems(BATCH // config.group_size, random.Random(123))
    full = fixed_rollout(model_dir, config, problems)
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    per_rank = len(problems) // world
    trainer.prompt_pool.sample = lambda n: problems[rank * per_rank:(rank + 1) * per_rank]
    trainer_module.generate = lambda *args, **kwargs: Rollout(
        full.query_ids[local], full.query_mask[local], full.response_ids[local], full.response_mask[local],
        full.has_eos[local], prompt_truncated=full.prompt_truncated[local])
    metrics = trainer.train_step()
    trainer_module.generate = generate
    weights = {f"policy.{k}": v for k, v in (whole_state(trainer.policy) or {}).items()}
    if trainer.value_model is not None:
        weights.update({f"value.{k}": v for k, v in (whole_state(trainer.value_model) or {}).items()})
    memory = distributed.gather_objects([measure_memory(trainer, full)])
    if distributed.is_main_process():
        torch.save(weights, out / f"update_{name}_weights.pt")
        (out / f"update_{name}_metrics.json").write_text(json.dumps(metrics))
        (out / f"memory_{name}.json").write_text(json.dumps(memory))
    if distributed.is_main_process():  # each model: its FSDP offload policy, or how it is held
        roles = {"policy": trainer.policy, "value": trainer.value_model, "reference": trainer.ref_policy,
                 "reward_model": trainer.reward_model, "teacher": trainer.teacher}
        (out / f"placement_{name}.json").write_text(json.dumps({role: placement(model) for role, model in roles.items()
                                                                if model is not None}))
    TRAINERS[name], ROLLOUTS[name] = trainer, full


def reward_model(model: str, out: Path) -> str:
    """A scalar-head reward model on the warm start's backbone with a random head (the same on
    every rank and in every launch): AlpacaFarm's fourth model, and its critic's start."""
    path = out / "reward_model"
    if distributed.is_main_process():
        from value_model import ScalarHeadModel

        policy, _ = load_policy(model)
        torch.manual_seed(11)
        ScalarHeadModel.from_policy(policy, head_init="normal", kind="reward").save_pretrained(path)
    distributed.barrier()
    return str(path)


def teacher_model(model: str, out: Path) -> str:
    """On-policy distillation's teacher: the warm start with seeded noise on every weight (the
    same on every rank and in every launch), so its distribution differs from the policy's."""
    path = out / "teacher"
    if distributed.is_main_process():
        teacher, tokenizer = load_policy(model)
        generator = torch.Generator().manual_seed(13)
        with torch.no_grad():
            for parameter in teacher.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
        teacher.save_pretrained(path)
        tokenizer.save_pretrained(path)
    distributed.barrier()
    return str(path)


def scenario_update(model: str, out: Path) -> None:
    fixed = dict(task="custom", total_steps=1, warmup_steps=0, num_minibatches=1, sharding="fsdp")
    # All four models: policy, critic (from the reward model, AlpacaFarm), reference, reward model.
    gae = preset("alpacafarm", testbed=True, model_path=model, output_dir=str(out / "u_gae"), **TINY)
    gae = gae.replace(whiten_rewards=True, whiten_advantages=True, loss_agg="token_mean", ppo_epochs=2,
                      gradient_accumulation_steps=2, adaptive_kl=True, reward_model_path=reward_model(model, out),
                      value_init="reward_model", **fixed)
    fixed_batch_update(model, out, "gae", gae)
    grpo = preset("grpo", testbed=True, model_path=model, output_dir=str(out / "u_grpo"), group_size=4, **TINY)
    grpo = grpo.replace(grpo_scale="batch", gradient_accumulation_steps=1, offload_frozen_models=True, **fixed)
    fixed_batch_update(model, out, "grpo", grpo)
    # GRPO plus the reverse KL to a teacher: a fifth model, frozen, sharded (and offloaded) like the reference.
    distill = grpo.replace(output_dir=str(out / "u_distill"), teacher_model_path=teacher_model(model, out),
                           distill_coef=0.5)
    fixed_batch_update(model, out, "distill", distill)
    lora = gae.replace(output_dir=str(out / "u_lora"), lora_r=4, lora_critic=True)
    fixed_batch_update(model, out, "lora", lora)
    if distributed.world_size() > 1:  # the same update with whole models on every rank (DDP)
        fixed_batch_update(model, out, "gae_ddp", gae.replace(output_dir=str(out / "u_ddp"), sharding="none"))


def scenario_checkpoint(model: str, out: Path) -> None:
    """Consolidated checkpoints load with from_pretrained and score as the sharded models do."""
    from transformers import AutoModelForCausalLM

    from value_model import ScalarHeadModel

    report = {}
    for name in ("gae", "lora"):
        trainer, rollout = TRAINERS[name], ROLLOUTS[name]
        path = distributed.broadcast_object(str(trainer.save_checkpoint()))
        args = rollout_args(rollout)
        with torch.no_grad():
            sharded_logprobs = response_logprobs(trainer.policy, *args)
            sharded_values = response_values(trainer.value_model, *args)
        if distributed.is_main_process():
            policy = AutoModelForCausalLM.from_pretrained(Path(path) / "policy").eval()
            critic = ScalarHeadModel.from_pretrained(Path(path) / "value").eval()
            with torch.no_grad():
                loaded_logprobs, loaded_values = response_logprobs(policy, *args), response_values(critic, *args)
            report[name] = {
                "logprob_max_diff": float((loaded_logprobs - sharded_logprobs).abs().max()),
                "value_max_diff": float((loaded_values - sharded_values).abs().max()),
                "logprob_abs_mean": float(loaded_logprobs.abs().mean()),
                "value_abs_mean": float(loaded_values.abs().mean()),
                "files": sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file())}
    report["sampling"] = sampling_matches_whole_model(model, out)
    if distributed.is_main_process():
        (out / "checkpoint.json").write_text(json.dumps(report))


def sampling_matches_whole_model(model_dir: str, out: Path) -> dict | None:
    """Each rank samples its own prompts from the sharded policy (rank 0 stops after 3 tokens,
    so it keeps stepping in sync while rank 1 samples on); the main process samples the same
    prompts from the whole warm start with the same seeds: the same responses."""
    trainer = TRAINERS["grpo"]  # not updated past its one step; compared with its consolidated weights
    tokenizer, rank = trainer.tokenizer, distributed.rank()
    prompts = {0: ["1+2=", "7+7="], 1: ["3+9=", "5+5=", "8+1="]}
    lengths = {0: 3, 1: trainer.config.response_length}
    whole = {k.removeprefix("policy."): v for k, v in (whole_state(trainer.policy) or {}).items()}

    def sample(policy, r):
        torch.manual_seed(100 + r)
        return generate(policy, tokenizer, prompts[r], lengths[r]).response_ids.tolist()

    sharded = distributed.gather_objects([sample(trainer.policy, rank)])
    if not distributed.is_main_process():
        return None
    policy, _ = load_policy(model_dir)
    policy.load_state_dict(whole)
    return {"sharded": sharded, "whole": [sample(policy, r) for r in (0, 1)]}


if __name__ == "__main__":
    model_dir, out_dir, *scenarios = sys.argv[1:]
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    for scenario in scenarios:
        {"update": scenario_update, "checkpoint": scenario_checkpoint}[scenario](model_dir, out_path)
    distributed.shutdown()
    # Everything is written and the group is gone: leave without the interpreter's teardown of
    # native threads, which once aborted a rank here (SIGABRT after its results were written)
    # while the other rank was still exiting, failing the test on the exit code alone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

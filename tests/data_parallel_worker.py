"""Run by tests/test_data_parallel.py under ``torch.distributed.run`` (1 or 2 CPU processes, gloo).

Not a test module itself: each process runs the scenarios named on the command line and
the main process writes what the test compares into ``OUT``.

    python -m torch.distributed.run --nproc_per_node 2 tests/data_parallel_worker.py MODEL OUT update train stale \
        whitening_scope
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from ppo.parallel import distributed
from ppo import trainer as trainer_module
from ppo.config import preset
from ppo.models.rollout import Rollout, generate
from ppo.trainer import RLTrainer

BATCH = 8  # global rollout batch
TINY = dict(rollout_batch_size=BATCH, response_length=10, eval_size=6, eval_every=2, save_every=0, progress=False,
            log_samples=8, lr=1e-3, threads=1, device="cpu")


MANY_PROMPTS = [f"{a}+{b}=" for a in range(15) for b in range(15)]  # ranks rarely draw the same one
PROMPTS = ["1+1=", "2+3=", "9+9=", "4+4=", "7+1=", "5+6=", "8+2=", "3+3="]


def reward_fn(prompts: list[str], responses: list[str]) -> list[float]:
    """A deterministic reward that differs across responses (a random model earns no task reward)."""
    return [float(response.count("1")) + 0.25 * len(response) for response in responses]


def fixed_batch_update(out: Path, name: str, config) -> None:
    """One train_step on a fixed global rollout batch; each rank holds its contiguous share."""
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=reward_fn)
    rank, world = distributed.rank(), distributed.world_size()
    problems = trainer.task.sample_problems(BATCH // config.group_size, random.Random(123))  # global prompts
    full_prompts = [p.prompt for p in problems for _ in range(config.group_size)]
    torch.manual_seed(7)  # the same global rollout on every rank, whatever the world size
    tokenizer = trainer.tokenizer
    # Extra stop tokens give the fixed batch responses of different lengths (masks matter).
    stops = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["3", "7"])]
    full = generate(trainer.accelerator.unwrap_model(trainer.policy), tokenizer, full_prompts,
                    config.response_length, stop_token_ids=stops)
    assert len(set(full.response_lengths.tolist())) > 1
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    prompts_per_rank = len(problems) // world
    trainer.prompt_pool.sample = lambda n: problems[rank * prompts_per_rank:(rank + 1) * prompts_per_rank]
    trainer_module.generate = lambda *args, **kwargs: Rollout(
        full.query_ids[local], full.query_mask[local], full.response_ids[local], full.response_mask[local],
        full.has_eos[local], prompt_truncated=full.prompt_truncated[local])
    metrics = trainer.train_step()
    trainer_module.generate = generate
    weights = {f"policy.{k}": v for k, v in trainer.accelerator.unwrap_model(trainer.policy).state_dict().items()}
    if trainer.value_model is not None:
        weights.update({f"value.{k}": v
                        for k, v in trainer.accelerator.unwrap_model(trainer.value_model).state_dict().items()})
    # DDP must keep every rank's copy identical: rank 0 compares its weights with everyone's.
    gathered = distributed.gather_objects([{k: v.clone() for k, v in weights.items()}])
    if distributed.is_main_process():
        for other in gathered[1:]:
            assert all(torch.equal(other[k], weights[k]) for k in weights), "ranks disagree on the weights"
        torch.save(weights, out / f"update_{name}_weights.pt")
        (out / f"update_{name}_metrics.json").write_text(json.dumps(metrics))


def scenario_update(model: str, out: Path) -> None:
    fixed = dict(task="custom", total_steps=1, warmup_steps=0, num_minibatches=1)
    gae = preset("alpacafarm", testbed=True, model_path=model, output_dir=str(out / "u_gae"), **TINY)
    gae = gae.replace(whiten_rewards=True, whiten_advantages=True, loss_agg="token_mean", ppo_epochs=2,
                      gradient_accumulation_steps=2, **fixed)
    fixed_batch_update(out, "gae", gae)
    grpo = preset("grpo", testbed=True, model_path=model, output_dir=str(out / "u_grpo"), group_size=4, **TINY)
    grpo = grpo.replace(grpo_scale="batch", gradient_accumulation_steps=1, **fixed)
    fixed_batch_update(out, "grpo", grpo)


def scenario_train(model: str, out: Path) -> None:
    """Straight run, split + resumed run, and a run that stops epochs early on target_kl."""
    common = dict(model_path=model, group_size=4, total_steps=4, task="custom", **TINY)
    config = preset("grpo", testbed=True, output_dir=str(out / "straight"), **common).replace(
        ppo_epochs=2, num_minibatches=2, adaptive_kl=True, kl_target=0.01, kl_horizon=100)
    prompts = MANY_PROMPTS
    straight = RLTrainer(config, prompts=prompts, reward_fn=reward_fn)
    straight.train()
    first = RLTrainer(config.replace(output_dir=str(out / "split")), prompts=prompts, reward_fn=reward_fn)
    first.train(stop_after=2)
    resumed = RLTrainer(config.replace(output_dir=str(out / "split")), prompts=prompts, reward_fn=reward_fn)
    resumed.train(resume=True)
    same = all(torch.equal(a, b) for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()))
    early = RLTrainer(config.replace(output_dir=str(out / "early"), ppo_epochs=4, target_kl=1e-4, lr=3e-2),
                      prompts=prompts, reward_fn=reward_fn)
    early_metrics = [early.train_step() for _ in range(2)]
    decisions = distributed.gather_objects([[m["early_stopped"] for m in early_metrics]])
    if distributed.is_main_process():
        (out / "train.json").write_text(json.dumps({"resumed_weights_equal": same, "early_stopped": decisions}))


def _digest(module: torch.nn.Module) -> str:
    """One string per set of weights: equal strings, bit-identical weights."""
    import hashlib

    hasher = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        hasher.update(name.encode())
        hasher.update(tensor.detach().float().contiguous().numpy().tobytes())
    return hasher.hexdigest()


def scenario_stale(model: str, out: Path) -> None:
    """rollout_staleness = 2 in data parallel: each rank keeps its own history of the (shared)
    weights; records, per step and rank, the policy's weights at the step's start and the weights
    the step sampled with."""
    config = preset("grpo", testbed=True, model_path=model, output_dir=str(out / "stale"), group_size=4,
                    total_steps=5, task="custom", rollout_staleness=2, **TINY)
    trainer = RLTrainer(config, prompts=MANY_PROMPTS, reward_fn=reward_fn)
    policy = trainer.policy_module
    history = trainer.state.policy_history
    starts, sampled, versions = [], [], []
    for _ in range(config.total_steps):
        starts.append(_digest(policy))
        trainer.train_step()
        sampled.append(_digest(history.sampler))
        versions.append(history.version)
    gathered = distributed.gather_objects([{"starts": starts, "sampled": sampled, "versions": versions}])
    if distributed.is_main_process():
        (out / "stale.json").write_text(json.dumps(gathered))


WHITENING_ROWS, WHITENING_WIDTH = 16, 6  # the global batch of the whitening_scope scenario


def whitening_inputs() -> dict[str, torch.Tensor]:
    """The whitening_scope scenario's global batch, the same on every rank (float64): scores
    ``[16]``, per-token KL, values and the response mask ``[16, 6]``. The second half's scores
    are 3x larger and shifted, so each half's statistics differ from the whole batch's."""
    generator = torch.Generator().manual_seed(11)
    rows, width = WHITENING_ROWS, WHITENING_WIDTH
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)  # [16]
    lengths[0] = width  # one response fills the width
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()  # [16, 6]
    scores = torch.randn(rows, generator=generator, dtype=torch.float64)  # [16]
    scores[rows // 2:] = 3.0 * scores[rows // 2:] + 1.0
    kl = torch.rand(rows, width, generator=generator, dtype=torch.float64) * 0.5 * mask  # [16, 6], >= 0
    values = torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.5  # [16, 6], padding too
    return {"scores": scores, "kl": kl, "values": values, "mask": mask}


def scenario_whitening_scope(model: str, out: Path) -> None:
    """Phases 5-6 (per-token rewards, advantages) of the alpacafarm preset on a fixed global
    batch of 16 rows, each rank holding its 8, once per `whitening_scope`; rank 0 writes
    every rank's rewards, advantages and returns for the test to recompute independently."""
    from ppo.algorithm.dynamic_sampling import ScoredBatch

    inputs = whitening_inputs()
    results = {}
    for scope in ("global", "process"):
        config = preset("alpacafarm", testbed=True, model_path=model, output_dir=str(out / f"whiten_{scope}"),
                        task="custom", whitening_scope=scope, **{**TINY, "rollout_batch_size": WHITENING_ROWS,
                                                                 "response_length": WHITENING_WIDTH})
        trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=reward_fn)  # joins the process group
        rank, world = distributed.rank(), distributed.world_size()
        local = slice(rank * WHITENING_ROWS // world, (rank + 1) * WHITENING_ROWS // world)
        scores, kl, values, mask = (inputs[k][local] for k in ("scores", "kl", "values", "mask"))
        rows = mask.shape[0]
        rollout = Rollout(torch.ones(rows, 1, dtype=torch.long), torch.ones(rows, 1, dtype=torch.long),
                          torch.ones(rows, WHITENING_WIDTH, dtype=torch.long), mask.long(),
                          torch.ones(rows, dtype=torch.bool))
        batch = ScoredBatch(problems=[None] * rows, rollout=rollout, texts=[""] * rows, task_scores=scores,
                            raw_scores=scores, correct=torch.zeros(rows, dtype=torch.bool),
                            well_formed=torch.zeros(rows, dtype=torch.bool))
        token_rewards, gae_mask, _ = trainer._token_rewards(batch, kl, mask, config.kl_coef, kl_in_reward=True)
        advantages, returns, _ = trainer._advantages(token_rewards, gae_mask, values, mask)
        results[scope] = {"rewards": token_rewards.tolist(), "advantages": advantages.tolist(),
                          "returns": returns.tolist()}
    gathered = distributed.gather_objects([results])
    if distributed.is_main_process():
        (out / "whitening_scope.json").write_text(json.dumps(gathered))


if __name__ == "__main__":
    model_dir, out_dir, *scenarios = sys.argv[1:]
    out_path = Path(out_dir)
    for scenario in scenarios:
        {"update": scenario_update, "train": scenario_train, "stale": scenario_stale,
         "whitening_scope": scenario_whitening_scope}[scenario](model_dir, out_path)
    distributed.shutdown()

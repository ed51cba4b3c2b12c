"""Data parallelism with real processes: 1 vs 2 CPU processes over gloo (torch.distributed.run).

- the same rollout batch gives the same update and the same logged metrics on 1 and on 2
  processes (each holding half), for GAE with whitening + token_mean and for GRPO with a
  batch-scope std;
- a 2-process run divides the work (different prompts per rank) and writes one result;
- 2-process resume equals a straight 2-process run; a target_kl early stop never deadlocks;
- with rollout_staleness = 2 every rank samples with the weights of 2 steps before, the same on
  every rank;
- whitening_scope="process" whitens each rank's rows alone (AlpacaFarm's per-process whitening,
  recomputed here from its formula), "global" the whole batch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppo.parallel import distributed
from ppo.config import PPOConfig

WORKER = Path(__file__).with_name("data_parallel_worker.py")
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(processes: int, model_dir: Path, out: Path, *scenarios: str) -> tuple[subprocess.Popen, Path]:
    """Start one `torch.distributed.run` launch (1 thread per process); its output goes to a log."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER), str(model_dir),
               str(out), *scenarios]
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as handle:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, text=True), log


@pytest.fixture(scope="session")
def runs(tmp_path_factory, tiny_model_dir):
    """One launch with 1 process and one with 2 (each runs every scenario it is given), at the
    same time: each process has one thread, and nothing they compare depends on timing."""
    root = tmp_path_factory.mktemp("dp")
    launches = [start(1, tiny_model_dir, root / "one", "update"),
                start(2, tiny_model_dir, root / "two", "update", "train", "stale", "whitening_scope")]
    try:
        for process, log in launches:
            assert process.wait(timeout=600) == 0, log.read_text()[-6000:]
    finally:
        for process, _ in launches:
            process.kill()
    return root


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_metrics_close(one: dict, two: dict) -> None:
    assert set(one) == set(two)
    for key in one:
        if key.startswith("time_"):
            continue
        a, b = one[key], two[key]
        if isinstance(a, float) and math.isnan(a):
            assert math.isnan(b), key
        else:
            assert b == pytest.approx(a, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", ["gae", "grpo"])
def test_same_update_on_one_and_two_processes(runs, name):
    one = torch.load(runs / "one" / f"update_{name}_weights.pt", weights_only=True)
    two = torch.load(runs / "two" / f"update_{name}_weights.pt", weights_only=True)
    for key in one:
        assert torch.allclose(one[key], two[key], atol=1e-5, rtol=0), key
    metrics_one = json.loads((runs / "one" / f"update_{name}_metrics.json").read_text())
    metrics_two = json.loads((runs / "two" / f"update_{name}_metrics.json").read_text())
    assert_metrics_close(metrics_one, metrics_two)
    # The update really moved the weights (a no-op update would trivially agree).
    assert metrics_one["policy_grad_norm"] > 0 and metrics_one["advantage_abs_mean"] > 0


def test_two_processes_divide_the_work_and_write_one_result(runs):
    run = runs / "two" / "straight"
    rows = read_rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # one line per step, not one per rank
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    samples = read_rows(run / "samples.jsonl")
    for step in (1, 2, 3, 4):
        prompts = {rank: {s["prompt"] for s in samples if s["step"] == step and s["rank"] == rank} for rank in (0, 1)}
        assert prompts[0] and prompts[1] and prompts[0].isdisjoint(prompts[1]), step  # each rank its own prompts
    summary = json.loads((run / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["samples"] == 4 * 8  # both ranks' samples
    assert "eval_sampled_accuracy" in rows[0] and "eval_sampled_accuracy" in rows[2]
    assert any(r.get("advantage_abs_mean", 0) > 0 for r in rows)  # the run had a learning signal


def test_two_process_resume_equals_a_straight_run(runs):
    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]

    straight = strip(read_rows(runs / "two" / "straight" / "metrics.jsonl"))
    split = strip(read_rows(runs / "two" / "split" / "metrics.jsonl"))
    assert straight == split
    assert json.loads((runs / "two" / "train.json").read_text())["resumed_weights_equal"]
    checkpoint = runs / "two" / "split" / "checkpoints" / "step_000004"
    assert (checkpoint / "rng_rank1.pt").is_file()


def test_a_two_process_checkpoint_resumes_in_one_process(runs, tmp_path):
    """Checkpoints are written once and load under any world size that divides the batch."""
    from data_parallel_worker import MANY_PROMPTS, reward_fn

    from ppo.trainer import RLTrainer

    shutil.copytree(runs / "two" / "straight", tmp_path / "run")
    config = PPOConfig.from_yaml(tmp_path / "run" / "config.yaml").replace(output_dir=str(tmp_path / "run"),
                                                                          total_steps=5)
    trainer = RLTrainer(config, prompts=MANY_PROMPTS, reward_fn=reward_fn)
    summary = trainer.train(resume=True)
    assert summary["steps"] == 5 and summary["processes"] == 1
    assert [r["step"] for r in read_rows(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]


def test_target_kl_early_stop_is_the_same_on_every_rank(runs):
    decisions = json.loads((runs / "two" / "train.json").read_text())["early_stopped"]
    assert len(decisions) == 2 and decisions[0] == decisions[1]
    assert any(decisions[0]), "target_kl must actually stop some step early for this test to mean anything"


def test_batch_that_does_not_divide_names_fields_and_world_size():
    config = PPOConfig(rollout_batch_size=12, group_size=4)
    assert config.per_process_batch_size(1) == 12
    with pytest.raises(ValueError, match=r"rollout_batch_size.*\(12\).*processes \(5\)"):
        config.per_process_batch_size(5)
    with pytest.raises(ValueError, match=r"group_size: with 2 processes each process samples 6"):
        config.per_process_batch_size(2)
    with pytest.raises(ValueError, match=r"num_minibatches: with 2 processes"):
        PPOConfig(rollout_batch_size=8, num_minibatches=8).per_process_batch_size(2)


def test_rank_seeds_differ_and_keep_rank_zero():
    assert distributed.rank_seed(3, 0) == 3
    assert len({distributed.rank_seed(s, r) for s in range(4) for r in range(4)}) == 16


def test_collectives_are_the_identity_in_one_process():
    x = torch.tensor([1.0, 2.0])
    assert distributed.world_size() == 1 and distributed.is_main_process()
    assert torch.equal(distributed.global_sum(x), x)
    assert distributed.gather_objects([1, 2]) == [1, 2]
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    means = distributed.GlobalMeans()
    means.add("a", torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0]))
    means.add("empty", torch.tensor([1.0]), torch.tensor([0.0]))
    result = means.result()
    assert result["a"] == 1.0 and math.isnan(result["empty"])


SHUTDOWN = """
import sys
import weakref
import torch.distributed as dist
from ppo.parallel import distributed
distributed.shutdown()  # no group yet: nothing to do
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
before = dist.is_initialized()


class Holder:  # like a finished trainer's DDP wrapper: in a reference cycle, holding the group
    pass


holder = Holder()
holder.group, holder.itself = dist.group.WORLD, holder
held = weakref.ref(holder)
del holder
distributed.shutdown()
print(before, dist.is_initialized(), held() is None)
"""


def test_shutdown_leaves_the_process_group():
    """`distributed.shutdown` (called at the end of `ppo.cli` and of every 2-process launch
    above, which must exit with status 0) destroys the group; without one it does nothing.
    Unreachable objects that hold the group (a finished trainer's DDP wrappers, in reference
    cycles) are collected first, so nothing keeps the gloo threads alive until interpreter exit.
    In a fresh interpreter: a group in this test process would outlive the test."""
    done = subprocess.run([sys.executable, "-c", SHUTDOWN, str(_free_port())], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False", "True"]


def test_step_1_kl_is_exactly_zero_in_two_processes(runs):
    """Each rank's policy passes run through its DDP wrapper (the HF forward), so the reference
    takes the HF forward too: the same weights through two code paths would fake a KL."""
    first = read_rows(runs / "two" / "straight" / "metrics.jsonl")[1]
    assert first["step"] == 1 and first["kl_k1"] == 0.0 and first["kl"] == 0.0


def test_stale_rollouts_in_two_processes_lag_by_k_on_every_rank(runs):
    """rollout_staleness = 2 under DDP: step t samples with the weights the policy had at the start
    of step max(0, t - 2), on each rank, and the ranks' samplers agree bit for bit."""
    ranks = json.loads((runs / "two" / "stale.json").read_text())
    assert len(ranks) == 2
    for record in ranks:
        starts, sampled = record["starts"], record["sampled"]
        assert record["versions"] == [0, 0, 0, 1, 2]
        assert sampled == [starts[max(0, t - 2)] for t in range(5)]
        assert len(set(starts)) == 5  # the policy moved every step, so the lag is visible
    assert ranks[0] == ranks[1]


# ---- whitening_scope: AlpacaFarm's per-process whitening, written out independently -----------

def alpacafarm_rewards_and_advantages(scores, kl, values, mask, beta):
    """AlpacaFarm's `_shape_reward` and `_estimate_advantage` on the rows one process holds
    (tatsu-lab/alpaca_farm@30717dd src/alpaca_farm/rl/ppo_trainer.py L67-99, its
    `torch_ops.whiten` L61-67), in plain loops: the KL clamped at 0 times -beta at every
    column, the score added at the last token; the whole padded tensor whitened with
    ``(x - mean) / (std + 1e-8)`` (population std) and the mean added back; GAE with
    gamma = lambda = 1 over every column; returns = advantages + values; the advantages
    whitened the same way, mean shifted. No all-reduce: the statistics are these rows' alone.
    Returns ``(rewards, advantages, returns)``, each ``[rows, T]``."""
    def whiten_alpacafarm(x, shift_mean):
        mean, std = x.mean(), x.std(unbiased=False)
        whitened = (x - mean) / (std + 1e-8)
        return whitened if shift_mean else whitened + mean

    rows, width = mask.shape
    shaped = -beta * kl.clamp(min=0.0)
    for row in range(rows):
        shaped[row, int(mask[row].sum()) - 1] += scores[row]
    rewards = whiten_alpacafarm(shaped, shift_mean=False)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rows, dtype=rewards.dtype)
    for t in reversed(range(width)):
        next_values = values[:, t + 1] if t < width - 1 else 0.0
        running = rewards[:, t] + next_values - values[:, t] + running
        advantages[:, t] = running
    returns = advantages + values
    return rewards, whiten_alpacafarm(advantages, shift_mean=True), returns


def _whitening_runs(runs):
    from data_parallel_worker import WHITENING_ROWS, whitening_inputs

    ranks = json.loads((runs / "two" / "whitening_scope.json").read_text())
    assert len(ranks) == 2
    return ranks, whitening_inputs(), WHITENING_ROWS // 2


def _assert_equal_to_alpacafarm(got: dict, expected: tuple, label: str) -> None:
    for name, want in zip(("rewards", "advantages", "returns"), expected):
        have = torch.tensor(got[name], dtype=torch.float64)
        assert have.shape == want.shape, (label, name)
        assert torch.allclose(have, want, rtol=1e-6, atol=1e-6), (label, name, (have - want).abs().max())


def test_whitening_scope_process_whitens_each_ranks_rows_alone(runs):
    """Under whitening_scope="process" each rank's rewards, advantages and returns are those
    of AlpacaFarm's formula applied to its own 8 rows, to 1e-6; and they differ from the
    global whitening (the halves' statistics differ), so the toggle acts."""
    from ppo.config import preset

    ranks, inputs, share = _whitening_runs(runs)
    beta = preset("alpacafarm").kl_coef
    for rank, record in enumerate(ranks):
        rows = slice(rank * share, (rank + 1) * share)
        own = alpacafarm_rewards_and_advantages(*(inputs[k][rows] for k in ("scores", "kl", "values", "mask")), beta)
        _assert_equal_to_alpacafarm(record["process"], own, f"rank {rank}, process")
        gap = (torch.tensor(record["process"]["advantages"]) - torch.tensor(record["global"]["advantages"])).abs()
        assert gap.max() > 0.05, f"rank {rank}: per-process and global whitening agree, the test cannot tell them apart"


def test_whitening_scope_global_whitens_all_16_rows_together(runs):
    """Under whitening_scope="global" (the default) each rank's rows are those of AlpacaFarm's
    formula applied to all 16 rows at once: the statistics do not depend on the split."""
    from ppo.config import preset

    ranks, inputs, share = _whitening_runs(runs)
    whole = alpacafarm_rewards_and_advantages(*(inputs[k] for k in ("scores", "kl", "values", "mask")),
                                              preset("alpacafarm").kl_coef)
    for rank, record in enumerate(ranks):
        rows = slice(rank * share, (rank + 1) * share)
        _assert_equal_to_alpacafarm(record["global"], tuple(t[rows] for t in whole), f"rank {rank}, global")

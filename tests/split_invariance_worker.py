"""The split-invariance matrix, as one function any number of processes can run.

Not a test module itself: tests/test_split_invariance.py calls `gradients` in its own
process (one process) and launches this file under ``torch.distributed.run`` (two gloo
processes, which write their gradients to ``OUT``)::

    python -m torch.distributed.run --nproc_per_node 2 tests/split_invariance_worker.py OUT

The update is the trainer's (`RLTrainer._update`), on a model small enough to hold one
parameter per token: per-token log-probs, entropies and values are functions of a
parameter per position plus one shared scalar each, so the gradient of each parameter is
the weight its token got. Each process holds a contiguous share of the global batch (whole
prompt groups, and far more tokens on the first process than on the second), splits it
into micro-batches, weights each by `accumulation_weights` over all processes, and
backpropagates ``loss * world_size``; summing the processes' gradients and dividing by
their number is what DDP does. The result must equal one process, one micro-batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ppo.algorithm.buffer import accumulation_weights, with_group_shares
from ppo.algorithm.losses import LOSS_AGG_MODES, entropy_loss, kl_loss, value_loss
from ppo.algorithm.policy_losses import policy_loss
from ppo.parallel import distributed

B, T, G = 8, 6, 2  # rows, columns, group size: four prompt groups
BETA, ENTROPY_COEF, VF_COEF = 0.1, 0.01, 0.5
MICRO_BATCHES = (1, 2, 4)
# Rows 0-3 (the first process's share with two processes) are long, rows 4-7 short; row 6 is
# empty (a filtered or truncated response): unequal token counts per process and per micro-batch.
LENGTHS = (6, 5, 6, 4, 2, 1, 0, 3)


def batch() -> dict[str, torch.Tensor]:
    """The fixed global batch (the same on every process)."""
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).float()  # [B, T]
    return dict(
        mask=mask, rows=torch.arange(B),
        old_logprobs=-torch.rand(B, T, generator=generator) - 0.5,
        ref_logprobs=-torch.rand(B, T, generator=generator) - 0.5,
        advantages=torch.randn(B, T, generator=generator),
        old_values=torch.randn(B, T, generator=generator),
        returns=torch.randn(B, T, generator=generator),
        policy_init=0.3 * torch.randn(B, T, generator=generator),
    )


def parameters(data) -> dict[str, torch.Tensor]:
    return dict(policy=data["policy_init"].clone().requires_grad_(True), policy_shared=torch.zeros((), requires_grad=True),
                critic=torch.zeros(B, T, requires_grad=True), critic_shared=torch.zeros((), requires_grad=True))


def micro_loss(params, data, rows, loss_agg, policy_name, kl_estimator, group_share) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy side (surrogate + KL in the loss - entropy) and the critic's loss of one micro-batch."""
    logits = params["policy"][rows] + params["policy_shared"]  # [b, T]
    logprobs = data["old_logprobs"][rows] + logits  # off-policy: the ratio is exp(logits)
    entropy = torch.nn.functional.softplus(logits)  # any differentiable per-token term
    mask = data["mask"][rows]
    agg = dict(loss_agg=loss_agg, max_len=T, group_share=group_share)
    loss, _ = policy_loss(logprobs, data["old_logprobs"][rows], data["advantages"][rows], mask, name=policy_name,
                          clip_low=0.2, **agg)
    kl_term, _ = kl_loss(logprobs, data["ref_logprobs"][rows], mask, kl_estimator, **agg)
    entropy_value, _ = entropy_loss(entropy, mask, **agg)
    values = data["old_values"][rows] + params["critic"][rows] + params["critic_shared"]
    vf_loss, _ = value_loss(values, data["old_values"][rows], data["returns"][rows], mask, clip_range_value=0.2)
    return loss + BETA * kl_term - ENTROPY_COEF * entropy_value, VF_COEF * vf_loss


def gradients(loss_agg: str, micro_batches: int, policy_name: str = "vanilla", kl_estimator: str = "k3") -> list[float]:
    """Every parameter's gradient after one accumulated update on this process's share,
    summed over the processes and divided by their number (DDP's average)."""
    data, world, rank = batch(), distributed.world_size(), distributed.rank()
    params = parameters(data)
    share = B // world
    local = torch.arange(rank * share, (rank + 1) * share)  # whole groups: G divides the share
    chunks = local.split(share // micro_batches)
    micros = [{"rows": rows, "loss_mask": data["mask"][rows]} for rows in chunks]
    if loss_agg == "prompt_mean":
        micros = with_group_shares(micros, G)
    policy_weights, value_weights = accumulation_weights([m["loss_mask"] for m in micros], loss_agg,
                                                         reduce_sum=distributed.global_sum,
                                                         group_shares=[m.get("group_share") for m in micros])
    for micro, weight, value_weight in zip(micros, policy_weights, value_weights):
        policy_side, critic = micro_loss(params, data, micro["rows"], loss_agg, policy_name, kl_estimator,
                                         micro.get("group_share"))
        ((policy_side * weight + critic * value_weight) * world).backward()
    flat = torch.cat([p.grad.reshape(-1) for p in params.values()]).double()
    return (distributed.global_sum(flat) / world).tolist()


# The matrix: every aggregation mode x micro-batches, plus the new policy losses and KL form.
CASES = ([(agg, k, "vanilla", "k3") for agg in LOSS_AGG_MODES for k in MICRO_BATCHES]
         + [("token_sum", 4, "sapo", "abs+"), ("seq_mean_token_mean", 2, "gpg", "k1+")])


def main(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    results = {"|".join(map(str, case)): gradients(*case) for case in CASES}
    if distributed.rank() == 0:
        out.write_text(json.dumps({"world_size": distributed.world_size(), "results": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

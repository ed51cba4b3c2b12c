"""The experience buffer: one rollout batch, replayed as epochs x minibatches x micro-batches.

PPO's sample efficiency comes from reusing each batch of rollouts for several gradient
steps. The buffer holds everything the update needs (tokens, masks, old log-probs, values,
advantages, returns, reference log-probs) as ``[B, ...]`` tensors and yields:

- ``ppo_epochs`` passes, each over a fresh random permutation of the batch,
- split into ``num_minibatches`` minibatches (one optimizer step each),
- each split into ``gradient_accumulation_steps`` micro-batches (memory only: gradients
  are accumulated, so the math equals one big minibatch).

Every sample appears exactly once per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch


@dataclass
class ExperienceBuffer:
    """Named ``[B, ...]`` tensors that share their first dimension."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"buffer tensors disagree on batch size: {sizes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def select(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows `indices` of every tensor, and `rows`: those indices (which samples these are)."""
        return {**{name: t[indices] for name, t in self.tensors.items()}, "rows": indices}

    def iterate(self, epochs: int, num_minibatches: int, micro_batches: int,
                generator: torch.Generator | None = None) -> Iterator[tuple[int, int, list[dict[str, torch.Tensor]]]]:
        """Yield ``(epoch, minibatch_index, [micro_batch, ...])`` with shuffled indices.

        The caller accumulates gradients over the micro-batches of a minibatch, then steps
        its optimizer once. Each epoch's order is one ``torch.randperm`` from `generator`.
        """
        size = len(self)
        if size % num_minibatches:
            raise ValueError(f"batch of {size} is not divisible into {num_minibatches} minibatches")
        minibatch_size = size // num_minibatches
        if minibatch_size % micro_batches:
            raise ValueError(f"minibatch of {minibatch_size} is not divisible into {micro_batches} micro-batches")
        micro_size = minibatch_size // micro_batches
        for epoch in range(epochs):
            order = torch.randperm(size, generator=generator)  # [B]
            for m in range(num_minibatches):
                minibatch = order[m * minibatch_size:(m + 1) * minibatch_size]
                micro = [self.select(minibatch[k * micro_size:(k + 1) * micro_size]) for k in range(micro_batches)]
                yield epoch, m, micro


def with_group_shares(micro_batches: list[dict[str, torch.Tensor]], group_size: int,
                      skip_empty_rows: bool = False) -> list[dict[str, torch.Tensor]]:
    """The micro-batches with `group_share` added: each row's share of its prompt group
    within this minibatch, for `loss_agg="prompt_mean"` (`ppo.algorithm.losses.group_shares`).

    Rows ``g * group_size ... (g + 1) * group_size - 1`` of the buffer answer one prompt; the
    shuffle may spread a group over micro-batches and minibatches, so its share is counted
    over the whole minibatch (on this process, which sampled the group), never per micro-batch.
    """
    from ppo.algorithm.losses import group_shares

    rows = torch.cat([micro["rows"] for micro in micro_batches])  # [b_minibatch]
    mask = torch.cat([micro["loss_mask"] for micro in micro_batches])  # [b_minibatch, T]
    shares = group_shares(mask, torch.div(rows, group_size, rounding_mode="floor"), skip_empty_rows)
    sizes = [len(micro["rows"]) for micro in micro_batches]
    return [{**micro, "group_share": share} for micro, share in zip(micro_batches, shares.split(sizes))]


def accumulation_weights(loss_masks: list[torch.Tensor], loss_agg: str, skip_empty_rows: bool = False,
                         reduce_sum=None, value_masks: list[torch.Tensor] | None = None,
                         group_shares: list[torch.Tensor | None] | None = None) -> tuple[list[float], list[float]]:
    """Per micro-batch weights that make gradient accumulation exact: `(policy, value)`.

    Each micro-batch's loss is an average over its own units (tokens or sequences, see
    `ppo.algorithm.losses.loss_units`); weighting it by its share of the minibatch's units turns the
    sum of the weighted micro-batch losses into the average over the whole minibatch, in
    every aggregation mode. The policy-side terms (surrogate, KL in the loss, entropy) use
    `loss_agg`; the critic's loss is always a token mean, so it needs token shares even when
    the policy loss is a mean over sequences (a uniform 1/k there is off by the
    micro-batches' differing token counts). `reduce_sum` (`ppo.parallel.distributed.global_sum`)
    counts the units over every data-parallel process, so the weights are shares of the
    *global* minibatch. `value_masks` are the critic's own masks where they differ from the
    loss masks (`ppo.algorithm.losses.critic_loss_mask`); its token shares are counted over them.
    `group_shares` (`prompt_mean` only, `with_group_shares`) count each micro-batch's units
    as the fractions of prompt groups it holds. Under `token_sum` every weight is 1 (so the
    policy weights then add up to the number of micro-batches, not to 1).

    Worked example, two micro-batches with 3 and 1 loss tokens in one row each, under
    `seq_mean_token_mean`: policy weights [0.5, 0.5] (one sequence each), value weights
    [0.75, 0.25] (token shares).
    """
    from ppo.algorithm.losses import loss_units

    reduce_sum = reduce_sum or (lambda total: total)

    def shares(masks: list[torch.Tensor], mode: str, skip: bool, groups=None) -> list[float]:
        if mode == "token_sum":  # a sum has no normaliser: every micro-batch counts in full
            return [1.0] * len(masks)
        groups = groups or [None] * len(masks)
        units = [loss_units(mask, mode, skip, group).double() for mask, group in zip(masks, groups)]
        total = float(reduce_sum(torch.stack(units).sum()))
        return [float(u) / (total if total > 0 else 1.0) for u in units]

    return (shares(loss_masks, loss_agg, skip_empty_rows, group_shares),
            shares(loss_masks if value_masks is None else value_masks, "token_mean", False))

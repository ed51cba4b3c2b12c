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
        return {name: t[indices] for name, t in self.tensors.items()}

    def iterate(self, epochs: int, num_minibatches: int, micro_batches: int,
                generator: torch.Generator | None = None) -> Iterator[tuple[int, int, list[dict[str, torch.Tensor]]]]:
        """Yield ``(epoch, minibatch_index, [micro_batch, ...])`` with shuffled indices.

        The caller accumulates gradients over the micro-batches of a minibatch, then steps
        its optimizer once.
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

"""Masked whitening: normalising advantages (and optionally rewards) to zero mean, unit variance.

Implementation details that live here:

- **Advantage whitening** (`whiten(adv, mask)`): PPO implementations normalise advantages
  over the whole rollout batch before the policy loss, so the step size does not depend on
  the reward's scale (N+ implementation details; TRL and AlpacaFarm both do it).
- **Reward whitening without shifting the mean** (`shift_mean=False`): the OpenAI
  lm-human-preferences / AlpacaFarm form divides by the std but adds the mean back, so the
  sign of a reward keeps its meaning while its scale is normalised.
- **Masked statistics**: mean and variance use only positions where `mask == 1`, so
  padding neither drags the mean towards 0 nor shrinks the variance. Passing `mask=None`
  uses every element, which is how a source that whitens over padding is reproduced.
- **Population variance**: see `whiten`.
"""

from __future__ import annotations

from typing import Callable

import torch


def population_moments(
    values: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(count, mean, population variance)`` of every element of `values`, in float64.

    Two passes (mean, then squared deviations): as exact as ``torch.var`` and each pass is
    one sum, so with `reduce_sum` (`ppo.parallel.distributed.global_sum`) the moments are those of
    every process's values together. An empty input gives NaN mean and variance.

    >>> population_moments(torch.tensor([1., 2., 3., 4.]))
    (tensor(4., dtype=torch.float64), tensor(2.5000, dtype=torch.float64), tensor(1.2500, dtype=torch.float64))
    """
    reduce_sum = reduce_sum or (lambda total: total)
    values = values.double().reshape(-1)
    count = reduce_sum(torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device))
    mean = reduce_sum(values.sum()) / count
    var = reduce_sum((values - mean).pow(2).sum()) / count
    return count, mean, var


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Return ``(x - mean) * rsqrt(var + eps)`` with statistics over the masked positions.

    Args:
        x: any shape, usually `[B, T]` advantages or rewards.
        mask: same shape as `x`, 1 (or True) on positions that count; `None` means all.
        shift_mean: if False, add the mean back after scaling (AlpacaFarm / OpenAI reward
            whitening): only the scale is normalised.
        eps: added to the variance so a near-constant batch does not divide by ~0.
        reduce_sum: sums a tensor over the processes of a data-parallel run
            (`ppo.parallel.distributed.global_sum`), so the statistics are those of the whole
            rollout batch; None = this process's `x` is the whole batch.

    Returns:
        A tensor shaped like `x`; with a mask, positions outside it are 0.

    The variance is the *population* variance (divide by n, ``unbiased=False``): the
    whitened values then have a mean square of exactly 1 over the selected positions, and
    it matches the population std used for GRPO groups in `gae.group`. TRL's masked
    variance applies Bessel's correction (divide by n - 1) instead; over a rollout batch of
    hundreds of tokens the two differ by a factor n/(n-1), i.e. well under 1%.

    Raises:
        ValueError: fewer than 2 positions are selected (the variance would be meaningless).

    Worked example::

        x = [1., 2., 3., 4.]   mean = 2.5   var = (2.25+0.25+0.25+2.25)/4 = 1.25
        whiten(x)                   -> [-1.3416, -0.4472, 0.4472, 1.3416]
        whiten(x, shift_mean=False) -> [ 1.1584,  2.0528, 2.9472, 3.8416]   (+ 2.5)
    """
    if mask is None:
        selected = x.reshape(-1)  # [N]
    else:
        if mask.shape != x.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match x shape {tuple(x.shape)}")
        keep = mask.bool()
        selected = x[keep]  # [N] only the positions that count
    count, mean, var = population_moments(selected, reduce_sum)  # population variance, see above
    if count < 2:
        raise ValueError(f"whiten needs at least 2 selected elements, got {int(count)}")
    mean, var = mean.to(x.dtype), var.to(x.dtype)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    if mask is not None:
        whitened = torch.where(keep, whitened, torch.zeros_like(whitened))
    return whitened

"""Group-relative advantages: the GRPO family's replacement for a learned value function.

For each prompt we sample G responses and score them; the other samples of the same prompt
serve as the baseline. One scalar per response comes out, which `gae.registry` broadcasts
to every response token.

Implementation details that live here:

- **Group layout**: `scores` is `[B*G]` with the G samples of one prompt contiguous; the
  grouping is an einops ``"(b g) -> b g"``.
- **Scale of the advantage** (`group_advantages(scale=...)`):
  ``"group"`` divides by the group's population std + eps (DeepSeekMath GRPO,
  nano-aha-moment); ``"batch"`` divides by the std of every score in the batch
  (group mean, batch std); ``"none"`` only centres (Dr. GRPO).
- **Constant groups give exactly 0**: a prompt whose G samples all got the same score
  carries no learning signal; its advantages are set to 0 explicitly so float rounding in
  the mean, or ``eps=0``, can never turn them into noise or NaN.
- **Leave-one-out baseline** (`rloo_advantages`): each sample is compared with the mean of
  the *other* G-1 samples, which keeps the baseline independent of the sample itself.
"""

from __future__ import annotations

from typing import Callable

import torch
from einops import rearrange

from .whiten import population_moments

GROUP_SCALES = ("group", "batch", "none")


def _grouped(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[B*G]` -> `[B, G]`, with errors that say what is wrong."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B*G], got shape {tuple(scores.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if scores.numel() % group_size != 0:
        raise ValueError(
            f"len(scores)={scores.numel()} is not divisible by group_size={group_size}; "
            "the G samples of each prompt must be contiguous"
        )
    return rearrange(scores, "(b g) -> b g", g=group_size)  # [B, G]


def _zero_constant_groups(grouped_scores: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Set advantages of groups whose scores are all equal to exactly 0 (no signal, no NaN)."""
    constant = (grouped_scores == grouped_scores[:, :1]).all(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(constant, torch.zeros_like(advantages), advantages)


def group_advantages(
    scores: torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-4,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    std_correction: int = 0,
) -> torch.Tensor:
    """Group-relative advantages: each score minus its group's mean, optionally scaled.

    Sources: DeepSeekMath (Shao et al. 2024) GRPO with outcome supervision, as in
    nano-aha-moment (``scale="group"``); Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective") drops the std (``scale="none"``); ``scale="batch"`` keeps
    the group mean but divides by the std of the whole batch, as in "Tricks or Traps? A Deep
    Dive into RL for LLM Reasoning" (2025).

    Args:
        scores: `[B*G]` one score per response, the G samples of a prompt contiguous.
        group_size: G.
        scale: ``"group"`` -> (s - mean_g) / (std_g + eps); ``"batch"`` -> (s - mean_g) /
            (std_batch + eps); ``"none"`` -> s - mean_g.
        eps: keeps the division finite when a std is ~0.
        reduce_sum: for ``scale="batch"`` in a data-parallel run, sums over processes
            (`ppo.parallel.distributed.global_sum`) so the batch std is the whole batch's. Groups
            never span processes, so the group statistics need no reduction.
        std_correction: Bessel correction of the *group* std (``"group"``): 0 = population
            std (nano-aha-moment), 1 = sample std, dividing by G - 1 (TRL's GRPOTrainer and
            verl's GRPO use torch.std's default). At G = 8 the sample std is sqrt(8/7) =
            1.069 times larger, so every advantage is 1/1.069 = 0.935 times the population
            form's. The batch std stays a population std.

    Returns:
        `[B*G]` advantages; exactly 0 for every group whose samples all scored the same.

    Why Dr. GRPO drops the group std: with binary rewards and success rate p, the group std
    is sqrt(p(1-p)), which is small when a prompt is almost always or almost never solved.
    Dividing by it *upweights* exactly those prompts, so the rare success on a hard prompt
    (or the rare failure on an easy one) gets a larger push than any sample of a prompt of
    medium difficulty: a difficulty bias that the objective never asked for. Worked example
    (G=4, eps=0)::

        [1, 0, 0, 0]  mean 0.25, std 0.433  "group": [ 1.732, -0.577, -0.577, -0.577]
                                             "none":  [ 0.75,  -0.25,  -0.25,  -0.25 ]
        [1, 1, 0, 0]  mean 0.5,  std 0.5    "group": [ 1.0,    1.0,   -1.0,   -1.0  ]
                                             "none":  [ 0.5,    0.5,   -0.5,   -0.5  ]

    The lone success on the hard prompt gets 1.73 under "group" but only 0.75 under "none".
    """
    if scale not in GROUP_SCALES:
        raise ValueError(f"unknown scale={scale!r}; expected one of {GROUP_SCALES}")
    grouped = _grouped(scores, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=-1, keepdim=True)  # [B, G]
    if scale == "group":
        group_std = grouped.std(dim=-1, correction=std_correction, keepdim=True)  # [B, 1]
        advantages = centred / (group_std + eps)
    elif scale == "batch":
        batch_std = batch_population_std(scores, reduce_sum)  # scalar, over all B*G scores
        advantages = centred / (batch_std + eps)
    else:
        advantages = centred
    advantages = _zero_constant_groups(grouped, advantages)  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]


def batch_population_std(scores: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Population std of every score in the batch (over all processes with `reduce_sum`)."""
    _, _, var = population_moments(scores, reduce_sum)
    return var.sqrt().to(scores.dtype)


def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: each score minus the mean of the other G-1 scores of its group.

    Sources: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
    Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs".

    The baseline excludes the sample itself, so it is independent of that sample's action and
    the gradient estimate stays unbiased. Algebraically
    ``s_i - (sum - s_i)/(G-1) = G/(G-1) * (s_i - mean)``: RLOO is the mean-centred
    (Dr. GRPO) advantage scaled up by G/(G-1).

    Args:
        scores: `[B*G]`, the G samples of a prompt contiguous.
        group_size: G, at least 2 (with one sample there are no "others").

    Returns:
        `[B*G]` advantages; exactly 0 for groups whose samples all scored the same.

    Worked example (G=4)::

        [1, 0, 0, 0] -> [1 - 0, 0 - 1/3, 0 - 1/3, 0 - 1/3] = [1.0, -0.333, -0.333, -0.333]
    """
    if group_size < 2:
        raise ValueError(f"rloo_advantages needs group_size >= 2, got {group_size}")
    grouped = _grouped(scores, group_size)  # [B, G]
    others_mean = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)  # [B, G]
    advantages = _zero_constant_groups(grouped, grouped - others_mean)  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]

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
- **Failed samples leave the statistics** (`valid`, `PPOConfig.nonfinite_rewards="drop"`): a
  sample whose score is missing or not finite is not in its group's mean, std or
  leave-one-out baseline, and gets advantage 0; the group is normalised over the samples
  that are left (TRL's nan-aware baseline for unscorable completions).
- **Other group estimators**: MaxRL's mean-normalised advantage (`maxrl_advantages`),
  pass@k credit for the best response (`passk_advantages`) and GDPO's per-component
  normalisation (`gdpo_advantages`).
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


def _valid_grouped(valid: torch.Tensor | None, grouped: torch.Tensor) -> torch.Tensor:
    """The `[B*G]` bool `valid` as ``[B, G]`` (all True when None)."""
    if valid is None:
        return torch.ones_like(grouped, dtype=torch.bool)
    return rearrange(valid.bool(), "(b g) -> b g", g=grouped.shape[-1])  # [B, G]


def group_moments(grouped: torch.Tensor, valid: torch.Tensor, std_correction: int = 0):
    """Count, mean and std of each group over its `valid` samples, ``[B, 1]`` each.

    The std divides by ``count - std_correction`` (at least 1); an empty group has mean 0.

    >>> n, mean, std = group_moments(torch.tensor([[1.0, 0.0, 5.0, 0.0]]), torch.tensor([[True, True, False, True]]))
    >>> n.item(), round(mean.item(), 4), round(std.item(), 4)
    (3, 0.3333, 0.4714)
    """
    count = valid.sum(-1, keepdim=True)  # [B, 1]
    kept = torch.where(valid, grouped, torch.zeros_like(grouped))  # [B, G]
    mean = kept.sum(-1, keepdim=True) / count.clamp(min=1)  # [B, 1]
    squares = torch.where(valid, (grouped - mean).square(), torch.zeros_like(grouped))
    std = (squares.sum(-1, keepdim=True) / (count - std_correction).clamp(min=1)).sqrt()  # [B, 1]
    return count, mean, std


def _zero_constant_valid_groups(grouped: torch.Tensor, valid: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """`_zero_constant_groups` over the valid samples only; invalid samples get 0 too."""
    first = torch.where(valid, grouped, torch.full_like(grouped, float("inf"))).min(-1, keepdim=True).values
    constant = (~valid | (grouped == first)).all(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(constant | ~valid, torch.zeros_like(advantages), advantages)


def group_advantages(
    scores: torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-4,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    std_correction: int = 0,
    valid: torch.Tensor | None = None,
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
        valid: optional `[B*G]` bool, the samples whose score counts (a failed or non-finite
            score is False): the group's mean and std, and the batch std, are taken over the
            valid samples only, and an invalid sample's advantage is 0. Worked example
            (``"group"``, eps 0), scores [1, 0, x, 0] with x invalid: mean 1/3, std 0.4714,
            advantages [1.4142, -0.7071, 0, -0.7071]; filling x with the mean instead (the
            former handling) keeps the mean but shrinks the std to 0.4082 ([1.633, -0.8165, 0, -0.8165]).

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
    if valid is not None and not bool(valid.all()):
        return _valid_group_advantages(scores, grouped, _valid_grouped(valid, grouped), scale, eps, reduce_sum,
                                       std_correction)
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


def _valid_group_advantages(scores, grouped, valid, scale, eps, reduce_sum, std_correction):
    """`group_advantages` when some samples are invalid: the statistics over the valid ones."""
    _, mean, group_std = group_moments(grouped, valid, std_correction)  # [B, 1] each
    centred = grouped - mean  # [B, G]
    if scale == "group":
        advantages = centred / (group_std + eps)
    elif scale == "batch":
        kept = rearrange(valid, "b g -> (b g)")
        advantages = centred / (batch_population_std(scores[kept], reduce_sum) + eps)
    else:
        advantages = centred
    advantages = _zero_constant_valid_groups(grouped, valid, advantages)  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]


def batch_population_std(scores: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Population std of every score in the batch (over all processes with `reduce_sum`)."""
    _, _, var = population_moments(scores, reduce_sum)
    return var.sqrt().to(scores.dtype)


def rloo_advantages(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
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
        valid: optional `[B*G]` bool: an invalid sample is none of the "others" and gets 0; a
            group with fewer than 2 valid samples gets 0.

    Returns:
        `[B*G]` advantages; exactly 0 for groups whose samples all scored the same.

    Worked example (G=4)::

        [1, 0, 0, 0] -> [1 - 0, 0 - 1/3, 0 - 1/3, 0 - 1/3] = [1.0, -0.333, -0.333, -0.333]
    """
    if group_size < 2:
        raise ValueError(f"rloo_advantages needs group_size >= 2, got {group_size}")
    grouped = _grouped(scores, group_size)  # [B, G]
    if valid is not None and not bool(valid.all()):
        ok = _valid_grouped(valid, grouped)  # [B, G]
        kept = torch.where(ok, grouped, torch.zeros_like(grouped))
        others = (ok.sum(-1, keepdim=True) - 1).clamp(min=1)  # [B, 1]
        others_mean = (kept.sum(dim=-1, keepdim=True) - kept) / others  # [B, G]
        advantages = _zero_constant_valid_groups(grouped, ok, grouped - others_mean)  # [B, G]
        return rearrange(advantages, "b g -> (b g)")  # [B*G]
    others_mean = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)  # [B, G]
    advantages = _zero_constant_groups(grouped, grouped - others_mean)  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]


MAXRL_EPS = 1e-6  # SkyRL compute_maxrl_advantage's epsilon


def maxrl_advantages(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """MaxRL (Maximum-likelihood RL, arXiv 2602.02710): each score minus its group's mean,
    divided by that mean, ``(r - mean) / (mean + 1e-6)``.

    With a 0/1 reward the group mean is the pass rate p, so a correct sample gets
    (1 - p) / p: about 1/p on hard prompts. GRPO's std divides by sqrt(p (1 - p)) and
    Dr. GRPO by nothing; dividing by p makes the gradient that of an order-G truncation of
    log p, the likelihood of success, rather than of p itself, so rarely solved prompts
    weigh most (G = 1 is REINFORCE, G -> infinity the exact maximum-likelihood gradient).
    Meant for non-negative rewards: a group whose mean is <= 0 gets advantage 0
    (prime-rl's guard; SkyRL adds 1e-6 to the mean, kept here). Invalid samples leave the
    mean and get 0.

    Worked example (G = 4): [1, 0, 0, 0], mean 0.25: [3, -1, -1, -1]; [1, 1, 0, 0]:
    [1, 1, -1, -1]; [0, 0, 0, 0]: zeros.
    """
    grouped = _grouped(scores, group_size)  # [B, G]
    ok = _valid_grouped(valid, grouped)  # [B, G]
    _, mean, _ = group_moments(grouped, ok)  # [B, 1]
    advantages = torch.where(mean > 0, (grouped - mean) / (mean + MAXRL_EPS), torch.zeros_like(grouped))
    advantages = _zero_constant_valid_groups(grouped, ok, advantages)  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]


def passk_advantages(scores: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4,
                     std_correction: int = 0, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """Pass@k credit (Chen et al. 2025, arXiv 2503.19595; verl ``grpo_passk``): in each
    group only the best response gets an advantage, ``r_max - r_second_max``, and every
    other response gets 0.

    Pass@k asks whether *any* of k samples succeeds, so the only sample worth reinforcing
    is the one that beats its siblings: a lone success among failures gets all the credit,
    and a group with two equal best scores gets none (the second best equals the best).
    Nothing is ever pushed down. `scale` divides by the group std (``"group"``, with
    `std_correction`; verl: the sample std, eps 1e-6), the batch std (``"batch"``) or
    nothing (``"none"``). Ties for the best go to the first. Invalid samples are never the
    best or the second best; a group with fewer than 2 valid samples gets 0 (verl refuses
    groups of one).

    Worked example (G = 4, ``"none"``): [1, 0, 0, 0] -> [1, 0, 0, 0]; [1, 1, 0, 0] -> zeros;
    [0.2, 0.9, 0.5, 0] -> [0, 0.4, 0, 0].
    """
    if scale not in GROUP_SCALES:
        raise ValueError(f"unknown scale={scale!r}; expected one of {GROUP_SCALES}")
    grouped = _grouped(scores, group_size)  # [B, G]
    ok = _valid_grouped(valid, grouped)  # [B, G]
    ranked = torch.where(ok, grouped, torch.full_like(grouped, float("-inf")))
    top2 = ranked.topk(min(2, group_size), dim=-1)  # values, indices: [B, 2]
    enough = ok.sum(-1) >= 2  # [B]
    gap = torch.where(enough, top2.values[:, 0] - top2.values[:, -1], torch.zeros_like(grouped[:, 0]))  # [B]
    if scale == "group":
        gap = gap / (group_moments(grouped, ok, std_correction)[2][:, 0] + eps)
    elif scale == "batch":
        gap = gap / (batch_population_std(scores[rearrange(ok, "b g -> (b g)")], reduce_sum) + eps)
    advantages = torch.zeros_like(grouped).scatter(-1, top2.indices[:, :1], gap[:, None])  # [B, G]
    return rearrange(advantages, "b g -> (b g)")  # [B*G]


def gdpo_advantages(components: torch.Tensor, weights: torch.Tensor, group_size: int, eps: float = 1e-4,
                    std_correction: int = 0, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    """GDPO (Group reward-Decoupled normalisation Policy Optimization, arXiv 2601.05242; TRL
    ``multi_objective_aggregation="normalize_then_sum"``): normalise each reward component
    within its group, take their weighted sum, then normalise that over the batch::

        z_k    = (c_k - mean_group(c_k)) / (std_group(c_k) + eps)     per component k
        s      = sum_k w_k z_k
        A      = (s - mean_batch(s)) / (std_batch(s) + eps)

    Summing first (GRPO) lets the component with the widest spread decide the advantage: a
    0/1 correctness and a small format bonus that every sample but one earns give a sum
    whose group std is mostly correctness, so format differences barely register, and two
    different mixes of component outcomes can collapse onto the same advantage. Normalising
    each first gives each its own unit scale before the weights apply.

    Args:
        components: `[B*G, K]` raw reward components (here correctness, format, length).
        weights: `[K]` each component's weight (its coefficient; 0 leaves it out).
        std_correction: Bessel correction of both stds (TRL: 1, its `nanstd`).
        reduce_sum: the batch statistics over every process.
        valid: optional `[B*G]` bool; invalid samples leave every statistic and get 0.

    Worked example (G = 2, eps 0, population std, weights [1, 1]), two groups with
    correctness [1, 0 | 1, 1] and format [1, 1 | 1, 0]: z_correct = [1, -1 | 0, 0],
    z_format = [0, 0 | 1, -1], s = [1, -1, 1, -1], batch mean 0, std 1: A = [1, -1, 1, -1].
    """
    ok = _valid_grouped(valid, _grouped(components[:, 0], group_size))  # [B, G]
    summed = torch.zeros_like(components[:, 0])  # [B*G]
    for k in range(components.shape[-1]):
        if float(weights[k]) == 0.0:
            continue
        grouped = _grouped(components[:, k].contiguous(), group_size)  # [B, G]
        _, mean, std = group_moments(grouped, ok, std_correction)  # [B, 1] each
        z = _zero_constant_valid_groups(grouped, ok, (grouped - mean) / (std + eps))  # [B, G]
        summed = summed + float(weights[k]) * rearrange(z, "b g -> (b g)")
    kept = rearrange(ok, "b g -> (b g)")  # [B*G]
    count, mean, var = population_moments(summed[kept], reduce_sum)
    var = var * count / (count - std_correction).clamp(min=1)  # sample variance when std_correction = 1
    advantages = (summed - mean.to(summed.dtype)) / (var.sqrt().to(summed.dtype) + eps)  # [B*G]
    return torch.where(kept, advantages, torch.zeros_like(advantages))

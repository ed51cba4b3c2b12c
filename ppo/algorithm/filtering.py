"""Difficulty filtering (Kimi k1.5; also DAPO's dynamic sampling and Qwen 3's curated set).

A prompt that all G samples solve, or that none solves, gives every sample of its group the
same score, so every group-relative advantage is 0: the group costs a rollout and teaches
nothing. Kimi k1.5 estimates each prompt's pass rate from best-of-n samples and keeps the
middle band; mastered problems are retired from the pool.

Here the pass rate comes for free from the group itself: ``pass_rate = mean(correct)``
over the G samples of a prompt. Groups outside ``(min_pass_rate, max_pass_rate)`` leave the
loss; `PPOConfig.difficulty_filter_mode` says whether the batch is refilled with new groups
(DAPO's dynamic sampling, `ppo/algorithm/dynamic_sampling.py`), or the loss is renormalised over the
kept rows, or (the old form) they are only masked. With ``retire_mastered`` a prompt that
every sample solved is never drawn again in this run. The verdict is the task's own, so
none of this runs against a reward model (there it would be the hidden gold reward).

Example (G = 4): correct = [1,1,1,1 | 1,0,0,1 | 0,0,0,0] gives pass rates [1.0, 0.5, 0.0];
with the default band (0, 1) only the middle group is kept.
"""

from __future__ import annotations

import random

import torch
from einops import rearrange

from ppo.parallel import distributed
from ppo.tasks.base import Problem


def group_pass_rates(correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """Mean correctness per contiguous group: ``[B*G] -> [B]``."""
    return rearrange(correct.float(), "(b g) -> b g", g=group_size).mean(-1)


def keep_groups(pass_rates: torch.Tensor, min_pass_rate: float = 0.0, max_pass_rate: float = 1.0) -> torch.Tensor:
    """Boolean ``[B]``: groups strictly inside the band ``(min_pass_rate, max_pass_rate)``.

    >>> keep_groups(torch.tensor([1.0, 0.5, 0.0])).tolist()
    [False, True, False]
    """
    return (pass_rates > min_pass_rate) & (pass_rates < max_pass_rate)


def zero_advantage_groups(advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` bool: the groups whose every sample has advantage 0 (no learning signal).

    `advantages` is ``[B*G, T]`` (or ``[B*G]``).
    """
    per_sample = advantages.abs().reshape(advantages.shape[0], -1).sum(-1)  # [B*G]
    return rearrange(per_sample, "(b g) -> b g", g=group_size).amax(-1) < 1e-8  # [B]


def zero_advantage_group_fraction(advantages: torch.Tensor, group_size: int, among: torch.Tensor | None = None) -> float:
    """Share of groups whose every sample has advantage 0; `among` restricts to kept groups."""
    zero = zero_advantage_groups(advantages, group_size)  # [B]
    if among is not None:
        if not among.any():
            return float("nan")
        zero = zero[among]
    return float(zero.float().mean())


class PromptPool:
    """Draws training problems from a task, skipping retired (mastered) prompts."""

    def __init__(self, task, rng: random.Random, max_tries: int = 100):
        self.task = task
        self.rng = rng
        self.retired: set[str] = set()
        self.max_tries = max_tries

    def sample(self, n: int) -> list[Problem]:
        problems: list[Problem] = []
        for _ in range(self.max_tries):
            problems += [p for p in self.task.sample_problems(n - len(problems), self.rng) if p.prompt not in self.retired]
            if len(problems) == n:
                return problems
        raise RuntimeError(f"could not draw {n} un-retired prompts in {self.max_tries} tries: "
                           f"{len(self.retired)} prompts are retired; the pool is exhausted")

    def retire(self, problems: list[Problem], pass_rates: torch.Tensor) -> int:
        """Retire every prompt whose group was solved by all samples; returns how many."""
        newly = {p.prompt for p, rate in zip(problems, pass_rates.tolist()) if rate >= 1.0} - self.retired
        self.retired |= newly
        return len(newly)


def gather_pass_rates(problems, pass_rates: torch.Tensor) -> tuple[list, torch.Tensor]:
    """Every rank's (problem, group pass rate) pairs, so all ranks retire the same prompts."""
    pairs = distributed.gather_objects(list(zip(problems, pass_rates.tolist())))
    return [problem for problem, _ in pairs], torch.tensor([rate for _, rate in pairs])

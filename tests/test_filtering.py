import random

import pytest
import torch

from ppo.algorithm.filtering import PromptPool, group_pass_rates, keep_groups, zero_advantage_group_fraction
from ppo.tasks import ArithmeticTask
from ppo.tasks.base import Problem


def test_pass_rates_and_band():
    correct = torch.tensor([1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0])
    rates = group_pass_rates(correct, group_size=4)
    assert rates.tolist() == [1.0, 0.5, 0.0, 0.25]
    assert keep_groups(rates).tolist() == [False, True, False, True]  # default: drop all-solved and none-solved
    assert keep_groups(rates, 0.3, 1.0).tolist() == [False, True, False, False]


def test_zero_advantage_fraction_before_and_after_filtering():
    advantages = torch.tensor([[0.0, 0.0], [0.0, 0.0],  # group 0: no signal
                               [0.5, 0.5], [-0.5, 0.0],  # group 1
                               [0.0, 0.0], [0.0, 0.0]])  # group 2: no signal
    assert zero_advantage_group_fraction(advantages, 2) == pytest.approx(2 / 3)
    kept = torch.tensor([False, True, False])
    assert zero_advantage_group_fraction(advantages, 2, among=kept) == 0.0
    assert torch.isnan(torch.tensor(zero_advantage_group_fraction(advantages, 2, among=torch.zeros(3, dtype=torch.bool))))


class FixedTask:
    def __init__(self, prompts):
        self.prompts = prompts

    def sample_problems(self, n, rng):
        return [Problem(rng.choice(self.prompts), "0") for _ in range(n)]


def test_retired_prompts_are_never_drawn_again():
    pool = PromptPool(FixedTask(["a", "b", "c"]), random.Random(0))
    problems = [Problem("a", "0"), Problem("b", "0")]
    assert pool.retire(problems, torch.tensor([1.0, 0.5])) == 1  # only "a" was mastered
    assert {p.prompt for p in pool.sample(50)} == {"b", "c"}
    pool.retire([Problem("b", "0"), Problem("c", "0")], torch.tensor([1.0, 1.0]))
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.sample(1)


def test_pool_over_the_real_task():
    pool = PromptPool(ArithmeticTask(), random.Random(0))
    assert len(pool.sample(10)) == 10

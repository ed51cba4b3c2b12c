"""Simulated staleness (`PPOConfig.rollout_staleness`, ppo/models/staleness.py): rollouts
sampled by exactly the weights the policy had k training steps earlier."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ppo.models.staleness import PolicyHistory


def _policy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.Linear(4, 2))


def _step(policy: nn.Module, t: int) -> None:
    """What an update does to the weights, distinct at every step."""
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 + t)


def _weights(module: nn.Module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_staleness_zero_samples_from_the_policy_itself():
    policy = _policy()
    history = PolicyHistory(policy, 0)
    for t in range(3):
        assert history.sampling_policy(t) is policy
        _step(policy, t)
    assert not history.snapshots  # nothing kept, nothing copied


@pytest.mark.parametrize("k", [1, 2, 4])
def test_sampler_holds_the_weights_of_k_steps_before(k):
    policy = _policy()
    history = PolicyHistory(policy, k)
    start_of_step = []
    for t in range(7):
        start_of_step.append(_weights(policy))
        sampler = history.sampling_policy(t)
        assert sampler is not policy
        expected = start_of_step[max(0, t - k)]
        for name, tensor in sampler.state_dict().items():
            assert torch.equal(tensor, expected[name]), (t, name)
        assert history.version == max(0, t - k) and history.lag(t) == min(t, k)
        _step(policy, t)
    assert len(history.snapshots) == k + 1  # never more than the lag needs


def test_the_sampler_never_trains_and_follows_the_policys_mode():
    policy = _policy()
    history = PolicyHistory(policy, 1)
    policy.eval()
    sampler = history.sampling_policy(0)
    assert not any(p.requires_grad for p in sampler.parameters())
    assert all(p.requires_grad for p in policy.parameters())
    assert not sampler.training
    policy.train()
    assert history.sampling_policy(1).training


def test_a_resumed_history_samples_from_the_same_versions():
    policy = _policy()
    history = PolicyHistory(policy, 2)
    for t in range(3):
        history.sampling_policy(t)
        _step(policy, t)
    saved = history.state_dict()
    resumed = PolicyHistory(policy, 2)
    resumed.load_state_dict(saved)
    a, b = history.sampling_policy(3), resumed.sampling_policy(3)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name])
    with pytest.raises(ValueError, match="rollout_staleness=2"):
        PolicyHistory(policy, 1).load_state_dict(saved)


def test_one_call_per_step():
    history = PolicyHistory(_policy(), 1)
    history.sampling_policy(0)
    with pytest.raises(ValueError, match="one call per step"):
        history.sampling_policy(0)

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


def test_calls_within_a_step_record_once_and_steps_only_move_forward():
    policy = _policy()
    history = PolicyHistory(policy, 1)
    first = _weights(policy)
    history.sampling_policy(0)
    _step(policy, 0)  # weights moved inside the step: a second round still samples version 0
    sampler = history.sampling_policy(0)
    assert len(history.snapshots) == 1
    assert all(torch.equal(t, first[n]) for n, t in sampler.state_dict().items())
    history.sampling_policy(1)
    with pytest.raises(ValueError, match="only move forward"):
        history.sampling_policy(0)


# ---------------------------------------------------------------------- in the training loop
import copy  # noqa: E402
import json  # noqa: E402

import ppo.trainer as trainer_module  # noqa: E402
from ppo.config import PPOConfig  # noqa: E402
from ppo.models.lora import load_policy_weights  # noqa: E402
from ppo.trainer import RLTrainer  # noqa: E402

TINY = dict(rollout_batch_size=8, group_size=4, advantage_estimator="grpo", kl_coef=0.0,
            response_length=8, eval_size=8, eval_every=0, progress=False, log_samples=0, lr=5e-2, threads=1)


PROMPTS = ["1+1=", "2+3=", "4+4=", "9+1=", "5+2=", "7+7="]


def _by_length(prompts, responses):  # any signal that differs within a group, so the policy moves
    return [float(len(r)) for r in responses]


def _trainer(config: PPOConfig) -> RLTrainer:
    return RLTrainer(config, prompts=PROMPTS, reward_fn=_by_length)


def _config(tmp_path, tiny_model_dir, **overrides) -> PPOConfig:
    return PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), **{**TINY, **overrides})


def _recorded_generate(calls: list):
    """`generate` as the trainer calls it, recording the weights, the RNG state and the result."""
    real = trainer_module.generate

    def record(model, tokenizer, prompts, *args, **kwargs):
        calls.append(dict(weights=_weights(model), rng=torch.get_rng_state(), prompts=list(prompts), args=args,
                          kwargs=kwargs))
        calls[-1]["rollout"] = real(model, tokenizer, prompts, *args, **kwargs)
        return calls[-1]["rollout"]

    return record


def test_rollouts_come_from_the_saved_weights_of_k_steps_before(tmp_path, tiny_model_dir, monkeypatch):
    """Sampled by exactly the k-steps-old weights: the policy saved at step t-k, reloaded into a
    fresh model and sampled with the same RNG state, gives step t's responses token for token."""
    k = 2
    calls: list[dict] = []
    monkeypatch.setattr(trainer_module, "generate", _recorded_generate(calls))
    trainer = _trainer(_config(tmp_path, tiny_model_dir, total_steps=5, save_every=1, keep_checkpoints=0,
                               rollout_staleness=k))
    start = _weights(trainer.policy_module)
    trainer.train()
    assert len(calls) == 5
    fresh = copy.deepcopy(trainer.policy_module)
    for t in range(k, 5):
        saved = tmp_path / "run" / "checkpoints" / f"step_{t - k:06d}" / "policy"
        if t - k == 0:  # no checkpoint before the first step: the start's weights
            fresh.load_state_dict(start)
        else:
            load_policy_weights(fresh, saved)
        assert all(torch.equal(calls[t]["weights"][n], v) for n, v in fresh.state_dict().items()), t
        torch.set_rng_state(calls[t]["rng"])
        replay = _real_generate()(fresh, trainer.tokenizer, calls[t]["prompts"], *calls[t]["args"], **calls[t]["kwargs"])
        assert torch.equal(replay.response_ids, calls[t]["rollout"].response_ids), t
    moved = [any(not torch.equal(calls[t]["weights"][n], start[n]) for n in start) for t in range(5)]
    assert moved == [False] * (k + 1) + [True] * (4 - k)  # steps 0..k sample the start, later ones moved weights


def _real_generate():
    from ppo.models.rollout import generate

    return generate


def test_staleness_zero_is_the_on_policy_loop(tmp_path, tiny_model_dir):
    """rollout_staleness=0 keeps no copy: the loop samples from the policy it trains (the
    bit-identity of every preset to the loop before the toggle is tests/bit_identity.py's)."""
    trainer = _trainer(_config(tmp_path, tiny_model_dir, total_steps=1, save_every=0))
    assert trainer.state.policy_history.sampler is trainer.policy_module
    assert trainer.state.policy_history.sampling_policy(0) is trainer.policy_module


def test_a_resumed_stale_run_equals_the_straight_one(tmp_path, tiny_model_dir):
    straight = _trainer(_config(tmp_path / "a", tiny_model_dir, total_steps=4, save_every=1, rollout_staleness=2))
    straight.train()
    config = _config(tmp_path / "b", tiny_model_dir, total_steps=4, save_every=1, rollout_staleness=2)
    _trainer(config).train(stop_after=3)
    resumed = _trainer(config)
    resumed.train(resume=True)
    assert (tmp_path / "b" / "run" / "checkpoints" / "step_000003" / "policy_history.pt").is_file()

    def rows(root):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time")}
                for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]

    assert rows(tmp_path / "a") == rows(tmp_path / "b")
    a, b = _weights(straight.policy_module), _weights(resumed.policy_module)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_staleness_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="rollout_staleness"):
        PPOConfig(rollout_staleness=-1).validate()
    with pytest.raises(ValueError, match="rollout_staleness.*sharding='fsdp'"):
        PPOConfig(rollout_staleness=2, sharding="fsdp").validate()

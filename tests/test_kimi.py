"""Kimi k1.5's surrogate (`policy_loss="kimi"`, ppo/algorithm/policy_losses.py `kimi`).

The loss per sequence is ``(A_i - tau S_i)^2 / (2 tau)`` with ``S_i`` the sum of the
sequence's log-ratios to the sampling policy and ``A_i = r_i - mean(group)``. The tests pin
its value on the worked example by hand, check that its gradient is the paper's eq. 3
(REINFORCE with the group-mean baseline plus ``(tau / 2) grad S^2``) on a small parametric
policy, and check the configuration rules around it.
"""

from __future__ import annotations

import pytest
import torch

from gae import group_advantages
from ppo.algorithm.policy_losses import policy_loss
from ppo.config import PPOConfig, preset
from ppo.settings.config_checks import config_warnings


def test_kimi_worked_example_by_hand():
    # tau = 0.5. Row 0: correct, two tokens, log-ratios [0.1, 0.1]: S = 0.2, A = +0.5.
    # Row 1: wrong, one token, log-ratio -0.2: S = -0.2, A = -0.5.
    # loss_i = (A - tau S)^2 / (2 tau) = (0.5 - 0.1)^2 / 1 = 0.16 for both; mean 0.16.
    # d loss_i / d logp_t = -(A - tau S) = -0.4 (row 0), +0.4 (row 1); halved by the mean over 2.
    old = torch.full((2, 2), -1.0)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logprobs = (old + torch.tensor([[0.1, 0.1], [-0.2, 0.0]])).requires_grad_(True)
    advantages = torch.tensor([[0.5, 0.5], [-0.5, -0.5]])
    loss, metrics = policy_loss(logprobs, old, advantages, mask, name="kimi", kimi_tau=0.5,
                                loss_agg="seq_mean_token_mean")
    loss.backward()
    assert loss.item() == pytest.approx(0.16, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.2, -0.2], [0.2, 0.0]]), atol=1e-6, rtol=0)
    assert metrics["kimi_log_ratio_seq"] == pytest.approx(0.0, abs=1e-6)  # (0.2 - 0.2) / 2
    assert metrics["kimi_regulariser"] == pytest.approx(0.25 * 0.04, abs=1e-6)  # (tau / 2) S^2 = 0.01 each


def _tiny_policy_batch(seed: int, groups: int = 3, group_size: int = 4, length: int = 5, vocab: int = 7):
    """A fixed batch of sampled tokens, a parametric policy over them (free logits per position,
    shared across rows through a linear map), and 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * group_size
    features = torch.randn(rows, length, 3, generator=g)  # [B, T, 3]: a stand-in for hidden states
    theta = torch.randn(3, vocab, generator=g).requires_grad_(True)  # the policy's parameters
    tokens = torch.randint(vocab, (rows, length), generator=g)  # [B, T]
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()  # [B, T], right-padded
    rewards = torch.randint(0, 2, (rows,), generator=g).float()  # [B]
    theta_old = theta.detach() + 0.3 * torch.randn(3, vocab, generator=g)  # the sampling policy, moved away

    def token_logprobs(weights):
        return torch.log_softmax(features @ weights, -1).gather(-1, tokens[..., None])[..., 0]  # [B, T]

    return theta, token_logprobs, token_logprobs(theta_old).detach(), mask, rewards, group_size


@pytest.mark.parametrize("tau", [0.1, 1.0, 3.0])
def test_kimi_gradient_is_reinforce_with_group_mean_baseline_plus_regulariser(tau):
    """Kimi k1.5 eq. 3: grad = (1/k) sum_j [grad log pi(y_j) (r_j - r_bar) - (tau/2) grad (log pi/pi_i)^2],
    averaged over the problems, ascended; the loss's gradient must be its negative exactly."""
    theta, token_logprobs, old, mask, rewards, group_size = _tiny_policy_batch(0)
    advantages = group_advantages(rewards, group_size, scale="none")[:, None].expand_as(mask)  # r - mean(group)
    loss, _ = policy_loss(token_logprobs(theta), old, advantages, mask, name="kimi", kimi_tau=tau,
                          loss_agg="seq_mean_token_mean")
    (kimi_grad,) = torch.autograd.grad(loss, theta)

    # The paper's gradient written out, group by group: REINFORCE with r_bar, plus the l2 term.
    logp = token_logprobs(theta)
    seq_logp = (logp * mask).sum(-1)  # [B], log pi(y_j | x): a sum over tokens, no length normaliser
    seq_log_ratio = ((logp - old) * mask).sum(-1)  # [B], log pi / pi_i
    ascent = 0.0
    for group in range(len(rewards) // group_size):
        rows = slice(group * group_size, (group + 1) * group_size)
        r_bar = rewards[rows].mean()
        ascent = ascent + ((rewards[rows] - r_bar) * seq_logp[rows]
                           - tau / 2 * seq_log_ratio[rows].pow(2)).mean()
    ascent = ascent / (len(rewards) // group_size)
    (paper_grad,) = torch.autograd.grad(-ascent, theta)
    torch.testing.assert_close(kimi_grad, paper_grad, atol=1e-6, rtol=1e-5)


def test_kimi_on_policy_is_reinforce_and_tau_acts_only_off_policy():
    """At the sampling policy S = 0: the gradient is REINFORCE's with the group-mean baseline,
    whatever tau is (so kimi_tau is inert with one epoch and one minibatch); off it, tau matters."""
    theta, token_logprobs, _, mask, rewards, group_size = _tiny_policy_batch(1)
    advantages = group_advantages(rewards, group_size, scale="none")[:, None].expand_as(mask)
    on_policy = token_logprobs(theta).detach()

    def grad(tau, old):
        loss, _ = policy_loss(token_logprobs(theta), old, advantages, mask, name="kimi", kimi_tau=tau,
                              loss_agg="seq_mean_token_mean")
        return torch.autograd.grad(loss, theta)[0]

    seq_logp = (token_logprobs(theta) * mask).sum(-1)
    (reinforce,) = torch.autograd.grad(-(advantages[:, 0] * seq_logp).mean(), theta)
    torch.testing.assert_close(grad(0.1, on_policy), reinforce, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad(5.0, on_policy), reinforce, atol=1e-6, rtol=1e-5)
    _, _, moved, _, _, _ = _tiny_policy_batch(1)
    assert not torch.allclose(grad(0.1, moved), grad(5.0, moved))


# ---------------------------------------------------------------- configuration
def _kimi(**overrides):
    return dict(policy_loss="kimi", advantage_estimator="dr_grpo", grpo_scale="none", group_size=4,
                whiten_advantages=False, loss_agg="seq_mean_token_mean", **overrides)


def test_kimi_config_is_accepted_and_tau_live_off_policy():
    config = PPOConfig(**_kimi(kimi_tau=0.5, ppo_epochs=2))
    assert not [m for m in config_warnings(config) if "kimi_tau" in m]


@pytest.mark.parametrize("overrides, field", [
    (dict(advantage_estimator="grpo", grpo_scale="group"), "advantage_estimator"),
    (dict(whiten_advantages=True), "whiten_advantages"),
    (dict(loss_agg="token_mean"), "loss_agg"),
    (dict(kimi_tau=0.0), "kimi_tau"),
    (dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
])
def test_kimi_refuses_what_is_not_its_loss_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}:"):
        PPOConfig(**{**_kimi(), **overrides})


def test_kimi_tau_is_warned_where_it_cannot_act():
    elsewhere = preset("grpo", kimi_tau=0.5, ppo_epochs=2)
    assert any(m.startswith("PPOConfig.kimi_tau:") and "policy_loss='vanilla'" in m for m in config_warnings(elsewhere))
    one_step = PPOConfig(**_kimi(kimi_tau=0.5, ppo_epochs=1, num_minibatches=1))
    assert any(m.startswith("PPOConfig.kimi_tau:") and "on-policy" in m for m in config_warnings(one_step))
    clipped = PPOConfig(**_kimi(cliprange=0.3, ppo_epochs=2))
    assert any(m.startswith("PPOConfig.cliprange:") and "kimi" in m for m in config_warnings(clipped))


def test_kimi_trains_in_the_loop_and_its_regulariser_acts_after_the_first_step(tmp_path, tiny_model_dir):
    from ppo.trainer import RLTrainer

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path),
                    rollout_batch_size=8, response_length=12, eval_size=8, eval_every=0, total_steps=1, save_every=0,
                    progress=False, log_samples=0, lr=1e-2, lean_forward=False,
                    **_kimi(kimi_tau=0.5, ppo_epochs=2))
    trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "9+9="], reward_fn=lambda p, r: [float(x.count("1")) for x in r])
    metrics = trainer.train_step()
    assert metrics["kimi_regulariser"] > 0  # the second epoch sees a moved policy: S != 0

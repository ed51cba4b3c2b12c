"""The 2026 additions, each pinned twice: on hand-made numbers written out below, and
against the formula of the project it cites, written here from that project's source at a
pinned commit (the formula, not its code), to 1e-6.

Pinned sources:
- V = volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7 `verl/trainer/ppo/core_algos.py`
- T = huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8 `trl/trainer/grpo_trainer.py`
- S = NovaSky-AI/SkyRL@a9564572eb8e91076be43c1bd5e4615e3de17265 `skyrl/backends/skyrl_train/utils/ppo_utils.py`
- P = PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64 `src/prime_rl/orchestrator/algo/max_rl.py`
- N = NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909 `nemo_rl/algorithms/loss/loss_functions.py`
"""

from __future__ import annotations

import math

import pytest
import torch

from gae import estimate_advantages
from gae.group import gdpo_advantages, group_advantages, maxrl_advantages, passk_advantages, rloo_advantages
from ppo.algorithm.kl import kl_penalty
from ppo.algorithm.losses import aggregate, kl_loss, loss_units, positive_nll_loss, token_loss_weights
from ppo.algorithm.policy_losses import policy_loss
from ppo.algorithm.rewards import reward_components
from ppo.algorithm.rollout_correction import correction_weights
from ppo.config import PPOConfig, preset
from ppo.settings.config_checks import inert_settings


def grad_of(name, logprobs, old, advantages, mask, loss_agg="token_mean", **settings):
    current = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(current, old, advantages, mask, name=name, loss_agg=loss_agg, **settings)
    loss.backward()
    return loss.item(), current.grad, metrics


# ---------------------------------------------------------------- SAPO
def test_sapo_hand_computed():
    # ratios 1 and 1.5 with A = +1 (tau_pos 1), ratio 0.5 with A = -1 (tau_neg 2), token mean over 3
    logprobs = torch.log(torch.tensor([[1.0, 1.5, 0.5]]))
    old, adv, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, -1.0]]), torch.ones(1, 3)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    gates = [4 * sig(0.0), 4 * sig(0.5), 4 * sig(2 * -0.5) / 2]  # 2, 2.4492, 0.5379
    loss, grad, metrics = grad_of("sapo", logprobs, old, adv, mask, sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    assert loss == pytest.approx((-gates[0] - gates[1] + gates[2]) / 3, abs=1e-6)
    # d/dlogp of -A * f(r) = -A * 4 sig'(tau (r - 1)) * r
    dsig = lambda x: sig(x) * (1 - sig(x))  # noqa: E731
    expected = [-4 * dsig(0.0) * 1.0, -4 * dsig(0.5) * 1.5, 4 * dsig(-1.0) * 0.5]
    assert grad[0].tolist() == pytest.approx([g / 3 for g in expected], abs=1e-6)
    assert grad[0, 0].item() == pytest.approx(-1 / 3, abs=1e-7)  # on-policy: PPO's gradient -A / N
    assert metrics["sapo_gate_mean"] == pytest.approx((1 + 4 * dsig(0.5) + 4 * dsig(-1.0)) / 3, abs=1e-6)


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos=1.0, tau_neg=1.05):
    """V L1329-1411 `compute_policy_loss_sapo` (T L3092-3095 has the same gate): gate
    sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg, loss -gate * A,
    aggregated by seq-mean-token-mean whatever the mode (log-ratio clamped to [-20, 20])."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    taus = torch.where(advantages > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    losses = -torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * advantages
    seq = (losses * response_mask).sum(-1) / (response_mask.sum(-1) + 1e-8)
    return seq.sum() / (response_mask.sum(-1) > 0).sum()


def test_sapo_matches_verl_under_seq_mean_token_mean():
    torch.manual_seed(0)
    logprobs, old = -torch.rand(3, 5), -torch.rand(3, 5)
    adv, mask = torch.randn(3, 5), (torch.rand(3, 5) > 0.3).float()
    mask[:, 0] = 1.0
    ours = policy_loss(logprobs, old, adv, mask, name="sapo", loss_agg="seq_mean_token_mean")[0]
    assert ours.item() == pytest.approx(verl_sapo(old, logprobs, adv, mask).item(), abs=1e-6)


# ---------------------------------------------------------------- GPG and verl's REINFORCE loss
def test_gpg_hand_computed():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    adv, mask = torch.tensor([[1.0, 1.0], [-2.0, -2.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, grad, _ = grad_of("gpg", logprobs, logprobs + 0.3, adv, mask)  # the old policy is never read
    assert loss == pytest.approx((1 + 2 - 1) / 3)  # -A logp: 1, 2, -1 over 3 tokens
    assert grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 2 / 3, 0.0])


def test_gpg_with_token_tis_is_verl_reinforce_loss():
    """V L1984-2061 `compute_policy_loss_reinforce`: -A * log_prob * rollout_is_weights, weights
    the truncated trainer / sampler ratio; here they are folded into the advantage first."""
    torch.manual_seed(1)
    logprobs, old, sampler = -torch.rand(2, 4), -torch.rand(2, 4), -torch.rand(2, 4)
    adv, mask = torch.randn(2, 4), torch.ones(2, 4)
    weights, kept = correction_weights(old, sampler, mask, "token_tis", cap=2.0)
    ours = policy_loss(logprobs, old, adv * weights, mask * kept, name="gpg", loss_agg="seq_mean_token_sum")[0]
    w = torch.clamp(torch.exp(old - sampler), max=2.0)
    verl = (-adv * logprobs * w * mask).sum(-1).sum() / 2  # seq-mean-token-sum, its default
    assert ours.item() == pytest.approx(verl.item(), abs=1e-6)


# ---------------------------------------------------------------- token_sum and abs+
def test_token_sum_hand_computed_and_units():
    values, mask = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token_sum").item() == 10.0
    assert loss_units(mask, "token_sum").item() == 1.0  # each micro-batch weighs 1
    assert token_loss_weights(mask, "token_sum").tolist() == [4.0, 4.0]  # N per token, against token_mean's 1


def verl_agg_token_sum(loss_mat, loss_mask):
    """verl's `agg_loss` token-sum (added after the pinned V, whose agg_loss L1025-1081 has the
    three other modes): the masked sum, no normaliser."""
    return (loss_mat * loss_mask).sum()


def test_token_sum_matches_verl():
    torch.manual_seed(2)
    values, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.4).float()
    assert aggregate(values, mask, "token_sum").item() == pytest.approx(verl_agg_token_sum(values, mask).item(), abs=1e-6)


def test_abs_plus_has_abs_value_and_k2_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    kl = kl_penalty(logprobs, ref, "abs+")
    assert kl[0].tolist() == pytest.approx([0.5, 1.0, 0.0])
    kl.sum().backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.5, -1.0, 0.0])  # log_ratio, k2's gradient
    # V L1841-1864 `kl_penalty`: backward 0.5 (logp - ref)^2 - its detach + the forward value
    value = (logprobs - ref).abs()
    backward = 0.5 * (logprobs - ref).square()
    verl = backward - backward.detach() + value.detach()
    assert torch.allclose(kl, verl, atol=1e-6)
    loss, _ = kl_loss(logprobs, ref, torch.ones(1, 3), estimator="abs+")
    assert loss.item() == pytest.approx(0.5)


# ---------------------------------------------------------------- MaxRL
def test_maxrl_hand_computed():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert maxrl_advantages(scores, 4).tolist() == pytest.approx([3, -1, -1, -1, 1, 1, -1, -1, 0, 0, 0, 0], abs=1e-4)


def test_maxrl_matches_skyrl_and_prime_rl():
    torch.manual_seed(3)
    scores = torch.rand(24)
    grouped = scores.view(-1, 4)
    mean = grouped.mean(-1, keepdim=True)
    skyrl = (grouped - mean) / (mean + 1e-6)  # S L1396-1428 compute_maxrl_advantage, epsilon 1e-6
    prime = torch.where(mean <= 0, torch.zeros_like(grouped), (grouped - mean) / mean)  # P L22-26 score_group
    ours = maxrl_advantages(scores, 4).view(-1, 4)
    assert torch.allclose(ours, skyrl, atol=1e-6)
    assert torch.allclose(ours, prime, atol=1e-4)  # prime-rl has no epsilon
    assert maxrl_advantages(torch.tensor([-1.0, 0.0]), 2).tolist() == [0.0, 0.0]  # mean <= 0: no signal


# ---------------------------------------------------------------- pass@k
def test_passk_hand_computed():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.2, 0.9, 0.5, 0.0])
    assert passk_advantages(scores, 4, scale="none").tolist() == pytest.approx([1, 0, 0, 0, 0, 0, 0, 0, 0, 0.4, 0, 0])
    # "group", population std 0.433 of [1, 0, 0, 0]
    assert passk_advantages(scores[:4], 4, scale="group", eps=0.0)[0].item() == pytest.approx(1 / math.sqrt(0.1875))


def verl_passk(scores, group_size, epsilon=1e-6, norm_adv_by_std=True):
    """V L360-419 `compute_grpo_passk_outcome_advantage`: topk(2) per group, the best gets
    r_max - r_second_max, divided by torch.std (sample) + epsilon when normalising."""
    out = torch.zeros_like(scores)
    for start in range(0, len(scores), group_size):
        rewards = scores[start:start + group_size]
        top, idx = torch.topk(rewards, 2)
        advantage = top[0] - top[1]
        if norm_adv_by_std:
            advantage = advantage / (torch.std(rewards) + epsilon)
        out[start + idx[0]] = advantage
    return out


def test_passk_matches_verl():
    torch.manual_seed(4)
    scores = torch.rand(32)
    ours = passk_advantages(scores, 8, scale="group", eps=1e-6, std_correction=1)
    assert torch.allclose(ours, verl_passk(scores, 8), atol=1e-6)
    assert torch.allclose(passk_advantages(scores, 8, scale="none"), verl_passk(scores, 8, norm_adv_by_std=False))


# ---------------------------------------------------------------- GDPO and the reward components
def test_gdpo_hand_computed():
    components = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert gdpo_advantages(components, torch.tensor([1.0, 1.0]), 2, eps=0.0).tolist() == [1.0, -1.0, 1.0, -1.0]
    # a zero weight leaves a component out: s = [1, -1, 0, 0], batch std sqrt(1/2)
    assert gdpo_advantages(components, torch.tensor([1.0, 0.0]), 2, eps=0.0).tolist() == pytest.approx(
        [math.sqrt(2), -math.sqrt(2), 0.0, 0.0])


def trl_normalize_then_sum(rewards_per_func, weights, num_generations):
    """T L2710-2719: per function, (x - nanmean) / (nanstd + 1e-4) within each group
    (nanstd: Bessel-corrected), weighted nansum, then (s - nanmean) / (nanstd + 1e-4) over the batch."""
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[-1])
    mean_k = grouped.mean(1, keepdim=True)
    std_k = grouped.std(1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[-1])
    rewards = (reward_k * weights).sum(1)
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def test_gdpo_matches_trl_normalize_then_sum():
    torch.manual_seed(5)
    components = torch.stack([torch.randint(0, 2, (16,)).float(), torch.rand(16), torch.randn(16)], -1)
    weights = torch.tensor([1.0, 0.5, 0.2])
    ours = gdpo_advantages(components, weights, 4, eps=1e-4, std_correction=1)
    assert torch.allclose(ours, trl_normalize_then_sum(components, weights, 4), atol=1e-6)


def test_reward_components_sum_to_the_score_and_feed_gdpo():
    scores, correct = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([True, False, True, True])
    raw, weights = reward_components(scores, correct, torch.tensor([True, True, False, True]),
                                     torch.tensor([2.0, 4.0, 3.0, 5.0]), 2, 0.5, 0.1)
    assert raw[:, 2].tolist() == [0.5, -0.5, 0.5, -0.5]  # Kimi: shorter correct +0.5, longer wrong min(0, -0.5)
    assert (raw @ weights).tolist() == pytest.approx([1.35, -0.15, 1.25, 0.85])
    token_rewards = torch.zeros(4, 2)
    advantages, _ = estimate_advantages("gdpo", token_rewards=token_rewards, response_mask=torch.ones(4, 2),
                                        group_size=2, reward_components=raw, reward_weights=weights)
    assert torch.allclose(advantages[:, 0], gdpo_advantages(raw, weights, 2))


# ---------------------------------------------------------------- failed samples out of the baseline
VALID = torch.tensor([True, True, False, True])


def test_failed_sample_leaves_group_mean_and_std():
    scores = torch.tensor([1.0, 0.0, float("nan"), 0.0])
    # over the three valid scores: mean 1/3, population std sqrt(2)/3 = 0.4714
    expected = [(2 / 3) / 0.47140452, (-1 / 3) / 0.47140452, 0.0, (-1 / 3) / 0.47140452]
    assert group_advantages(scores, 4, eps=0.0, valid=VALID).tolist() == pytest.approx(expected, abs=1e-5)
    # the former handling (fill with the finite mean) keeps the mean but shrinks the std to 0.4082
    filled = torch.tensor([1.0, 0.0, 1 / 3, 0.0])
    assert group_advantages(filled, 4, eps=0.0)[0].item() == pytest.approx((2 / 3) / math.sqrt(1 / 6), abs=1e-5)
    # leave-one-out over the valid others only: 1 - 0, 0 - 1/2, 0, 0 - 1/2
    assert rloo_advantages(scores, 4, valid=VALID).tolist() == pytest.approx([1.0, -0.5, 0.0, -0.5])
    assert maxrl_advantages(scores, 4, valid=VALID).tolist() == pytest.approx([2.0, -1.0, 0.0, -1.0], abs=1e-4)
    assert passk_advantages(torch.tensor([0.0, 0.5, 9.0, 0.2]), 4, "none", valid=VALID).tolist() == pytest.approx(
        [0.0, 0.3, 0.0, 0.0])
    gdpo = gdpo_advantages(torch.tensor([[1.0], [0.0], [5.0], [0.0]]), torch.tensor([1.0]), 4, eps=0.0, valid=VALID)
    assert gdpo[2].item() == 0.0 and gdpo[0].item() == pytest.approx(math.sqrt(2), abs=1e-5)


def test_all_valid_is_the_unmasked_estimator():
    torch.manual_seed(6)
    scores = torch.rand(16)
    every = torch.ones(16, dtype=torch.bool)
    assert torch.equal(group_advantages(scores, 4, valid=every), group_advantages(scores, 4))
    assert torch.equal(rloo_advantages(scores, 4, valid=every), rloo_advantages(scores, 4))


def test_trl_unscorable_baseline_agrees():
    """T L2679-2708: an unscorable completion is NaN, the group mean and std are nan-aware
    (nanstd: Bessel), its advantage 0."""
    scores = torch.tensor([1.0, 0.0, float("nan"), 0.0, 1.0, 1.0, 0.0, float("nan")])
    valid = ~torch.isnan(scores)
    grouped = scores.view(-1, 4)
    mean = torch.nanmean(grouped, 1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(1, keepdim=True)
    std = (torch.nanmean((grouped - mean) ** 2, 1, keepdim=True) * count / (count - 1)).sqrt()
    trl = torch.nan_to_num(((grouped - mean) / (std + 1e-4)).view(-1), nan=0.0)
    ours = group_advantages(torch.nan_to_num(scores), 4, eps=1e-4, std_correction=1, valid=valid)
    assert torch.allclose(ours, trl, atol=1e-6)


# ---------------------------------------------------------------- VAPO's positive-example NLL
def test_positive_nll_hand_computed_and_nemo_rl():
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    positive = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert positive_nll_loss(logprobs, positive)[0].item() == 1.5
    assert positive_nll_loss(logprobs, torch.zeros(2, 2))[0].item() == 0.0
    # N L720-735: correct_mask = mask * (rewards > 0); masked_mean(-logprobs) over its tokens
    rewards, mask = torch.tensor([1.0, 0.0]), torch.ones(2, 2)
    correct_mask = mask * (rewards > 0).float().unsqueeze(-1)
    nemo = (-logprobs * correct_mask).sum() / correct_mask.sum()
    assert positive_nll_loss(logprobs, correct_mask)[0].item() == pytest.approx(nemo.item())


# ---------------------------------------------------------------- config and inert settings
def test_new_values_are_accepted_and_their_settings_checked():
    config = preset("grpo", policy_loss="sapo", advantage_estimator="gdpo", loss_agg="token_sum",
                    kl_estimator="abs+", positive_nll_coef=0.1)
    assert config.policy_loss == "sapo"
    for estimator in ("maxrl", "grpo_passk"):
        assert preset("grpo", advantage_estimator=estimator).advantage_estimator == estimator
    with pytest.raises(ValueError, match="sapo_tau_neg"):
        PPOConfig(sapo_tau_neg=0.0)
    with pytest.raises(ValueError, match="group_size"):
        PPOConfig(advantage_estimator="maxrl", group_size=1)
    with pytest.raises(ValueError, match="kl_placement"):
        preset("grpo", advantage_estimator="gdpo", kl_placement="reward")
    with pytest.raises(ValueError, match="reward_clip"):
        preset("grpo", advantage_estimator="gdpo", reward_clip=1.0)
    inert = dict(inert_settings(preset("grpo", sapo_tau_pos=2.0, policy_loss="vanilla")))
    assert "sapo_tau_pos" in inert
    assert "cliprange" in dict(inert_settings(preset("grpo", policy_loss="gpg", cliprange=0.3)))

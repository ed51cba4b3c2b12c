"""Hand-computed checks for `gae`: GAE, whitening, group-relative advantages, the registry.

Every expected number below was worked out on paper; the arithmetic is in the comments.
"""

import pytest
import torch

from gae import (
    ADVANTAGE_ESTIMATORS,
    compute_gae,
    estimate_advantages,
    group_advantages,
    register_advantage_estimator,
    rloo_advantages,
    whiten,
)


def t(values):
    return torch.tensor(values, dtype=torch.float32)


def assert_close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, t(expected), atol=atol, rtol=0)


# --------------------------------------------------------------------------------------
# compute_gae
# --------------------------------------------------------------------------------------


def test_gae_hand_computed_1x3():
    # gamma = 0.9, lam = 0.8 -> gamma*lam = 0.72; V after the last token = 0
    # delta_2 = 1.0 + 0.9*0   - 0.3 =  0.7
    # delta_1 = 0.0 + 0.9*0.3 - 0.4 = -0.13
    # delta_0 = 0.0 + 0.9*0.4 - 0.5 = -0.14
    # A_2 = 0.7 ; A_1 = -0.13 + 0.72*0.7 = 0.374 ; A_0 = -0.14 + 0.72*0.374 = 0.12928
    # returns = A + V = [0.62928, 0.774, 1.0]
    advantages, returns = compute_gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.4, 0.3]]), t([[1, 1, 1]]), 0.9, 0.8)
    assert_close(advantages, [[0.12928, 0.374, 0.7]])
    assert_close(returns, [[0.62928, 0.774, 1.0]])


def test_gae_padding_does_not_leak():
    # Row 0 is real for 2 tokens; its padding holds large rewards and values that must be ignored.
    # delta_1 = 1 - 0.2 = 0.8 (bootstrap 0 after the last real token)
    # delta_0 = 0.9*0.2 - 0.5 = -0.32 ; A_0 = -0.32 + 0.72*0.8 = 0.256
    # Row 1 is the fully-real 1x3 case above, padded with a 4th masked column.
    rewards = t([[0.0, 1.0, 99.0, 99.0], [0.0, 0.0, 1.0, 50.0]])
    values = t([[0.5, 0.2, 7.0, 7.0], [0.5, 0.4, 0.3, -3.0]])
    mask = t([[1, 1, 0, 0], [1, 1, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, 0.9, 0.8)
    assert_close(advantages, [[0.256, 0.8, 0.0, 0.0], [0.12928, 0.374, 0.7, 0.0]])
    assert_close(returns, [[0.756, 1.0, 0.0, 0.0], [0.62928, 0.774, 1.0, 0.0]])


def test_gae_ignores_nan_in_padding_and_accepts_bool_mask():
    rewards = t([[0.0, 1.0, float("nan")]])
    values = t([[0.5, 0.2, float("inf")]])
    advantages, returns = compute_gae(rewards, values, torch.tensor([[True, True, False]]), 0.9, 0.8)
    assert_close(advantages, [[0.256, 0.8, 0.0]])
    assert_close(returns, [[0.756, 1.0, 0.0]])


def test_gae_hole_in_mask_is_skipped():
    # mask [1, 0, 1]: the middle position is absent, so the row behaves like the 2-token
    # episode rewards [0, 1], values [0.5, 0.3]:
    # delta_last = 1 - 0.3 = 0.7 ; delta_first = 0.9*0.3 - 0.5 = -0.23
    # A_first = -0.23 + 0.72*0.7 = 0.274
    advantages, returns = compute_gae(t([[0.0, 5.0, 1.0]]), t([[0.5, 9.0, 0.3]]), t([[1, 0, 1]]), 0.9, 0.8)
    assert_close(advantages, [[0.274, 0.0, 0.7]])
    assert_close(returns, [[0.774, 0.0, 1.0]])


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    # Row 0: reward-to-go = [0.1-0.2+1.0, -0.2+1.0, 1.0] = [0.9, 0.8, 1.0]; minus V -> [0.6, 0.3, 0.8]
    # Row 1 (last token masked): reward-to-go = [2.5, 2.0]; minus V -> [2.4, 1.6]
    rewards = t([[0.1, -0.2, 1.0], [0.5, 2.0, 3.0]])
    values = t([[0.3, 0.5, 0.2], [0.1, 0.4, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, 1.0, 1.0)
    assert_close(advantages, [[0.6, 0.3, 0.8], [2.4, 1.6, 0.0]])
    # returns = reward-to-go on real tokens
    assert_close(returns, [[0.9, 0.8, 1.0], [2.5, 2.0, 0.0]])


def test_gae_lam_zero_is_one_step_td():
    # lam = 0: A_t = delta_t. gamma = 0.5: delta = [0 + 0.5*2 - 1, 3 + 0.5*0 - 2] = [0, 1]
    advantages, _ = compute_gae(t([[0.0, 3.0]]), t([[1.0, 2.0]]), t([[1, 1]]), 0.5, 0.0)
    assert_close(advantages, [[0.0, 1.0]])


def test_gae_shape_mismatch_raises():
    with pytest.raises(ValueError, match="rewards, values and mask"):
        compute_gae(t([[0.0, 1.0]]), t([[0.0, 1.0, 2.0]]), t([[1, 1]]), 1.0, 1.0)


# --------------------------------------------------------------------------------------
# whiten
# --------------------------------------------------------------------------------------


def test_whiten_population_variance():
    # mean 2.5 ; population var = (2.25+0.25+0.25+2.25)/4 = 1.25 ; std = 1.118034
    # (x - 2.5)/1.118034 = [-1.341641, -0.447214, 0.447214, 1.341641]
    # (the unbiased var 5/3 would give +-1.161895 for the ends: this test tells them apart)
    out = whiten(t([1.0, 2.0, 3.0, 4.0]))
    assert_close(out, [-1.341641, -0.447214, 0.447214, 1.341641])


def test_whiten_shift_mean_false_restores_mean():
    # same as above plus 2.5
    out = whiten(t([1.0, 2.0, 3.0, 4.0]), shift_mean=False)
    assert_close(out, [1.158359, 2.052786, 2.947214, 3.841641])


def test_whiten_masked_ignores_padding_and_zeros_it():
    # the selected values are {1, 2, 3, 4} again; 100 and -50 must not enter the statistics
    x = t([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    assert_close(whiten(x, mask), [[-1.341641, -0.447214, 0.0], [0.447214, 1.341641, 0.0]])
    # shift_mean=False: mean 2.5 restored on real positions, padding still 0 (not 2.5)
    assert_close(whiten(x, mask, shift_mean=False), [[1.158359, 2.052786, 0.0], [2.947214, 3.841641, 0.0]])


def test_whiten_without_mask_uses_padding():
    # [1, 2, 0, 0] over all 4 elements: mean 0.75, var = (0.0625+1.5625+0.5625+0.5625)/4 = 0.6875
    # std = 0.829156 ; (x - 0.75)/0.829156 = [0.301511, 1.507557, -0.904534, -0.904534]
    assert_close(whiten(t([[1.0, 2.0], [0.0, 0.0]])), [[0.301511, 1.507557], [-0.904534, -0.904534]])


def test_whiten_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        whiten(t([[1.0, 2.0, 3.0]]), t([[0, 1, 0]]))
    with pytest.raises(ValueError, match="at least 2"):
        whiten(t([5.0]))


# --------------------------------------------------------------------------------------
# group_advantages and rloo_advantages
# --------------------------------------------------------------------------------------

BINARY_SCORES = t([1, 0, 0, 0, 1, 1, 0, 0])  # two prompts, G = 4


def test_group_scale_binary_rewards():
    # group 1: mean 0.25, pop var = (0.5625 + 3*0.0625)/4 = 0.1875, std = 0.433013
    #   0.75/0.433013 = 1.732051 ; -0.25/0.433013 = -0.577350
    # group 2: mean 0.5, std 0.5 -> +-1
    out = group_advantages(BINARY_SCORES, 4, scale="group", eps=0.0)
    assert_close(out, [1.732051, -0.577350, -0.577350, -0.577350, 1.0, 1.0, -1.0, -1.0])


def test_group_scale_default_eps():
    # eps = 1e-4 is added to the std: 0.75/0.4331127 = 1.731651 ; -0.25/0.4331127 = -0.577217
    out = group_advantages(t([1, 0, 0, 0]), 4)
    assert_close(out, [1.731651, -0.577217, -0.577217, -0.577217])


def test_none_scale_is_mean_centred_only():
    out = group_advantages(BINARY_SCORES, 4, scale="none")
    assert_close(out, [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])


def test_batch_scale_uses_std_of_all_scores():
    # all 8 scores: mean 3/8, pop var = (3/8)(5/8) = 15/64, std = 0.484123
    # group-centred [0.75, -0.25 x3, 0.5, 0.5, -0.5, -0.5] / 0.484123
    out = group_advantages(BINARY_SCORES, 4, scale="batch", eps=0.0)
    assert_close(out, [1.549193, -0.516398, -0.516398, -0.516398, 1.032796, 1.032796, -1.032796, -1.032796])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_constant_groups_give_exact_zero(scale):
    # all-correct, all-wrong, and a value (0.1) whose float mean is not exact
    scores = t([1, 1, 1, 1, 0, 0, 0, 0, 0.1, 0.1, 0.1, 0.1, 1, 0, 0, 0])
    for eps in (1e-4, 0.0):
        out = group_advantages(scores, 4, scale=scale, eps=eps)
        assert torch.isfinite(out).all()
        assert torch.equal(out[:12], torch.zeros(12))
        assert out[12] > 0  # the mixed group still gets a signal


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(t([1, 0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t([1, 0]), 2, scale="std")


def test_rloo_hand_case():
    # group 1 [1,0,0,0]: 1 - 0 = 1 ; 0 - 1/3 = -0.333333
    # group 2 [2,4,6,8] (sum 20): 2 - 18/3 = -4 ; 4 - 16/3 = -1.333333 ; 6 - 14/3 = 1.333333 ; 8 - 12/3 = 4
    out = rloo_advantages(t([1, 0, 0, 0, 2, 4, 6, 8]), 4)
    assert_close(out, [1.0, -0.333333, -0.333333, -0.333333, -4.0, -1.333333, 1.333333, 4.0])


def test_rloo_is_scaled_mean_centred():
    scores = t([0.3, -1.2, 2.5, 0.0, 0.7, 0.7])  # G = 3, not hand-picked to be nice
    expected = 3 / 2 * group_advantages(scores, 3, scale="none")
    torch.testing.assert_close(rloo_advantages(scores, 3), expected)


def test_rloo_needs_two_samples_and_zeroes_constant_groups():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(t([1, 0]), 1)
    assert torch.equal(rloo_advantages(t([0.1, 0.1, 0.1, 1.0, 0.0, 0.0]), 3)[:3], torch.zeros(3))


# --------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------

# Two prompts, G = 2. Rewards outside the mask (the 5.0) must not count.
# sequence scores = [1, 0, 3, 1]
TOKEN_REWARDS = t([[0, 0, 1], [0, 0, 5], [0, 3, 0], [0, 1, 0]])
RESPONSE_MASK = t([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]])


def run(name, **kwargs):
    return estimate_advantages(name, token_rewards=TOKEN_REWARDS, response_mask=RESPONSE_MASK, group_size=2, **kwargs)


def test_registry_has_the_builtin_estimators():
    assert {"gae", "grpo", "dr_grpo", "rloo", "reinforce", "rft"} <= set(ADVANTAGE_ESTIMATORS)


def test_grpo_broadcasts_to_tokens_and_zeroes_padding():
    # group [1, 0]: mean 0.5, std 0.5 -> [1, -1] ; group [3, 1]: mean 2, std 1 -> [1, -1]
    advantages, returns = run("grpo", grpo_eps=0.0)
    assert_close(advantages, [[1, 1, 1], [-1, -1, 0], [1, 1, 0], [-1, -1, -1]])
    assert torch.equal(returns, advantages)


def test_grpo_passes_scale_through():
    advantages, _ = run("grpo", grpo_scale="none")
    assert_close(advantages, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0], [1, 1, 0], [-1, -1, -1]])


def test_dr_grpo_ignores_grpo_scale():
    # mean-centred only: [0.5, -0.5] and [1, -1]
    advantages, _ = run("dr_grpo", grpo_scale="group")
    assert_close(advantages, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0], [1, 1, 0], [-1, -1, -1]])


def test_rloo_estimator():
    # G = 2: each minus the other: [1-0, 0-1, 3-1, 1-3] = [1, -1, 2, -2]
    advantages, _ = run("rloo")
    assert_close(advantages, [[1, 1, 1], [-1, -1, 0], [2, 2, 0], [-2, -2, -2]])


def test_reinforce_with_and_without_baseline():
    advantages, _ = run("reinforce")
    assert_close(advantages, [[1, 1, 1], [0, 0, 0], [3, 3, 0], [1, 1, 1]])
    # batch mean score = 5/4 = 1.25 -> [-0.25, -1.25, 1.75, -0.25]
    advantages, _ = run("reinforce", reinforce_baseline=True)
    assert_close(advantages, [[-0.25, -0.25, -0.25], [-1.25, -1.25, 0], [1.75, 1.75, 0], [-0.25, -0.25, -0.25]])


def test_rft_keeps_responses_at_or_above_the_threshold():
    # sequence scores [1, 0, 3, 1]: threshold 1 keeps rows 0, 2, 3 with advantage 1, no baseline
    advantages, returns = run("rft")
    assert_close(advantages, [[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 1, 1]])
    assert torch.equal(returns, advantages)
    # threshold 2 keeps only the score-3 response; padding stays 0
    assert_close(run("rft", rft_min_score=2.0)[0], [[0, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]])


def test_rft_with_one_update_is_sft_on_the_kept_samples():
    """With ratio 1 the policy-gradient loss of RFT advantages has the gradient of the SFT
    cross-entropy summed over kept tokens (divided by all tokens under token_mean)."""
    from ppo.algorithm.policy_losses import policy_loss

    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.3]], requires_grad=True)
    mask = torch.ones(2, 2)
    advantages, _ = estimate_advantages("rft", token_rewards=t([[0, 1], [0, 0]]), response_mask=mask)
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, loss_agg="token_mean")
    loss.backward()
    sft_logprobs = logprobs.detach().clone().requires_grad_(True)
    (-(sft_logprobs[0].sum()) / 4).backward()
    assert torch.allclose(logprobs.grad, sft_logprobs.grad)
    assert logprobs.grad[1].abs().sum() == 0  # the rejected response gets no gradient at all


def test_gae_estimator_matches_compute_gae_and_needs_values():
    rewards, values, mask = t([[0.0, 1.0, 99.0]]), t([[0.5, 0.2, 7.0]]), t([[1, 1, 0]])
    advantages, returns = estimate_advantages(
        "gae", token_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.8
    )
    assert_close(advantages, [[0.256, 0.8, 0.0]])  # the padding case worked out above
    assert_close(returns, [[0.756, 1.0, 0.0]])
    with pytest.raises(ValueError, match="values"):
        estimate_advantages("gae", token_rewards=rewards, response_mask=mask)


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'") as info:
        estimate_advantages("ppo", token_rewards=TOKEN_REWARDS, response_mask=RESPONSE_MASK)
    for name in ("gae", "grpo", "dr_grpo", "rloo", "reinforce"):
        assert name in str(info.value)


def test_register_custom_estimator():
    @register_advantage_estimator("test_constant_two")
    def constant_two(*, token_rewards, response_mask, **kwargs):
        advantages = 2.0 * response_mask
        return advantages, advantages

    try:
        advantages, _ = run("test_constant_two")
        assert_close(advantages, [[2, 2, 2], [2, 2, 0], [2, 2, 0], [2, 2, 2]])
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator("test_constant_two")(constant_two)
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_constant_two", None)


# ---------------------------------------------------------------------------------------
# the critic's details: decoupled and length-adaptive lambda, REINFORCE++, ReMax
# ---------------------------------------------------------------------------------------
from gae.gae import length_adaptive_lambda  # noqa: E402
from ppo.config import PPOConfig  # noqa: E402


def _critic_batch():
    rewards = torch.tensor([[0.1, -0.2, 0.0, 1.0], [0.0, 0.3, 0.5, 0.0]])
    values = torch.tensor([[0.4, 0.2, 0.6, 0.1], [0.5, -0.1, 0.2, 0.9]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    return rewards, values, mask


def test_decoupled_lambda_equals_two_separate_gae_runs():
    rewards, values, mask = _critic_batch()
    advantages, returns = estimate_advantages("gae", token_rewards=rewards, response_mask=mask, values=values,
                                              gamma=0.9, lam=0.95, lam_critic=1.0)
    policy_run, critic_run = compute_gae(rewards, values, mask, 0.9, 0.95), compute_gae(rewards, values, mask, 0.9, 1.0)
    assert torch.equal(advantages, policy_run[0]) and torch.equal(returns, critic_run[1])
    assert not torch.allclose(returns, policy_run[1])  # the two lambdas really differ here
    # lam_critic equal to lam is the coupled estimator, bit for bit
    coupled = estimate_advantages("gae", token_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.95)
    same = estimate_advantages("gae", token_rewards=rewards, response_mask=mask, values=values, gamma=0.9,
                               lam=0.95, lam_critic=0.95)
    assert all(torch.equal(a, b) for a, b in zip(coupled, same))


def test_length_adaptive_lambda_matches_hand_computed_values():
    # alpha 0.25: length 8 -> 1 - 1/2 = 0.5; length 2 -> 1 - 1/0.5 = -1, clamped to 0
    assert length_adaptive_lambda(torch.tensor([8.0, 2.0]), alpha=0.25).tolist() == [0.5, 0.0]
    assert length_adaptive_lambda(torch.tensor([10.0, 40.0]), alpha=0.05).tolist() == [0.0, 0.5]
    # rows of 3 and 2 real tokens, gamma 1, alpha 2/3: lambda 1 - 1/2 = 0.5 and 1 - 1/(4/3) = 0.25
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = estimate_advantages("gae", token_rewards=rewards, response_mask=mask, values=values,
                                              gamma=1.0, lam=0.95, lam_critic=1.0, lam_length_alpha=2 / 3)
    # row 0, deltas [0, 0, 0.5]: A2 = 0.5, A1 = 0 + 0.5*0.5 = 0.25, A0 = 0 + 0.5*0.25 = 0.125
    # row 1, deltas [0, 1]:      A1 = 1, A0 = 0 + 0.25*1 = 0.25
    assert torch.allclose(advantages, torch.tensor([[0.125, 0.25, 0.5], [0.25, 1.0, 0.0]]))
    # the lengths passed in win over the mask's row sums (GAE over padding, AlpacaFarm)
    padded, _ = estimate_advantages("gae", token_rewards=rewards, response_mask=torch.ones(2, 3), values=values,
                                    gamma=1.0, lam=0.95, lam_length_alpha=2 / 3, response_lengths=torch.tensor([3, 2]))
    assert torch.allclose(padded[0], advantages[0])
    assert returns.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]  # lambda 1: reward-to-go


def test_reinforce_plus_plus_hand_computed_2x3():
    """Score at the last token minus beta * k1 KL per token, gamma 0.5, whitened over the batch."""
    beta = 0.1
    kl = torch.tensor([[1.0, -2.0, 0.0], [2.0, 0.0, 0.0]])  # k1 = logp - ref, row 1 padded at t=2
    scores = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = -beta * kl * mask
    rewards[0, 2] += scores[0]
    rewards[1, 1] += scores[1]  # rewards [[-0.1, 0.2, 1.0], [-0.2, 0, 0]]
    advantages, returns = estimate_advantages("reinforce_plus_plus", token_rewards=rewards, response_mask=mask,
                                              gamma=0.5)
    # row 0: G2 = 1, G1 = 0.2 + 0.5 = 0.7, G0 = -0.1 + 0.35 = 0.25;  row 1: G1 = 0, G0 = -0.2
    expected_returns = torch.tensor([[0.25, 0.7, 1.0], [-0.2, 0.0, 0.0]])
    assert torch.allclose(returns, expected_returns)
    # 5 real tokens: mean 1.75/5 = 0.35; population variance
    # (0.01 + 0.1225 + 0.4225 + 0.3025 + 0.1225)/5 = 0.196
    std = 0.196 ** 0.5
    expected = torch.tensor([[-0.1 / std, 0.35 / std, 0.65 / std], [-0.55 / std, -0.35 / std, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens():
    # two groups of 2, gamma 1, score at the last token only (KL in the loss)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [3.0, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    advantages, returns = estimate_advantages("reinforce_plus_plus_baseline", token_rewards=rewards,
                                              response_mask=mask, group_size=2)
    # group means 0.5 and 2: centred [[0.5, 0.5], [-0.5, -0.5], [1, 0], [-1, 0]]; mean over 6 tokens 0,
    # variance (4 * 0.25 + 2 * 1) / 6 = 0.5
    expected = torch.tensor([[0.5, 0.5], [-0.5, -0.5], [1.0, 0.0], [-1.0, 0.0]]) / 0.5 ** 0.5
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert returns.tolist() == [[1.0, 1.0], [0.0, 0.0], [3.0, 0.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="group_size"):
        PPOConfig(advantage_estimator="reinforce_plus_plus_baseline", group_size=1)


def test_remax_subtracts_the_greedy_samples_reward():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    greedy = torch.tensor([0.25, 0.25, 1.0])  # the greedy response's score, repeated over its prompt's samples
    advantages, returns = estimate_advantages("remax", token_rewards=rewards, response_mask=mask,
                                              reward_baselines=greedy)
    assert returns.tolist() == [[1.0, 1.0, 1.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert advantages.tolist() == [[0.75, 0.75, 0.75], [0.25, 0.25, 0.0], [-1.0, -1.0, -1.0]]
    with pytest.raises(ValueError, match="reward_baselines"):
        estimate_advantages("remax", token_rewards=rewards, response_mask=mask)

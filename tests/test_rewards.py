"""Hand-computed checks for ppo/algorithm/rewards.py: every expected number was worked out on paper."""

import pytest
import torch

from ppo.algorithm.rewards import (
    apply_missing_eos,
    clip_scores,
    format_reward,
    group_kimi_length_reward,
    kimi_length_reward,
    length_reward_weight,
    score_positions,
    shape_rewards,
    whiten_rewards,
)


def close(actual, expected, atol=1e-4):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=atol)


# ---------------------------------------------------------------- missing EOS


SCORES = torch.tensor([1.0, 2.0, 3.0])
HAS_EOS = torch.tensor([True, False, True])


def test_missing_eos_none_leaves_scores():
    assert apply_missing_eos(SCORES, HAS_EOS, "none").tolist() == [1.0, 2.0, 3.0]


def test_missing_eos_penalty_subtracts_from_truncated_only():
    assert apply_missing_eos(SCORES, HAS_EOS, "penalty", penalty=1.5).tolist() == [1.0, 0.5, 3.0]


def test_missing_eos_replace_sets_fixed_score():
    out = apply_missing_eos(SCORES, HAS_EOS, "replace", replace_value=-1.0)
    assert out.tolist() == [1.0, -1.0, 3.0]


def test_missing_eos_unknown_mode_names_mode():
    with pytest.raises(ValueError, match="mode"):
        apply_missing_eos(SCORES, HAS_EOS, "drop")


# ---------------------------------------------------------------- clipping


def test_clip_scores_clamps_both_sides():
    assert clip_scores(torch.tensor([-3.0, 0.5, 3.0]), 1.0).tolist() == [-1.0, 0.5, 1.0]


def test_clip_scores_none_is_noop():
    assert clip_scores(torch.tensor([-3.0, 0.5, 3.0]), None).tolist() == [-3.0, 0.5, 3.0]


# ---------------------------------------------------------------- shaping


def test_score_on_last_real_token_and_kl_elsewhere():
    scores = torch.tensor([2.0, 4.0, -1.0])
    kl = torch.tensor([[0.5, 1.0, 2.0], [1.0, 3.0, 9.9], [0.2, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    rewards = shape_rewards(scores, kl, mask, kl_coef=0.5)
    # row 0: [-0.25, -0.5, -1.0 + 2]; row 1: [-0.5, -1.5 + 4, pad]; row 2: [-0.1 - 1, pad, pad]
    expected = [[-0.25, -0.5, 1.0], [-0.5, 2.5, 0.0], [-1.1, 0.0, 0.0]]
    assert close(rewards, expected)


def test_kl_not_in_reward_leaves_only_score():
    scores = torch.tensor([2.0, 4.0])
    kl = torch.tensor([[0.5, 1.0, 2.0], [1.0, 3.0, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards = shape_rewards(scores, kl, mask, kl_coef=0.5, kl_in_reward=False)
    assert rewards.tolist() == [[0.0, 0.0, 2.0], [0.0, 4.0, 0.0]]


def test_shape_rewards_ignores_inf_kl_on_padding():
    rewards = shape_rewards(
        torch.tensor([1.0]), torch.tensor([[0.0, float("inf")]]), torch.tensor([[1, 0]]), kl_coef=0.1
    )
    assert rewards.tolist() == [[1.0, 0.0]]


def test_score_after_the_last_token_as_trl_puts_it():
    """score_position='after_last_token': the score moves one column past the last real
    token, unless the response fills the width; the KL stays on the real tokens."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    kl = torch.tensor([[0.5, 1.0, 7.0, 7.0], [1.0, 1.0, 1.0, 1.0]])  # 7.0 sits on padding
    scores = torch.tensor([2.0, 4.0])
    rewards = shape_rewards(scores, kl, mask, kl_coef=0.5, score_position="after_last_token")
    assert rewards.tolist() == [[-0.25, -0.5, 2.0, 0.0], [-0.5, -0.5, -0.5, 3.5]]
    assert shape_rewards(scores, kl, mask, 0.5).tolist() == [[-0.25, 1.5, 0.0, 0.0], [-0.5, -0.5, -0.5, 3.5]]
    assert score_positions(mask, "after_last_token").tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert torch.equal(score_positions(mask, "last_token"), mask)
    with pytest.raises(ValueError, match="score_position"):
        shape_rewards(scores, kl, mask, 0.5, score_position="first_token")


def test_shape_rewards_rejects_empty_row():
    with pytest.raises(ValueError, match="empty"):
        shape_rewards(torch.tensor([1.0, 1.0]), torch.zeros(2, 2), torch.tensor([[1, 0], [0, 0]]), 0.1)


# ---------------------------------------------------------------- whitening

# rewards [[1, 3], [2, pad]]; the pad entry holds 0 as shape_rewards leaves it
WHITEN_REWARDS = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
WHITEN_MASK = torch.tensor([[1, 1], [1, 0]])


def test_whiten_rewards_masked_statistics():
    # {1, 3, 2}: mean 2, population var 2/3, std 0.81650; (x - 2)/std + 2
    out = whiten_rewards(WHITEN_REWARDS, WHITEN_MASK, over_padding=False)
    assert close(out, [[0.77526, 3.22474], [2.0, 0.0]])


def test_reward_whitening_mode_alpacafarm_like_alpacafarm():
    # {1, 3, 2, 0}: mean 1.5, population var 1.25, std 1.11803; (x - 1.5)/std + 1.5, then * mask
    out = whiten_rewards(WHITEN_REWARDS, WHITEN_MASK, over_padding=True)
    assert close(out, [[1.05279, 2.84164], [1.94721, 0.0]])


def test_whitening_over_padding_differs_from_masked():
    masked = whiten_rewards(WHITEN_REWARDS, WHITEN_MASK, over_padding=False)
    padded = whiten_rewards(WHITEN_REWARDS, WHITEN_MASK, over_padding=True)
    assert not torch.allclose(masked, padded, atol=1e-2)


# ---------------------------------------------------------------- Kimi length reward


def test_kimi_mixed_lengths_and_correctness():
    out = kimi_length_reward(torch.tensor([10, 20, 30]), torch.tensor([True, False, True]))
    assert close(out, [0.5, 0.0, -0.5])
    assert out.dtype.is_floating_point


def test_kimi_wrong_answers_not_rewarded_for_shortness():
    # lam = [0.5, 0.25, -0.5]; wrong answers get min(0, lam), the right one gets lam
    out = kimi_length_reward(torch.tensor([10, 15, 30]), torch.tensor([False, True, False]))
    assert close(out, [0.0, 0.25, -0.5])


def test_kimi_all_wrong_group_only_penalises_long():
    out = kimi_length_reward(torch.tensor([10, 20, 30, 25]), torch.zeros(4, dtype=torch.bool))
    # lam = [0.5, 0.0, -0.5, -0.25]
    assert close(out, [0.0, 0.0, -0.5, -0.25])


def test_kimi_all_equal_lengths_is_zero():
    out = kimi_length_reward(torch.tensor([7, 7, 7]), torch.tensor([True, False, True]))
    assert out.tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(out).all()


def test_group_kimi_uses_per_group_min_and_max():
    lengths = torch.tensor([10, 20, 30, 100, 300, 200, 5, 5, 5])
    correct = torch.tensor([True, False, True, True, True, False, True, True, True])
    out = group_kimi_length_reward(lengths, correct, group_size=3)
    # group 1: [0.5, 0, -0.5]; group 2: lam [0.5, -0.5, 0] -> [0.5, -0.5, min(0, 0)];
    # group 3: all equal -> zeros
    assert close(out, [0.5, 0.0, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])


def test_group_kimi_rejects_bad_group_size():
    with pytest.raises(ValueError, match="group_size"):
        group_kimi_length_reward(torch.tensor([1, 2, 3]), torch.ones(3, dtype=torch.bool), 2)


# ---------------------------------------------------------------------- length-reward warm-up
def test_length_reward_is_off_during_warmup_then_constant():
    weights = [length_reward_weight(step, 0.5, warmup_steps=3) for step in range(6)]
    assert weights == [0.0, 0.0, 0.0, 0.5, 0.5, 0.5]


def test_length_reward_without_warmup_is_on_from_step_zero():
    assert length_reward_weight(0, 0.5, warmup_steps=0) == 0.5
    with pytest.raises(ValueError, match="warmup_steps"):
        length_reward_weight(0, 0.5, warmup_steps=-1)


# ---------------------------------------------------------------------- format reward
def test_format_reward_pays_only_well_formed_responses():
    out = format_reward(torch.tensor([True, False, True]), 0.25)
    assert out.tolist() == [0.25, 0.0, 0.25]
    assert format_reward(torch.tensor([True, False]), 0.0).tolist() == [0.0, 0.0]


def test_format_reward_cancels_in_a_group_that_is_all_well_formed():
    """Added before group statistics, a bonus every sample gets changes no advantage."""
    from gae import group_advantages

    accuracy = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    all_formed = accuracy + format_reward(torch.ones(8, dtype=torch.bool), 0.5)
    assert torch.allclose(group_advantages(all_formed, 4), group_advantages(accuracy, 4))
    # In a group of all-wrong answers where only some are well formed, the bonus is the only signal.
    wrong = torch.zeros(4)
    mixed = wrong + format_reward(torch.tensor([True, False, True, False]), 0.5)
    assert (group_advantages(wrong, 4) == 0).all()
    assert group_advantages(mixed, 4).tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-3)

"""Hand-computed checks for ppo/algorithm/losses.py: every expected number was worked out on paper."""

import math

import pytest
import torch

from ppo.algorithm.losses import (
    LOSS_AGG_MODES,
    aggregate,
    entropy_loss,
    explained_variance,
    group_shares,
    kl_loss,
    token_loss_weights,
    value_loss,
)
from ppo.algorithm.policy_losses import policy_loss


def one_token(ratio, advantage):
    """[1, 1] tensors for a single token with the given ratio to the old policy."""
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old_logprobs = torch.zeros(1, 1)
    return logprobs, old_logprobs, torch.tensor([[float(advantage)]]), torch.ones(1, 1)


# ---------------------------------------------------------------- aggregation

AGG_VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
AGG_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", 2.5),  # (1+2+3+4) / 4
        ("seq_mean_token_mean", 3.0),  # (2 + 4) / 2
        ("seq_mean_token_sum_norm", 10.0 / 6.0),  # 10 / (2*3)
        ("token_sum", 10.0),  # 1+2+3+4, no normaliser (verl token-sum)
    ],
)
def test_aggregate_modes(mode, expected):
    assert aggregate(AGG_VALUES, AGG_MASK, mode).item() == pytest.approx(expected)


def test_aggregate_modes_give_different_numbers():
    # prompt_mean needs groups; its own three-way example is below
    modes = [mode for mode in LOSS_AGG_MODES if mode != "prompt_mean"]
    results = {round(aggregate(AGG_VALUES, AGG_MASK, mode).item(), 4) for mode in modes}
    assert len(results) == len(modes) == 5


PROMPT_VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
PROMPT_MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
PROMPT_GROUPS = torch.tensor([0, 0, 1])  # rows 0-1 answer one prompt, row 2 another


def test_prompt_mean_hand_computed_value_and_gradient():
    shares = group_shares(PROMPT_MASK, PROMPT_GROUPS)
    assert shares.tolist() == [0.75, 0.25, 1.0]  # 3 of group 0's 4 tokens, 1 of 4; all of group 1's
    values = PROMPT_VALUES.clone().requires_grad_(True)
    loss = aggregate(values, PROMPT_MASK, "prompt_mean", group_share=shares)
    assert loss.item() == pytest.approx(5.0)  # ((1+2+3+4)/4 + (7+8)/2) / 2
    assert aggregate(PROMPT_VALUES, PROMPT_MASK, "token_mean").item() == pytest.approx(25 / 6)
    assert aggregate(PROMPT_VALUES, PROMPT_MASK, "seq_mean_token_mean").item() == pytest.approx(4.5)
    loss.backward()
    # 1 / (2 prompts * 4 tokens) for group 0's tokens, 1 / (2 * 2) for group 1's
    expected = torch.tensor([[0.125, 0.125, 0.125], [0.125, 0, 0], [0.25, 0.25, 0]])
    torch.testing.assert_close(values.grad, expected)


def test_prompt_mean_with_one_response_per_prompt_is_the_sequence_mean():
    shares = group_shares(PROMPT_MASK, torch.arange(3))
    assert aggregate(PROMPT_VALUES, PROMPT_MASK, "prompt_mean", group_share=shares).item() == pytest.approx(
        aggregate(PROMPT_VALUES, PROMPT_MASK, "seq_mean_token_mean").item())


def test_prompt_mean_counts_an_empty_group_unless_skipped():
    mask = PROMPT_MASK.clone()
    mask[2] = 0  # group 1 filtered out
    kept = aggregate(PROMPT_VALUES, mask, "prompt_mean", group_share=group_shares(mask, PROMPT_GROUPS))
    skipped = aggregate(PROMPT_VALUES, mask, "prompt_mean", group_share=group_shares(mask, PROMPT_GROUPS, True))
    assert kept.item() == pytest.approx(2.5 / 2)  # two prompts, one contributes 0
    assert skipped.item() == pytest.approx(2.5)


def test_prompt_mean_without_group_shares_is_refused():
    with pytest.raises(ValueError, match="prompt_mean.*group_share"):
        aggregate(PROMPT_VALUES, PROMPT_MASK, "prompt_mean")


def test_aggregate_sum_norm_uses_given_max_len():
    assert aggregate(AGG_VALUES, AGG_MASK, "seq_mean_token_sum_norm", max_len=5).item() == pytest.approx(1.0)


def test_aggregate_ignores_nan_on_padding():
    values = torch.tensor([[1.0, float("nan")]])
    assert aggregate(values, torch.tensor([[1, 0]]), "token_mean").item() == 1.0


def test_aggregate_unknown_mode_names_loss_agg():
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(AGG_VALUES, AGG_MASK, "sum")


def test_per_sequence_normalisation_gives_long_wrong_answers_a_smaller_push():
    # two wrong answers (A = -1), of length 2 and 4; the ratio is 1 so loss_t = 1 per token
    logprobs = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    advantages = -torch.ones(2, 4)
    expected_grads = {
        # 1/2 (two sequences) * 1/length: 0.25 per short token, 0.125 per long token
        "seq_mean_token_mean": [[0.25, 0.25, 0, 0], [0.125] * 4],
        # every real token weighs 1/6
        "token_mean": [[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4],
        # constant 1 / (B * T) = 1/8
        "seq_mean_token_sum_norm": [[0.125, 0.125, 0, 0], [0.125] * 4],
    }
    for mode, expected in expected_grads.items():
        logprobs.grad = None
        loss, _ = policy_loss(logprobs, torch.zeros(2, 4), advantages, mask, loss_agg=mode)
        loss.backward()
        assert torch.allclose(logprobs.grad, torch.tensor(expected)), mode


@pytest.mark.parametrize("mode, expected", [
    ("token_mean", [1.0, 1.0, 0.0]),
    # N = 5 real tokens, B = 3 rows: 5 / (3 * 4) and 5 / (3 * 1); the empty row gets 0
    ("seq_mean_token_mean", [5 / 12, 5 / 3, 0.0]),
    # constant 5 / (3 * T), T = 4
    ("seq_mean_token_sum_norm", [5 / 12, 5 / 12, 0.0]),
])
def test_token_loss_weights_hand_computed(mode, expected):
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert torch.allclose(token_loss_weights(mask, mode), torch.tensor(expected))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("skip_empty_rows", [False, True])
def test_token_loss_weights_are_the_gradient_of_aggregate(mode, skip_empty_rows):
    # d aggregate / d value, times the number of real tokens, row by row
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    values = torch.randn(4, 5, requires_grad=True)
    shares = group_shares(mask, torch.tensor([0, 0, 1, 1]), skip_empty_rows) if mode == "prompt_mean" else None
    aggregate(values, mask, mode, max_len=7, skip_empty_rows=skip_empty_rows, group_share=shares).backward()
    per_row = values.grad[:, 0] * mask.sum()
    weights = token_loss_weights(mask, mode, max_len=7, skip_empty_rows=skip_empty_rows, group_share=shares)
    assert torch.allclose(weights, per_row)
    assert torch.allclose(values.grad * mask.sum(), weights[:, None] * mask)


# ---------------------------------------------------------------- clipped surrogate


@pytest.mark.parametrize(
    "ratio, advantage, expected_loss, clipped",
    [
        (1.1, 1.0, -1.1, False),  # inside the range
        (1.5, 1.0, -1.2, True),  # above, A > 0: gain capped at 1.2
        (0.5, 1.0, -0.5, False),  # below, A > 0: wrong direction, never clipped
        (1.1, -1.0, 1.1, False),  # inside the range
        (1.5, -1.0, 1.5, False),  # above, A < 0: wrong direction, never clipped
        (0.5, -1.0, 0.8, True),  # below, A < 0: capped at 0.8
    ],
)
def test_policy_loss_clipping_cases(ratio, advantage, expected_loss, clipped):
    logprobs, old, adv, mask = one_token(ratio, advantage)
    loss, metrics = policy_loss(logprobs, old, adv, mask, clip_low=0.2)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert metrics["clipfrac"] == (1.0 if clipped else 0.0)
    loss.backward()
    # clipped tokens get no gradient; others get d(-A * ratio)/dlogp = -A * ratio
    expected_grad = 0.0 if clipped else -advantage * ratio
    assert logprobs.grad.item() == pytest.approx(expected_grad, abs=1e-6)


def test_policy_loss_batch_metrics():
    ratios = torch.tensor([[1.1, 1.5, 0.5, 148.0], [1.1, 1.5, 0.5, 148.0]])  # last column is padding
    logprobs = ratios.log()
    advantages = torch.tensor([[1.0] * 4, [-1.0] * 4])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    loss, metrics = policy_loss(logprobs, torch.zeros(2, 4), advantages, mask)
    # per-token losses [-1.1, -1.2, -0.5] and [1.1, 1.5, 0.8]: sum 0.6 over 6 tokens
    assert loss.item() == pytest.approx(0.1, abs=1e-6)
    assert metrics["clipfrac"] == pytest.approx(2 / 6)
    assert metrics["clipfrac_high"] == pytest.approx(1 / 6)  # ratio 1.5 with A > 0
    assert metrics["clipfrac_low"] == pytest.approx(1 / 6)  # ratio 0.5 with A < 0
    assert metrics["dualclip_frac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(3.1 / 3, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.5)  # padding's 148 is ignored
    # 0.5 * log(r)^2 for r = 1.1, 1.5, 0.5: 0.0045420 + 0.0822010 + 0.2402265, averaged
    assert metrics["approx_kl"] == pytest.approx(0.1089898, abs=1e-6)
    assert all(isinstance(v, float) for v in metrics.values())


def test_clip_higher_widens_only_the_upper_side():
    # ratio 1.25, A > 0: clipped at 1.2 symmetrically, free under clip_high = 0.28
    loss_sym, m_sym = policy_loss(*one_token(1.25, 1.0), clip_low=0.2)
    loss_dapo, m_dapo = policy_loss(*one_token(1.25, 1.0), clip_low=0.2, clip_high=0.28)
    assert loss_sym.item() == pytest.approx(-1.2)
    assert loss_dapo.item() == pytest.approx(-1.25)
    assert (m_sym["clipfrac_high"], m_dapo["clipfrac_high"]) == (1.0, 0.0)
    # ratio 1.35 is beyond 1.28 too
    loss_far, _ = policy_loss(*one_token(1.35, 1.0), clip_low=0.2, clip_high=0.28)
    assert loss_far.item() == pytest.approx(-1.28)
    # the lower side is unchanged: ratio 0.75, A < 0 is clipped at 0.8 either way
    loss_low, m_low = policy_loss(*one_token(0.75, -1.0), clip_low=0.2, clip_high=0.28)
    assert loss_low.item() == pytest.approx(0.8)
    assert m_low["clipfrac_low"] == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    logprobs, old, adv, mask = one_token(5.0, -1.0)
    loss_plain, _ = policy_loss(logprobs, old, adv, mask)
    assert loss_plain.item() == pytest.approx(5.0)  # ratio * |A|, unbounded
    loss, metrics = policy_loss(logprobs, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)  # capped at c * |A|
    assert metrics["dualclip_frac"] == 1.0
    loss.backward()
    assert logprobs.grad.item() == 0.0


def test_dual_clip_leaves_small_ratios_and_positive_advantages():
    loss, metrics = policy_loss(*one_token(2.0, -2.0), dual_clip=3.0)
    assert loss.item() == pytest.approx(4.0)  # 2 * 2 < cap 3 * 2
    assert metrics["dualclip_frac"] == 0.0
    loss, metrics = policy_loss(*one_token(5.0, 1.0), dual_clip=3.0)
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["dualclip_frac"] == 0.0


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(*one_token(1.0, 1.0), dual_clip=1.0)


def test_on_policy_ratio_is_one_and_nothing_clips():
    logprobs = torch.tensor([[-1.3, -0.2, -2.5], [-0.7, -4.0, -0.1]], requires_grad=True)
    old = logprobs.detach().clone()
    advantages = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics = policy_loss(logprobs, old, advantages, mask, dual_clip=3.0)
    assert metrics["ratio_mean"] == 1.0 and metrics["ratio_max"] == 1.0
    assert metrics["clipfrac"] == 0.0 and metrics["dualclip_frac"] == 0.0
    assert metrics["approx_kl"] == 0.0
    assert loss.item() == pytest.approx(-0.8)  # -(2+2+2-1-1)/5
    loss.backward()
    # plain policy gradient: -A / 5 on each real token
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.4, -0.4, -0.4], [0.2, 0.2, 0.0]]))


# ---------------------------------------------------------------- value loss

# tokens: (V=1, old=0, R=2) moves past eps toward R; (V=0.1, old=0, R=2) within eps;
# (V=1, old=0, R=0) moves away from R; the fourth is padding
VALUES = torch.tensor([[1.0, 0.1, 1.0, 100.0]])
OLD_VALUES = torch.zeros(1, 4)
RETURNS = torch.tensor([[2.0, 2.0, 0.0, 0.0]])
VALUE_MASK = torch.tensor([[1, 1, 1, 0]])


def test_value_loss_unclipped():
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, VALUE_MASK)
    # 0.5 * [1, 3.61, 1] averaged over 3 tokens
    assert loss.item() == pytest.approx(0.935)
    assert metrics["vf_clipfrac"] == 0.0
    assert metrics["value_mean"] == pytest.approx(0.7)
    assert metrics["value_error"] == pytest.approx(1.87)


def test_value_loss_clipped():
    values = VALUES.clone().requires_grad_(True)
    loss, metrics = value_loss(values, OLD_VALUES, RETURNS, VALUE_MASK, clip_range_value=0.2)
    # token 0: V_clipped = 0.2, 0.5 * 1.8^2 = 1.62 beats 0.5; tokens 1, 2 unchanged (1.805, 0.5)
    assert loss.item() == pytest.approx((1.62 + 1.805 + 0.5) / 3)
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["value_error"] == pytest.approx(1.87)  # always the unclipped error
    loss.backward()
    # d/dV of 0.5 (V - R)^2 / 3 = (V - R) / 3; zero where clipped and on padding
    assert torch.allclose(values.grad, torch.tensor([[0.0, -1.9 / 3, 1.0 / 3, 0.0]]))


# ---------------------------------------------------------------- entropy, KL, explained variance


def test_entropy_loss_aggregates():
    value, metrics = entropy_loss(AGG_VALUES, AGG_MASK, "seq_mean_token_mean")
    assert value.item() == pytest.approx(3.0)
    assert metrics["entropy"] == pytest.approx(3.0)


def test_kl_loss_k3():
    logprobs = torch.tensor([[0.0, -1.0, 5.0]])
    ref_logprobs = torch.tensor([[math.log(2.0), -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = kl_loss(logprobs, ref_logprobs, mask, estimator="k3")
    # token 0: exp(ln 2) - ln 2 - 1 = 0.3068528; token 1: 0; mean over 2
    assert loss.item() == pytest.approx(0.1534264, abs=1e-6)
    assert metrics["kl_loss"] == pytest.approx(0.1534264, abs=1e-6)


def test_kl_loss_k1():
    logprobs = torch.tensor([[0.0, -1.0]])
    ref_logprobs = torch.tensor([[math.log(2.0), -1.0]])
    loss, _ = kl_loss(logprobs, ref_logprobs, torch.ones(1, 2), estimator="k1")
    assert loss.item() == pytest.approx(-0.3465736, abs=1e-6)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 5), returns, mask) == pytest.approx(0.0)
    # residual [1, 0, -1, 0]: var 0.5; Var[R] = 1.25; 1 - 0.4
    values = torch.tensor([[0.0, 2.0, 4.0, 4.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.6)


def test_explained_variance_nan_for_constant_returns():
    assert math.isnan(explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)))

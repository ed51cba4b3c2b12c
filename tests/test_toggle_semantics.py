"""Each toggle does what its row in docs/implementation-details.md says, on hand-made inputs.

One test (or a few) per semantic point: difficulty filtering that changes the batch, not
only the gradient's scale; no gold verdict in RLHF training; exact gradient accumulation for
policy and critic in every aggregation mode; transformers' warmup schedule; AlpacaFarm's
exact reward whitening; AlpacaFarm's KL controller; the group std's Bessel correction.
"""

import math

import pytest
import torch

from gae import compute_gae, group_advantages
from ppo.algorithm.buffer import accumulation_weights
from ppo.config import PRESETS, PPOConfig, preset
from ppo.algorithm.dynamic_sampling import ScoredBatch, sample_batch
from ppo.algorithm.kl import AdaptiveKLController, AlpacaFarmKLController, make_kl_controller
from ppo.algorithm.losses import LOSS_AGG_MODES, aggregate, group_shares, value_loss
from ppo.algorithm.policy_losses import policy_loss
from ppo.algorithm.rewards import whiten_rewards, whitening_gae_mask
from ppo.models.rollout import Rollout
from ppo.tasks.base import Problem


# ---------------------------------------------------------------- 1. difficulty filtering
def test_renormalised_filter_equals_training_on_the_kept_rows_only():
    # Rows 0-1: a group kept; rows 2-3: a filtered group (masked out of the loss).
    torch.manual_seed(0)
    logprobs = torch.randn(4, 3, requires_grad=True)
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3, [0.0] * 3, [0.0] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]])
    kept_only, _ = policy_loss(logprobs[:2], logprobs[:2].detach(), advantages[:2], mask[:2],
                               loss_agg="seq_mean_token_mean")
    renormalised, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, loss_agg="seq_mean_token_mean",
                                  skip_empty_rows=True)
    masked, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, loss_agg="seq_mean_token_mean")
    grad_kept = torch.autograd.grad(kept_only, logprobs)[0]
    grad_renormalised = torch.autograd.grad(renormalised, logprobs)[0]
    grad_masked = torch.autograd.grad(masked, logprobs)[0]
    assert torch.allclose(grad_renormalised, grad_kept)
    # The old masking only rescales: the filtered rows still count in the mean over rows.
    assert torch.allclose(grad_masked, grad_kept * 2 / 4)


def test_aggregate_skip_empty_rows_worked_example():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    assert aggregate(values, mask, "seq_mean_token_mean").item() == pytest.approx(1.0)
    assert aggregate(values, mask, "seq_mean_token_mean", skip_empty_rows=True).item() == pytest.approx(2.0)
    assert aggregate(values, mask, "seq_mean_token_sum_norm", skip_empty_rows=True).item() == pytest.approx(2.0)
    assert aggregate(values, mask, "token_mean", skip_empty_rows=True).item() == pytest.approx(2.0)


def _fake_draw(pass_patterns, group_size):
    """A `draw` returning rounds whose groups have the given numbers of correct samples."""
    rounds = iter(pass_patterns)
    counter = iter(range(10_000))

    def draw(n_groups):
        solved = next(rounds)
        assert len(solved) == n_groups
        correct = torch.tensor([i < k for k in solved for i in range(group_size)])
        b = len(correct)
        problems = [Problem(prompt=f"p{next(counter)}", answer="") for _ in solved for _ in range(group_size)]
        width = 1 + len(problems) % 3  # rounds of different response widths
        rollout = Rollout(torch.ones(b, 2, dtype=torch.long), torch.ones(b, 2, dtype=torch.long),
                          torch.ones(b, width, dtype=torch.long), torch.ones(b, width, dtype=torch.long),
                          torch.ones(b, dtype=torch.bool))
        return ScoredBatch(problems, rollout, ["r"] * b, correct.float(), correct.float(), correct)

    return draw


def test_dynamic_sampling_fills_the_batch_with_groups_inside_the_band():
    # G = 2, 2 groups per batch. Round 1: solved [2, 1] -> keeps 1; round 2: [0, 1] -> keeps 1.
    batch = sample_batch(_fake_draw([[2, 1], [0, 1], [1, 1]], 2), n_groups=2, group_size=2, band=(0.0, 1.0),
                         max_rounds=4)
    assert batch.rounds == 2 and batch.responses_generated == 8
    assert batch.correct.tolist() == [True, False, True, False]  # both groups pass rate 0.5
    assert len(batch.problems) == len(batch.rollout) == 4
    assert batch.seen_pass_rates.tolist() == [1.0, 0.5, 0.0, 0.5]  # everything generated, for retirement


def test_dynamic_sampling_stops_at_the_round_cap_and_fills_with_filtered_groups():
    batch = sample_batch(_fake_draw([[2, 0], [0, 1]], 2), n_groups=2, group_size=2, band=(0.0, 1.0), max_rounds=2)
    assert batch.rounds == 2 and batch.responses_generated == 8
    assert len(batch.problems) == 4
    rates = batch.correct.float().reshape(2, 2).mean(-1).tolist()
    assert sorted(rates) == [0.0, 0.5]  # the kept group plus the latest filtered one


def test_one_round_without_resampling():
    batch = sample_batch(_fake_draw([[2, 0]], 2), n_groups=2, group_size=2, band=(0.0, 1.0), max_rounds=1)
    assert batch.rounds == 1 and batch.responses_generated == 4 and len(batch.problems) == 4


# ---------------------------------------------------------------- 2. no gold in RLHF training
@pytest.mark.parametrize("toggle", [dict(difficulty_filter=True), dict(retire_mastered=True),
                                    dict(length_reward_coef=0.5)])
def test_gold_verdict_toggles_are_refused_with_a_reward_model(toggle):
    with pytest.raises(ValueError, match="gold"):
        PPOConfig(task="preference", reward_model_path="some/rm", group_size=4, **toggle)
    PPOConfig(task="arithmetic", group_size=4, **toggle)  # fine without a reward model


# ---------------------------------------------------------------- 3. exact gradient accumulation
@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("skip_empty_rows", [False, True])
def test_accumulation_over_micro_batches_equals_the_full_batch(loss_agg, skip_empty_rows):
    torch.manual_seed(1)
    batch, horizon, k = 8, 6, 4
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 1, 4])
    mask = (torch.arange(horizon)[None, :] < lengths[:, None]).long()  # [8, 6]
    mask[[2, 5]] = 0  # rows out of the loss (truncated, or a filtered group)
    old_logprobs, advantages = -torch.rand(batch, horizon), torch.randn(batch, horizon)
    old_values, returns = torch.randn(batch, horizon), torch.randn(batch, horizon)
    logprobs = (old_logprobs + 0.1 * torch.randn(batch, horizon)).requires_grad_()
    values = (old_values + 0.3 * torch.randn(batch, horizon)).requires_grad_()

    # prompt_mean: three rows per prompt, so micro-batches of two rows split the groups
    shares = group_shares(mask, torch.arange(batch) // 3, skip_empty_rows) if loss_agg == "prompt_mean" else None

    def total_loss(rows, policy_weight=1.0, value_weight=1.0):
        pg, _ = policy_loss(logprobs[rows], old_logprobs[rows], advantages[rows], mask[rows], loss_agg=loss_agg,
                            max_len=horizon, skip_empty_rows=skip_empty_rows,
                            group_share=None if shares is None else shares[rows])
        vf, _ = value_loss(values[rows], old_values[rows], returns[rows], mask[rows], clip_range_value=0.2)
        return policy_weight * pg + value_weight * 0.1 * vf

    full = torch.autograd.grad(total_loss(torch.arange(batch)), [logprobs, values])
    micro_rows = torch.arange(batch).chunk(k)
    policy_w, value_w = accumulation_weights([mask[r] for r in micro_rows], loss_agg, skip_empty_rows,
                                             group_shares=None if shares is None else [shares[r] for r in micro_rows])
    accumulated = torch.autograd.grad(sum(total_loss(r, pw, vw) for r, pw, vw in zip(micro_rows, policy_w, value_w)),
                                      [logprobs, values])
    for exact, summed in zip(full, accumulated):
        assert torch.allclose(exact, summed, atol=1e-6)
    # The former uniform 1/k weight is wrong for the critic's token-mean loss.
    uniform = torch.autograd.grad(sum(total_loss(r, pw, 1 / k) for r, pw in zip(micro_rows, policy_w)), values)[0]
    assert not torch.allclose(full[1], uniform, atol=1e-4)


# ---------------------------------------------------------------- 4. learning-rate schedule
def test_linear_warmup_is_piecewise_like_transformers():
    from ppo.models.optimization import build_lr_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, "linear", warmup_steps=5, total_steps=250)
    lrs = []
    for _ in range(251):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.2) and lrs[5] == pytest.approx(1.0)
    assert lrs[6] == pytest.approx(244 / 245) and lrs[250] == 0.0
    constant = build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), "constant", 2, 10)
    assert constant.get_last_lr() == [0.0]


# ---------------------------------------------------------------- 5. AlpacaFarm's reward whitening
def test_alpacafarm_whitening_keeps_padding_and_feeds_it_through_gae():
    rewards = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    exact = whiten_rewards(rewards, mask, "alpacafarm")
    stats_only = whiten_rewards(rewards, mask, "stats")
    pad_value = 1.5 * (1 - 1 / math.sqrt(1.25))  # mean * (1 - 1/std) = 0.158
    assert exact[1, 1].item() == pytest.approx(pad_value, abs=1e-6)
    assert stats_only[1, 1].item() == 0.0
    assert torch.allclose(exact[0], stats_only[0]) and exact[1, 0] == stats_only[1, 0]
    zeros = torch.zeros_like(rewards)
    advantages, _ = compute_gae(exact, zeros, whitening_gae_mask(mask, "alpacafarm"), 1.0, 1.0)
    masked_advantages, _ = compute_gae(stats_only, zeros, whitening_gae_mask(mask, "stats"), 1.0, 1.0)
    # The short response's first token collects the padding's whitened reward in its return.
    assert advantages[1, 0].item() == pytest.approx(stats_only[1, 0].item() + pad_value, abs=1e-5)
    assert masked_advantages[1, 0].item() == pytest.approx(stats_only[1, 0].item(), abs=1e-6)
    assert preset("alpacafarm").reward_whitening_mode == "alpacafarm"
    assert PPOConfig(reward_whitening_mode=True).reward_whitening_mode == "stats"  # configs from before its modes


# ---------------------------------------------------------------- 6. adaptive KL controllers
def test_alpacafarm_kl_controller_moves_per_step_with_k_beta():
    alpacafarm = make_kl_controller(0.2, True, target=6.0, rule="alpacafarm", k_beta=0.1)
    assert isinstance(alpacafarm, AlpacaFarmKLController)
    alpacafarm.update(6.6, 512)  # error +0.1 -> x(1 + 0.1 * 0.1), whatever the batch size
    assert alpacafarm.value == pytest.approx(0.202)
    alpacafarm.update(60.0, 10)  # error clipped at +0.2 -> x1.02
    assert alpacafarm.value == pytest.approx(0.202 * 1.02)
    ziegler = make_kl_controller(0.2, True, target=6.0, horizon=10000, rule="ziegler")
    assert type(ziegler) is AdaptiveKLController
    ziegler.update(6.6, 512)  # x(1 + 0.1 * 512 / 10000)
    assert ziegler.value == pytest.approx(0.2 * 1.00512)
    # rlhf_ppo.sh keeps beta fixed, so the preset sets no controller: one there would act on nothing.
    assert "kl_controller" not in PRESETS["alpacafarm"] and not preset("alpacafarm").adaptive_kl


# ---------------------------------------------------------------- 7. group std
def test_group_std_population_or_sample():
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0])
    population = group_advantages(scores, 4, "group", eps=0.0, std_correction=0)
    sample = group_advantages(scores, 4, "group", eps=0.0, std_correction=1)
    assert population.tolist() == [1.0, 1.0, -1.0, -1.0]  # std 0.5
    assert sample.tolist() == pytest.approx([0.8660254] * 2 + [-0.8660254] * 2)  # std sqrt(1/3)
    eight = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0])
    ratio = group_advantages(eight, 8, eps=0.0, std_correction=0) / group_advantages(eight, 8, eps=0.0, std_correction=1)
    assert ratio.tolist() == pytest.approx([math.sqrt(8 / 7)] * 8)  # x1.069 at G = 8


# ---------------------------------------------------------------- catalogue: TRL's old log-probs
def test_trl_preset_takes_old_logprobs_from_generation():
    assert preset("trl_ppo").logprobs_from_generation
    assert not preset("alpacafarm").logprobs_from_generation

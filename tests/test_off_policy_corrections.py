"""The off-policy corrections of ppo/algorithm/rollout_correction.py and the DPPO losses, each
pinned twice: on a hand-made batch whose right answer is written out below (weights, loss
and gradient), and against the peer implementation it cites, written here from that peer's
published source at a pinned commit (the formula, not its code), to 1e-6.

The hand-made batch: two sequences, trainer / sampler ratios w = [3, 0.25] (and a padding
column) with advantage +1, and w = [1.5, 1, 0.8] with advantage -1. The current policy
equals the trainer's old pass (ratio 1), so PPO's clipped loss is ``-A * weight`` on every
kept token and its gradient ``-A * weight / N`` (token mean over the N tokens left in the
loss mask): every number below is one of the weights, written out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from ppo.algorithm.losses import aggregate
from ppo.algorithm.policy_losses import policy_loss
from ppo.algorithm.rollout_correction import (KL_REJECTIONS, ROLLOUT_CORRECTIONS, correction_weights, kl_statistic,
                                              mismatch_metrics, normalize_weights, off_policy_sequence_mask)

RATIOS = torch.tensor([[3.0, 0.25, 1.0], [1.5, 1.0, 0.8]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
SAMPLER = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]])
OLD = SAMPLER + torch.log(RATIOS)
ADV = torch.tensor([[1.0] * 3, [-1.0] * 3])
GEO_0, GEO_1 = math.sqrt(0.75), 1.2 ** (1 / 3)  # geometric means of each row's ratios
K2 = [[0.5 * math.log(3) ** 2, 0.5 * math.log(0.25) ** 2], [0.5 * math.log(1.5) ** 2, 0.0, 0.5 * math.log(0.8) ** 2]]
K3 = [[3 - 1 - math.log(3), 0.25 - 1 - math.log(0.25)], [1.5 - 1 - math.log(1.5), 0.0, 0.8 - 1 - math.log(0.8)]]


def loss_and_grad(weights, mask, loss_name="vanilla", loss_agg="token_mean", logprobs=OLD, old=OLD, **settings):
    """The policy loss with the advantages times `weights` over `mask`, as the trainer applies a
    correction, and its gradient with respect to the current log-probs."""
    current = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(current, old, ADV * weights, mask, name=loss_name, loss_agg=loss_agg, **settings)
    loss.backward()
    return loss.item(), current.grad, metrics


# mode, cap, floor, kl_threshold, weights (hand-written), loss mask (hand-written)
HAND = [
    ("token_tis", 2.0, 0.5, 0.01, [[2, 0.25, 1], [1.5, 1, 0.8]], [[1, 1, 0], [1, 1, 1]]),
    ("sequence_tis", 2.0, 0.5, 0.01, [[0.75] * 3, [1.2] * 3], [[1, 1, 0], [1, 1, 1]]),
    # the geometric mean of the truncated token weights: sqrt(2 * 0.25), (1.5 * 1 * 0.8)^(1/3)
    ("geo_tis", 2.0, 0.5, 0.01, [[math.sqrt(0.5)] * 3, [GEO_1] * 3], [[1, 1, 0], [1, 1, 1]]),
    ("token_mis", 2.0, 0.5, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),        # 3 > 2, 0.25 < 0.5
    ("token_mis", 2.0, 0.75, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),       # 0.8 is inside [0.75, 2]
    ("sequence_mis", 1.1, 0.9, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [0, 0, 0]]),     # 0.75 and 1.2 outside
    ("geo_mis", 1.1, 0.9, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),          # 0.866 out, 1.063 in
    ("token_icepop", 2.0, 0.5, 0.01, [[0, 0, 1], [1.5, 1, 0.8]], [[1, 1, 0], [1, 1, 1]]),  # zeroed, still counted
    ("sequence_icepop", 1.25, 0.9, 0.01, [[0] * 3, [1.2] * 3], [[1, 1, 0], [1, 1, 1]]),    # 0.75 out, 1.2 in
    ("decoupled", 2.0, 0.5, 0.01, [[0, 0.25, 1], [1.5, 1, 0.8]], [[1, 1, 0], [1, 1, 1]]),  # 3 > cap zeroed
    # k1 keeps sampler / trainer = 1/w in [floor, cap]: the reciprocal band of token_mis
    ("token_k1", 2.0, 0.75, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [0, 1, 1]]),        # 1/1.5 = 0.667 < 0.75
    ("token_k2", 2.0, 0.5, 0.05, [[1] * 3, [1] * 3], [[0, 0, 0], [0, 1, 1]]),         # k2 0.082 of 1.5 > 0.05
    ("token_k3", 2.0, 0.5, 0.05, [[1] * 3, [1] * 3], [[0, 0, 0], [0, 1, 1]]),         # k3 0.0945 of 1.5 > 0.05
    ("seq_sum_k1", 2.0, 0.5, 0.01, [[1] * 3, [1] * 3], [[1, 1, 0], [1, 1, 1]]),       # 1/0.75, 1/1.2 inside
    ("seq_mean_k1", 1.1, 0.9, 0.01, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),      # 1/0.866 out, 1/1.063 in
    ("seq_mean_k3", 2.0, 0.5, 0.05, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),      # means 0.769, 0.0392
    ("seq_max_k2", 2.0, 0.5, 0.1, [[1] * 3, [1] * 3], [[0, 0, 0], [1, 1, 1]]),        # maxima 0.961, 0.082
]


@pytest.mark.parametrize("mode, cap, floor, threshold, weights, mask", HAND, ids=[f"{h[0]}-{i}" for i, h in enumerate(HAND)])
def test_weights_masks_loss_and_gradient_by_hand(mode, cap, floor, threshold, weights, mask):
    got_weights, got_mask = correction_weights(OLD, SAMPLER, MASK, mode, cap=cap, floor=floor, kl_threshold=threshold)
    weights, mask = torch.tensor(weights, dtype=torch.float), torch.tensor(mask, dtype=torch.float)
    real = mask.bool()
    torch.testing.assert_close(got_weights[real], weights[real], atol=1e-6, rtol=0)
    assert torch.equal(got_mask, mask)
    if not real.any():
        return
    loss, grad, _ = loss_and_grad(got_weights, got_mask)
    kept = mask.sum()
    expected_grad = torch.where(real, -ADV * weights / kept, torch.zeros_like(weights))
    assert loss == pytest.approx(float(expected_grad.sum()), abs=1e-6)  # at ratio 1, loss_t = -A w_t / N
    torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=0)


def test_two_losses_written_out_in_full():
    # token_tis: (-(2 + 0.25) + (1.5 + 1 + 0.8)) / 5; IcePop: row 0 zeroed and still in the denominator.
    loss, grad, _ = loss_and_grad(*correction_weights(OLD, SAMPLER, MASK, "token_tis"))
    assert loss == pytest.approx(1.05 / 5, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-2 / 5, -0.25 / 5, 0], [1.5 / 5, 1 / 5, 0.8 / 5]]), atol=1e-6, rtol=0)
    loss, grad, _ = loss_and_grad(*correction_weights(OLD, SAMPLER, MASK, "token_icepop"))
    assert loss == pytest.approx(3.3 / 5, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0, 0, 0], [1.5 / 5, 1 / 5, 0.8 / 5]]), atol=1e-6, rtol=0)


def test_every_correction_has_a_hand_case():
    """Every ratio correction above; every level and every estimator of the KL rejections
    (the remaining pairings run the same lines, and all of them meet verl's below)."""
    covered = {case[0] for case in HAND} | {"none"}
    assert set(ROLLOUT_CORRECTIONS) - set(KL_REJECTIONS) <= covered
    kl_cases = covered & set(KL_REJECTIONS)
    assert {mode.rpartition("_")[0] for mode in kl_cases} == {"token", "seq_sum", "seq_mean", "seq_max"}
    assert {mode[-2:] for mode in kl_cases} == {"k1", "k2", "k3"}


def test_kl_statistics_by_hand():
    k2 = kl_statistic(OLD - SAMPLER, MASK, "token_k2")
    torch.testing.assert_close(k2[0, :2], torch.tensor(K2[0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(k2[1], torch.tensor(K2[1]), atol=1e-6, rtol=0)
    mean_k3 = kl_statistic(OLD - SAMPLER, MASK, "seq_mean_k3")[:, 0]
    torch.testing.assert_close(mean_k3, torch.tensor([sum(K3[0]) / 2, sum(K3[1]) / 3]), atol=1e-6, rtol=0)
    max_k3 = kl_statistic(OLD - SAMPLER, MASK, "seq_max_k3")[:, 0]
    torch.testing.assert_close(max_k3, torch.tensor([max(K3[0]), max(K3[1])]), atol=1e-6, rtol=0)
    sum_k1 = kl_statistic(OLD - SAMPLER, MASK, "seq_sum_k1")[:, 0]
    torch.testing.assert_close(sum_k1, torch.tensor([-math.log(0.75), -math.log(1.2)]), atol=1e-6, rtol=0)


def test_batch_normalised_weights_by_hand():
    token, _ = correction_weights(OLD, SAMPLER, MASK, "token_tis")
    normalised, mean = normalize_weights(token, MASK, "token_tis")
    assert mean == pytest.approx(5.55 / 5)  # (2 + 0.25 + 1.5 + 1 + 0.8) / 5
    torch.testing.assert_close(normalised[MASK.bool()], torch.tensor([2, 0.25, 1.5, 1, 0.8]) / 1.11, atol=1e-6, rtol=0)
    sequence, _ = correction_weights(OLD, SAMPLER, MASK, "sequence_tis")
    normalised, mean = normalize_weights(sequence, MASK, "sequence_tis")
    assert mean == pytest.approx((0.75 + 1.2) / 2)  # one vote per sequence, not per token
    torch.testing.assert_close(normalised[:, 0], torch.tensor([0.75, 1.2]) / 0.975, atol=1e-6, rtol=0)
    # the loss: token_tis weights over their mean 1.11, so 1.05 / 5 / 1.11
    loss, grad, _ = loss_and_grad(*normalize_weights(token, MASK, "token_tis")[:1], MASK)
    assert loss == pytest.approx(1.05 / 5 / 1.11, abs=1e-6)
    # over two processes the mean is the pooled one: a reduce_sum that adds a second, equal batch changes nothing
    assert normalize_weights(token, MASK, "token_tis", reduce_sum=lambda t: 2 * t)[1] == pytest.approx(1.11)


def test_off_policy_sequence_mask_by_hand():
    # log(pi_sampler / pi_current) per token: row 0 [0.3, 0.1] (mean 0.2), row 1 [0.05, -0.05, 0.0] (mean 0)
    current = SAMPLER - torch.tensor([[0.3, 0.1, 0.0], [0.05, -0.05, 0.0]])
    advantages = torch.tensor([[-1.0] * 3, [-1.0] * 3])
    kept = off_policy_sequence_mask(advantages, current, SAMPLER, MASK, threshold=0.1)
    assert kept.tolist() == [[False] * 3, [True] * 3]  # row 0 drifted 0.2 > 0.1 with A < 0
    assert off_policy_sequence_mask(-advantages, current, SAMPLER, MASK, 0.1).all()  # A >= 0 is always kept
    # In the loss: row 0 leaves the numerator, the denominator stays 5. Ratios to the old pass are
    # exp(current - OLD); A = -1 everywhere, clip 0.2 never binds on row 1 (ratios 1/1.5*e^-0.05 ...).
    logprobs = current.clone().requires_grad_(True)
    old = current.detach()  # ratio 1 to the proximal policy: loss_t = -A = 1, gradient -A / N
    loss, metrics = policy_loss(logprobs, old, advantages, MASK, behaviour_logprobs=SAMPLER,
                                off_policy_mask_threshold=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(3 / 5)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0, 0], [1 / 5, 1 / 5, 1 / 5]]))
    assert metrics["off_policy_masked_frac"] == pytest.approx(2 / 5)


def test_corrected_fraction_counts_what_each_correction_did():
    assert mismatch_metrics(OLD, SAMPLER, MASK, "token_icepop")["rollout_corrected_frac"] == pytest.approx(2 / 5)
    assert mismatch_metrics(OLD, SAMPLER, MASK, "decoupled")["rollout_corrected_frac"] == pytest.approx(1 / 5)
    assert mismatch_metrics(OLD, SAMPLER, MASK, "token_k2", kl_threshold=0.05)["rollout_corrected_frac"] == \
        pytest.approx(3 / 5)
    assert mismatch_metrics(OLD, SAMPLER, MASK, "geo_mis", cap=1.1, floor=0.9)["rollout_corrected_frac"] == \
        pytest.approx(2 / 5)


# ======================================================================================
# The peers, each written from its published source at a pinned commit.
# ======================================================================================
def _random_batch(seed, rows=8, width=7, spread=0.4):
    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(rows, width, generator=generator) * 3
    old = sampler + torch.randn(rows, width, generator=generator) * spread
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, width).contiguous()
    current = old + torch.randn(rows, width, generator=generator) * 0.2
    return sampler, old, current, advantages, mask


def _verl_masked_mean(values, mask, axis=None):
    """verl ``masked_mean`` (volcengine/verl@b178a3cd verl/utils/torch_functional.py L287-301)."""
    return torch.where(mask.bool(), values, 0.0).sum(axis) / (mask.sum(axis) + 1e-8)


def verl_rejection_mask(log_ratio, mask, option, lower, upper):
    """verl ``compute_rollout_rejection_mask`` for one option (volcengine/verl@b178a3cd
    verl/trainer/ppo/rollout_corr_helper.py L156-371): statistics of the clamped log(train /
    rollout); k1 options keep ``log(lower) <= stat <= log(upper)``, the others ``stat <= upper``."""
    safe = log_ratio.clamp(-20.0, 20.0)
    token = {"k1": -safe, "k2": 0.5 * safe ** 2, "k3": torch.exp(safe) - 1.0 - safe}[option[-2:]]
    if option.startswith("token"):
        stat = token
    elif option.startswith("seq_sum"):
        stat = torch.where(mask.bool(), token, 0.0).sum(-1, keepdim=True).expand_as(token)
    elif option.startswith("seq_mean"):
        stat = _verl_masked_mean(token, mask, axis=-1)[:, None].expand_as(token)
    else:
        largest = token.masked_fill(~mask.bool(), float("-inf")).max(-1).values
        stat = torch.where(largest == float("-inf"), 0.0, largest)[:, None].expand_as(token)
    if option.endswith("k1"):
        keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
    else:
        keep = stat <= upper
    return mask * keep.float(), stat


@pytest.mark.parametrize("option", KL_REJECTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_rejection_equals_verl(option, seed):
    sampler, old, _, _, mask = _random_batch(seed)
    floor, cap, threshold = 0.8, 1.6, 0.05
    expected_mask, expected_stat = verl_rejection_mask(old - sampler, mask, option, floor, cap if option.endswith(
        "k1") else threshold)
    weights, got_mask = correction_weights(old, sampler, mask, option, cap=cap, floor=floor, kl_threshold=threshold)
    assert torch.equal(got_mask, expected_mask) and torch.equal(weights, torch.ones_like(mask))
    real = mask.bool()
    torch.testing.assert_close(kl_statistic(old - sampler, mask, option)[real], expected_stat[real], atol=1e-6, rtol=1e-6)
    assert 0 < expected_mask.sum() < mask.sum() or option.startswith("seq")  # the batch exercises the test


def test_mis_band_is_verls_k1_band_reversed():
    """By-design difference 1: `token_mis` keeps w = trainer / sampler in [floor, cap]; verl's
    ``token_k1`` keeps sampler / trainer in its band. They agree once the band is inverted."""
    sampler, old, *_, mask = _random_batch(3)
    _, mis = correction_weights(old, sampler, mask, "token_mis", cap=2.0, floor=0.8)
    verl_same_band, _ = verl_rejection_mask(old - sampler, mask, "token_k1", 0.8, 2.0)
    verl_inverted, _ = verl_rejection_mask(old - sampler, mask, "token_k1", 1 / 2.0, 1 / 0.8)
    assert not torch.equal(mis, verl_same_band) and torch.equal(mis, verl_inverted)
    _, k1 = correction_weights(old, sampler, mask, "token_k1", cap=2.0, floor=0.8)
    assert torch.equal(k1, verl_same_band)


def verl_is_weights(old, rollout, mask, level, threshold, batch_normalize):
    """verl ``compute_rollout_correction_weights`` (volcengine/verl@b178a3cd
    rollout_corr_helper.py L481-596), one process."""
    log_ratio = old - rollout
    if level == "token":
        weights = torch.exp(log_ratio.clamp(-20.0, 20.0))
    else:
        total = torch.where(mask.bool(), log_ratio, 0.0).sum(-1, keepdim=True)
        weights = torch.exp(total.clamp(-20.0, 20.0)).expand_as(log_ratio)
    weights = (weights * mask).clamp(max=threshold)
    if batch_normalize:
        if level == "token":
            mean = _verl_masked_mean(weights, mask)
        else:
            per_sequence = _verl_masked_mean(weights, mask, axis=-1)
            rows = (mask.sum(-1) > 0).float()
            mean = (per_sequence * rows).sum() / rows.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
    return weights


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("batch_normalize", [False, True])
def test_truncated_and_batch_normalised_weights_equal_verl(level, batch_normalize):
    sampler, old, *_, mask = _random_batch(4, spread=0.1)
    mode = f"{level}_tis"
    weights, _ = correction_weights(old, sampler, mask, mode, cap=1.5)
    if batch_normalize:
        weights, _ = normalize_weights(weights, mask, mode)
    expected = verl_is_weights(old, sampler, mask, level, 1.5, batch_normalize)
    real = mask.bool()
    torch.testing.assert_close(weights[real], expected[real], atol=1e-6, rtol=1e-6)


def test_geo_tis_under_geo_mean_equals_verls_geo_mean():
    """By-design difference 3: under ``geo_mean`` verl folds token TIS weights into the
    sequence's loss by their geometric mean (volcengine/verl@b178a3cd core_algos.py L1635-1718
    ``compute_policy_loss_geo_mean``); ``token_tis`` here folds them by the arithmetic mean
    (the sequence's mean advantage), ``geo_tis`` as verl does."""
    sampler, old, current, advantages, mask = _random_batch(5, spread=0.3)
    cap, clip = 1.5, 0.4

    def verl(logprobs):
        token_weights = (torch.exp((old - sampler).clamp(-20, 20)) * mask).clamp(max=cap)
        log_ratio = logprobs - old
        sign = torch.sign(advantages)
        clamped = torch.clamp(log_ratio, -clip, clip)
        pessimistic = sign * torch.min(sign * log_ratio, sign * clamped)
        lengths = mask.sum(-1)
        ratio = torch.exp((pessimistic * mask).sum(-1) / (lengths + 1e-8))
        advantage = (advantages * mask).sum(-1) / (lengths + 1e-8)
        sequence_weight = torch.exp((torch.log(token_weights + 1e-10) * mask).sum(-1) / (lengths + 1e-8))
        return torch.mean(-advantage * ratio * sequence_weight)

    results = {}
    for mode in ("geo_tis", "token_tis", "peer"):
        logprobs = current.clone().requires_grad_(True)
        if mode == "peer":
            loss = verl(logprobs)
        else:
            weights, _ = correction_weights(old, sampler, mask, mode, cap=cap)
            loss, _ = policy_loss(logprobs, old, advantages * weights, mask, name="geo_mean", clip_low=clip,
                                  loss_agg="seq_mean_token_mean")
        loss.backward()
        results[mode] = (loss.detach(), logprobs.grad)
    torch.testing.assert_close(results["geo_tis"][0], results["peer"][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results["geo_tis"][1], results["peer"][1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(results["token_tis"][0], results["peer"][0], atol=1e-4)


def test_token_tis_under_gspo_token_equals_verls_gspo():
    """By-design difference 2: verl's ``gspo`` multiplies each token's loss by its TIS weight
    (volcengine/verl@b178a3cd core_algos.py L1253-1326: the sequence ratio with each token's own
    gradient, then ``pg_losses * rollout_is_weights``, ``seq-mean-token-mean``). Here ``gspo``
    folds the weights into the sequence's advantage: the same value, another gradient;
    ``gspo_token`` gives verl's gradient too."""
    sampler, old, current, advantages, mask = _random_batch(6, spread=0.3)
    weights, _ = correction_weights(old, sampler, mask, "token_tis", cap=1.5)
    low, high = 3e-2, 4e-2

    def verl(logprobs):
        negative_kl = logprobs - old
        lengths = mask.sum(-1).clamp(min=1)
        sequence_log_ratio = (negative_kl * mask).sum(-1) / lengths
        log_ratio = (logprobs - logprobs.detach() + sequence_log_ratio.detach()[:, None]).clamp(max=10.0)
        ratio = torch.exp(log_ratio)
        losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - low, 1 + high)) * weights
        return ((losses * mask).sum(-1) / lengths).mean()  # seq-mean-token-mean

    results = {}
    for name in ("gspo", "gspo_token", "peer"):
        logprobs = current.clone().requires_grad_(True)
        if name == "peer":
            loss = verl(logprobs)
        else:
            loss, _ = policy_loss(logprobs, old, advantages * weights, mask, name=name, clip_low=low, clip_high=high,
                                  loss_agg="seq_mean_token_mean")
        loss.backward()
        results[name] = (loss.detach(), logprobs.grad)
    for name in ("gspo", "gspo_token"):
        torch.testing.assert_close(results[name][0], results["peer"][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results["gspo_token"][1], results["peer"][1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(results["gspo"][1], results["peer"][1], atol=1e-5)


def trl_grpo_loss(logprobs, old, sampler, advantages, mask, mode, clip_min, clip_max, eps=0.2):
    """TRL GRPOTrainer with vLLM importance sampling, ``loss_type="dapo"``-style token mean
    (huggingface/trl@f2cd5771 trl/trainer/grpo_trainer.py L2579-2623: ``token_mask`` /
    ``sequence_mask`` zero the ratio outside [clip_min, clip_max] and keep it inside;
    L3085-3119: the clipped loss times that ratio; the mask, not the ratio, is the denominator)."""
    diff = (old - sampler) * mask
    log_is = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff
    is_ratio = torch.exp(log_is)
    is_ratio = is_ratio.masked_fill((is_ratio < clip_min) | (is_ratio > clip_max), 0.0)
    coef_1 = torch.exp(logprobs - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    per_token = -torch.min(coef_1 * advantages, coef_2 * advantages) * is_ratio
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_icepop_equals_trl_token_and_sequence_mask(level):
    """By-design difference 6: TRL's ``token_mask`` / ``sequence_mask`` are IcePop's weighting
    (the ratio kept as the weight, the dropped tokens in the denominator); ``token_mis`` /
    ``sequence_mis`` are verl's rejection. ``token_icepop`` / ``sequence_icepop`` are TRL's."""
    sampler, old, current, advantages, mask = _random_batch(7, spread=0.3 if level == "token" else 0.1)
    floor, cap = 0.7, 1.3
    results = {}
    for name in (f"{level}_icepop", f"{level}_mis", "peer"):
        logprobs = current.clone().requires_grad_(True)
        if name == "peer":
            loss = trl_grpo_loss(logprobs, old, sampler, advantages, mask, level, floor, cap)
        else:
            weights, kept = correction_weights(old, sampler, mask, name, cap=cap, floor=floor)
            loss, _ = policy_loss(logprobs, old, advantages * weights, kept, loss_agg="token_mean")
        loss.backward()
        results[name] = (loss.detach(), logprobs.grad)
    torch.testing.assert_close(results[f"{level}_icepop"][0], results["peer"][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results[f"{level}_icepop"][1], results["peer"][1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(results[f"{level}_mis"][1], results["peer"][1], atol=1e-5)


def areal_decoupled_loss(logprobs, proximal, behaviour, advantages, mask, eps, cap):
    """AReaL ``ppo_actor_loss_fn`` with the decoupled loss and token-level rejection by the
    ratio, ``action="mask"``, ``upper=cap`` (inclusionAI/AReaL@4aef98d8
    areal/utils/functional/functional.py L185-426 ``apply_rejection_sampling``, L429-560):
    ``w = pi_proximal / pi_behave`` where it is at most the cap, else 0; the clipped loss anchored
    at the proximal policy, times w; divided by the token count taken before the rejection."""
    count = mask.count_nonzero()
    log_ratio = torch.where(torch.isfinite(proximal - behaviour), proximal - behaviour, 0.0)
    weight = torch.exp(log_ratio)
    in_bounds = weight <= cap
    kept = mask.bool() & in_bounds
    weight = torch.where(kept, weight, 0.0)
    ratio = torch.where(kept, torch.exp(logprobs - proximal), 0)
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    loss = torch.max(-advantages * ratio, -advantages * clipped) * weight
    return torch.where(kept, loss, 0).sum() / count


def test_decoupled_equals_areal():
    sampler, old, current, advantages, mask = _random_batch(8, spread=0.5)
    cap = 1.6
    results = {}
    for name in ("decoupled", "peer"):
        logprobs = current.clone().requires_grad_(True)
        if name == "peer":
            loss = areal_decoupled_loss(logprobs, old, sampler, advantages, mask, 0.2, cap)
        else:
            weights, kept = correction_weights(old, sampler, mask, "decoupled", cap=cap)
            assert torch.equal(kept, mask)  # zeroed, not removed: AReaL's denominator is the original count
            loss, _ = policy_loss(logprobs, old, advantages * weights, kept, loss_agg="token_mean")
        loss.backward()
        results[name] = (loss.detach(), logprobs.grad)
    torch.testing.assert_close(results["decoupled"][0], results["peer"][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results["decoupled"][1], results["peer"][1], atol=1e-6, rtol=1e-6)
    assert ((torch.exp(old - sampler) > cap) & mask.bool()).any()  # the cap acted


def skyrl_geometric_mask(old, rollout, mask, low, high):
    """SkyRL ``compute_sequence_mask`` with ``sequence_mask_metric="geometric"``
    (NovaSky-AI/SkyRL@a9564572 skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py
    L191-254, the "geometric" branch L220-237): the geometric mean of pi_old / pi_rollout per
    sequence inside [low, high]."""
    count = mask.sum(-1, keepdim=True).clamp(min=1.0)
    geometric = torch.exp(((old - rollout) * mask).sum(-1, keepdim=True) / count)
    return mask * (~(geometric > high) & ~(geometric < low)).float()


@pytest.mark.parametrize("seed", [0, 1])
def test_geo_mis_equals_skyrl_geometric_mask_and_verl_seq_mean_k1_inverted(seed):
    sampler, old, *_, mask = _random_batch(seed, spread=0.1)
    low, high = 0.97, 1.03
    _, kept = correction_weights(old, sampler, mask, "geo_mis", cap=high, floor=low)
    assert torch.equal(kept, skyrl_geometric_mask(old, sampler, mask, low, high))
    assert 0 < kept.sum() < mask.sum()
    verl_inverted, _ = verl_rejection_mask(old - sampler, mask, "seq_mean_k1", 1 / high, 1 / low)
    assert torch.equal(kept, verl_inverted)


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold):
    """TRL ``GRPOTrainer.get_off_policy_mask`` (huggingface/trl@f2cd5771
    trl/trainer/grpo_trainer.py L2920-2937)."""
    kl_div = sampling_per_token_logps - per_token_logps.detach()
    average = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (average <= threshold)).to(dtype=mask.dtype)


def test_off_policy_sequence_mask_equals_trl():
    sampler, _, current, advantages, mask = _random_batch(9, spread=0.3)
    current = sampler + torch.randn(sampler.shape, generator=torch.Generator().manual_seed(1)) * 0.3 - 0.1
    kept = off_policy_sequence_mask(advantages, current, sampler, mask, threshold=0.05)
    expected = trl_off_policy_mask(advantages, current, sampler, mask, 0.05)
    assert torch.equal(kept.float(), expected)
    assert (expected == 0).any() and (expected == 1).any()
    # in the loss: TRL multiplies the per-token loss by the mask, the denominator unchanged
    logprobs = current.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, current.detach(), advantages, mask, behaviour_logprobs=sampler,
                          off_policy_mask_threshold=0.05)
    peer = (aggregate(-advantages * torch.exp(logprobs - logprobs.detach()) * expected, mask, "token_mean"))
    assert loss.item() == pytest.approx(peer.item(), abs=1e-6)


# ---------------------------------------------------------------- DPPO
def skyrl_dppo(logprobs, mu_logprobs, advantages, kind, delta_low, delta_high):
    """SkyRL ``dppo_policy_loss`` per token (NovaSky-AI/SkyRL@a9564572
    skyrl/backends/skyrl_train/utils/ppo_utils.py L867-935)."""
    ratio = torch.exp((logprobs - mu_logprobs).clamp(max=20.0))
    with torch.no_grad():
        p, mu = torch.exp(logprobs), torch.exp(mu_logprobs)
        diff = p - mu
        keep = torch.ones_like(advantages)
        if kind == "binary_tv":
            keep[(advantages > 0) & (diff > delta_high)] = 0.0
            keep[(advantages < 0) & (-diff > delta_low)] = 0.0
        else:
            eps = 1e-8
            kl = mu * (mu_logprobs - logprobs) + (1 - mu) * torch.log((1 - mu + eps) / (1 - p + eps))
            keep[(advantages > 0) & (diff > 0) & (kl > delta_high)] = 0.0
            keep[(advantages < 0) & (diff < 0) & (kl > delta_low)] = 0.0
    return -(ratio * advantages * keep)


def prime_rl_default_loss(trainer_logprobs, inference_logprobs, advantages, mask, low, high, kl_tau):
    """prime-rl ``default_loss_fn`` per token (PrimeIntellect-ai/prime-rl@559b4477
    src/prime_rl/trainer/rl/loss.py L109-161), ``adv_tau=1``."""
    log_ratio = trainer_logprobs - inference_logprobs
    ratio = torch.exp(log_ratio)
    diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    invalid = torch.where(advantages > 0, diff > high, diff < -low)
    keep = mask.bool() & ~invalid
    return -(keep * advantages * ratio) + kl_tau * mask * log_ratio ** 2


def _dppo_batch(seed):
    generator = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(6, 8, generator=generator) * 0.9 + 0.05)  # probabilities in (0.05, 0.95)
    current = old + torch.randn(6, 8, generator=generator) * 0.5
    advantages = torch.randn(6, 1, generator=generator).expand(6, 8).contiguous()
    lengths = torch.randint(1, 9, (6,), generator=generator)
    mask = (torch.arange(8)[None] < lengths[:, None]).float()
    return old, current, advantages, mask


@pytest.mark.parametrize("name, kind, low, high", [("dppo_tv", "binary_tv", 0.2, 0.15),
                                                    ("dppo_kl", "binary_kl", 0.05, 0.03)])
@pytest.mark.parametrize("seed", [0, 1])
def test_dppo_equals_skyrl(name, kind, low, high, seed):
    old, current, advantages, mask = _dppo_batch(seed)
    results = {}
    for which in ("ours", "peer"):
        logprobs = current.clone().requires_grad_(True)
        if which == "peer":
            loss = aggregate(skyrl_dppo(logprobs, old, advantages, kind, low, high), mask, "token_mean")
        else:
            loss, metrics = policy_loss(logprobs, old, advantages, mask, name=name, clip_low=low, clip_high=high)
            assert 0 < metrics["clipfrac"] < 1  # the trust region acts on this batch
        loss.backward()
        results[which] = (loss.detach(), logprobs.grad)
    torch.testing.assert_close(results["ours"][0], results["peer"][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results["ours"][1], results["peer"][1], atol=1e-6, rtol=1e-6)


def test_dppo_tv_equals_prime_rl_default_loss_without_its_kl_term():
    old, current, advantages, mask = _dppo_batch(3)
    logprobs = current.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, advantages, mask, name="dppo_tv", clip_low=0.2, clip_high=0.2,
                          loss_agg="seq_mean_token_sum")
    loss.backward()
    reference = current.clone().requires_grad_(True)
    peer = prime_rl_default_loss(reference, old, advantages, mask, 0.2, 0.2, kl_tau=0.0)
    peer = (peer * mask).sum() / mask.shape[0]  # prime-rl sums each sample's tokens
    peer.backward()
    assert loss.item() == pytest.approx(peer.item(), abs=1e-6)
    torch.testing.assert_close(logprobs.grad, reference.grad, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- config: refused and warned
@pytest.mark.parametrize("settings, field", [
    (dict(rollout_correction="token_k4"), "rollout_correction"),
    (dict(rollout_correction="token_k3", rollout_correction_kl_threshold=0.0), "rollout_correction_kl_threshold"),
    (dict(off_policy_mask_threshold=-0.1), "off_policy_mask_threshold"),
    (dict(policy_loss="dppo_tv", dual_clip=3.0), "dual_clip"),
])
def test_nonsense_is_refused_naming_the_field(settings, field):
    from ppo.config import PPOConfig

    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}:"):
        PPOConfig(**settings)


@pytest.mark.parametrize("settings, field, cause", [
    # with the old log-probs taken from the sampler every ratio is 1: no correction can act
    (dict(rollout_correction="decoupled", logprobs_from_generation=True), "rollout_correction",
     "logprobs_from_generation=True"),
    (dict(rollout_correction="token_mis", rollout_correction_batch_normalize=True),
     "rollout_correction_batch_normalize", "no truncated"),
    (dict(rollout_correction="token_tis", rollout_correction_kl_threshold=0.1), "rollout_correction_kl_threshold",
     "reads no k2 / k3"),
    (dict(rollout_correction="seq_mean_k3", rollout_correction_cap=3.0), "rollout_correction_cap", "k2 / k3"),
    (dict(rollout_correction="decoupled", rollout_correction_floor=0.8), "rollout_correction_floor", "only caps"),
    (dict(rollout_correction_kl_threshold=0.1), "rollout_correction_kl_threshold", "rollout_correction='none'"),
])
def test_inert_settings_are_warned_with_their_cause(settings, field, cause):
    from ppo.config import PPOConfig
    from ppo.settings.config_checks import inert_settings

    message = dict(inert_settings(PPOConfig(**settings)))[field]
    assert cause in message


def test_live_settings_are_not_warned():
    from ppo.config import PPOConfig
    from ppo.settings.config_checks import inert_settings

    for settings in (dict(rollout_correction="token_k1", rollout_correction_floor=0.8, rollout_correction_cap=1.5),
                     dict(rollout_correction="seq_max_k2", rollout_correction_kl_threshold=0.1),
                     dict(rollout_correction="geo_tis", rollout_correction_batch_normalize=True),
                     dict(rollout_correction="token_icepop", rollout_correction_floor=0.8),
                     dict(off_policy_mask_threshold=0.1, logprobs_from_generation=True),
                     dict(policy_loss="dppo_kl", cliprange=0.05)):
        assert not inert_settings(PPOConfig(**settings)), settings


def test_importance_weighted_k3_under_gspo_differs_from_trl_and_the_setting_removes_it():
    """By-design difference 5: TRL weights the k3 KL by ``coef_1``, the sequence ratio at
    ``importance_sampling_level="sequence"`` (huggingface/trl@f2cd5771 grpo_trainer.py
    L3055-3076); `kl_loss` here by each token's own ratio. Without the weight
    (`kl_loss_importance_weight=False`, TRL ``use_bias_correction_kl=False``) they agree."""
    from ppo.algorithm.losses import kl_loss

    sampler, old, current, _, mask = _random_batch(10, spread=0.3)
    ref = old - 0.2

    def trl(logprobs, weighted):
        per_token = torch.exp(ref - logprobs) - (ref - logprobs) - 1
        if weighted:
            sequence_log_ratio = ((logprobs - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            per_token = per_token * torch.exp(sequence_log_ratio)[:, None]
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)

    for weighted in (True, False):
        results = []
        for which in ("ours", "trl"):
            logprobs = current.clone().requires_grad_(True)
            loss = (kl_loss(logprobs, ref, mask, "k3", old_logprobs=old if weighted else None)[0] if which == "ours"
                    else trl(logprobs, weighted))
            loss.backward()
            results.append((loss.detach(), logprobs.grad))
        same = torch.allclose(results[0][0], results[1][0], atol=1e-6) and torch.allclose(
            results[0][1], results[1][1], atol=1e-6)
        assert same == (not weighted)


def test_reinforce_plus_plus_baseline_against_verls_outcome_contract():
    """By-design difference 4: verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``
    (volcengine/verl@b178a3cd core_algos.py L425-473) broadcasts each row's total reward, minus
    its group's mean (0 for a group of one), to every token; this codebase takes the
    return-to-go. Outcome-only rewards (``kl_placement="loss"``) make them one (the whitening,
    population here and Bessel-corrected in verl, is applied the same way to both below)."""
    from gae import whiten
    from gae.registry import reinforce_plus_plus_baseline_estimator

    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    outcome = torch.tensor([[0.0, 0, 1], [0, 2, 0], [0, 0, 0], [3, 0, 0]])  # the score at the last token
    dense = outcome - 0.1 * mask  # -beta * KL on every token as well

    def verl_centred(rewards, group_size):
        totals = rewards.sum(-1)
        groups = totals.view(-1, group_size)
        means = groups.mean(-1, keepdim=True) if group_size > 1 else torch.zeros_like(groups)
        return ((groups - means).view(-1)[:, None] * torch.ones_like(rewards)) * mask

    ours = reinforce_plus_plus_baseline_estimator(token_rewards=outcome, response_mask=mask, group_size=2)[0]
    torch.testing.assert_close(ours, whiten(verl_centred(outcome, 2), mask) * mask, atol=1e-6, rtol=0)
    ours = reinforce_plus_plus_baseline_estimator(token_rewards=dense, response_mask=mask, group_size=2)[0]
    assert not torch.allclose(ours, whiten(verl_centred(dense, 2), mask) * mask, atol=1e-3)
    # a group of one: verl keeps the score (baseline 0); the group mean here is the score itself,
    # every advantage 0, so the config refuses the setting instead
    alone = reinforce_plus_plus_baseline_estimator(token_rewards=outcome, response_mask=mask, group_size=1)[0]
    assert torch.equal(alone, torch.zeros_like(alone)) and verl_centred(outcome, 1).abs().sum() > 0
    from ppo.config import PPOConfig

    with pytest.raises(ValueError, match=r"PPOConfig\.group_size:"):
        PPOConfig(advantage_estimator="reinforce_plus_plus_baseline", group_size=1, rollout_batch_size=4)

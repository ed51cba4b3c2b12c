"""The policy-loss registry (ppo/algorithm/policy_losses.py), the entropy controls and DAPO's soft
overlong punishment, each pinned on a hand-made 2x4 batch.

The batch: old log-probs all -1; log-ratios row 0 [0.1, 0.3, -0.1, 0.0] with A = +1, row 1
[0.4, -0.5] (two padding columns) with A = -1; N = 6 real tokens. The expected numbers below
are written out token by token from each paper's formula, not computed by the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from ppo.config import PPOConfig
from ppo.algorithm.losses import LOSS_AGG_MODES, aggregate, group_shares
from ppo.algorithm.policy_losses import POLICY_LOSSES, EntropyControl, policy_loss, top_entropy_mask
from ppo.algorithm.rewards import overlong_penalty

e = math.exp
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
OLD = torch.full((2, 4), -1.0)
LOG_RATIO = torch.tensor([[0.1, 0.3, -0.1, 0.0], [0.4, -0.5, 0.0, 0.0]])
ADV = torch.tensor([[1.0] * 4, [-1.0] * 4])
N = 6


def run(name="vanilla", loss_agg="token_mean", log_ratio=LOG_RATIO, **settings):
    logprobs = (OLD + log_ratio).clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, OLD, ADV, MASK, name=name, loss_agg=loss_agg, **settings)
    loss.backward()
    return loss.item(), logprobs.grad, metrics


def check(loss, grad, expected_loss, expected_grad):
    assert loss == pytest.approx(expected_loss, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor(expected_grad), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- off-policy, hand-computed
def test_vanilla_hand_computed():
    # Row 0 (A=+1): ratio e^0.3 > 1.2 is clipped (loss -1.2, no gradient). Row 1 (A=-1):
    # e^0.4 is a move the wrong way, never clipped; e^-0.5 < 0.8 is clipped (loss 0.8).
    loss, grad, metrics = run()
    check(loss, grad, (-e(0.1) - 1.2 - e(-0.1) - 1 + e(0.4) + 0.8) / N,
          [[-e(0.1) / N, 0, -e(-0.1) / N, -1 / N], [e(0.4) / N, 0, 0, 0]])
    assert metrics["clipfrac"] == pytest.approx(2 / N) and metrics["clipfrac_seq"] == 1.0


def test_dual_clip_hand_computed_and_equal_to_trl_delta():
    loss, grad, metrics = run(dual_clip=1.4)  # row 1's e^0.4 * 1 > 1.4: capped, no gradient
    check(loss, grad, (-e(0.1) - 1.2 - e(-0.1) - 1 + 1.4 + 0.8) / N,
          [[-e(0.1) / N, 0, -e(-0.1) / N, -1 / N], [0, 0, 0, 0]])
    # INTELLECT-2's two-sided clip as TRL writes it: cap the unclipped ratio at delta, then min.
    logprobs = (OLD + LOG_RATIO).clone().requires_grad_(True)
    ratio = torch.exp(logprobs - OLD)
    per_token = -torch.minimum(torch.clamp(ratio, max=1.4) * ADV, torch.clamp(ratio, 0.8, 1.2) * ADV)
    delta_loss = aggregate(per_token, MASK, "token_mean")
    delta_loss.backward()
    assert delta_loss.item() == pytest.approx(loss, abs=1e-7)
    torch.testing.assert_close(logprobs.grad, grad, atol=1e-7, rtol=0)


def test_gspo_hand_computed():
    # s_0 = e^(0.3/4) = 1.078 > 1.05: clipped, no gradient. s_1 = e^(-0.1/2) = 0.951 inside
    # [0.9, 1.05]: loss s_1 * |A|, gradient s_1 / 2 per token; mean over the 2 sequences.
    s1 = e(-0.05)
    loss, grad, metrics = run("gspo", "seq_mean_token_mean", clip_low=0.1, clip_high=0.05)
    check(loss, grad, (-1.05 + s1) / 2, [[0, 0, 0, 0], [s1 / 4, s1 / 4, 0, 0]])
    assert metrics["clipfrac_seq"] == 0.5 and metrics["clipfrac_high_seq"] == 0.5


def test_gspo_token_equals_gspo_with_sequence_advantages():
    loss, grad, _ = run("gspo_token", "seq_mean_token_mean", clip_low=0.1, clip_high=0.05)
    s1 = e(-0.05)
    check(loss, grad, (-1.05 + s1) / 2, [[0, 0, 0, 0], [s1 / 4, s1 / 4, 0, 0]])


def test_cispo_hand_computed():
    # weight = sg[clip(r, 0.8, 1.2)]; loss_t = -w A logp; gradient -w A / N on every token.
    w = [[e(0.1), 1.2, e(-0.1), 1.0], [1.2, 0.8]]
    logp = [[-0.9, -0.7, -1.1, -1.0], [-0.6, -1.5]]
    value = sum(-w[0][t] * logp[0][t] for t in range(4)) + sum(w[1][t] * logp[1][t] for t in range(2))
    loss, grad, metrics = run("cispo")
    check(loss, grad, value / N, [[-w[0][t] / N for t in range(4)], [w[1][0] / N, w[1][1] / N, 0, 0]])
    assert metrics["clipfrac"] == pytest.approx(3 / N)  # 1.35 -> 1.2, 1.49 -> 1.2, 0.61 -> 0.8


def test_geo_mean_hand_computed():
    # Row 0 (A>0): log-ratios clamped above at 0.2 -> [0.1, 0.2, -0.1, 0], mean 0.05, the
    # clamped token has no gradient. Row 1 (A<0): clamped below at -0.2 -> [0.4, -0.2], mean 0.1.
    loss, grad, metrics = run("geo_mean", "seq_mean_token_mean")
    check(loss, grad, (-e(0.05) + e(0.1)) / 2,
          [[-e(0.05) / 8, 0, -e(0.05) / 8, -e(0.05) / 8], [e(0.1) / 4, 0, 0, 0]])
    assert metrics["clipfrac"] == pytest.approx(2 / N)


def test_clip_cov_hand_computed():
    # Covariance terms (A - 1/3)(logp + 29/30): row 0 [0.044, 0.178, -0.089, -0.022], row 1
    # [-0.489, 0.711]. In (0.01, 5) and not clipped by PPO: only token (0, 0) (0.178 and
    # 0.711 belong to clipped tokens). It is detached: vanilla's loss without it.
    loss, grad, metrics = run("clip_cov", cov_fraction=0.01, clip_cov_low=0.01, clip_cov_high=5.0,
                              generator=torch.Generator().manual_seed(0))
    check(loss, grad, (-1.2 - e(-0.1) - 1 + e(0.4) + 0.8) / N,
          [[0, 0, -e(-0.1) / N, -1 / N], [e(0.4) / N, 0, 0, 0]])
    assert metrics["cov_frac"] == pytest.approx(1 / N)


def test_kl_cov_hand_computed():
    # No clip. The top covariance term is token (1, 1) (0.711): it gets + |log r| = 0.5, whose
    # gradient is sign(-0.5) = -1 on top of the surrogate's r.
    loss, grad, metrics = run("kl_cov", cov_fraction=0.01, kl_cov_coef=1.0)
    check(loss, grad, (-e(0.1) - e(0.3) - e(-0.1) - 1 + e(0.4) + e(-0.5) + 0.5) / N,
          [[-e(0.1) / N, -e(0.3) / N, -e(-0.1) / N, -1 / N], [e(0.4) / N, (e(-0.5) - 1) / N, 0, 0]])
    assert metrics["cov_frac"] == pytest.approx(1 / N)


def test_dppo_tv_hand_computed():
    # mu = e^-1 = 0.3679 everywhere. Probabilities p = e^(-1 + log r): row 0 moved by
    # p - mu = [+0.0387, +0.1287, -0.0350, 0] with A = +1: token 1 went up past 0.1, blocked.
    # Row 1 (A = -1) moved [+0.1809, -0.1447]: token 1 went down past 0.1, blocked; token 0 moved
    # the wrong way for its advantage and is never blocked. The rest: -r A, unclipped.
    loss, grad, metrics = run("dppo_tv", clip_low=0.1, clip_high=0.1)
    check(loss, grad, (-e(0.1) - e(-0.1) - 1 + e(0.4)) / N,
          [[-e(0.1) / N, 0, -e(-0.1) / N, -1 / N], [e(0.4) / N, 0, 0, 0]])
    assert metrics["clipfrac"] == pytest.approx(2 / N)
    assert metrics["clipfrac_high"] == pytest.approx(1 / N) and metrics["clipfrac_low"] == pytest.approx(1 / N)
    # PPO's clip (0.2) picks the same two tokens here but keeps their constant loss (-1.2, 0.8): DPPO drops it.
    assert run()[0] == pytest.approx(loss + (-1.2 + 0.8) / N, abs=1e-6)


def binary_kl(mu, p):
    """D(mu || p) between Bernoulli(mu) and Bernoulli(p), DPPO eq. 14."""
    return mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))


def test_dppo_kl_hand_computed():
    mu = e(-1)
    # row 0 token 1 went up (p = e^-0.7): D = 0.0335; row 1 token 1 went down (p = e^-1.5): D = 0.0536
    assert binary_kl(mu, e(-0.7)) == pytest.approx(0.03355, abs=1e-5)
    assert binary_kl(mu, e(-1.5)) == pytest.approx(0.05360, abs=1e-5)
    # clip_high 0.04 lets row 0 token 1 through (0.0335); clip_low 0.05 blocks row 1 token 1 (0.0536)
    loss, grad, metrics = run("dppo_kl", clip_low=0.05, clip_high=0.04)
    check(loss, grad, (-e(0.1) - e(0.3) - e(-0.1) - 1 + e(0.4)) / N,
          [[-e(0.1) / N, -e(0.3) / N, -e(-0.1) / N, -1 / N], [e(0.4) / N, 0, 0, 0]])
    assert metrics["clipfrac"] == pytest.approx(1 / N)
    # a token that moved against its advantage is never blocked, however far (row 1 token 0: D = 0.0660)
    assert binary_kl(mu, e(-0.6)) > 0.05
    assert run("dppo_kl", clip_low=0.001, clip_high=0.001)[1][1, 0] != 0


def test_top_entropy_mask_keeps_gradient_only_on_high_entropy_tokens():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 5.0, 5.0]])  # padding never counts
    keep = top_entropy_mask(entropy, MASK, 0.5)  # median of [0.1 .9 .5 .3 .7 .2] = 0.4
    assert keep.tolist() == [[False, True, True, False], [True, False, False, False]]
    loss, grad, metrics = run(train_on=keep)
    # vanilla's tokens (0, 1) clipped, (0, 2) and (1, 0) kept; the denominator stays N.
    check(loss, grad, (-1.2 - e(-0.1) + e(0.4)) / N, [[0, 0, -e(-0.1) / N, 0], [e(0.4) / N, 0, 0, 0]])
    assert metrics["entropy_mask_frac"] == pytest.approx(3 / N)


# ---------------------------------------------------------------- at ratio 1
def _previous_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=None,
                          dual_clip=None, loss_agg="token_mean", max_len=None, skip_empty_rows=False):
    """The clipped loss as ppo/algorithm/losses.py computed it before the registry, kept as the reference."""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        cap = -dual_clip * advantages
        per_token = torch.where((advantages < 0) & (per_token > cap), cap, per_token)
    return aggregate(per_token, mask, loss_agg, max_len, skip_empty_rows)


def _random_batch(seed, on_policy=True):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 9, generator=generator) * 3
    shift = 0 if on_policy else torch.randn(6, 9, generator=generator) * 0.3
    advantages = torch.randn(6, 1, generator=generator).expand(6, 9).contiguous()
    lengths = torch.randint(1, 10, (6,), generator=generator)
    mask = (torch.arange(9)[None] < lengths[:, None]).float()
    return old, old + shift, advantages, mask


def _groups(loss_agg, mask):
    """`group_share` for `prompt_mean` (three rows per prompt), nothing for the other modes."""
    if loss_agg != "prompt_mean":
        return {}
    return {"group_share": group_shares(mask, torch.arange(mask.shape[0]) // 3)}


@pytest.mark.parametrize("loss_agg", [mode for mode in LOSS_AGG_MODES if mode != "prompt_mean"])  # the previous code's
@pytest.mark.parametrize("on_policy", [True, False])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_registry_vanilla_is_the_previous_code_bit_for_bit(loss_agg, on_policy, dual_clip):
    old, new, advantages, mask = _random_batch(1, on_policy)
    grads, losses = [], []
    for fn in (_previous_policy_loss, policy_loss):
        logprobs = new.clone().requires_grad_(True)
        result = fn(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip,
                    loss_agg=loss_agg, max_len=12, skip_empty_rows=False)
        loss = result[0] if isinstance(result, tuple) else result
        loss.backward()
        losses.append(loss.detach())
        grads.append(logprobs.grad)
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "geo_mean", "kl_cov", "dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_at_ratio_one_the_losses_are_token_ppo(name, loss_agg):
    """At ratio 1 nothing clips: GSPO's sequence ratio spreads 1/L over the sequence's tokens,
    which the broadcast of its loss to L tokens gives back, in every aggregation mode."""
    old, new, advantages, mask = _random_batch(2)
    results = []
    for loss_name in ("vanilla", name):
        logprobs = new.clone().requires_grad_(True)
        loss, _ = policy_loss(logprobs, old, advantages, mask, name=loss_name, loss_agg=loss_agg,
                              **_groups(loss_agg, mask))
        loss.backward()
        results.append((loss.detach(), logprobs.grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_cispo_gradient_is_reinforce_at_ratio_one(loss_agg):
    old, new, advantages, mask = _random_batch(3)
    logprobs = new.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, advantages, mask, name="cispo", loss_agg=loss_agg, **_groups(loss_agg, mask))
    loss.backward()
    reference = new.clone().requires_grad_(True)
    aggregate(-advantages * reference, mask, loss_agg, **_groups(loss_agg, mask)).backward()  # REINFORCE: -A log pi
    assert torch.equal(logprobs.grad, reference.grad)


def test_losses_differ_off_policy():
    """The ablation's premise: off the sampling policy the losses give different gradients."""
    grads = {name: run(name, "seq_mean_token_mean")[1] for name in POLICY_LOSSES}
    names = ["vanilla", "gspo", "cispo", "geo_mean", "kl_cov", "dppo_tv"]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(grads[a], grads[b]), (a, b)


def test_unknown_loss_names_the_field():
    with pytest.raises(ValueError, match="policy_loss must be one of"):
        run("ppo2")


# ---------------------------------------------------------------- entropy control, overlong
def test_adaptive_entropy_coefficient_moves_toward_the_target():
    control = EntropyControl(coef=0.01, target=0.2, step=0.005)
    assert control.applied == 0.0  # nothing measured yet: entropy not known to be low
    control.observe(torch.tensor([[0.1, 0.2, 9.0]]), torch.tensor([[1, 1, 0]]))  # mean 0.15 < 0.2
    control.update()
    assert control.coef == pytest.approx(0.015) and control.applied == pytest.approx(0.015)
    control.observe(torch.tensor([[0.5]]), torch.tensor([[1]]))  # above the target
    control.update()
    assert control.coef == pytest.approx(0.01) and control.applied == 0.0
    for _ in range(5):
        control.observe(torch.tensor([[0.5]]), torch.tensor([[1]]))
        control.update()
    assert control.coef == 0.0  # never below zero
    fixed = EntropyControl(coef=0.01)
    fixed.observe(torch.tensor([[0.5]]), torch.tensor([[1]]))
    fixed.update()
    assert fixed.applied == 0.01


def test_soft_overlong_penalty_hand_computed():
    # L_max 10, L_cache 4: free up to 6 tokens, then -1/4 per token times the factor.
    lengths = torch.tensor([3, 6, 7, 9, 10])
    assert overlong_penalty(lengths, 10, 4, factor=0.5).tolist() == pytest.approx([0, 0, -0.125, -0.375, -0.5])
    assert overlong_penalty(lengths, 10, 0).tolist() == [0.0] * 5


# ---------------------------------------------------------------- config validation
@pytest.mark.parametrize("settings, field", [
    (dict(policy_loss="ppo2"), "policy_loss"),
    (dict(policy_loss="gspo", dual_clip=3.0), "dual_clip"),
    (dict(policy_loss="cispo", dual_clip=3.0), "dual_clip"),
    (dict(policy_loss="kl_cov", cliprange_high=0.28), "cliprange_high"),
    (dict(policy_loss="gspo", top_entropy_quantile=0.2), "top_entropy_quantile"),
    (dict(policy_loss="geo_mean", top_entropy_quantile=0.2), "top_entropy_quantile"),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile"),
    (dict(cov_fraction=0.0), "cov_fraction"),
    (dict(clip_cov_low=5.0, clip_cov_high=1.0), "clip_cov_low"),
    (dict(entropy_target=0.0), "entropy_target"),
    (dict(overlong_buffer_length=64, response_length=64), "overlong_buffer_length"),
    (dict(overlong_penalty_factor=-1.0), "overlong_penalty_factor"),
])
def test_nonsensical_combinations_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}:"):
        PPOConfig(**settings)


def test_sensible_combinations_are_accepted():
    PPOConfig(policy_loss="gspo_token", top_entropy_quantile=0.2)
    PPOConfig(policy_loss="vanilla", dual_clip=3.0, entropy_target=0.2, overlong_buffer_length=16)

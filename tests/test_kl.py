"""Hand-computed checks for `ppo.algorithm.kl`: the per-token KL estimators and the KL controllers."""

import math

import pytest
import torch

from ppo.algorithm.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    make_kl_controller,
)

# log_ratio = logp - ref = [0.5, -1.0, 0.0]
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5]])
REF_LOGPROBS = torch.tensor([[-1.5, -1.0, -0.5]])


def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=atol, rtol=0)


def test_estimator_names():
    assert KL_ESTIMATORS == ("k1", "k2", "k3", "abs")


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", [[0.5, -1.0, 0.0]]),  # logp - ref
        ("k2", [[0.125, 0.5, 0.0]]),  # 0.5 * (0.25, 1, 0)
        # ref - logp = [-0.5, 1, 0]: e^-0.5 + 0.5 - 1 = 0.1065307 ; e^1 - 1 - 1 = 0.7182818
        ("k3", [[0.1065307, 0.7182818, 0.0]]),
        ("abs", [[0.5, 1.0, 0.0]]),
    ],
)
def test_kl_estimators_hand_computed(estimator, expected):
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS, estimator), expected)


def test_default_estimator_is_k1():
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS), [[0.5, -1.0, 0.0]])


def test_clip_at_zero_only_touches_negative_tokens():
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS, "k1", clip_at_zero=True), [[0.5, 0.0, 0.0]])
    # k3 is already >= 0: clipping changes nothing
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS, "k3", clip_at_zero=True), [[0.1065307, 0.7182818, 0.0]])


def test_k3_nonnegative_for_tiny_log_ratios():
    # exp(-x) + x - 1 in float32 is round-off for |x| ~ 1e-4 and goes negative; k3 must not
    log_ratio = torch.linspace(-1e-3, 1e-3, 2001)[None, :]  # [1, 2001]
    assert (kl_penalty(log_ratio, torch.zeros_like(log_ratio), "k3") >= 0).all()


def test_unknown_estimator_names_argument_and_choices():
    with pytest.raises(ValueError, match="estimator='k4'") as info:
        kl_penalty(LOGPROBS, REF_LOGPROBS, "k4")
    assert "k3" in str(info.value) and "abs" in str(info.value)


def test_fixed_controller_never_moves():
    controller = FixedKLController(0.05)
    controller.update(100.0, n_steps=10_000)
    assert controller.value == 0.05
    restored = FixedKLController(1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == 0.05


@pytest.mark.parametrize(
    "current_kl, n_steps, expected",
    [
        (6.6, 1000, 0.202),  # error 6.6/6 - 1 = +0.1 -> 0.2 * (1 + 0.1*0.1) = 0.202
        (5.4, 1000, 0.198),  # error -0.1 -> 0.2 * (1 - 0.01) = 0.198
        (30.0, 10_000, 0.24),  # error +4 clipped to +0.2 -> 0.2 * 1.2
        (0.0, 10_000, 0.16),  # error -1 clipped to -0.2 -> 0.2 * 0.8
        (6.0, 10_000, 0.2),  # on target: unchanged
    ],
)
def test_adaptive_controller_hand_computed(current_kl, n_steps, expected):
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    controller.update(current_kl, n_steps)
    assert math.isclose(controller.value, expected, rel_tol=1e-12)


def test_adaptive_controller_accepts_tensor_kl_and_compounds():
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    controller.update(torch.tensor(30.0), 10_000)  # 0.2 * 1.2 = 0.24
    controller.update(torch.tensor(0.0), 10_000)  # 0.24 * 0.8 = 0.192
    assert math.isclose(controller.value, 0.192, rel_tol=1e-6)


def test_adaptive_controller_state_round_trip():
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    controller.update(30.0, 10_000)
    restored = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    restored.load_state_dict(controller.state_dict())
    assert math.isclose(restored.value, 0.24, rel_tol=1e-12)


@pytest.mark.parametrize(
    "target, horizon, field", [(0.0, 10_000, "target"), (6.0, -1, "horizon"), (None, 10, "target")]
)
def test_adaptive_controller_validation(target, horizon, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveKLController(0.2, target=target, horizon=horizon)


def test_make_kl_controller():
    fixed = make_kl_controller(0.1, adaptive=False, target=6.0, horizon=10_000)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.1
    adaptive = make_kl_controller(0.1, adaptive=True, target=6.0, horizon=10_000)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.1, 6.0, 10_000)
    with pytest.raises(ValueError, match="target"):
        make_kl_controller(0.1, adaptive=True)

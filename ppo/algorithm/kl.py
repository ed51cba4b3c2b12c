"""Per-token KL between the policy and the reference model, and the KL coefficient's controllers.

The KL keeps the policy near the reference (SFT) model so it cannot wander into text the
reward model was never trained on. It enters either the reward (PPO: ``-beta * KL`` per
token, see `ppo/algorithm/rewards.py`) or the loss (GRPO); both uses take their per-token estimate
from `kl_penalty` here.

Implementation details that live here:

- **KL estimators** (`kl_penalty(estimator=...)`, names in `KL_ESTIMATORS`), from the
  log-ratio ``log_ratio = logp - ref`` of the sampled token (Schulman, "Approximating KL
  Divergence", 2020):

  - ``"k1"`` = ``log_ratio``: unbiased for KL(pi || ref) under samples from pi, but a
    single token can be negative; the usual choice in the reward (TRL, AlpacaFarm).
  - ``"k2"`` = ``0.5 * log_ratio**2``: always >= 0, low variance, biased.
  - ``"k3"`` = ``exp(-log_ratio) + log_ratio - 1``: always >= 0 *and* unbiased; GRPO puts
    it in the loss (DeepSeekMath).
  - ``"abs"`` = ``|log_ratio|``: always >= 0, biased.
  - ``"k1+"`` / ``"k3+"`` / ``"abs+"``: straight-through: the value of k1 / k3 / abs, the
    gradient of k2 (verl `kl_penalty`, verl/trainer/ppo/core_algos.py; verl documents the
    ``+`` suffix for any of its estimators, docs/algo/grpo.md). ``"abs+"`` logs a KL that is
    never negative, as ``"abs"`` does, but its gradient is k2's, not ``sign(log_ratio)``.
    In the loss, k2's gradient
    ``log_ratio * grad(logp)`` has the expectation of the true KL gradient under samples from
    pi; k1's has expectation 0 and k3's is the gradient of KL(ref || pi), the forward KL (the
    reverse KL is the KL(pi || ref) its value estimates).
  - ``"full"`` (`full_kl`): the exact KL(pi || ref) over the whole vocabulary at each
    position, from both models' full log-softmax: no sampling noise at all, but it needs
    ``[B, T, V]`` log-probs of both models (cheap at the testbed's vocabulary, ~0.6 GB per
    1k tokens in fp32 at a 150k vocabulary).

- **Importance-weighted KL in the loss** (`importance_weighted_kl`,
  `PPOConfig.kl_loss_importance_weight`): each token's estimate times
  ``exp(logp - sg(old_logp))``, the ratio to the sampling policy with a detached denominator
  (TRL GRPO `use_bias_correction_kl`, DeepSeek-V3.2). Its value equals the estimate
  on-policy, but its gradient gains ``k3 * grad(logp)``, which makes k3's expected gradient
  the true KL gradient, on-policy and off.
- **Clip at zero** (`clip_at_zero=True`): clamp the per-token KL at 0 before it is used
  (AlpacaFarm's reward shaping). Biased, but AlpacaFarm's runs blow up without it: a
  negative per-token k1 turns the penalty into a bonus on that token, a source of reward
  the policy can chase instead of the reward model's score.
- **Fixed coefficient** (`FixedKLController`) and two **adaptive coefficients** that nudge
  beta so the measured KL tracks a target (`PPOConfig.kl_controller`):
  `AdaptiveKLController` (Ziegler et al. 2019, also TRL's `AdaptiveKLController`): the
  step is scaled by samples / horizon; `AlpacaFarmKLController` (AlpacaFarm's
  `kl_controller.py`): the step is scaled by a fixed gain `k_beta` once per RL step, with
  no horizon. AlpacaFarm's PPO script runs the fixed controller.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
STRAIGHT_THROUGH_ESTIMATORS = ("k1+", "k3+", "abs+")  # verl; the exact "full" KL is `full_kl`


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k1",
    clip_at_zero: bool = False,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) at the sampled tokens.

    Args:
        logprobs: `[B, T]` log pi(a_t | s_t) of the sampled tokens under the policy.
        ref_logprobs: `[B, T]` the same tokens under the reference model.
        estimator: one of `KL_ESTIMATORS` or `STRAIGHT_THROUGH_ESTIMATORS` (module docstring).
        clip_at_zero: clamp the result at a minimum of 0 (AlpacaFarm).

    Returns:
        `[B, T]` per-token KL estimates. No masking here: callers mask or sum over
        `response_mask`.

    Why k3 is unbiased and non-negative: with r = ref/pi at a token sampled from pi,
    E_pi[r] = 1, so E_pi[r - 1 - log r] = E_pi[-log r] = KL(pi || ref); and
    r - 1 - log r >= 0 for every r > 0 because log r <= r - 1. k1 is unbiased too
    (it is -log r) but has no lower bound per token; k2 = (log r)^2 / 2 is non-negative
    and matches KL to second order for small log r, but is biased.

    Worked example (log_ratio = logp - ref)::

        logprobs     = [[-1.0, -2.0, -0.5]]
        ref_logprobs = [[-1.5, -1.0, -0.5]]
        log_ratio    = [[ 0.5, -1.0,  0.0]]
        k1  = [[0.5,    -1.0,    0.0]]
        k2  = [[0.125,   0.5,    0.0]]
        k3  = [[0.10653, 0.71828, 0.0]]   # e^-0.5 + 0.5 - 1, e^1 - 1 - 1
        abs = [[0.5,     1.0,    0.0]]
        k1 with clip_at_zero -> [[0.5, 0.0, 0.0]]
        abs+ -> the value of abs; d/d logprobs = log_ratio = [[0.5, -1.0, 0.0]] (k2's gradient)
    """
    if estimator not in KL_ESTIMATORS + STRAIGHT_THROUGH_ESTIMATORS:
        raise ValueError(f"unknown estimator={estimator!r}; expected one of "
                         f"{KL_ESTIMATORS + STRAIGHT_THROUGH_ESTIMATORS}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs shape {tuple(logprobs.shape)} does not match "
            f"ref_logprobs shape {tuple(ref_logprobs.shape)}"
        )
    log_ratio = logprobs - ref_logprobs  # [B, T]
    if estimator.endswith("+"):
        # Straight-through (verl): forward the value of k1 / k3, backward the gradient of k2.
        value = kl_penalty(logprobs, ref_logprobs, estimator[:-1])
        gradient_of = 0.5 * log_ratio.square()
        kl = gradient_of - gradient_of.detach() + value.detach()
    elif estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    elif estimator == "k3":
        # expm1(-x) + x rather than exp(-x) + x - 1: for small |x| (~1e-4 in float32) the
        # latter is pure round-off and comes out slightly negative; expm1 keeps k3 >= 0.
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        kl = log_ratio.abs()
    if clip_at_zero:
        kl = kl.clamp(min=0.0)
    return kl


def full_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || ref) over the whole vocabulary at each position, ``[B, T]``.

    Args:
        log_probs: `[B, T, V]` log-softmax of the policy at each response position.
        ref_log_probs: `[B, T, V]` the reference's.

    ``sum_v pi(v) * (log pi(v) - log ref(v))``. Differentiable through `log_probs`: in the
    loss its gradient is the exact gradient of the per-position KL, with no sampling noise.

    Worked example (one position, two tokens)::

        pi = [0.5, 0.5], ref = [0.25, 0.75]
        KL = 0.5 * log(0.5/0.25) + 0.5 * log(0.5/0.75) = 0.5 * log(4/3) = 0.14384
    """
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(f"log_probs shape {tuple(log_probs.shape)} does not match "
                         f"ref_log_probs shape {tuple(ref_log_probs.shape)}")
    return (log_probs.exp() * (log_probs - ref_log_probs)).sum(-1)  # [B, T]


def importance_weighted_kl(per_token_kl: torch.Tensor, logprobs: torch.Tensor,
                           old_logprobs: torch.Tensor) -> torch.Tensor:
    """`per_token_kl` times the ratio ``pi / sg(pi_old)`` of the sampled tokens, ``[B, T]``
    (TRL GRPO `use_bias_correction_kl`; DeepSeek-V3.2 eq. 8).

    The samples come from pi_old, so an expectation under pi needs the ratio. With k3 the
    product's gradient is ``ratio * (k3 + 1 - ref/pi) * grad(logp)``, whose expectation under
    pi_old is ``sum_a pi(a) * (log pi(a) - log ref(a)) * grad(log pi(a))``: the true gradient
    of KL(pi || ref). On-policy the value is unchanged (ratio 1) but the gradient is not.
    """
    return per_token_kl * torch.exp(logprobs - old_logprobs.detach())


class FixedKLController:
    """A constant KL coefficient beta. `update` does nothing; it exists so the loop can call
    it unconditionally."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences"; the same rule is TRL's `AdaptiveKLController`. AlpacaFarm's differs: see
    `AlpacaFarmKLController`).

    After each rollout batch::

        proportional_error = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + proportional_error * n_steps / horizon

    `n_steps` is the number of samples (episodes) since the last update, usually the
    rollout batch size, so `horizon` is measured in samples: the clip bounds the change to
    at most 20% per `horizon` samples, which stops one noisy KL estimate from swinging beta.

    Worked example (init 0.2, target 6, horizon 10000)::

        update(6.6, n_steps=1000)   # error +0.1          -> 0.2 * 1.01 = 0.202
        update(30.0, n_steps=10000) # error +4 -> +0.2    -> value * 1.2
        update(0.0, n_steps=10000)  # error -1 -> -0.2    -> value * 0.8
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if target is None or target <= 0:
            raise ValueError(f"target must be > 0, got {target}")
        if horizon is None or horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        # Only `value` changes during training; target and horizon come from the config.
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AlpacaFarmKLController(AdaptiveKLController):
    """AlpacaFarm's adaptive KL coefficient (`src/alpaca_farm/rl/kl_controller.py`).

    Once per RL step, whatever the batch size::

        proportional_error = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + k_beta * proportional_error

    So beta moves by at most `0.2 * k_beta` (2% at AlpacaFarm's k_beta = 0.1) per step; the
    Ziegler rule moves it by `0.2 * batch / horizon` (1% for 512 samples and horizon 10000).

    Worked example (init 0.2, target 6, k_beta 0.1)::

        update(6.6)   # error +0.1         -> 0.2 * 1.01 = 0.202
        update(30.0)  # error +4 -> +0.2   -> value * 1.02
    """

    def __init__(self, init_kl_coef: float, target: float, k_beta: float = 0.1):
        super().__init__(init_kl_coef, target, horizon=1.0)
        if k_beta <= 0:
            raise ValueError(f"k_beta must be > 0, got {k_beta}")
        self.k_beta = float(k_beta)

    def update(self, current_kl: float | torch.Tensor, n_steps: int = 1) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + self.k_beta * proportional_error  # n_steps ignored: per step


KL_CONTROLLERS = ("ziegler", "alpacafarm")


def make_kl_controller(
    kl_coef: float,
    adaptive: bool,
    target: float | None = None,
    horizon: float | None = None,
    rule: str = "ziegler",
    k_beta: float = 0.1,
) -> FixedKLController | AdaptiveKLController:
    """Build the KL controller the config asks for. `target` and the rule's own setting
    (`horizon` for "ziegler", `k_beta` for "alpacafarm") are only used when `adaptive`."""
    if not adaptive:
        return FixedKLController(kl_coef)
    if rule == "ziegler":
        return AdaptiveKLController(kl_coef, target, horizon)
    if rule == "alpacafarm":
        return AlpacaFarmKLController(kl_coef, target, k_beta)
    raise ValueError(f"unknown KL controller rule={rule!r}; expected one of {KL_CONTROLLERS}")

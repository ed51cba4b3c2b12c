"""Generalized Advantage Estimation over response tokens: PPO's advantages and the critic's targets.

Implementation details that live here:

- **Token-level GAE** (`compute_gae`): each response token is one action; the per-token
  reward is usually zero except for the sequence score at the last token and, when the KL
  is in the reward, a per-token KL penalty (built in `ppo/algorithm/rewards.py`).
- **Masked positions are absent, not zero-reward steps**: padding after the stop token (or
  any hole in the mask) contributes no reward, no value and no TD error, and the value after
  the last real token is 0 (the episode ends there). A hole is skipped over, so the token
  before it bootstraps from the next *real* token.
- **Returns before whitening**: `returns = advantages + values` is computed from the raw
  advantages; the critic regresses on these. Whitening the advantages for the policy loss
  happens afterwards (`gae.whiten`) and must not leak into the critic's targets.
- **Per-response lambda** (`length_adaptive_lambda`, VAPO): `compute_gae` also takes one
  lambda per row, so a long response can look further ahead than a short one.
- **gamma = lam = 1 is a bandit** (AlpacaFarm's setting): the advantage of a token is the
  sum of rewards from it to the end minus its value, with no discounting and no bias from
  bootstrapping on an imperfect critic.
"""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation"), token by token over the response.

    With V after the last real token taken as 0::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                       (the critic's target)

    Args:
        rewards: `[B, T]` per-token rewards.
        values: `[B, T]` critic values V(s_t), already detached from the critic's graph.
        mask: `[B, T]` 1 (or True) on real response tokens. Normally a prefix of each row;
            any mask is handled by treating masked positions as absent (skipped).
        gamma: discount factor.
        lam: GAE lambda; 0 gives one-step TD errors, 1 gives Monte-Carlo returns minus V.
            A `[B]` tensor gives each response its own lambda (`length_adaptive_lambda`).

    Returns:
        `(advantages, returns)`, both `[B, T]` and 0 outside `mask`.

    With ``gamma = lam = 1`` the recursion telescopes to
    ``A_t = (r_t + r_{t+1} + ... + r_last) - V_t``: a contextual bandit with the value as a
    baseline, which is how AlpacaFarm runs PPO.

    Worked example (gamma=0.9, lam=0.8, so gamma*lam=0.72)::

        rewards = [[0.0, 0.0, 1.0]], values = [[0.5, 0.4, 0.3]], mask = [[1, 1, 1]]
        delta   = [0.9*0.4-0.5, 0.9*0.3-0.4, 1.0-0.3] = [-0.14, -0.13, 0.7]
        A_2 = 0.7
        A_1 = -0.13 + 0.72*0.7   = 0.374
        A_0 = -0.14 + 0.72*0.374 = 0.12928
        returns = A + V = [0.62928, 0.774, 1.0]
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must all be [B, T]; got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    is_real = mask.bool()  # [B, T]
    # torch.where rather than multiplying by the mask: padding may hold NaN/inf garbage
    # (e.g. a value head run on pad tokens), and NaN * 0 is still NaN.
    rewards = torch.where(is_real, rewards, torch.zeros_like(rewards))  # [B, T]
    values = torch.where(is_real, values, torch.zeros_like(values))  # [B, T]

    if isinstance(lam, torch.Tensor):
        lam = lam.to(rewards.dtype)  # [B]: one lambda per response
    batch_size, num_steps = rewards.shape
    advantages = torch.zeros_like(rewards)  # [B, T]
    # V and A of the next *real* token; 0 after the last one because the episode ends there.
    next_value = rewards.new_zeros(batch_size)  # [B]
    next_advantage = rewards.new_zeros(batch_size)  # [B]
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        advantage = delta + gamma * lam * next_advantage  # [B]
        advantages[:, t] = torch.where(is_real[:, t], advantage, torch.zeros_like(advantage))
        # A masked position is not a step of the episode: carry the next real token's value
        # and advantage through it unchanged, so padding can never leak into real tokens.
        next_value = torch.where(is_real[:, t], values[:, t], next_value)
        next_advantage = torch.where(is_real[:, t], advantage, next_advantage)

    returns = advantages + values  # [B, T]; 0 outside the mask since both terms are
    return advantages, returns


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """VAPO's per-sequence policy lambda (Yue et al. 2025, arXiv 2504.05118, eq. 8):
    ``lam = 1 - 1 / (alpha * length)``, clamped to [0, 1].

    The effective horizon of GAE is about ``1 / (1 - lam)`` tokens; tying it to the
    response's length keeps the final reward from decaying away before it reaches the
    first tokens of a long response, while a short one keeps the variance of a low lambda.

    Worked example, alpha = 0.05: ``1 - 1/(0.05*10) = -1``, clamped to 0 (one-step TD);
    ``1 - 1/(0.05*40) = 0.5``.

    >>> length_adaptive_lambda(torch.tensor([10.0, 40.0]), alpha=0.05).tolist()
    [0.0, 0.5]
    """
    lam = 1.0 - 1.0 / (alpha * lengths.clamp(min=1).to(torch.float64))  # [B]
    return lam.clamp(0.0, 1.0)

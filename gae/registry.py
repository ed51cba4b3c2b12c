"""A registry of advantage estimators keyed by name: how `advantage_estimator` picks the algorithm.

The training loop calls `estimate_advantages(name, ...)` and never branches on the name
itself, so PPO and the GRPO family share one loop and differ only in this string (the
verl `core_algos` pattern). Adding an estimator is one decorated function here or anywhere
else; the loop does not change.

Implementation details that live here:

- **Outcome advantages broadcast to tokens** (`grpo`, `dr_grpo`, `rloo`, `reinforce`): the
  sequence score is the sum of the masked per-token rewards, and the single advantage of a
  response is copied to each of its tokens (DeepSeekMath's outcome supervision), 0 on padding.
- **Rejection sampling as an estimator** (`rft`): advantage 1 on kept responses and 0 on
  the rest turns the policy-gradient loss into SFT on the policy's own correct samples
  (expert iteration), so it runs in the same loop as GRPO at equal samples.
- **Returns without a critic**: the value-free estimators return ``returns = advantages``;
  nothing regresses on them, but every estimator keeps the same `(advantages, returns)` shape.
- **Decoupled and length-adaptive lambda** (`gae`: `lam_critic`, `lam_length_alpha`): the
  critic's targets come from one GAE run, the policy's advantages from another with its own
  lambda (VC-PPO, arXiv 2503.01491; VAPO, arXiv 2504.05118).
- **Per-token returns-to-go without a critic** (`reinforce_plus_plus`,
  `reinforce_plus_plus_baseline`, `remax`): the discounted sum of the per-token rewards
  (the KL penalty included) from each token on, so a token is credited only with what
  follows it; REINFORCE++ then whitens over the whole batch (arXiv 2501.03262).
- **Group estimators of 2026** (`maxrl`, `grpo_passk`, `gdpo`; `gae/group.py`): MaxRL's
  mean-normalised advantage, pass@k credit for a group's best response, and GDPO's
  per-component normalisation of the named reward components.
- **Failed samples out of the baseline** (`sample_mask`): the group estimators take their
  statistics over the samples whose score counts; the others get advantage 0.
- **Every estimator takes every keyword** (plus ``**kwargs``) and ignores what it does not
  need, so one call site serves all of them.
"""

from __future__ import annotations

from typing import Callable

import torch

from einops import rearrange

from .gae import compute_gae, length_adaptive_lambda
from .group import gdpo_advantages, group_advantages, maxrl_advantages, passk_advantages, rloo_advantages
from .whiten import population_moments, whiten

AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator adding an estimator to `ADVANTAGE_ESTIMATORS` under `name`.

    The function must accept the keyword arguments of `estimate_advantages` (and
    ``**kwargs``) and return `(advantages [B, T], returns [B, T])`::

        @register_advantage_estimator("my_estimator")
        def my_estimator(*, token_rewards, response_mask, **kwargs):
            ...
    """

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        # Silently replacing an estimator would make two runs with the same config differ.
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def estimate_advantages(
    name: str,
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    group_size: int = 1,
    gamma: float = 1.0,
    lam: float = 1.0,
    grpo_scale: str = "group",
    grpo_eps: float = 1e-4,
    grpo_std_correction: int = 0,
    reinforce_baseline: bool = False,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rft_min_score: float = 1.0,
    lam_critic: float | None = None,
    lam_length_alpha: float | None = None,
    response_lengths: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    sample_mask: torch.Tensor | None = None,
    reward_components: torch.Tensor | None = None,
    reward_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the advantage estimator registered as `name`.

    Args:
        name: a key of `ADVANTAGE_ESTIMATORS` (``"gae"``, ``"grpo"``, ``"dr_grpo"``,
            ``"rloo"``, ``"reinforce"``, or one registered later).
        token_rewards: `[B, T]` per-token rewards (score at the last token, KL penalty if
            the KL is in the reward).
        response_mask: `[B, T]` 1 on real response tokens.
        values: `[B, T]` critic values; required by ``"gae"`` only.
        group_size: G samples per prompt, contiguous in the batch (group estimators).
        gamma, lam: GAE discount and lambda.
        grpo_scale, grpo_eps, grpo_std_correction: `scale`, `eps` and `std_correction` of
            `gae.group_advantages` for ``"grpo"``.
        reinforce_baseline: ``"reinforce"`` subtracts the batch mean score when True.
        reduce_sum: sums over data-parallel processes (`ppo.parallel.distributed.global_sum`), for
            the estimators that use batch statistics (``grpo_scale="batch"``, the REINFORCE
            baseline); None = a single process.
        rft_min_score: ``"rft"`` keeps the responses whose score is at least this.
        lam_critic: ``"gae"``: lambda of the critic's targets; None = `lam` (coupled).
        lam_length_alpha: ``"gae"``: per-response policy lambda ``1 - 1/(alpha * length)``
            instead of `lam` (VAPO); None = off.
        response_lengths: `[B]` real tokens per response, for `lam_length_alpha`; None =
            the row sums of `response_mask` (which counts padding when GAE runs over it).
        reward_baselines: `[B]` the greedy response's score per sample (``"remax"``).
        sample_mask: `[B]` bool, the samples whose score counts; the group estimators
            (``"grpo"``, ``"dr_grpo"``, ``"rloo"``, ``"maxrl"``, ``"grpo_passk"``, ``"gdpo"``)
            leave the others out of their statistics and give them 0. None = all count.
        reward_components, reward_weights: `[B, K]` raw reward components and their `[K]`
            weights (``"gdpo"``; `ppo.algorithm.rewards.reward_components`).

    Returns:
        `(advantages, returns)`, both `[B, T]`, 0 outside `response_mask`.
    """
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    if token_rewards.shape != response_mask.shape or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards and response_mask must both be [B, T]; got "
            f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    return ADVANTAGE_ESTIMATORS[name](
        token_rewards=token_rewards,
        response_mask=response_mask,
        values=values,
        group_size=group_size,
        gamma=gamma,
        lam=lam,
        grpo_scale=grpo_scale,
        grpo_eps=grpo_eps,
        grpo_std_correction=grpo_std_correction,
        reinforce_baseline=reinforce_baseline,
        reduce_sum=reduce_sum,
        rft_min_score=rft_min_score,
        lam_critic=lam_critic,
        lam_length_alpha=lam_length_alpha,
        response_lengths=response_lengths,
        reward_baselines=reward_baselines,
        sample_mask=sample_mask,
        reward_components=reward_components,
        reward_weights=reward_weights,
    )


# ---------------------------------------------------------------------------------------
# helpers for the outcome (sequence-level) estimators
# ---------------------------------------------------------------------------------------


def _sequence_scores(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token rewards over real response tokens: one score per response."""
    is_real = response_mask.bool()
    masked = torch.where(is_real, token_rewards, torch.zeros_like(token_rewards))  # [B, T]
    return masked.sum(dim=-1)  # [B]


def _broadcast_to_tokens(
    sequence_advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy one advantage per response onto each of its tokens; returns = advantages."""
    expanded = sequence_advantages[:, None].expand(response_mask.shape)  # [B, T]
    advantages = torch.where(response_mask.bool(), expanded, torch.zeros_like(expanded))  # [B, T]
    return advantages, advantages.clone()


# ---------------------------------------------------------------------------------------
# the estimators
# ---------------------------------------------------------------------------------------


def _returns_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over real tokens, 0 on padding: GAE with V = 0 and
    lambda = 1 is exactly this sum, holes in the mask skipped the same way."""
    return compute_gae(token_rewards, torch.zeros_like(token_rewards), response_mask, gamma, 1.0)[1]  # [B, T]


@register_advantage_estimator("gae")
def gae_estimator(*, token_rewards, response_mask, values=None, gamma=1.0, lam=1.0, lam_critic=None,
                  lam_length_alpha=None, response_lengths=None, **kwargs):
    """PPO with a critic: `gae.compute_gae` over the per-token rewards.

    Coupled (the default) one GAE run gives both. Decoupled, the critic regresses on the
    returns of a run with `lam_critic` (VC-PPO: 1.0, unbiased Monte-Carlo targets) while the
    policy's advantages come from a run with `lam` (0.95, lower variance), or with VAPO's
    per-response ``1 - 1/(lam_length_alpha * length)``.
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values from the value model; got values=None")
    if lam_critic is None and lam_length_alpha is None:
        return compute_gae(token_rewards, values, response_mask, gamma, lam)
    lam_policy = lam
    if lam_length_alpha is not None:
        lengths = response_mask.sum(-1) if response_lengths is None else response_lengths  # [B]
        lam_policy = length_adaptive_lambda(lengths, lam_length_alpha)  # [B]
    advantages, _ = compute_gae(token_rewards, values, response_mask, gamma, lam_policy)  # [B, T]
    _, returns = compute_gae(token_rewards, values, response_mask, gamma, lam if lam_critic is None else lam_critic)
    return advantages, returns


@register_advantage_estimator("grpo")
def grpo_estimator(
    *, token_rewards, response_mask, group_size=1, grpo_scale="group", grpo_eps=1e-4, reduce_sum=None,
    grpo_std_correction=0, sample_mask=None, **kwargs
):
    """GRPO (DeepSeekMath): group-normalised outcome advantage on every response token."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B*G]
    sequence_advantages = group_advantages(scores, group_size, scale=grpo_scale, eps=grpo_eps, reduce_sum=reduce_sum,
                                           std_correction=grpo_std_correction, valid=sample_mask)  # [B*G]
    return _broadcast_to_tokens(sequence_advantages, response_mask)


@register_advantage_estimator("dr_grpo")
def dr_grpo_estimator(*, token_rewards, response_mask, group_size=1, grpo_eps=1e-4, sample_mask=None, **kwargs):
    """Dr. GRPO: GRPO without the std division, whatever `grpo_scale` says."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B*G]
    sequence_advantages = group_advantages(scores, group_size, scale="none", eps=grpo_eps, valid=sample_mask)  # [B*G]
    return _broadcast_to_tokens(sequence_advantages, response_mask)


@register_advantage_estimator("rloo")
def rloo_estimator(*, token_rewards, response_mask, group_size=1, sample_mask=None, **kwargs):
    """RLOO: leave-one-out baseline within each group, on every response token."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B*G]
    sequence_advantages = rloo_advantages(scores, group_size, valid=sample_mask)  # [B*G]
    return _broadcast_to_tokens(sequence_advantages, response_mask)


@register_advantage_estimator("reinforce")
def reinforce_estimator(*, token_rewards, response_mask, reinforce_baseline=False, reduce_sum=None, **kwargs):
    """Vanilla REINFORCE (Williams 1992): the raw score, optionally minus the batch mean."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B]
    if reinforce_baseline:
        # A constant baseline lowers the gradient's variance without biasing it.
        _, batch_mean, _ = population_moments(scores, reduce_sum)  # over every process's batch
        scores = scores - batch_mean.to(scores.dtype)
    return _broadcast_to_tokens(scores, response_mask)


@register_advantage_estimator("rft")
def rft_estimator(*, token_rewards, response_mask, rft_min_score=1.0, **kwargs):
    """Rejection-sampling fine-tuning (expert iteration; STaR, RAFT, ReST): sample G
    responses, keep those scoring at least `rft_min_score`, fine-tune on them.

    As an advantage it is 1 on every token of a kept response and 0 elsewhere. With one
    update per batch the ratio is 1 and the policy loss's gradient is
    ``-sum(kept tokens) grad log p / normaliser``: the SFT cross-entropy gradient on the
    kept samples, weighted as the loss aggregation weighs them, plus any KL or entropy term
    of the loss (the `rft_vs_grpo` arm keeps GRPO's; docs/derivations.md, section 2, says
    when it is exactly SFT). Nothing pushes down the rejected ones (no negative advantage) and there
    is no baseline, which is the difference from GRPO this estimator lets one measure.
    Under ``loss_agg="token_mean"`` the normaliser counts all response tokens of the batch,
    rejected ones too, so a batch with fewer kept samples takes a proportionally smaller
    step (Adam's normalisation absorbs most of that).

    >>> rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    >>> rft_estimator(token_rewards=rewards, response_mask=torch.ones(2, 2))[0].tolist()
    [[1.0, 1.0], [0.0, 0.0]]
    """
    scores = _sequence_scores(token_rewards, response_mask)  # [B]
    kept = (scores >= rft_min_score).to(token_rewards.dtype)  # [B]
    return _broadcast_to_tokens(kept, response_mask)


@register_advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus_estimator(*, token_rewards, response_mask, gamma=1.0, reduce_sum=None, **kwargs):
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262; OpenRLHF ``reinforce``): each token's
    advantage is its discounted return-to-go over the per-token rewards, the score at the
    last token and -beta * KL (k1) at every token, whitened over the whole batch (every
    real token of every process): the batch is the baseline, no critic, no group.

    Worked example (gamma = 1, one row's rewards [0, 0, 1] and another's [0, -1], padded)::

        returns    = [[1, 1, 1], [-1, -1, 0]]     (0 on the padding)
        5 real tokens: mean 0.2, population var 0.96
        advantages = (returns - 0.2) / sqrt(0.96) = [[0.8165, 0.8165, 0.8165], [-1.2247, -1.2247, 0]]
    """
    returns = _returns_to_go(token_rewards, response_mask, gamma)  # [B, T]
    return whiten(returns, response_mask, reduce_sum=reduce_sum), returns


@register_advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_estimator(*, token_rewards, response_mask, group_size=1, gamma=1.0,
                                           reduce_sum=None, **kwargs):
    """REINFORCE++-baseline (arXiv 2501.03262; OpenRLHF ``reinforce_baseline``; verl
    ``reinforce_plus_plus_baseline``): the mean total reward of the prompt's group is
    subtracted from every token's return-to-go, then the batch whitening of REINFORCE++.
    The group mean removes the prompt's difficulty; the whitening divides by the batch's
    spread, not the group's (the GRPO bias the paper argues against).

    The mean is taken over each response's summed reward; with the KL in the loss (the
    GRPO layout) that is the group mean of the scores, OpenRLHF's form.
    """
    returns = _returns_to_go(token_rewards, response_mask, gamma)  # [B*G, T]
    totals = rearrange(_sequence_scores(token_rewards, response_mask), "(b g) -> b g", g=group_size)  # [B, G]
    group_mean = rearrange(totals.mean(-1, keepdim=True).expand_as(totals), "b g -> (b g)")  # [B*G]
    centred = torch.where(response_mask.bool(), returns - group_mean[:, None], torch.zeros_like(returns))
    return whiten(centred, response_mask, reduce_sum=reduce_sum), returns


@register_advantage_estimator("remax")
def remax_estimator(*, token_rewards, response_mask, reward_baselines=None, gamma=1.0, **kwargs):
    """ReMax (Li et al. 2023, arXiv 2310.10505; verl ``remax``): the baseline of a sampled
    response is the score of the *greedy* response to the same prompt, one extra decode per
    prompt instead of a critic or a group. Each token's advantage is its return-to-go minus
    that baseline.

    >>> rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    >>> remax_estimator(token_rewards=rewards, response_mask=torch.ones(2, 2),
    ...                 reward_baselines=torch.tensor([0.5, 0.5]))[0].tolist()
    [[0.5, 0.5], [-0.5, -0.5]]
    """
    if reward_baselines is None:
        raise ValueError("advantage estimator 'remax' needs reward_baselines (the greedy responses' scores)")
    returns = _returns_to_go(token_rewards, response_mask, gamma)  # [B, T]
    baseline = reward_baselines.to(returns.dtype)[:, None]  # [B, 1]
    advantages = torch.where(response_mask.bool(), returns - baseline, torch.zeros_like(returns))
    return advantages, returns


@register_advantage_estimator("maxrl")
def maxrl_estimator(*, token_rewards, response_mask, group_size=1, sample_mask=None, **kwargs):
    """MaxRL (arXiv 2602.02710; SkyRL ``maxrl``, prime-rl ``max_rl``): ``(r - mean) / mean``
    within each group, on every response token (`gae.group.maxrl_advantages`)."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B*G]
    return _broadcast_to_tokens(maxrl_advantages(scores, group_size, valid=sample_mask), response_mask)


@register_advantage_estimator("grpo_passk")
def grpo_passk_estimator(*, token_rewards, response_mask, group_size=1, grpo_scale="group", grpo_eps=1e-4,
                         grpo_std_correction=0, reduce_sum=None, sample_mask=None, **kwargs):
    """Pass@k credit (arXiv 2503.19595; verl ``grpo_passk``): the group's best response gets
    ``r_max - r_second_max``, scaled by `grpo_scale`, the rest 0 (`gae.group.passk_advantages`)."""
    scores = _sequence_scores(token_rewards, response_mask)  # [B*G]
    sequence_advantages = passk_advantages(scores, group_size, grpo_scale, grpo_eps, grpo_std_correction, reduce_sum,
                                           valid=sample_mask)  # [B*G]
    return _broadcast_to_tokens(sequence_advantages, response_mask)


@register_advantage_estimator("gdpo")
def gdpo_estimator(*, response_mask, group_size=1, grpo_eps=1e-4, grpo_std_correction=0, reduce_sum=None,
                   sample_mask=None, reward_components=None, reward_weights=None, **kwargs):
    """GDPO (arXiv 2601.05242; TRL ``normalize_then_sum``): each named reward component
    z-scored within its group, their weighted sum normalised over the batch
    (`gae.group.gdpo_advantages`). It reads the components, not the summed score in
    `token_rewards`, so a KL in the reward would not reach it (the config refuses that)."""
    if reward_components is None or reward_weights is None:
        raise ValueError("advantage estimator 'gdpo' needs reward_components and reward_weights "
                         "(ppo.algorithm.rewards.reward_components)")
    sequence_advantages = gdpo_advantages(reward_components, reward_weights, group_size, grpo_eps, grpo_std_correction,
                                          reduce_sum, valid=sample_mask)  # [B*G]
    return _broadcast_to_tokens(sequence_advantages, response_mask)

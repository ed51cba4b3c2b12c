"""The policy-loss registry: how `policy_loss` in `PPOConfig` picks the surrogate objective.

The update calls `policy_loss(..., name=cfg.policy_loss)` and never branches on the name, so
PPO's clipped loss and its 2025 relatives share one loop and differ only in this string (the
verl `POLICY_LOSS_REGISTRY` pattern). Every loss is one decorated function with one
signature: keyword tensors ``[B, T]`` (`logprobs` with grad, `old_logprobs`, `advantages`,
the loss `mask`) plus every setting as a keyword it may ignore, returning the per-token loss
``[B, T]`` and its own metrics. `policy_loss` then aggregates with `loss_agg`
(`ppo.algorithm.losses.aggregate`), so every loss is exact under gradient accumulation.

Implementation details that live here:

- **`vanilla`**: PPO's clipped surrogate, with DAPO's clip-higher (`clip_high`) and the dual
  clip (`dual_clip`; equal to INTELLECT-2's two-sided clip `delta` of TRL, see `vanilla`).
- **`gspo`** and **`gspo_token`** (Qwen, GSPO): one importance ratio per sequence, the
  geometric mean of its token ratios, clipped per sequence.
- **`cispo`** (MiniMax-M1): clip the importance weight, stop its gradient, keep every
  token's gradient.
- **`geo_mean`** (GMPO): the geometric mean of token ratios clipped in log space, times the
  sequence's advantage.
- **`clip_cov`** and **`kl_cov`** (Cui et al., "The Entropy Mechanism of RL for Reasoning
  LMs"): act on the few tokens whose log-prob and advantage covary most.
- **`dppo_tv`** and **`dppo_kl`** (DPPO, arXiv 2602.04879; prime-rl's default loss, SkyRL):
  no ratio clip; a token whose probability has moved past a trust region, measured on the
  probability itself (total variation) or on the binary KL, in the direction its advantage
  asks for, loses its gradient.
- **`sapo`** (Qwen, SAPO, arXiv 2511.20347; verl, TRL `loss_type="sapo"`): no hard clip; the
  ratio passes through a sigmoid gate whose slope at ratio 1 is PPO's, so a token's gradient
  fades smoothly as its ratio leaves 1, faster for negative advantages.
- **`gpg`** (GPG, arXiv 2504.02546; verl `compute_policy_loss_gpg`): ``-A log pi``, plain
  policy gradient with no ratio and no clip. With `rollout_correction` weights folded into
  the advantage it is verl's `compute_policy_loss_reinforce` with importance weights.
- **`kimi`** (Kimi k1.5, sec. 2.3.2): a squared loss on the optimal policy's reward identity,
  one per sequence, with the group-mean reward for ``tau log Z`` and the policy that sampled
  the batch as the mirror-descent anchor; `kimi_tau` is its tau (docs/derivations.md, section 5).
- **`top_entropy_mask`** (Wang et al., "Beyond the 80/20 Rule"; TRL `top_entropy_quantile`):
  train only on the highest-entropy tokens.
- **Off-policy sequence masking** (`PPOConfig.off_policy_mask_threshold`; DeepSeek-V3.2):
  applied here, after any loss, because it needs the current policy
  (`ppo.algorithm.rollout_correction.off_policy_sequence_mask`).
- **`EntropyControl`** (Skywork-OR1; TRL `use_adaptive_entropy`): an entropy coefficient
  that moves toward a target entropy.

How sequence-level losses compose with `loss_agg`: `gspo` and `geo_mean` compute one loss per
sequence and place it on each of the sequence's tokens. `seq_mean_token_mean` then gives each
sequence one vote, the papers' form (and verl's fixed choice); `token_mean` weighs a
sequence by its length, `seq_mean_token_sum` by its length too (over the number of
sequences). At ratio 1 every loss here has PPO's gradient in every mode (`cispo` and `kl_cov`
REINFORCE's, which is the same; `clip_cov` less its detached tokens): the sequence ratio's
gradient spreads `1/L` over the sequence's tokens, which is what the broadcast gives back.

Not offered: verl's clamp of the log-ratio at 20 (`vanilla`, `cispo`) and at 10
(`gspo`) for stability; the testbed never comes near it, and a clamp hides a diverging run.
"""

from __future__ import annotations

from typing import Callable

import torch

from ppo.algorithm.losses import _masked_mean, aggregate
from ppo.algorithm.rollout_correction import off_policy_sequence_mask

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {}
# Losses whose importance ratio is one number per sequence: a per-token mask or cap cannot
# act on them (`PPOConfig.validate` refuses those combinations, naming the fields).
SEQUENCE_LEVEL_LOSSES = ("gspo", "geo_mean", "kimi")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator adding a loss to `POLICY_LOSSES` under `name`::

        @register_policy_loss("my_loss")
        def my_loss(*, logprobs, old_logprobs, advantages, mask, **settings):
            return per_token_loss, {"my_metric": 0.0}   # [B, T], floats
    """

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:  # silently replacing one would make equal configs differ
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    loss_agg: str = "token_mean",
    max_len: int | None = None,
    skip_empty_rows: bool = False,
    group_share: torch.Tensor | None = None,
    name: str = "vanilla",
    train_on: torch.Tensor | None = None,
    cov_fraction: float = 2e-4,
    clip_cov_low: float = 1.0,
    clip_cov_high: float = 5.0,
    kl_cov_coef: float = 1.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    generator: torch.Generator | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    off_policy_mask_threshold: float | None = None,
    kimi_tau: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss registered as `name`, aggregated over `response_mask` by `loss_agg`.

    Args:
        logprobs: `[B, T]` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: `[B, T]` log-probs under the policy that sampled them (no grad).
        advantages: `[B, T]`.
        response_mask: `[B, T]`, 1 on the tokens in the loss; it is the denominator of `loss_agg`.
        group_share: `[B]`, each row's share of its prompt group (`loss_agg="prompt_mean"` only).
        clip_low, clip_high, dual_clip: the clip ranges (`clip_high=None`: symmetric).
        train_on: optional `[B, T]` bool, the tokens that get a gradient (`top_entropy_mask`);
            the others count in the denominator but add 0, as TRL masks them.
        cov_fraction, clip_cov_low, clip_cov_high, kl_cov_coef: `clip_cov` / `kl_cov` settings.
        sapo_tau_pos, sapo_tau_neg: `sapo`'s gate temperatures for A > 0 and A <= 0.
        kimi_tau: the regularisation strength tau of `kimi`.
        generator: draws `clip_cov`'s random tokens.
        behaviour_logprobs, off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence mask
            (`off_policy_sequence_mask`) against the sampler's `[B, T]` log-probs (the old
            log-probs when None), as TRL applies it: the dropped tokens stay in the denominator.

    Returns:
        `(loss, metrics)`: every loss's own metrics plus `pg_loss`, `approx_kl` (mean of
        0.5 * (logprobs - old_logprobs)^2, as TRL and AlpacaFarm log it), `ratio_mean`,
        `ratio_max` (token ratios) and, with `train_on`, `entropy_mask_frac`.
    """
    if name not in POLICY_LOSSES:
        raise ValueError(f"policy_loss must be one of {sorted(POLICY_LOSSES)}, got policy_loss={name!r}")
    if clip_high is None:
        clip_high = clip_low
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (a cap of c*|A| above the clipped loss), got dual_clip={dual_clip}")
    per_token, metrics = POLICY_LOSSES[name](
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, cov_fraction=cov_fraction,
        clip_cov_low=clip_cov_low, clip_cov_high=clip_cov_high, kl_cov_coef=kl_cov_coef, sapo_tau_pos=sapo_tau_pos,
        sapo_tau_neg=sapo_tau_neg, generator=generator, kimi_tau=kimi_tau)
    if train_on is not None:
        per_token = torch.where(train_on.bool(), per_token, torch.zeros_like(per_token))  # [B, T]
    if off_policy_mask_threshold is not None:
        behaviour = old_logprobs if behaviour_logprobs is None else behaviour_logprobs
        kept = off_policy_sequence_mask(advantages, logprobs, behaviour, response_mask, off_policy_mask_threshold)
        per_token = torch.where(kept, per_token, torch.zeros_like(per_token))  # [B, T]
        metrics["off_policy_masked_frac"] = _masked_mean((~kept).float(), response_mask).item()
    loss = aggregate(per_token, response_mask, loss_agg, max_len, skip_empty_rows, group_share)

    with torch.no_grad():
        mask = response_mask.bool()
        log_ratio = logprobs - old_logprobs  # [B, T]
        ratio = torch.exp(log_ratio)  # [B, T]
        metrics.update({
            "pg_loss": loss.item(),
            "approx_kl": _masked_mean(0.5 * log_ratio.pow(2), mask).item(),
            "ratio_mean": _masked_mean(ratio, mask).item(),
            "ratio_max": torch.where(mask, ratio, torch.full_like(ratio, float("-inf"))).max().item(),
        })
        if train_on is not None:
            metrics["entropy_mask_frac"] = _masked_mean(train_on.float(), mask).item()
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _row_fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of the rows with a token in `mask` that have a flagged token (or flag ``[B]``)."""
    rows = mask.bool().any(-1)  # [B]
    per_row = (flags.bool() & mask.bool()).any(-1) if flags.dim() == 2 else flags.bool()  # [B]
    return float((per_row & rows).sum() / rows.sum().clamp(min=1))


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`log s_i = (1/|y_i|) sum_t (logprobs - old_logprobs)`, ``[B]``: the log of the geometric
    mean of a sequence's token ratios (GSPO eq. 7); 0 for a row with no token in `mask`."""
    is_real = mask.bool()
    log_ratio = torch.where(is_real, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [B, T]
    return log_ratio.sum(-1) / is_real.sum(-1).clamp(min=1)  # [B]


def sequence_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean advantage over a sequence's tokens, ``[B]`` (its outcome advantage under GRPO)."""
    is_real = mask.bool()
    return torch.where(is_real, advantages, torch.zeros_like(advantages)).sum(-1) / is_real.sum(-1).clamp(min=1)


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each token's term of the covariance of log-prob and advantage over the masked tokens,
    ``(A_t - mean A)(logp_t - mean logp)``, ``[B, T]`` (no grad); -inf off the mask.

    Cui et al. (2505.22617) show the entropy change of one update is minus this covariance:
    tokens that are likely *and* advantaged drive entropy down, so these are the ones to act on.
    """
    with torch.no_grad():
        is_real = mask.bool()
        centred_adv = advantages - _masked_mean(advantages, is_real)
        centred_logp = logprobs.detach() - _masked_mean(logprobs.detach(), is_real)
        return torch.where(is_real, centred_adv * centred_logp, torch.full_like(logprobs, float("-inf")))


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The tokens whose entropy is in the top `quantile` of the masked tokens, ``[B, T]`` bool.

    Wang et al. 2025 ("Beyond the 80/20 Rule", arXiv 2506.01939): the few high-entropy
    "forking" tokens carry the learning; training only on the top 20% matches or beats all
    tokens. Threshold = the (1 - quantile) quantile of the masked entropies; a token at least
    that high is kept (TRL `get_high_entropy_mask`, grpo_trainer.py). Taken over this
    micro-batch on this process (TRL gathers it over processes).

    Worked example, entropies [[0.1, 0.9, 0.5, 0.3]], all real, quantile 0.5: the 0.5 quantile
    is 0.4, so [[False, True, True, False]].
    """
    is_real = mask.bool()
    if quantile >= 1.0 or not is_real.any():
        return is_real
    threshold = torch.quantile(entropy.detach()[is_real].float(), 1.0 - quantile)
    return (entropy.detach() >= threshold) & is_real


class EntropyControl:
    """The entropy coefficient, fixed or adapted toward a target entropy (Skywork-OR1).

    Skywork-OR1 (arXiv 2505.22312, sec. 4): after each optimizer step, with e the mean token
    entropy of its minibatch, ``c <- c + step`` if e < target else ``c - step`` (at least 0),
    and the bonus applied is ``c`` only while e <= target, else 0: the bonus pushes entropy up
    only once it has fallen to the target (TRL `use_adaptive_entropy`, `entropy_coef_delta`).
    With `target=None` the coefficient is `coef`, always.
    """

    def __init__(self, coef: float, target: float | None = None, step: float = 0.005):
        self.coef, self.target, self.step = coef, target, step
        self.last_entropy: float | None = None
        self._sum = self._count = 0.0

    @property
    def applied(self) -> float:
        """The coefficient every micro-batch of the next minibatch uses."""
        if self.target is None:
            return self.coef
        return self.coef if self.last_entropy is not None and self.last_entropy <= self.target else 0.0

    def observe(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        """Add a micro-batch's masked token entropies to this minibatch's mean."""
        if self.target is not None:
            self._sum += float(torch.where(mask.bool(), entropy.detach(), torch.zeros_like(entropy)).sum())
            self._count += float(mask.bool().sum())

    def update(self, reduce_sum=None) -> None:
        """After an optimizer step: move the coefficient toward the target (all ranks' tokens)."""
        if self.target is None:
            return
        totals = torch.tensor([self._sum, self._count])
        if reduce_sum is not None:
            totals = reduce_sum(totals)
        self.last_entropy = float(totals[0] / totals[1].clamp(min=1))
        self.coef = self.coef + self.step if self.last_entropy < self.target else max(self.coef - self.step, 0.0)
        self._sum = self._count = 0.0


def policy_loss_options(config) -> dict:
    """The keyword settings `policy_loss` takes from a `PPOConfig`."""
    return dict(name=config.policy_loss, clip_low=config.cliprange, clip_high=config.cliprange_high,
                dual_clip=config.dual_clip, cov_fraction=config.cov_fraction, clip_cov_low=config.clip_cov_low,
                clip_cov_high=config.clip_cov_high, kl_cov_coef=config.kl_cov_coef,
                sapo_tau_pos=config.sapo_tau_pos, sapo_tau_neg=config.sapo_tau_neg,
                off_policy_mask_threshold=config.off_policy_mask_threshold, kimi_tau=config.kimi_tau)


# ---------------------------------------------------------------------------------------------
# The losses
# ---------------------------------------------------------------------------------------------
@register_policy_loss("vanilla")
def vanilla(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, dual_clip=None, **settings):
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347), per token ``[B, T]``.

    With `ratio = exp(logprobs - old_logprobs)`::

        loss_t = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)

    The min is pessimistic: once a token's probability has moved far enough in the
    direction its advantage asks for (ratio > 1 + clip_high for A > 0, ratio < 1 - clip_low
    for A < 0), the clipped branch is constant and its gradient is zero, so one rollout
    batch cannot drag the policy far away. Moves in the wrong direction are never clipped.

    - `clip_high > clip_low` is DAPO's clip-higher (arXiv 2503.14476): rare tokens with
      positive advantage can grow their probability further before being clipped.
    - `dual_clip=c` (c > 1; Ye et al. 2020, arXiv 1912.09729): for A < 0 the loss
      `ratio * |A|` grows without bound as the ratio explodes; dual-clip caps it at `c * |A|`.
      INTELLECT-2's two-sided clip (arXiv 2505.07291; TRL `delta`, grpo_trainer.py) caps the
      unclipped ratio at `delta` before the min: for A < 0 that is `max(min(r, delta),
      clip(r)) * |A| = min(max(r, clip(r)), delta) * |A|` once `delta >= 1 + clip_high`, and for
      A > 0 it changes nothing. So `delta` is `dual_clip` under another name, value and
      gradient (tests/test_policy_losses.py); this codebase keeps the one field.

    With one gradient update per rollout batch the ratio is exactly 1 and clipping never
    fires: fully online GRPO is plain policy gradient with group-normalised advantages.

    Metrics: `clipfrac` (clipped branch chosen), `clipfrac_low` (ratio < 1 - clip_low,
    A < 0), `clipfrac_high` (ratio > 1 + clip_high, A > 0), `dualclip_frac`, and
    `clipfrac_seq` (sequences with a clipped token).

    Worked example (clip 0.2): ratios [1.1, 1.5, 0.5] with A = +1 give losses
    [-1.1, -1.2 (clipped), -0.5]; with A = -1 they give [1.1, 1.5, 0.8 (clipped)].
    """
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    unclipped = -advantages * ratio  # [B, T]
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    per_token = torch.maximum(unclipped, clipped)  # [B, T]  (= -min of the objectives)

    is_dual_clipped = torch.zeros_like(per_token, dtype=torch.bool)  # [B, T]
    if dual_clip is not None:
        cap = -dual_clip * advantages  # [B, T]  c*|A| where A < 0
        is_dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(is_dual_clipped, cap, per_token)

    with torch.no_grad():
        is_clipped = clipped > unclipped  # [B, T] the flat (zero-gradient) branch won
        metrics = {
            "clipfrac": _masked_mean(is_clipped.float(), mask).item(),
            "clipfrac_low": _masked_mean(((ratio < 1.0 - clip_low) & (advantages < 0)).float(), mask).item(),
            "clipfrac_high": _masked_mean(((ratio > 1.0 + clip_high) & (advantages > 0)).float(), mask).item(),
            "dualclip_frac": _masked_mean(is_dual_clipped.float(), mask).item(),
            "clipfrac_seq": _row_fraction(is_clipped, mask),
        }
    return per_token, metrics


def _sequence_clip(seq_ratio, seq_advantage, clip_low, clip_high):
    """`-min(s A, clip(s, 1 - low, 1 + high) A)` per sequence ``[B]``, and where it clipped."""
    unclipped = -seq_advantage * seq_ratio
    clipped = -seq_advantage * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("gspo")
def gspo(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071, eq. 5-7).

    One importance ratio per sequence, the geometric mean of its token ratios, clipped per
    sequence::

        s_i    = exp((1/|y_i|) sum_t log(pi(y_it) / pi_old(y_it)))          [B]
        loss_i = -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)  [B]

    `A_i` is the sequence's mean token advantage (its outcome advantage under GRPO). The
    loss of sequence i is placed on each of its tokens ``[B, T]``; `seq_mean_token_mean`
    gives the paper's mean over sequences. A clipped sequence gives no gradient at all. The
    paper's ranges are far smaller than PPO's: 3e-4 and 4e-4 (verl `compute_policy_loss_gspo`
    reads the same `clip_ratio_low/high`).

    Worked example, one sequence of two tokens with log-ratios [0.2, 0.0] and A = +1,
    clip 0.05: s = exp(0.1) = 1.105 > 1.05, so loss = -1.05 on both tokens, zero gradient.
    """
    seq_ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))  # [B]
    seq_advantage = sequence_advantage(advantages, mask)  # [B]
    seq_loss, is_clipped = _sequence_clip(seq_ratio, seq_advantage, clip_low, clip_high)  # [B] each
    per_token = seq_loss[:, None].expand_as(logprobs)  # [B, T]
    with torch.no_grad():
        metrics = {
            "clipfrac": _masked_mean(is_clipped[:, None].expand_as(mask).float(), mask).item(),
            "clipfrac_seq": _row_fraction(is_clipped, mask),
            "clipfrac_low_seq": _row_fraction((seq_ratio < 1.0 - clip_low) & (seq_advantage < 0), mask),
            "clipfrac_high_seq": _row_fraction((seq_ratio > 1.0 + clip_high) & (seq_advantage > 0), mask),
            "seq_ratio_mean": float(seq_ratio[mask.bool().any(-1)].mean()) if mask.bool().any() else 1.0,
        }
    return per_token, metrics


@register_policy_loss("gspo_token")
def gspo_token(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """GSPO-token (GSPO paper eq. 13-14; verl `compute_policy_loss_gspo`): the sequence ratio's
    value with each token's own gradient, so token-level advantages can be used::

        s_it    = sg[s_i] * pi(y_it) / sg[pi(y_it)]       (value s_i, gradient s_i * grad log pi)
        loss_it = -min(s_it A_it, clip(s_it, 1 - clip_low, 1 + clip_high) A_it)   [B, T]

    With one advantage per sequence and `seq_mean_token_mean` its value and gradient equal
    `gspo`'s; it differs when advantages vary along a sequence (GAE). Clipping is decided per
    sequence (`s_i`) but applied per token, and only tokens whose advantage asks for the
    clipped direction lose their gradient.
    """
    seq_log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask).detach()  # [B]
    log_ratio = logprobs - logprobs.detach() + seq_log_ratio[:, None]  # [B, T], value log s_i
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    with torch.no_grad():
        is_clipped = clipped > unclipped
        metrics = {"clipfrac": _masked_mean(is_clipped.float(), mask).item(),
                   "clipfrac_seq": _row_fraction(is_clipped, mask)}
    return per_token, metrics


@register_policy_loss("cispo")
def cispo(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): clip the importance weight, not the update.

    ::

        r_t    = exp(logprobs - old_logprobs)
        loss_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A_t * logprobs_t      [B, T]

    PPO's clip zeroes the gradient of a clipped token, and the tokens it clips are often the
    rare "fork" tokens of reflective reasoning; CISPO only bounds the weight, so every token
    keeps a REINFORCE gradient `-w_t A_t grad log pi`. At ratio 1 the weight is 1 and the
    gradient is REINFORCE's exactly. The loss's *value* is `-w A log pi`, not a surrogate, so
    `pg_loss` is not comparable with the other losses'. MiniMax-M1 leaves the low side open
    (a large `clip_low`) and tunes the high side; TRL bounds the weight at `epsilon_high`
    (ScaleRL: 5), verl `compute_policy_loss_cispo` as here.

    Metrics: `clipfrac` (tokens whose weight was clipped), `clipfrac_seq`.
    """
    ratio = torch.exp(logprobs - old_logprobs).detach()  # [B, T]
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # [B, T], no grad
    per_token = -weight * advantages * logprobs  # [B, T]
    with torch.no_grad():
        is_clipped = weight != ratio
        metrics = {"clipfrac": _masked_mean(is_clipped.float(), mask).item(),
                   "clipfrac_seq": _row_fraction(is_clipped, mask)}
    return per_token, metrics


@register_policy_loss("geo_mean")
def geo_mean(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673, eq. 4).

    The geometric mean of the token ratios, each clipped in log space in the pessimistic
    direction of the sequence's sign, times the sequence's advantage::

        l_t    = sgn(A) * min(sgn(A) * log r_t, sgn(A) * clamp(log r_t, -clip_low, clip_high))
        loss_i = -A_i * exp((1/|y_i|) sum_t l_t)                                   [B]

    A geometric mean is less moved by one outlier token than GRPO's arithmetic mean, so the
    paper can afford a wider clip: (e^-0.4, e^0.4), i.e. `cliprange=0.4` here, in log units.
    The loss is placed on each of the sequence's tokens like `gspo`'s (verl `geo_mean` takes
    a plain mean over sequences: `seq_mean_token_mean`).

    Metrics: `clipfrac` (tokens whose clamped log-ratio was the pessimistic one), `clipfrac_seq`.
    """
    log_ratio = logprobs - old_logprobs  # [B, T]
    sign = torch.sign(advantages)  # [B, T]
    clamped = torch.clamp(log_ratio, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)  # [B, T]
    seq_ratio = torch.exp(sequence_log_ratio(pessimistic, torch.zeros_like(pessimistic), mask))  # [B]
    seq_loss = -sequence_advantage(advantages, mask) * seq_ratio  # [B]
    per_token = seq_loss[:, None].expand_as(logprobs)  # [B, T]
    with torch.no_grad():
        is_clipped = pessimistic != log_ratio  # the clamped value won: no gradient (verl counts any clamp)
        metrics = {"clipfrac": _masked_mean(is_clipped.float(), mask).item(),
                   "clipfrac_seq": _row_fraction(is_clipped, mask)}
    return per_token, metrics


def _how_many(fraction: float, mask: torch.Tensor) -> int:
    """`max(1, int(fraction * tokens))`: at least one token, as verl and the paper's code take."""
    return max(int(fraction * float(mask.bool().sum())), 1)


@register_policy_loss("clip_cov")
def clip_cov(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, cov_fraction, clip_cov_low,
             clip_cov_high, generator=None, **settings):
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, sec. 5; verl `compute_policy_loss_clip_cov`).

    PPO's clipped loss, plus: among the tokens the clip left alone whose covariance term
    (`token_covariance`) lies in ``(clip_cov_low, clip_cov_high)``, draw
    `max(1, int(cov_fraction * N))` at random and detach them (loss and gradient 0). Those
    tokens are the likely-and-advantaged ones whose update would lower entropy the most.
    Paper and verl: fraction 2e-4, bounds (1, 5). The draw uses `generator`.

    Metrics: PPO's clip fractions, and `cov_frac` (tokens detached).
    """
    per_token, metrics = vanilla(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask,
                                 clip_low=clip_low, clip_high=clip_high)
    with torch.no_grad():
        ratio = torch.exp(logprobs - old_logprobs)
        clipped_by_ppo = (-advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)) > (-advantages * ratio)
        cov = token_covariance(logprobs, advantages, mask)  # [B, T]
        candidates = torch.nonzero((cov > clip_cov_low) & (cov < clip_cov_high) & mask.bool() & ~clipped_by_ppo)
        order = torch.randperm(len(candidates), generator=generator)[:_how_many(cov_fraction, mask)]
        chosen = candidates[order.to(candidates.device)]  # [k, 2] (row, column)
        detached = torch.zeros_like(mask, dtype=torch.bool)
        detached[chosen[:, 0], chosen[:, 1]] = True
    per_token = torch.where(detached, torch.zeros_like(per_token), per_token)  # [B, T]
    metrics["cov_frac"] = _masked_mean(detached.float(), mask).item()
    return per_token, metrics


@register_policy_loss("kl_cov")
def kl_cov(*, logprobs, old_logprobs, advantages, mask, cov_fraction, kl_cov_coef, **settings):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, sec. 5; verl `compute_policy_loss_kl_cov`).

    No ratio clipping at all: the unclipped surrogate on every token, plus a KL penalty
    ``kl_cov_coef * |logprobs - old_logprobs|`` on the `max(1, int(cov_fraction * N))`
    tokens with the largest covariance term (`token_covariance`)::

        loss_t = -r_t A_t + [t in top-k by cov] * kl_cov_coef * |log r_t|          [B, T]

    Paper: k = 2e-3 (7B) or 2e-4 (32B) of the tokens, coefficient 1; verl defaults 2e-4.
    At ratio 1 the penalty and its gradient are 0 and the loss is REINFORCE's.

    Metrics: `cov_frac` (tokens penalised).
    """
    log_ratio = logprobs - old_logprobs  # [B, T]
    per_token = -advantages * torch.exp(log_ratio)  # [B, T]
    with torch.no_grad():
        cov = token_covariance(logprobs, advantages, mask).flatten()  # [B*T], -inf off the mask
        top = torch.topk(cov, min(_how_many(cov_fraction, mask), int(mask.bool().sum()))).indices
        penalised = torch.zeros_like(cov, dtype=torch.bool)
        penalised[top] = True
        penalised = penalised.view_as(mask) & mask.bool()  # [B, T]
    per_token = torch.where(penalised, per_token + kl_cov_coef * log_ratio.abs(), per_token)
    return per_token, {"cov_frac": _masked_mean(penalised.float(), mask).item()}


def _dppo(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, divergence):
    """DPPO's masked surrogate, ``-sg[m_t] r_t A_t`` per token ``[B, T]``, and its metrics.

    `divergence` gives, from the probabilities ``(p, mu)`` of the sampled token under the
    current and the old policy, how far it has moved up (``up``, for A > 0) and down
    (``down``, for A < 0), each compared with `clip_high` / `clip_low`.
    """
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    with torch.no_grad():
        up, down = divergence(torch.exp(logprobs), torch.exp(old_logprobs), logprobs, old_logprobs)  # [B, T] each
        blocked_high = (advantages > 0) & (up > clip_high)  # pushed up past the trust region
        blocked_low = (advantages < 0) & (down > clip_low)  # pushed down past it
        blocked = blocked_high | blocked_low
    per_token = torch.where(blocked, torch.zeros_like(ratio), -ratio * advantages)  # [B, T]
    with torch.no_grad():
        metrics = {"clipfrac": _masked_mean(blocked.float(), mask).item(),
                   "clipfrac_low": _masked_mean(blocked_low.float(), mask).item(),
                   "clipfrac_high": _masked_mean(blocked_high.float(), mask).item(),
                   "clipfrac_seq": _row_fraction(blocked, mask)}
    return per_token, metrics


@register_policy_loss("dppo_tv")
def dppo_tv(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """DPPO-Binary-TV ("Rethinking the trust region in LLM RL", arXiv 2602.04879, eq. 13).

    PPO's ratio clip bounds ``pi / pi_old``, which lets a rare token's probability jump from
    1e-4 to 1e-3 (ratio 10, clipped) while a common one moves from 0.5 to 0.6 (ratio 1.2)
    freely; DPPO bounds the change of the probability itself. With ``p = pi(y_t)`` and
    ``mu = pi_old(y_t)``::

        m_t    = 0 if (A > 0 and p - mu > clip_high) or (A < 0 and mu - p > clip_low) else 1
        loss_t = -sg[m_t] * (p / mu) * A_t                                         [B, T]

    A blocked token keeps its place in the denominator. The unblocked ones take the unclipped
    importance-weighted gradient, whatever their ratio. Thresholds: prime-rl and SkyRL 0.2
    (`cliprange` 0.2 here). prime-rl's default loss adds ``1e-3 * (log r)^2`` on every token
    (its `kl_tau`), which this loss leaves out; SkyRL's loss is this one.

    Worked example (clip 0.2), mu = 0.5: p = 0.75 with A = +1 moved up 0.25 > 0.2, blocked,
    loss 0; p = 0.6 with A = +1, loss -1.2; p = 0.25 with A = -1 moved down 0.25, blocked.
    """
    return _dppo(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
                 lambda p, mu, logp, log_mu: (p - mu, mu - p))


@register_policy_loss("dppo_kl")
def dppo_kl(*, logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **settings):
    """DPPO-Binary-KL (arXiv 2602.04879, eq. 14): DPPO's trust region measured by the KL
    between the two Bernoulli distributions "this token or another"::

        D_t = mu log(mu / p) + (1 - mu) log((1 - mu) / (1 - p))
        m_t = 0 if (A > 0 and p > mu and D_t > clip_high) or (A < 0 and p < mu and D_t > clip_low) else 1
        loss_t = -sg[m_t] * (p / mu) * A_t                                         [B, T]

    The KL weighs a move by how sure the old policy was: the same absolute change costs more
    near 0 or 1. SkyRL recommends 0.05 for both thresholds (`cliprange=0.05` here). The
    ``1 - p`` terms get 1e-8 added, as SkyRL does, so a token of probability 1 stays finite.
    """
    eps = 1e-8

    def binary_kl(p, mu, logp, log_mu):
        kl = mu * (log_mu - logp) + (1 - mu) * (torch.log(1 - mu + eps) - torch.log(1 - p + eps))  # [B, T]
        return torch.where(p > mu, kl, torch.zeros_like(kl)), torch.where(p < mu, kl, torch.zeros_like(kl))

    return _dppo(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, binary_kl)


@register_policy_loss("sapo")
def sapo(*, logprobs, old_logprobs, advantages, mask, sapo_tau_pos=1.0, sapo_tau_neg=1.05, **settings):
    """SAPO (Qwen, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a soft trust region.

    PPO's clip cuts a token's gradient to 0 the moment its ratio leaves the band; SAPO
    replaces the ratio by a sigmoid gate of it, with temperature ``tau``::

        f(r)   = sigmoid(tau * (r - 1)) * 4 / tau          (f(1) = 2 / tau, f'(1) = 1)
        loss_t = -f(r_t) * A_t                                                    [B, T]
        tau    = sapo_tau_pos if A_t > 0 else sapo_tau_neg

    The gradient ``A * 4 sigmoid'(tau (r - 1)) * r * grad log pi`` is PPO's at r = 1 and decays
    smoothly as r moves either way, so a far-off token still gets a small, bounded push
    instead of none. A larger ``tau_neg`` makes the decay faster for negative advantages,
    whose updates the paper finds less stable. Defaults 1.0 / 1.05 (verl `tau_pos` /
    `tau_neg`; TRL `sapo_temperature_pos` / `_neg`). verl aggregates SAPO with
    `seq_mean_token_mean` whatever its `loss_agg_mode`; here `loss_agg` applies, so
    ``loss_agg="seq_mean_token_mean"`` is verl's. The loss value is not PPO's (at r = 1 it is
    ``-2A / tau``), so `pg_loss` compares only between SAPO runs.

    Worked example, A = +1, tau = 1: r = 1 gives f = 4 * 0.5 = 2 and gradient 1 (PPO's);
    r = 1.5 gives f = 4 * sigmoid(0.5) = 2.4492 and d loss / d log r = -4 sigmoid'(0.5) * 1.5
    = -1.4100 (4 * 0.2350 * 1.5), where PPO with clip 0.2 gives 0.

    Metrics: `sapo_gate_mean` (mean of ``4 sigmoid'(tau (r - 1))``, the gradient's share left
    at each token, 1 on-policy).
    """
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    tau = torch.where(advantages > 0, torch.full_like(ratio, sapo_tau_pos), torch.full_like(ratio, sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau  # [B, T]
    per_token = -gate * advantages  # [B, T]
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        metrics = {"sapo_gate_mean": _masked_mean(4.0 * s * (1.0 - s), mask).item()}
    return per_token, metrics


@register_policy_loss("gpg")
def gpg(*, logprobs, advantages, **settings):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline",
    arXiv 2504.02546; verl `compute_policy_loss_gpg`): the plain policy gradient::

        loss_t = -A_t * log pi(y_t)                                              [B, T]

    No ratio, no clip, no old policy: REINFORCE on each token. On-policy its gradient is
    PPO's; off-policy (several epochs or minibatches) nothing bounds the step. Its value is
    ``-A log pi``, not a surrogate (`pg_loss` is not comparable with PPO's).

    verl's `compute_policy_loss_reinforce` (REINFORCE with importance weights, its
    rollout-correction bypass loss) is ``-A * log pi * w`` with ``w`` the detached
    sampler-to-trainer weights; here `rollout_correction` folds ``w`` into the advantage
    before the loss, so ``policy_loss="gpg"`` with ``rollout_correction="token_tis"`` is that
    loss (`tests/test_field_2026.py` checks both to 1e-6). GPG's paper also rescales the
    advantage by the batch's share of non-zero-advantage samples (verl's ``gpg`` estimator);
    that is not offered.
    """
    return -advantages * logprobs, {}
@register_policy_loss("kimi")
def kimi(*, logprobs, old_logprobs, advantages, mask, kimi_tau, **settings):
    """Kimi k1.5's surrogate (Kimi Team 2025, arXiv 2501.12599, sec. 2.3.2; the report at
    MoonshotAI/Kimi-k1.5@cf9a8785 Kimi_k1.5.pdf), one loss per sequence ``[B]``.

    Iteration i maximises ``E[r] - tau KL(pi || pi_i)`` with pi_i the policy that sampled the
    batch. Its optimum satisfies ``r - tau log Z = tau log(pi* / pi_i)`` for every response, so
    the paper fits pi to that identity by a squared loss, with the group's mean reward r_bar
    standing in for ``tau log Z``. With ``S_i = sum_t (logprobs - old_logprobs)``, the log of
    the sequence ratio ``pi(y_i) / pi_i(y_i)`` (a sum: no length normaliser), and
    ``A_i = r_i - r_bar`` (``advantage_estimator='dr_grpo'``: no std division)::

        loss_i = (A_i - tau * S_i)^2 / (2 tau)                                     [B]
        grad   = -A_i grad log pi(y_i) + (tau / 2) grad S_i^2

    The 1/(2 tau) scale makes the gradient the paper's eq. 3 exactly (REINFORCE with the
    group-mean baseline plus an l2 pull toward pi_i; docs/derivations.md, section 5), so the
    learning rate means what it means for the other losses. On the first update of a batch
    S_i = 0 and the gradient is REINFORCE's; the regulariser acts only once the policy has
    moved (a second minibatch or epoch). `A_i` is read as the sequence's mean token advantage
    (its outcome advantage), and the loss is placed on each of its tokens, so
    `seq_mean_token_mean` gives the paper's mean over the k responses.

    Worked example, tau = 0.5: a correct response of two tokens with log-ratios [0.1, 0.1]
    (S = 0.2, A = +0.5) and a wrong one of one token with log-ratio [-0.2] (S = -0.2,
    A = -0.5): both losses are (0.5 - 0.1)^2 / 1 = 0.16; the gradient on each log-prob of
    the first is -(0.5 - 0.1) = -0.4, on the second's +0.4 (then halved by the mean over 2).

    Metrics: `kimi_log_ratio_seq` (mean of S_i over the sequences), `kimi_regulariser` (mean of
    (tau / 2) S_i^2, the value of the pull toward pi_i).
    """
    if not kimi_tau > 0:
        raise ValueError(f"kimi_tau must be > 0 (the KL weight tau of Kimi k1.5), got kimi_tau={kimi_tau}")
    is_real = mask.bool()
    seq_log_ratio = torch.where(is_real, logprobs - old_logprobs, torch.zeros_like(logprobs)).sum(-1)  # [B], S_i
    seq_advantage = sequence_advantage(advantages, mask)  # [B], r_i - r_bar
    seq_loss = (seq_advantage - kimi_tau * seq_log_ratio).pow(2) / (2 * kimi_tau)  # [B]
    per_token = seq_loss[:, None].expand_as(logprobs)  # [B, T]
    with torch.no_grad():
        rows = is_real.any(-1)  # [B]
        s = seq_log_ratio[rows]
        metrics = {"kimi_log_ratio_seq": float(s.mean()) if len(s) else 0.0,
                   "kimi_regulariser": float((0.5 * kimi_tau * s.pow(2)).mean()) if len(s) else 0.0}
    return per_token, metrics

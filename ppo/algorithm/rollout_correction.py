"""Correcting for the mismatch between the policy that sampled and the policy being trained.

The tokens are drawn by the sampler (a different kernel, a different precision, vLLM in
large setups, or an older copy of the policy in an asynchronous pipeline) but the loss treats
them as drawn by the trainer's old policy. When the two disagree, the update is off-policy
without knowing it. Every sampled token's ratio

    w_t = pi_old(y_t) / pi_sampler(y_t) = exp(old_logprobs - sampler_logprobs)

(trainer over sampler) measures the disagreement; the corrections reweight or drop tokens by it.
In the language of decoupled PPO the sampler is the *behaviour* policy and the trainer's old
pass the *proximal* policy: the clipped surrogate is anchored at the proximal one, and `w`
carries the rest of the importance weight.

Implementation details that live here (`PPOConfig.rollout_correction`, `rollout_correction_cap`,
`rollout_correction_floor`, `rollout_correction_kl_threshold`, `rollout_correction_batch_normalize`,
`off_policy_mask_threshold`, `sampling_precision`, `log_rollout_mismatch`):

- **Truncated importance sampling** (TIS): each token's policy loss times ``min(w, cap)``
  (``"token_tis"``) or each sequence's times ``min(prod_t w_t, cap)`` (``"sequence_tis"``);
  detached (verl `compute_rollout_correction_weights`, ``rollout_is_threshold`` 2.0; Yao et
  al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
  ``"geo_tis"``: each sequence's weight is the geometric mean of its truncated token weights
  (how verl's ``geo_mean`` loss folds token weights into its one loss per sequence).
  With `rollout_correction_batch_normalize` the truncated weights are divided by their batch
  mean (verl ``rollout_is_batch_normalize``).
- **Masked importance sampling** (MIS, rejection): tokens (``"token_mis"``) or whole
  sequences (``"sequence_mis"``, ``"geo_mis"`` by the geometric mean of the token ratios)
  whose ratio falls outside ``[floor, cap]`` leave the loss and its denominator (verl
  `compute_rollout_rejection_mask`; SkyRL's geometric sequence mask).
- **IcePop weighting** (``"token_icepop"``, ``"sequence_icepop"``; Ring-1T 2025, TRL
  ``token_mask`` / ``sequence_mask``): the weight is the ratio itself inside ``[floor, cap]``
  and 0 outside, and the dropped tokens stay in the loss's denominator.
- **Decoupled PPO** (``"decoupled"``; Hilton et al. 2021, AReaL): the untruncated weight
  ``w = pi_proximal / pi_behaviour``, 0 above `cap`, dropped tokens kept in the denominator
  (AReaL's rejection with ``action="mask"``, ``metric="ratio"``, an upper bound only).
- **Rejection by a KL statistic** (verl ``rollout_rs``): ``"token_k1"`` ... ``"seq_max_k3"``
  drop tokens or sequences by k1 = log(sampler / trainer) (kept inside ``[log floor, log cap]``),
  k2 = (log w)^2 / 2 or k3 = w - 1 - log w (kept at most `rollout_correction_kl_threshold`),
  per token, or their sum, mean or max over the sequence.
- **Off-policy sequence masking** (`off_policy_sequence_mask`; DeepSeek-V3.2, TRL
  ``off_policy_mask_threshold``): in the loss, with the *current* policy, a sequence whose
  mean log(pi_sampler / pi_current) exceeds the threshold leaves the numerator where its
  advantage is negative.
- **A real mismatch to test on**: ``sampling_precision="bf16"`` samples under bf16 autocast
  (through Hugging Face's `generate`: ``lean_forward=False``) while the trainer scores in fp32 ("Defeating the training-inference mismatch via FP16",
  arXiv 2510.26788, reports the precision as the main source).
- **The logged mismatch**: ``rollout_mismatch_kl`` (k3 estimate of KL(sampler || trainer) per
  token), ``rollout_ratio_min`` / ``rollout_ratio_max`` (token ratios),
  ``rollout_corrected_frac`` (tokens whose weight was capped, zeroed or which were masked),
  ``rollout_logprob_gap_mean`` / ``rollout_logprob_gap_max`` (mean and largest
  |logp_trainer - logp_sampler| per token). Logged every step when the sampler returns its
  own log-probs (``generation_backend="vllm"``, ppo/parallel/vllm_sampler.py), which it always does.

Every weight is applied by scaling the advantages: every clipped surrogate is a min / max of
terms linear in the advantage, so a non-negative per-token factor moves through it exactly.
"""

from __future__ import annotations

import contextlib
import math

import torch

# Rejection by a KL statistic of the ratio (verl ``rollout_rs``, rollout_corr_helper.py): k1 is
# kept inside a band of the sampler / trainer ratio, k2 and k3 under a threshold. verl has no
# ``seq_max_k1`` (the largest signed log-ratio is a one-sided test), nor does this module.
KL_REJECTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                 "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
TRUNCATED_CORRECTIONS = ("token_tis", "sequence_tis", "geo_tis")  # the weights batch normalisation divides
ROLLOUT_CORRECTIONS = ("none", *TRUNCATED_CORRECTIONS, "token_mis", "sequence_mis", "geo_mis", "token_icepop",
                       "sequence_icepop", "decoupled", *KL_REJECTIONS)
# The corrections that read only `cap` (no lower edge), and those that read only the KL threshold.
CAP_ONLY_CORRECTIONS = (*TRUNCATED_CORRECTIONS, "decoupled")
THRESHOLD_CORRECTIONS = tuple(mode for mode in KL_REJECTIONS if not mode.endswith("k1"))
SAMPLING_PRECISIONS = ("fp32", "bf16")
LOG_RATIO_BOUND = 20.0  # exp(20) is already far past any cap; keeps a sequence's product finite (verl SAFETY_BOUND)


def wants_sampler_logprobs(config) -> bool:
    """Whether sampling must keep its logits for a correction or the mismatch log."""
    return (config.rollout_correction != "none" or config.log_rollout_mismatch
            or config.off_policy_mask_threshold is not None)


def sampling_autocast(precision: str, device: torch.device | str, model=None):
    """The context sampling runs in: bf16 autocast for ``"bf16"``, nothing for ``"fp32"``.
    The lean sampler's KV cache is float32 (`ppo.speed.lean_sampling`), so bf16 sampling takes
    Hugging Face's `generate`: it needs ``lean_forward=False``."""
    if precision not in SAMPLING_PRECISIONS:
        raise ValueError(f"unknown sampling precision {precision!r}; expected one of {SAMPLING_PRECISIONS}")
    if precision == "fp32":
        return contextlib.nullcontext()
    from ppo.speed.lean_forward import lean_backbone

    if model is not None and lean_backbone(model) is not None:
        raise ValueError("PPOConfig.sampling_precision: 'bf16' needs lean_forward=False (the lean sampler keeps "
                         "a float32 KV cache)")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def sampler_token_logprobs(rollout, temperature: float) -> torch.Tensor:
    """The sampler's log-probs of the sampled tokens, ``[B, T]``, 0 on padding: the ones it
    returned itself (vLLM), else taken from its generation logits at `temperature`."""
    if rollout.sampler_logprobs is not None:
        return rollout.sampler_logprobs * rollout.response_mask.float()
    from ppo.models.logprobs import logprobs_from_logits

    logprobs = logprobs_from_logits(rollout.generation_logits, rollout.response_ids, temperature)  # [B, T]
    return logprobs * rollout.response_mask.float()


def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean over `mask`, ``[B, 1]``; 0 for a row with no token in it."""
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return masked.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def kl_statistic(log_ratio: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The statistic a KL rejection (`KL_REJECTIONS`) thresholds, ``[B, T]`` (a sequence's on
    each of its tokens), from ``log_ratio = log(pi_trainer / pi_sampler)``, ``[B, T]``::

        k1 = -log_ratio                          log(sampler / trainer): verl's orientation
        k2 = log_ratio^2 / 2
        k3 = exp(log_ratio) - 1 - log_ratio      w - 1 - log w, >= 0: KL(sampler || trainer)

    ``token_*`` per token, ``seq_sum_*`` / ``seq_mean_*`` / ``seq_max_*`` the masked sum, mean
    or max over the sequence (0 for a row with no token in `mask`).
    """
    level, _, estimator = mode.rpartition("_")
    safe = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe ** 2, "k3": torch.exp(safe) - 1.0 - safe}[estimator]  # [B, T]
    if level == "token":
        return per_token
    if level == "seq_sum":
        sequence = torch.where(mask.bool(), per_token, torch.zeros_like(per_token)).sum(-1, keepdim=True)  # [B, 1]
    elif level == "seq_mean":
        sequence = _sequence_mean(per_token, mask)  # [B, 1]
    else:  # seq_max
        masked = per_token.masked_fill(~mask.bool(), float("-inf"))
        sequence = masked.max(-1, keepdim=True).values
        sequence = torch.where(torch.isinf(sequence), torch.zeros_like(sequence), sequence)  # [B, 1]
    return sequence.expand_as(per_token)


def correction_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                       mode: str, cap: float = 2.0, floor: float = 0.5,
                       kl_threshold: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss weights and the loss mask they leave, ``([B, T], [B, T])``.

    Args:
        old_logprobs: `[B, T]` the trainer's log-probs of the sampled tokens (the proximal policy).
        sampler_logprobs: `[B, T]` the sampler's (the behaviour policy).
        mask: `[B, T]` the loss mask.
        mode: one of `ROLLOUT_CORRECTIONS`.
        cap, floor: TIS truncates weights at `cap`; MIS and IcePop keep ratios inside
            ``[floor, cap]``; decoupled PPO zeroes weights above `cap`; the k1 rejections keep
            the sampler / trainer ratio inside ``[floor, cap]``.
        kl_threshold: the k2 / k3 rejections keep a statistic at most this.

    Worked example (one sequence of two tokens, ratios w = [3, 0.25], cap 2, floor 0.5)::

        token_tis        weights [2, 0.25]        mask [1, 1]
        sequence_tis     weights [0.75, 0.75]     mask [1, 1]      # prod w = 0.75
        geo_tis          weights [0.707, 0.707]   mask [1, 1]      # sqrt(2 * 0.25)
        token_mis        weights [1, 1]           mask [0, 0]      # 3 > 2, 0.25 < 0.5
        sequence_mis     weights [1, 1]           mask [1, 1]      # 0.75 is inside the band
        geo_mis          weights [1, 1]           mask [1, 1]      # sqrt(0.75) = 0.866 inside
        token_icepop     weights [0, 0]           mask [1, 1]      # both outside: weight 0, still counted
        sequence_icepop  weights [0.75, 0.75]     mask [1, 1]
        decoupled        weights [0, 0.25]        mask [1, 1]      # 3 > 2 zeroed, no lower edge
        token_k1         weights [1, 1]           mask [0, 0]      # sampler/trainer 1/3 and 4: outside
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout_correction {mode!r}; expected one of {ROLLOUT_CORRECTIONS}")
    ones = torch.ones_like(mask)
    if mode in KL_REJECTIONS:
        statistic = kl_statistic(old_logprobs - sampler_logprobs, mask, mode)  # [B, T]
        if mode.endswith("k1"):
            keep = (statistic >= math.log(floor)) & (statistic <= math.log(cap))
        else:
            keep = statistic <= kl_threshold
        return ones, mask * keep.to(mask.dtype)
    log_ratio = ((old_logprobs - sampler_logprobs) * mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, T]
    if mode == "geo_tis":
        # The geometric mean of the truncated token weights (verl compute_policy_loss_geo_mean).
        truncated = log_ratio.clamp(max=math.log(cap))
        return _sequence_mean(truncated, mask).exp().expand_as(mask).detach(), mask
    if mode == "geo_mis":
        geometric = _sequence_mean(log_ratio, mask).exp().expand_as(mask)  # [B, T]
        return ones, mask * ((geometric >= floor) & (geometric <= cap)).to(mask.dtype)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).expand_as(mask)
    ratio = log_ratio.exp().detach()  # [B, T]: per token, or its sequence's product on every token
    if mode == "none":
        return ones, mask
    if mode.endswith("tis"):
        return ratio.clamp(max=cap), mask
    if mode == "decoupled":
        return torch.where(ratio <= cap, ratio, torch.zeros_like(ratio)), mask
    inside = (ratio >= floor) & (ratio <= cap)
    if mode.endswith("icepop"):
        return torch.where(inside, ratio, torch.zeros_like(ratio)), mask
    return ones, mask * inside.to(mask.dtype)


def normalize_weights(weights: torch.Tensor, mask: torch.Tensor, mode: str,
                      reduce_sum=None) -> tuple[torch.Tensor, float]:
    """Truncated weights divided by their batch mean, and that mean (verl
    ``rollout_is_batch_normalize``): over the masked tokens for ``"token_tis"``, over the
    sequences with a masked token for the per-sequence weights; over every process's batch
    when `reduce_sum` is given. A mean of 1e-8 or less leaves the weights as they are.

    The truncation bounds the variance, the division removes the bias of the batch's weights
    away from 1 (their expectation under the sampler), so the update's scale stays the
    estimator's.

    >>> weights = torch.tensor([[2.0, 0.5, 1.0]]); mask = torch.tensor([[1.0, 1.0, 0.0]])
    >>> normalize_weights(weights, mask, "token_tis")[0].tolist()
    [[1.6, 0.4, 0.8]]
    """
    if mode == "token_tis":
        totals = torch.stack([(weights * mask).sum(), mask.sum()])
    else:
        rows = (mask.sum(-1) > 0).to(weights.dtype)  # [B]
        totals = torch.stack([(_sequence_mean(weights, mask).squeeze(-1) * rows).sum(), rows.sum()])
    if reduce_sum is not None:
        totals = reduce_sum(totals)
    mean = totals[0] / totals[1].clamp(min=1)
    if not mean > 1e-8:
        return weights, 1.0
    return weights / mean, float(mean)


def off_policy_sequence_mask(advantages: torch.Tensor, logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                             mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, ``[B, T]`` bool (True = kept); no gradient.

    A sequence whose mean ``log(pi_behaviour / pi_current)`` over its tokens exceeds
    `threshold` has drifted too far from the policy that sampled it; its tokens with a
    negative advantage leave the loss's numerator (they stay in its denominator), because
    pushing down a sample the policy no longer resembles is the update that destabilises
    (DeepSeek-V3.2, arXiv 2512.02556, sec. 3.1; TRL `get_off_policy_mask` and
    ``off_policy_mask_threshold``). Kept: ``A >= 0`` or mean KL <= `threshold`.

    Worked example, one row of log-ratios log(pi_behaviour / pi_current) = [0.3, 0.1] (mean
    0.2), threshold 0.1: kept where A >= 0, dropped where A < 0.
    """
    with torch.no_grad():
        drift = _sequence_mean(behaviour_logprobs - logprobs.detach(), mask.to(logprobs.dtype))  # [B, 1]
        return (advantages >= 0) | (drift <= threshold)  # [B, T]


def mismatch_metrics(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                     mode: str = "none", cap: float = 2.0, floor: float = 0.5,
                     kl_threshold: float = 0.01) -> dict[str, float]:
    """What the sampler and the trainer disagree on this step (see the module docstring)."""
    real = mask.bool()
    if not real.any():
        return {}
    log_ratio = (old_logprobs - sampler_logprobs)[real]  # log(trainer / sampler) at sampled tokens
    kl = (torch.expm1(log_ratio) - log_ratio).mean()  # k3 of KL(sampler || trainer): >= 0 token by token
    if mode in ("sequence_tis", "sequence_mis"):
        log_ratio = ((old_logprobs - sampler_logprobs) * mask).sum(-1, keepdim=True).expand_as(mask)[real]
    ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    if mode == "none":
        corrected = torch.zeros_like(ratio, dtype=torch.bool)
    elif mode in ("token_tis", "sequence_tis", "geo_tis", "decoupled"):
        corrected = ratio > cap  # the weight was capped (TIS) or zeroed (decoupled)
    elif mode in ("token_mis", "sequence_mis"):
        corrected = (ratio < floor) | (ratio > cap)
    else:  # the weight was zeroed or the token left the loss
        weights, kept = correction_weights(old_logprobs, sampler_logprobs, mask, mode, cap, floor, kl_threshold)
        corrected = ((weights == 0) | (kept == 0))[real]
    token_ratio = (old_logprobs - sampler_logprobs)[real].exp()
    gap = (old_logprobs - sampler_logprobs)[real].abs()  # |logp_trainer - logp_sampler| per token
    return {"rollout_mismatch_kl": float(kl), "rollout_ratio_min": float(token_ratio.min()),
            "rollout_ratio_max": float(token_ratio.max()), "rollout_corrected_frac": float(corrected.float().mean()),
            "rollout_logprob_gap_mean": float(gap.mean()), "rollout_logprob_gap_max": float(gap.max())}


def behaviour_logprobs(config, rollout, temperature: float) -> torch.Tensor | None:
    """The sampler's log-probs ``[B, T]`` for the update's buffer, where a correction acts with
    the current policy (`off_policy_mask_threshold`); None otherwise."""
    if config.off_policy_mask_threshold is None:
        return None
    return sampler_token_logprobs(rollout, temperature)


def correct(config, rollout, old_logprobs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor,
            temperature: float, reduce_sum=None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The trainer's one call: `(advantages, loss_mask, metrics)` after the configured
    correction; unchanged and no metrics when neither a correction nor the log is asked for.
    `reduce_sum` sums over the processes (the batch mean of `rollout_correction_batch_normalize`)."""
    mode = config.rollout_correction
    if mode == "none" and not config.log_rollout_mismatch and rollout.sampler_logprobs is None:
        return advantages, loss_mask, {}

    sampler_logprobs = sampler_token_logprobs(rollout, temperature)  # [B, T]
    limits = dict(cap=config.rollout_correction_cap, floor=config.rollout_correction_floor,
                  kl_threshold=config.rollout_correction_kl_threshold)
    weights, corrected = correction_weights(old_logprobs, sampler_logprobs, loss_mask, mode, **limits)
    metrics = mismatch_metrics(old_logprobs, sampler_logprobs, loss_mask, mode, **limits)
    if config.rollout_correction_batch_normalize and mode in TRUNCATED_CORRECTIONS:
        weights, metrics["rollout_weight_batch_mean"] = normalize_weights(weights, loss_mask, mode, reduce_sum)
    return advantages * weights, corrected, metrics

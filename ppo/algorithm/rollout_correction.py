"""Correcting for the mismatch between the sampler's and the trainer's log-probs.

The tokens are drawn by the sampler (a different kernel, a different precision, vLLM in
large setups) but the loss treats them as drawn by the trainer's old policy. When the two
disagree, the update is off-policy without knowing it. Every sampled token's ratio

    w_t = pi_old(y_t) / pi_sampler(y_t) = exp(old_logprobs - sampler_logprobs)

(trainer over sampler) measures the disagreement; the corrections reweight or drop tokens by it.

Implementation details that live here (`PPOConfig.rollout_correction`, `rollout_correction_cap`,
`rollout_correction_floor`, `sampling_precision`, `log_rollout_mismatch`):

- **Truncated importance sampling** (TIS): each token's policy loss times ``min(w, cap)``
  (``"token_tis"``) or each sequence's times ``min(prod_t w_t, cap)`` (``"sequence_tis"``);
  detached (verl `compute_rollout_correction_weights`, ``rollout_is_threshold`` 2.0; Yao et
  al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
- **Masked importance sampling** (MIS, IcePop-style band): tokens (``"token_mis"``) or whole
  sequences (``"sequence_mis"``) whose ratio falls outside ``[floor, cap]`` leave the loss
  (verl `compute_rollout_rejection_mask`, ``rollout_rs``; IcePop, Ring-1T 2025).
- **A real mismatch to test on**: ``sampling_precision="bf16"`` samples under bf16 autocast
  (through Hugging Face's `generate`: ``lean_forward=False``) while the trainer scores in fp32 ("Defeating the training-inference mismatch via FP16",
  arXiv 2510.26788, reports the precision as the main source).
- **The logged mismatch**: ``rollout_mismatch_kl`` (k3 estimate of KL(sampler || trainer) per
  token), ``rollout_ratio_min`` / ``rollout_ratio_max`` (token ratios),
  ``rollout_corrected_frac`` (tokens whose weight was capped or which were masked),
  ``rollout_logprob_gap_mean`` / ``rollout_logprob_gap_max`` (mean and largest
  |logp_trainer - logp_sampler| per token). Logged every step when the sampler returns its
  own log-probs (``generation_backend="vllm"``, ppo/parallel/vllm_sampler.py), which it always does.

The TIS weight is applied by scaling the advantages: every clipped surrogate is a min / max of
terms linear in the advantage, so a positive per-token factor moves through it exactly.
"""

from __future__ import annotations

import contextlib

import torch

ROLLOUT_CORRECTIONS = ("none", "token_tis", "sequence_tis", "token_mis", "sequence_mis")
SAMPLING_PRECISIONS = ("fp32", "bf16")
LOG_RATIO_BOUND = 20.0  # exp(20) is already far past any cap; keeps a sequence's product finite (verl SAFETY_BOUND)


def wants_sampler_logprobs(config) -> bool:
    """Whether sampling must keep its logits for the correction or the mismatch log."""
    return config.rollout_correction != "none" or config.log_rollout_mismatch


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


def correction_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                       mode: str, cap: float = 2.0, floor: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss weights and the loss mask they leave, ``([B, T], [B, T])``.

    Args:
        old_logprobs: `[B, T]` the trainer's log-probs of the sampled tokens.
        sampler_logprobs: `[B, T]` the sampler's.
        mask: `[B, T]` the loss mask.
        mode: one of `ROLLOUT_CORRECTIONS`.
        cap, floor: TIS truncates weights at `cap`; MIS keeps ratios inside ``[floor, cap]``.

    Worked example (one sequence of two tokens, ratios w = [3, 0.25], cap 2, floor 0.5)::

        token_tis     weights [2, 0.25]      mask [1, 1]
        sequence_tis  weights [0.75, 0.75]   mask [1, 1]      # prod w = 0.75
        token_mis     weights [1, 1]         mask [0, 0]      # 3 > 2, 0.25 < 0.5
        sequence_mis  weights [1, 1]         mask [1, 1]      # 0.75 is inside the band
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout_correction {mode!r}; expected one of {ROLLOUT_CORRECTIONS}")
    log_ratio = ((old_logprobs - sampler_logprobs) * mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, T]
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).expand_as(mask)
    ratio = log_ratio.exp().detach()  # [B, T]: per token, or its sequence's product on every token
    ones = torch.ones_like(mask)
    if mode == "none":
        return ones, mask
    if mode.endswith("tis"):
        return ratio.clamp(max=cap), mask
    inside = ((ratio >= floor) & (ratio <= cap)).to(mask.dtype)
    return ones, mask * inside


def mismatch_metrics(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                     mode: str = "none", cap: float = 2.0, floor: float = 0.5) -> dict[str, float]:
    """What the sampler and the trainer disagree on this step (see the module docstring)."""
    real = mask.bool()
    if not real.any():
        return {}
    log_ratio = (old_logprobs - sampler_logprobs)[real]  # log(trainer / sampler) at sampled tokens
    kl = (torch.expm1(log_ratio) - log_ratio).mean()  # k3 of KL(sampler || trainer): >= 0 token by token
    if mode.startswith("sequence"):
        log_ratio = ((old_logprobs - sampler_logprobs) * mask).sum(-1, keepdim=True).expand_as(mask)[real]
    ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    if mode == "none":
        corrected = torch.zeros_like(ratio, dtype=torch.bool)
    elif mode.endswith("tis"):
        corrected = ratio > cap
    else:
        corrected = (ratio < floor) | (ratio > cap)
    token_ratio = (old_logprobs - sampler_logprobs)[real].exp()
    gap = (old_logprobs - sampler_logprobs)[real].abs()  # |logp_trainer - logp_sampler| per token
    return {"rollout_mismatch_kl": float(kl), "rollout_ratio_min": float(token_ratio.min()),
            "rollout_ratio_max": float(token_ratio.max()), "rollout_corrected_frac": float(corrected.float().mean()),
            "rollout_logprob_gap_mean": float(gap.mean()), "rollout_logprob_gap_max": float(gap.max())}


def correct(config, rollout, old_logprobs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor,
            temperature: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The trainer's one call: `(advantages, loss_mask, metrics)` after the configured
    correction; unchanged and no metrics when neither a correction nor the log is asked for."""
    mode = config.rollout_correction
    if mode == "none" and not config.log_rollout_mismatch and rollout.sampler_logprobs is None:
        return advantages, loss_mask, {}

    sampler_logprobs = sampler_token_logprobs(rollout, temperature)  # [B, T]
    cap, floor = config.rollout_correction_cap, config.rollout_correction_floor
    weights, corrected = correction_weights(old_logprobs, sampler_logprobs, loss_mask, mode, cap, floor)
    metrics = mismatch_metrics(old_logprobs, sampler_logprobs, loss_mask, mode, cap, floor)
    return advantages * weights, corrected, metrics

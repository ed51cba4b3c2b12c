"""The losses of one PPO / GRPO update step, in verl's shape: every loss returns `(loss, metrics)`.

Implementation details that live here:

- **Loss aggregation** (`aggregate`, `LOSS_AGG_MODES`): how per-token losses become one
  number. `token_mean` (PPO as AlpacaFarm and TRL average it; DAPO's token-level loss),
  `seq_mean_token_mean` (GRPO's per-sequence length normalisation, which biases wrong
  answers toward being long), `seq_mean_token_sum` (each sequence's token sum averaged
  over sequences: REINFORCE on the whole sequence's log-probability, TRL RLOO, verl
  `seq-mean-token-sum`) and `seq_mean_token_sum_norm` (Dr. GRPO's fix: a constant
  normaliser; AlpacaFarm's `.mean()` over a batch padded to `response_len`) and
  `prompt_mean` (SkyRL: a token mean inside each prompt's group, averaged over prompts)
  and `token_sum` (every masked token summed, no normaliser at all; verl `token-sum`).
  `loss_units` says what each mode divides by, which is what makes gradient accumulation
  exact (`ppo.algorithm.buffer.accumulation_weights`).
- **The policy loss** (`policy_loss`, re-exported from `ppo/algorithm/policy_losses.py`): a registry
  of surrogates chosen by `PPOConfig.policy_loss`: PPO's clipped loss with clip-higher and
  dual clip, GSPO, CISPO, GMPO, Clip-Cov and KL-Cov.
- **Value clipping** (`value_loss`): the critic's regression loss, optionally clipped
  around the old values (AlpacaFarm, TRL; "The N+ Implementation Details of RLHF with PPO").
  `critic_loss_mask` says which positions it covers: AlpacaFarm's critic is trained on
  padding too (`PPOConfig.value_loss_over_padding`), TRL's one column past the last token.
- **Positive-example NLL** (`positive_nll_loss`, VAPO): the language-model loss on the
  correct responses, added to the policy loss (`PPOConfig.positive_nll_coef`).
- **Entropy bonus** (`entropy_loss`) and **KL in the loss** (`kl_loss`, GRPO's k3 estimator
  to the reference policy, DeepSeekMath).
- **Diagnostics**: clip fractions, approximate KL to the old policy, ratio statistics and
  the critic's `explained_variance`.

All tensors are `[B, T]` over response positions with a `response_mask`; padding positions
never enter a loss or a metric unless a toggle that reproduces a source puts them there. Metrics are plain Python floats.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "prompt_mean",
                  "token_sum")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked positions; 0 for an empty mask rather than nan."""
    mask = mask.bool()
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp(min=1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    max_len: int | None = None,
    skip_empty_rows: bool = False,
    group_share: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a `[B, T]` per-token loss to a scalar over the masked tokens.

    - `"token_mean"`: sum over all masked tokens / number of masked tokens. Every token in
      the batch weighs the same (PPO as in TRL/AlpacaFarm; DAPO's token-level policy
      gradient loss). It is not Dr. GRPO's fix: its denominator still depends on the
      lengths in the batch; Dr. GRPO divides by a constant (`seq_mean_token_sum_norm`).
      The denominator counts the whole minibatch over all processes (TRL `loss_type="dapo"`,
      global `num_items_in_batch`). TRL's `bnpo` is its non-global variant: a token mean per
      micro-batch and process, averaged over accumulation steps, so equal to this with one
      micro-batch on one process and otherwise dependent on how the batch is split; not
      offered, as every mode here is exact under accumulation.
    - `"seq_mean_token_mean"`: mean over sequences of each sequence's masked mean. Each
      *sequence* weighs the same, whatever its length (GRPO as written in DeepSeekMath).
    - `"seq_mean_token_sum"`: mean over sequences of each sequence's masked *sum*: the
      policy gradient of a sequence's total log-probability, as REINFORCE-style RLOO takes
      it (TRL `RLOOTrainer` sums log-probs per sequence; verl `seq-mean-token-sum`). A long
      sequence weighs more, in proportion to its length.
    - `"seq_mean_token_sum_norm"`: sum over all masked tokens / (B * max_len), `max_len`
      defaulting to T. A constant normaliser, independent of the lengths in the batch
      (Dr. GRPO).
    - `"prompt_mean"`: a token mean inside each prompt's group of responses, then a mean
      over the prompts: each *prompt* weighs the same, however many tokens its responses
      hold (SkyRL `loss_reduction="prompt_mean"`). With one response per prompt it is
      `seq_mean_token_mean`. It needs `group_share` (`[B]`, from `group_shares`): each
      row's share of its group, its masked tokens over the group's, so that a group split
      over micro-batches or minibatch rows still counts once. A row's token weighs
      `group_share / row_tokens` = 1 / group_tokens, and the units are the groups.
    - `"token_sum"`: the sum over all masked tokens, with no normaliser (verl `token-sum`,
      the aggregation of its REINFORCE bypass recipe). Every token weighs 1 whatever the
      batch holds, so the gradient grows with the number of tokens: a larger batch or longer
      answers take a larger step (the learning rate absorbs the scale). Exact under
      accumulation and across processes with weight 1 per micro-batch (`loss_units` is 1).

    Why per-sequence normalisation lets long wrong answers escape their penalty. Take two
    wrong answers with advantage A = -1, one 10 tokens long and one 100 tokens long. Under
    `seq_mean_token_mean` the 10-token answer's tokens each get a push of 1/10 = 0.1 away
    from being sampled again, the 100-token answer's tokens only 1/100 = 0.01. In terms of
    the whole sequence's log-probability, the gradient is (A / length) * grad log p(y): the
    penalty a wrong answer receives shrinks as 1/length, so among wrong answers the longer
    one is punished ten times less and the policy is nudged to ramble when it is wrong
    (and, for right answers, to be short). Under `token_mean` or the constant normaliser
    every token gets the same push, so a wrong answer's total penalty grows with its
    length as in the unnormalised policy gradient, and the bias disappears.

    `skip_empty_rows` (the sequence modes only): a row with no token in the mask (a group
    removed by difficulty filtering, a truncated response under DAPO's overlong masking)
    does not count in the number of sequences. Without it such a row adds 0 to the sum but
    1 to the denominator, so masking rows only shrinks the loss: the mean is then over the
    rows that are left (`PPOConfig.difficulty_filter_mode`).

    Worked example, values `[[1, 2, 3], [4, 5, 6]]`, mask `[[1, 1, 1], [1, 0, 0]]`:
    token_mean = (1+2+3+4)/4 = 2.5; seq_mean_token_mean = (2 + 4)/2 = 3.0;
    seq_mean_token_sum = (6 + 4)/2 = 5.0; seq_mean_token_sum_norm = 10/(2*3) = 1.667;
    token_sum = 1+2+3+4 = 10. With mask `[[1, 1, 1], [0, 0, 0]]`,
    seq_mean_token_mean = 2/2 = 1.0, or 2/1 = 2.0 with `skip_empty_rows`. Under
    `prompt_mean`, values `[[1, 2, 3], [4, 5, 6], [7, 8, 9]]`, mask `[[1, 1, 1], [1, 0, 0],
    [1, 1, 0]]`, rows 0-1 one prompt and row 2 another: group means (1+2+3+4)/4 = 2.5 and
    (7+8)/2 = 7.5, so prompt_mean = (2.5 + 7.5)/2 = 5.0, where token_mean gives 25/6 = 4.167
    and seq_mean_token_mean (2 + 4 + 7.5)/3 = 4.5.
    """
    is_real = mask.bool()
    # torch.where, not values * mask: padding may hold inf/nan and inf * 0 = nan.
    masked = torch.where(is_real, values, torch.zeros_like(values))  # [B, T]
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg must be one of {LOSS_AGG_MODES}, got loss_agg={mode!r}")
    units = _nonzero(loss_units(mask, mode, skip_empty_rows, group_share))  # tokens, sequences or groups
    if mode == "prompt_mean":
        token_weight = group_share.to(values.dtype) / is_real.sum(-1).clamp(min=1)  # [B]: 1 / group tokens
        return (masked.sum(-1) * token_weight).sum() / units
    if mode in ("token_mean", "token_sum"):
        return masked.sum() / units  # token_sum: units is 1
    if mode == "seq_mean_token_mean":
        seq_means = masked.sum(-1) / is_real.sum(-1).clamp(min=1)  # [B]
        return seq_means.sum() / units
    if mode == "seq_mean_token_sum":
        return masked.sum() / units  # the sum of the rows' sums, over the number of rows
    horizon = values.shape[-1] if max_len is None else max_len
    return masked.sum() / (units * horizon)


def _nonzero(units: torch.Tensor) -> torch.Tensor:
    """`units`, or 1 where it is 0 (an empty mask gives a loss of 0, not nan). Not a clamp at
    1: `prompt_mean`'s units are fractions of groups."""
    return torch.where(units > 0, units, torch.ones_like(units))


def loss_units(mask: torch.Tensor, mode: str = "token_mean", skip_empty_rows: bool = False,
               group_share: torch.Tensor | None = None) -> torch.Tensor:
    """What `aggregate` divides by (before `max_len`), in units that add up over micro-batches.

    Tokens in the mask under `token_mean`; 1 under `token_sum` (a sum has no normaliser, so
    each micro-batch weighs 1 and the weighted sum is the minibatch's sum); sequences under the three `seq_mean` modes (only
    the rows with a token in the mask when `skip_empty_rows`); prompt groups under
    `prompt_mean`, the sum of the rows' `group_share` (a micro-batch holding half of a
    group's tokens counts half a group; `skip_empty_rows` is already in the shares,
    `group_shares`). Gradient accumulation is
    exact when each micro-batch's loss is weighted by its units over the whole minibatch's
    (`ppo.algorithm.buffer.accumulation_weights`): then sum_k w_k * sum_k / units_k = sum / units.

    >>> loss_units(torch.tensor([[1, 1, 0], [0, 0, 0]]), "token_mean").item()
    2.0
    >>> loss_units(torch.tensor([[1, 1, 0], [0, 0, 0]]), "seq_mean_token_mean", skip_empty_rows=True).item()
    1.0
    """
    is_real = mask.bool()
    if mode == "token_mean":
        return is_real.sum().float()
    if mode == "token_sum":
        return torch.tensor(1.0, device=mask.device)
    if mode == "prompt_mean":
        if group_share is None:
            raise ValueError("loss_agg='prompt_mean' needs each row's group_share (ppo.algorithm.losses.group_shares)")
        return group_share.sum().float()
    if skip_empty_rows:
        return is_real.any(-1).sum().float()
    return torch.tensor(float(mask.shape[0]), device=mask.device)


def group_shares(mask: torch.Tensor, group_ids: torch.Tensor, skip_empty_rows: bool = False) -> torch.Tensor:
    """Each row's share of its prompt group, ``[B]`` float64, for `loss_agg="prompt_mean"`.

    A row's share is its masked tokens over its group's masked tokens (the rows of `mask`
    with the same `group_ids`), so the shares of a group add up to 1 and `aggregate` gives
    each of the group's tokens the weight 1 / group tokens. A group with no masked token
    (filtered, or every response truncated under overlong masking) still counts as one
    prompt, its rows sharing it equally, as SkyRL counts every prompt of the minibatch; with
    `skip_empty_rows` it counts 0 and leaves the denominator.

    >>> group_shares(torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]]), torch.tensor([0, 0, 1, 1])).tolist()
    [0.75, 0.25, 1.0, 0.0]
    >>> group_shares(torch.tensor([[1, 0], [0, 0], [0, 0]]), torch.tensor([0, 1, 1])).tolist()
    [1.0, 0.5, 0.5]
    """
    row_tokens = mask.bool().sum(-1).double()  # [B]
    _, group = torch.unique(group_ids, return_inverse=True)  # [B]: 0..groups-1
    count = int(group.max()) + 1 if group.numel() else 0
    group_tokens = torch.zeros(count, dtype=torch.float64, device=mask.device).index_add_(0, group, row_tokens)[group]
    group_rows = torch.bincount(group, minlength=count).double()[group]  # [B]
    empty_group_share = torch.zeros_like(row_tokens) if skip_empty_rows else 1.0 / group_rows
    return torch.where(group_tokens > 0, row_tokens / group_tokens.clamp(min=1), empty_group_share)


def token_loss_weights(mask: torch.Tensor, mode: str = "token_mean", max_len: int | None = None,
                       skip_empty_rows: bool = False, group_share: torch.Tensor | None = None) -> torch.Tensor:
    """The weight `aggregate` gives each real token of a row, relative to `token_mean`'s, ``[B]``.

    `aggregate(values, mask, mode)` is linear in `values`; this returns, per row, the
    derivative of the loss with respect to any one of that row's masked tokens, times the
    number of masked tokens in the batch, so that `token_mean` gives 1 to every token. Under
    `seq_mean_token_mean` a row of length L gets N / (B * L): long rows' tokens weigh less,
    which is how GRPO's per-sequence normalisation lets long wrong answers escape their
    penalty. Under `seq_mean_token_sum` every row gets N / B; under `seq_mean_token_sum_norm`
    every row gets N / (B * max_len); under `prompt_mean` N / (groups * group tokens); under
    `token_sum` N.
    Rows with no
    masked token get 0. The trainer logs these for incorrect responses (the
    `loss_weight_incorrect_*` metrics) to show how much less push long wrong answers got.

    Worked example, mask `[[1, 1, 1, 1], [1, 0, 0, 0]]` (N = 5 tokens, B = 2 rows, T = 4):
    token_mean [1, 1]; seq_mean_token_mean [5/8, 5/2]; seq_mean_token_sum [5/2, 5/2];
    seq_mean_token_sum_norm [5/8, 5/8].
    """
    is_real = mask.bool()
    lengths = is_real.sum(-1).float()  # [B]
    total_tokens = lengths.sum().clamp(min=1)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg must be one of {LOSS_AGG_MODES}, got loss_agg={mode!r}")
    units = _nonzero(loss_units(mask, mode, skip_empty_rows, group_share))
    if mode == "prompt_mean":
        per_token = group_share.float() / (units * lengths.clamp(min=1))
    elif mode in ("token_mean", "token_sum"):
        per_token = torch.ones_like(lengths) / units
    elif mode == "seq_mean_token_mean":
        per_token = 1.0 / (units * lengths.clamp(min=1))
    elif mode == "seq_mean_token_sum":
        per_token = torch.ones_like(lengths) / units
    else:
        per_token = torch.full_like(lengths, 1.0) / (units * (mask.shape[-1] if max_len is None else max_len))
    return torch.where(lengths > 0, per_token * total_tokens, torch.zeros_like(per_token))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range_value: float | None = None,
    loss_agg: str = "token_mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's regression loss `0.5 * (V - R)^2`, optionally with value clipping.

    Value clipping (AlpacaFarm, TRL; "The N+ Implementation Details of RLHF with PPO")
    mirrors the policy's ratio clipping: the new value may move at most
    `clip_range_value` from the value recorded at rollout time, and the loss takes the
    pessimistic max::

        V_clipped = old_V + clamp(V - old_V, -eps, eps)
        loss_t    = 0.5 * max((V - R)^2, (V_clipped - R)^2)

    Where the clipped term wins its gradient is zero, so a value that has already moved
    `eps` toward its target stops moving for the rest of this rollout batch.

    Metrics: `vf_loss`, `vf_clipfrac` (clipped term chosen), `value_mean`, `value_error`
    (masked mean of the unclipped (V - R)^2).

    Worked example (eps 0.2): V = 1, old_V = 0, R = 2 gives unclipped 0.5 * 1 = 0.5 but
    V_clipped = 0.2 and 0.5 * 1.8^2 = 1.62, so the loss is 1.62 (clipped, no gradient).
    """
    unclipped_sq = (values - returns).pow(2)  # [B, T]
    if clip_range_value is None:
        per_token = 0.5 * unclipped_sq  # [B, T]
        is_clipped = torch.zeros_like(per_token, dtype=torch.bool)  # [B, T]
    else:
        values_clipped = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)  # [B, T]
        clipped_sq = (values_clipped - returns).pow(2)  # [B, T]
        per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)  # [B, T]
        is_clipped = clipped_sq > unclipped_sq  # [B, T]

    loss = aggregate(per_token, response_mask, loss_agg, max_len)
    with torch.no_grad():
        mask = response_mask.bool()
        metrics = {
            "vf_loss": loss.item(),
            "vf_clipfrac": _masked_mean(is_clipped.float(), mask).item(),
            "value_mean": _masked_mean(values, mask).item(),
            "value_error": _masked_mean(unclipped_sq, mask).item(),
        }
    return loss, metrics


def critic_loss_mask(loss_mask: torch.Tensor, over_padding: bool = False,
                     score_position: str = "last_token") -> torch.Tensor:
    """The positions the critic's loss averages over, ``[B, T]``.

    By default the policy's loss mask. `over_padding` (`PPOConfig.value_loss_over_padding`):
    every column of each row in the loss, padding included, so that over a fixed-width
    batch the loss is AlpacaFarm's ``.mean()`` over ``[B, response_len]``. `score_position`
    ``"after_last_token"``: the loss mask plus the column after each row's last token (TRL's
    ``~padding_mask_p1``), where that score sits. A row left out of the loss (filtered,
    dropped) stays out either way.

    >>> m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    >>> critic_loss_mask(m, over_padding=True).tolist(), critic_loss_mask(m, score_position="after_last_token").tolist()
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    """
    from ppo.algorithm.rewards import score_positions

    if over_padding:
        return loss_mask.amax(-1, keepdim=True).expand_as(loss_mask).clone()  # [B, T]
    return score_positions(loss_mask, score_position)  # [B, T]


def positive_nll_loss(logprobs: torch.Tensor, positive_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """VAPO's positive-example language-model loss: the mean negative log-likelihood of the
    tokens of the correct responses, ``[b, T]`` in, a scalar out.

    VAPO (Yue et al. 2025, arXiv 2504.05118, sec. 3.3, eq. 10) adds ``mu * L_NLL`` to the
    policy loss, where ``L_NLL = -(1 / sum |o_i|) sum_i sum_t log pi(o_it)`` over the correct
    responses ``o_i`` of the batch (mu = 0.1): the few right answers the policy finds are
    imitated as well as reinforced, so they are learned faster. `positive_mask` is the loss
    mask times the response's verdict. A token mean over those tokens, so gradient
    accumulation is exact with each micro-batch weighted by its share of the minibatch's
    positive tokens (`ppo.algorithm.buffer.accumulation_weights` under ``"token_mean"``).
    NeMo-RL (`positive_example_nll_weight`) divides by each micro-batch's own count instead.

    Worked example, logprobs [[-1, -2], [-3, -4]], positive mask [[1, 1], [0, 0]]:
    NLL = (1 + 2) / 2 = 1.5. No positive token: 0.
    """
    loss = aggregate(-logprobs, positive_mask, "token_mean")
    return loss, {"positive_nll": loss.item()}


def entropy_loss(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    loss_agg: str = "token_mean",
    max_len: int | None = None,
    skip_empty_rows: bool = False,
    group_share: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregated per-token policy entropy; the trainer subtracts `entropy_coef * entropy`.

    An entropy bonus keeps the policy from collapsing onto one answer too early (standard
    PPO; most RLHF recipes set its coefficient to 0 and only log it). Aggregated with the
    same `loss_agg` as the policy loss so the two terms weigh tokens alike.

    Returns `(entropy_value, {"entropy": ...})`.
    """
    value = aggregate(entropy, mask, loss_agg, max_len, skip_empty_rows, group_share)
    return value, {"entropy": value.item()}


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str = "k3",
    loss_agg: str = "token_mean",
    max_len: int | None = None,
    skip_empty_rows: bool = False,
    group_share: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL to the reference policy as a loss term (GRPO, DeepSeekMath), not a reward.

    GRPO has no value model to carry a per-token KL reward through GAE, so it adds
    `kl_coef * KL` to the loss directly. It uses the k3 estimator
    `exp(ref - logp) - (ref - logp) - 1`, which is non-negative and unbiased for
    KL(policy || reference) when tokens are sampled from the policy. Estimators come from
    `ppo.algorithm.kl.kl_penalty`; ``"full"`` takes the full log-softmax of both models instead
    (`log_probs`, `ref_log_probs`, ``[B, T, V]``; `ppo.algorithm.kl.full_kl`). With `old_logprobs`
    each token's estimate is weighted by ``pi / sg(pi_old)`` (`ppo.algorithm.kl.importance_weighted_kl`,
    TRL's `use_bias_correction_kl`).

    Returns `(loss, {"kl_loss": ...})`; the trainer multiplies by the coefficient.
    """
    from ppo.algorithm.kl import full_kl, importance_weighted_kl, kl_penalty

    if estimator == "full":
        per_token = full_kl(log_probs, ref_log_probs)  # [B, T]
    else:
        per_token = kl_penalty(logprobs, ref_logprobs, estimator=estimator)  # [B, T]
    if old_logprobs is not None:
        per_token = importance_weighted_kl(per_token, logprobs, old_logprobs)  # [B, T]
    loss = aggregate(per_token, mask, loss_agg, max_len, skip_empty_rows, group_share)
    return loss, {"kl_loss": loss.item()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, reduce_sum=None) -> float:
    """How much of the returns' variance the critic explains: `1 - Var[R - V] / Var[R]`.

    1 is a perfect critic, 0 is no better than predicting the mean return, negative is
    worse than that. Masked; `nan` when the returns have no variance (nothing to explain).
    `reduce_sum` (`ppo.parallel.distributed.global_sum`) takes the variances over every process's
    tokens in a data-parallel run.

    >>> r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    >>> explained_variance(r, r, torch.ones(1, 4))
    1.0
    """
    from gae.whiten import population_moments

    with torch.no_grad():
        is_real = mask.bool()
        real_returns = returns[is_real].double()
        residual = real_returns - values[is_real].double()
        count, _, var_returns = population_moments(real_returns, reduce_sum)
        if count == 0:
            return float("nan")
        _, _, var_residual = population_moments(residual, reduce_sum)
        if var_returns == 0:
            return float("nan")
        return (1.0 - var_residual / var_returns).item()


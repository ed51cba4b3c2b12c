"""Turning sequence scores into per-token rewards.

A reward model or a task checker gives one number per response; PPO wants one reward per
token. Everything between those two lives here, in the order the training loop applies it:

- **Missing-EOS handling** (`apply_missing_eos`): a response that ran out of tokens before
  emitting a stop token is either left alone, penalised by a constant (TRL's
  `missing_eos_penalty`), or given a fixed low score (OpenAI lm-human-preferences; "The N+ Implementation
  Details of RLHF with PPO"), so the policy cannot farm reward with unfinished answers.
- **Score clipping** (`clip_scores`): clamp reward-model scores to `[-clip, clip]` so a
  few outliers cannot dominate a batch.
- **Score at the last response token, KL in the reward** (`shape_rewards`): the classic
  RLHF reward `r_t = -beta * KL_t`, plus the sequence score on the final real token
  (AlpacaFarm, N+ details), or one column after it (`PPOConfig.score_position`,
  `score_positions`: TRL's PPOTrainer).
- **Reward whitening** (`whiten_rewards`): rescale rewards to unit variance without
  moving their mean; AlpacaFarm's variant includes padding positions in the statistics,
  which is kept as a toggle.
- **Kimi k1.5 length reward** (`kimi_length_reward`, `group_kimi_length_reward`): within
  a group of answers to one prompt, reward short correct answers and penalise long ones,
  asymmetrically for wrong answers; `length_reward_weight` switches it on only after a
  warm-up (`length_reward_warmup_steps`), as Kimi k1.5 does.
- **DAPO's soft overlong punishment** (`overlong_penalty`): a score penalty that rises
  linearly over the last `buffer_length` tokens before the length limit, the soft form of
  leaving truncated responses out of the loss (`mask_truncated_responses`).
- **Format reward** (`format_reward`): a bonus for a well-formed response (answer marker
  and stop token), DeepSeek R1's second rule-based reward next to accuracy.

All functions are pure: tensors in, tensors out, plain numbers for settings.
"""

from __future__ import annotations

import torch
from einops import rearrange

MISSING_EOS_MODES = ("none", "penalty", "replace")
SCORE_POSITIONS = ("last_token", "after_last_token")


def apply_missing_eos(
    scores: torch.Tensor,
    has_eos: torch.Tensor,
    mode: str = "none",
    penalty: float = 1.0,
    replace_value: float = -1.0,
) -> torch.Tensor:
    """Adjust the scores of responses that never emitted a stop token.

    A response cut off at `max_new_tokens` is usually unfinished, yet a reward model may
    still score it well. Without a cost, the policy learns to ramble until truncation.

    - `"none"`: scores unchanged.
    - `"penalty"`: subtract `penalty` from truncated responses (TRL's `missing_eos_penalty`).
    - `"replace"`: a truncated response gets `replace_value` whatever its score (OpenAI lm-human-preferences;
      "The N+ Implementation Details of RLHF with PPO" use a fixed -1).

    Args:
        scores: `[B]` sequence scores.
        has_eos: `[B]` bool, True where the response ended with a stop token.

    >>> s, eos = torch.tensor([1.0, 2.0]), torch.tensor([True, False])
    >>> apply_missing_eos(s, eos, "penalty", penalty=0.5).tolist()
    [1.0, 1.5]
    >>> apply_missing_eos(s, eos, "replace", replace_value=-1.0).tolist()
    [1.0, -1.0]
    """
    has_eos = has_eos.bool()
    if mode == "none":
        return scores
    if mode == "penalty":
        return scores - penalty * (~has_eos).to(scores.dtype)  # [B]
    if mode == "replace":
        return torch.where(has_eos, scores, torch.full_like(scores, replace_value))  # [B]
    raise ValueError(f"mode must be one of {MISSING_EOS_MODES}, got mode={mode!r}")


def clip_scores(scores: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Clamp sequence scores to `[-clip, clip]`; `clip=None` leaves them unchanged.

    A reward model scores out-of-distribution text wildly; one extreme score would
    otherwise dominate the advantages of the whole batch (TRL's `score_clip`).

    >>> clip_scores(torch.tensor([-3.0, 0.5, 3.0]), 1.0).tolist()
    [-1.0, 0.5, 1.0]
    """
    if clip is None:
        return scores
    if clip <= 0:
        raise ValueError(f"clip must be positive or None, got clip={clip}")
    return scores.clamp(-clip, clip)


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real response token of each row (responses are right-padded).

    >>> last_token_index(torch.tensor([[1, 1, 1], [1, 0, 0]])).tolist()
    [2, 0]
    """
    lengths = response_mask.long().sum(-1)  # [B]
    if (lengths == 0).any():
        empty = torch.nonzero(lengths == 0).flatten().tolist()
        raise ValueError(f"response_mask has empty rows {empty}: no token to put the score on")
    return lengths - 1  # [B]


def shape_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_in_reward: bool = True,
    score_position: str = "last_token",
) -> torch.Tensor:
    """Per-token rewards: `-kl_coef * kl` on each response token, plus the score at the end.

    Why the score goes on the *last* response token: the reward model judges the whole
    response, so its verdict only exists once the final token has been chosen. In the
    token-level MDP that is a terminal reward; every earlier token is credited through
    the return (GAE propagates it backwards, discounted by gamma * lambda), exactly as
    in an episodic game where the win arrives at the last move. Putting it anywhere
    earlier would hand tokens credit for text they had not yet produced. It must be the
    last *real* token, not the last column: padding is outside the mask, so a score
    placed there would be ignored by the masked GAE and the loss (AlpacaFarm and TRL
    index the terminal position from the response length for the same reason).

    The KL term `-kl_coef * kl_t` is the per-token penalty for drifting from the
    reference model (Ziegler et al.; AlpacaFarm, TRL). With `kl_in_reward=False` (GRPO,
    which puts the KL in the loss instead) only the score remains.

    `score_position="after_last_token"` (`PPOConfig.score_position`) puts the score one
    column later, where the width has one, as TRL's PPOTrainer does (`actual_end =
    sequence_lengths + 1` unless that is past the last column): that column is the state
    after the stop token, which TRL's critic values and is trained on, so the score reaches
    the real tokens through GAE discounted once more by gamma * lambda. Its masks come from
    `score_positions`. With no stop token every response fills the width and the two
    positions coincide.

    Args:
        scores: `[B]` sequence scores.
        kl: `[B, T]` per-token KL estimates (from `ppo.algorithm.kl.kl_penalty`).
        response_mask: `[B, T]`, 1 on real response tokens; no row may be empty.
        kl_coef: beta, the KL coefficient.

    >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> kl = torch.tensor([[0.5, 1.0, 2.0], [1.0, 3.0, 9.9]])  # 9.9 sits on padding
    >>> shape_rewards(torch.tensor([2.0, 4.0]), kl, mask, kl_coef=0.5).tolist()
    [[-0.25, -0.5, 1.0], [-0.5, 2.5, 0.0]]
    """
    mask = response_mask.bool()
    last = last_token_index(response_mask)  # [B]
    if score_position == "after_last_token":
        last = (last + 1).clamp(max=response_mask.shape[1] - 1)  # [B]: TRL's actual_end
    elif score_position != "last_token":
        raise ValueError(f"score_position must be one of {SCORE_POSITIONS}, got {score_position!r}")
    if kl_in_reward:
        # torch.where, not multiplication: KL on padding may be inf/nan, and inf * 0 = nan.
        token_rewards = torch.where(mask, -kl_coef * kl, torch.zeros_like(kl))  # [B, T]
    else:
        token_rewards = torch.zeros_like(kl, dtype=scores.dtype)  # [B, T]
    rows = torch.arange(token_rewards.shape[0], device=token_rewards.device)  # [B]
    token_rewards = token_rewards.clone()
    token_rewards[rows, last] += scores.to(token_rewards.dtype)
    return token_rewards  # [B, T]


def whiten_rewards(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, over_padding: str | bool = "masked", reduce_sum=None
) -> torch.Tensor:
    """Reward whitening: scale rewards to unit variance, keeping their mean.

    Used by AlpacaFarm and OpenAI's lm-human-preferences (`whiten_rewards`). The
    `shift_mean=False` form divides by the standard deviation but adds the mean back: the
    sign of the average reward still carries information (a batch that is better than the
    baseline should stay positive), while the scale becomes independent of the reward
    model's units. `over_padding` (`PPOConfig.reward_whitening_mode`) says which
    positions it sees:

    - `"masked"`: statistics over real response tokens only; padding stays 0.
    - `"stats"`: statistics over the whole `[B, T]` tensor, padding zeros included (shorter
      responses pull the mean toward 0 and inflate the variance), then padding is zeroed
      again. AlpacaFarm's statistics, but not its result.
    - `"alpacafarm"`: AlpacaFarm exactly (`ppo_trainer.py` `_estimate_advantage`): the
      padded tensor is whitened and kept, so every padding position holds
      `mean * (1 - 1/std)`, not 0. AlpacaFarm then runs GAE over all `T` columns, so with
      gamma = lambda = 1 each real token's return gains that value once per padding
      position after its response: a reward that depends on the response's length
      (`whitening_gae_mask` gives the GAE that mask).

    Worked example, rewards `[[1, 3], [2, pad]]`: masked statistics use {1, 3, 2} (mean 2,
    population std 0.816), giving `[[0.775, 3.225], [2.0, 0]]`; over padding they use
    {1, 3, 2, 0} (mean 1.5, std 1.118), giving `[[1.053, 2.842], [1.947, 0]]` ("stats") or
    `[[1.053, 2.842], [1.947, 0.158]]` ("alpacafarm": 1.5 * (1 - 1/1.118) = 0.158).

    `reduce_sum` (`ppo.parallel.distributed.global_sum`) makes the statistics those of the whole
    batch in a data-parallel run.
    """
    from gae import whiten  # the shared masked whitening lives in gae/

    if isinstance(over_padding, bool):  # the former True/False toggle
        over_padding = "stats" if over_padding else "masked"
    mask = response_mask.to(token_rewards.dtype)  # [B, T]
    if over_padding == "alpacafarm":
        return whiten(token_rewards, mask=None, shift_mean=False, reduce_sum=reduce_sum)  # [B, T], padding kept
    if over_padding == "stats":
        return whiten(token_rewards, mask=None, shift_mean=False, reduce_sum=reduce_sum) * mask  # [B, T]
    if over_padding == "masked":
        return whiten(token_rewards, mask=mask, shift_mean=False, reduce_sum=reduce_sum) * mask  # [B, T]
    raise ValueError(f"over_padding must be 'masked', 'stats' or 'alpacafarm', got {over_padding!r}")


def score_positions(response_mask: torch.Tensor, score_position: str = "last_token") -> torch.Tensor:
    """The positions the score, reward whitening, GAE and the critic see, ``[B, T]``: the
    response mask, plus under ``"after_last_token"`` (TRL's ``~padding_mask_p1``) the column
    after each row's last real token where the width has one. Rows with no token stay empty.

    >>> score_positions(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]), "after_last_token").tolist()
    [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    """
    if score_position == "last_token":
        return response_mask
    if score_position != "after_last_token":
        raise ValueError(f"score_position must be one of {SCORE_POSITIONS}, got {score_position!r}")
    shifted = torch.nn.functional.pad(response_mask[:, :-1], (1, 0))  # [B, T]: the mask one column later
    return torch.maximum(response_mask, shifted)


def whitening_gae_mask(response_mask: torch.Tensor, over_padding: str | bool) -> torch.Tensor:
    """The mask GAE runs over: every column under AlpacaFarm's exact whitening (its GAE loops
    over all `T` positions, so whitened padding feeds the returns), else the response mask.

    >>> whitening_gae_mask(torch.tensor([[1.0, 0.0]]), "alpacafarm").tolist()
    [[1.0, 1.0]]
    """
    return torch.ones_like(response_mask) if over_padding == "alpacafarm" else response_mask


def _kimi_length_lambda(lengths: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Kimi's length reward over the last dimension; `lengths`, `correct` are `[B, G]`."""
    lengths = lengths.to(torch.float32)
    min_len = lengths.min(dim=-1, keepdim=True).values  # [B, 1]
    max_len = lengths.max(dim=-1, keepdim=True).values  # [B, 1]
    span = max_len - min_len  # [B, 1]
    # A group whose answers all have the same length carries no length signal: reward 0
    # rather than 0/0.
    safe_span = torch.where(span > 0, span, torch.ones_like(span))
    lam = 0.5 - (lengths - min_len) / safe_span  # [B, G], in [-0.5, 0.5]
    lam = torch.where(span > 0, lam, torch.zeros_like(lam))
    # Asymmetric on purpose: a wrong answer is never *rewarded* for being short (that
    # would teach the model to give up quickly on topics it is weak at, when thinking
    # longer might reach a right answer), but a long wrong answer is still penalised.
    return torch.where(correct.bool(), lam, lam.clamp(max=0.0))  # [B, G]


def kimi_length_reward(lengths: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Kimi k1.5's length reward over one group of answers to the same prompt.

    `lam = 0.5 - (len - min_len) / (max_len - min_len)` runs from +0.5 for the shortest
    answer in the group to -0.5 for the longest. A correct answer gets `lam`; an incorrect
    one gets `min(0, lam)`. The asymmetry: short wrong answers are not rewarded for their
    shortness (so on a topic the model is weak at it is not pushed to stop thinking early,
    and can still think its way to a right answer), while long wrong answers are
    penalised. When every length is equal the reward is 0 for all. Kimi k1.5 adds this to
    the task reward with a weight and warms it up; that weighting belongs to the caller.

    Args:
        lengths: `[G]` response lengths in tokens.
        correct: `[G]` bool, the answer was right.

    Returns:
        `[G]` float rewards.

    >>> kimi_length_reward(torch.tensor([10, 20, 30]), torch.tensor([True, False, True])).tolist()
    [0.5, 0.0, -0.5]
    """
    lengths_2d = rearrange(lengths, "g -> 1 g")  # [1, G]
    correct_2d = rearrange(correct, "g -> 1 g")  # [1, G]
    return rearrange(_kimi_length_lambda(lengths_2d, correct_2d), "1 g -> g")  # [G]


def group_kimi_length_reward(
    lengths: torch.Tensor, correct: torch.Tensor, group_size: int
) -> torch.Tensor:
    """`kimi_length_reward` applied to each contiguous group of `group_size` samples.

    The `G` samples of one prompt sit next to each other (`[B*G]`); min and max lengths
    are taken within each group, never across prompts, since a long answer to a hard
    problem is not comparable with a short answer to an easy one.

    >>> lengths = torch.tensor([10, 20, 30, 100, 300, 200])
    >>> group_kimi_length_reward(lengths, torch.ones(6, dtype=torch.bool), 3).tolist()
    [0.5, 0.0, -0.5, 0.5, -0.5, 0.0]
    """
    if group_size < 1 or lengths.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size} must divide the batch size {lengths.numel()}")
    lengths_bg = rearrange(lengths, "(b g) -> b g", g=group_size)  # [B, G]
    correct_bg = rearrange(correct, "(b g) -> b g", g=group_size)  # [B, G]
    return rearrange(_kimi_length_lambda(lengths_bg, correct_bg), "b g -> (b g)")  # [B*G]


def length_reward_weight(step: int, coef: float, warmup_steps: int = 0) -> float:
    """The weight of the length reward at RL step `step` (counted from 0): 0 during the
    warm-up, `coef` after it.

    Kimi k1.5 found that a length penalty from the first step slows training down: the
    policy is pushed to be brief before it can solve the problems. So the first
    `warmup_steps` steps train on the task reward alone, and the penalty then switches on
    at full, constant weight (a step, not a ramp).

    >>> [length_reward_weight(step, 0.5, warmup_steps=2) for step in range(4)]
    [0.0, 0.0, 0.5, 0.5]
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return coef if step >= warmup_steps else 0.0


def format_reward(well_formed: torch.Tensor, coef: float) -> torch.Tensor:
    """DeepSeek R1's format reward: `coef` for a well-formed response, 0 otherwise.

    R1-Zero trained on two rule-based rewards: accuracy, and format (the reasoning inside
    ``<think>`` tags). The format bonus pays for the structure the answer checker needs, so
    a model that starts out writing unparseable text gets a signal before it is ever
    correct. Here "well formed" is the task's own check (`Score.well_formed`: the answer
    marker with a parseable answer, then EOS). It is added to the score before any group
    statistics, so in a group where every response is well formed it cancels out of
    group-relative advantages: it only teaches where the format varies.

    Args:
        well_formed: `[B]` bool.
        coef: the bonus.

    >>> format_reward(torch.tensor([True, False]), 0.5).tolist()
    [0.5, 0.0]
    """
    return coef * well_formed.to(torch.float32)  # [B]


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer_length: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), ``[B]``.

    With `L_max = max_length` and `L_cache = buffer_length`, a response of `len` tokens gets::

        0                                          if len <= L_max - L_cache
        factor * ((L_max - L_cache) - len) / L_cache   otherwise (down to -factor at L_max)

    added to its score, so responses drift shorter before they hit the limit instead of
    being cut off with a score that says nothing about length (verl reward_manager/dapo.py
    `overlong_buffer`, penalty_factor). `buffer_length=0` is off. DAPO: L_max 20480, L_cache
    4096; responses here never exceed `max_length`, so DAPO's -1 beyond it never applies.

    >>> overlong_penalty(torch.tensor([4, 6, 8]), max_length=8, buffer_length=4)
    tensor([ 0.0000, -0.5000, -1.0000])
    """
    if buffer_length <= 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    excess = lengths.float() - (max_length - buffer_length)  # [B]
    return torch.clamp(-excess / buffer_length * factor, max=0.0)


REWARD_COMPONENTS = ("correctness", "format", "length")


def reward_components(scores: torch.Tensor, correct: torch.Tensor, well_formed: torch.Tensor | None,
                      lengths: torch.Tensor, group_size: int, length_coef: float,
                      format_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence score as named components, ``([B, 3] raw, [3] weights)``, in the order of
    `REWARD_COMPONENTS`: correctness (the task's or the reward model's score after the
    missing-EOS rule, weight 1), format (1 if well formed, weight `format_coef`) and length
    (Kimi's in-group length reward, weight `length_coef`; 0 when the weight is 0).

    The summed score is ``raw @ weights`` (before the overlong penalty and the clip). GRPO
    normalises that sum; GDPO (`gae.group.gdpo_advantages`) normalises each column within
    its group first. Each component's batch mean is logged as ``reward_<name>``.

    >>> raw, w = reward_components(torch.tensor([1.0, 0.0]), torch.tensor([True, False]),
    ...                            torch.tensor([True, True]), torch.tensor([2.0, 4.0]), 2, 0.5, 0.1)
    >>> raw.tolist(), w.tolist()
    ([[1.0, 1.0, 0.5], [0.0, 1.0, -0.5]], [1.0, 0.10000000149011612, 0.5])
    """
    formats = torch.zeros_like(scores) if well_formed is None else well_formed.to(scores.dtype)  # [B]
    length = (group_kimi_length_reward(lengths.float(), correct, group_size).to(scores.dtype) if length_coef > 0
              else torch.zeros_like(scores))  # [B]
    raw = torch.stack([scores, formats, length], dim=-1)  # [B, 3]
    weights = torch.tensor([1.0, format_coef, length_coef], dtype=scores.dtype, device=scores.device)  # [3]
    return raw, weights

"""What a training step logs: every metric of `metrics.jsonl`, and the wall time per phase.

Nothing here changes what a step computes. `RLTrainer.train_step` hands its tensors over
once, at the end of the step (`step_metrics`); `_update` hands each micro-batch's loss
metrics to an `UpdateTally`. Every metric is a mean over the *global* batch (all ranks,
one all-reduce for all of them), so a run logs the same numbers on 1 or N processes.

Metrics a reader may look for here: the per-token KL in its three forms (`kl`, the
estimator in use; `kl_k1`, unclamped; `kl_k1_sampling`, at the sampling temperature),
`loss_weight_incorrect_long/short` (the per-token weight each loss aggregation gives long
wrong answers: Dr. GRPO's length-bias argument), `adv_abs_level*` / `adv_share_level*`
(where the gradient weight goes by difficulty: the group-std argument), the critic's
`value_error_mc` and `advantage_bias_first_tokens` (`critic_diagnostics`: VC-PPO's diagnosis),
and the phase times `time_*` (`PhaseTimer`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from gae import compute_gae

from ppo.parallel import distributed
from ppo.algorithm.filtering import zero_advantage_groups
from ppo.algorithm.losses import explained_variance, group_shares, token_loss_weights
from ppo.algorithm.rewards import REWARD_COMPONENTS

if TYPE_CHECKING:
    from ppo.run.checkpoints import TrainingState


class PhaseTimer:
    """Wall time per phase of a step (generate, score, forward passes, rewards, update, ...).

    ``with timer("update"): ...`` adds the block's time to the phase; `phase` does the same
    for a whole method. `start_step` opens a new step (the trainer's `timed_step`)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.step_start = time.perf_counter()

    def start_step(self) -> None:
        self.seconds = defaultdict(float)
        self.step_start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.seconds[phase] += time.perf_counter() - start


def timed_step(method):
    """Decorate ``train_step``: each call starts a new step on ``self.timer``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self.timer.start_step()
        return method(self, *args, **kwargs)

    return wrapper


def phase(name: str):
    """Decorate a trainer method: its wall time counts towards phase `name` (``time_<name>``)."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with self.timer(name):
                return method(self, *args, **kwargs)

        return wrapper

    return decorate


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


# The policy's per-token fractions and means that `PPOConfig.metric_denominator` re-divides.
PER_TOKEN_POLICY_METRICS = ("clipfrac", "clipfrac_low", "clipfrac_high", "dualclip_frac", "approx_kl")


class UpdateTally:
    """The update's loss metrics over every micro-batch, optimizer step and rank.

    Loss metrics are weighted like their loss (the micro-batch's share of its minibatch;
    the critic's by token share); ``*_max`` metrics are maxima over the whole update;
    per-optimizer-step values (gradient norms) are averaged over the steps taken.

    **Metric denominator** (`PPOConfig.metric_denominator`): with ``"all_positions"`` the
    clip fractions and ``approx_kl`` (`PER_TOKEN_POLICY_METRICS`) are sums over the loss's
    tokens divided by every position of the padded ``[B, T]`` tensors, padding included,
    over all micro-batches and ranks: AlpacaFarm's ``.mean()`` over ``[B, response_len]``
    (ppo_trainer.py ``compute_loss``), where a padding position has ratio 1 and log-ratio 0.

    Worked example: one micro-batch, mask ``[[1, 1, 1, 0], [1, 0, 0, 0]]`` (4 tokens, 8
    positions), 2 tokens clipped: ``clipfrac`` is 2/4 = 0.5 with ``"tokens"`` and 2/8 = 0.25
    with ``"all_positions"``.
    """

    def __init__(self, metric_denominator: str = "tokens"):
        if metric_denominator not in ("tokens", "all_positions"):
            raise ValueError(f"metric_denominator must be 'tokens' or 'all_positions', got {metric_denominator!r}")
        self.metric_denominator = metric_denominator
        self.means = distributed.GlobalMeans()
        self.maxima: dict[str, float] = {}
        self.step_sums: dict[str, float] = defaultdict(float)
        self.optimizer_steps = 0

    def add(self, metrics: dict, weight: float, value_metrics: dict, value_weight: float,
            loss_mask: torch.Tensor | None = None) -> None:
        """One micro-batch's metrics; `loss_mask` ``[b, T]`` (the tokens its policy metrics
        average over) is needed with ``metric_denominator="all_positions"``."""
        for key, value in value_metrics.items():  # a token mean: weighted by token share
            self.means.add_weighted(key, value_weight * float(value), value_weight)
        by_position = self.metric_denominator == "all_positions"
        if by_position and loss_mask is None:
            raise ValueError("UpdateTally: metric_denominator='all_positions' needs the micro-batch's loss_mask")
        for key, value in metrics.items():
            if key.endswith("_max"):  # a maximum over the whole update, not a mean
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(value))
            elif by_position and key in PER_TOKEN_POLICY_METRICS:
                # The token mean back to a token sum, over the padded tensor's every position.
                tokens = float(loss_mask.detach().float().sum())
                self.means.add_weighted(key, float(value) * tokens, float(loss_mask.numel()))
            else:
                self.means.add_weighted(key, weight * float(value), weight)

    def add_token_sum(self, key: str, total: float, tokens: float) -> None:
        """A metric that is a mean over real tokens (the whole update, every rank), whatever
        the loss's weights: its sum over a micro-batch's tokens and their count."""
        self.means.add_weighted(key, total, tokens)

    def add_optimizer_step(self, step_metrics: dict[str, float]) -> None:
        for key, value in step_metrics.items():
            self.step_sums[key] += value
        self.optimizer_steps += 1

    def result(self, stopped_early: bool) -> dict:
        averaged = self.means.result()
        if self.maxima:
            averaged.update(zip(self.maxima, distributed.global_max(torch.tensor(list(self.maxima.values()))).tolist()))
        averaged.update({key: value / max(self.optimizer_steps, 1) for key, value in self.step_sums.items()})
        averaged["early_stopped"] = float(stopped_early)
        return averaged


def step_metrics(config, state: TrainingState, timer: PhaseTimer, batch, buffer, *, token_rewards, kl, kl_k1,
                 kl_sampling, finite, kept, skip_empty_rows: bool, lr: float,
                 scalars: dict) -> tuple[dict, list[dict]]:
    """This step's metrics, each a mean over the global batch (one all-reduce for all of
    them), and the decoded samples of every rank (for samples.jsonl).

    `state` is the run's `ppo.run.checkpoints.TrainingState` before the step is counted (its
    ``samples_generated`` grows by this step's responses), `timer` the step's phase times;
    `batch` is the step's `ScoredBatch`, `buffer` its `ExperienceBuffer`; the KL tensors are
    ``[B, T]`` (NaN metrics when there is no reference model: beta = 0 measures no KL);
    `lr` is the policy's learning rate, `scalars` the step's other numbers, logged as they are."""
    cfg = config
    rollout, correct = batch.rollout, batch.correct
    response_mask, advantages = buffer["response_mask"], buffer["advantages"]
    values = buffer.tensors.get("values")
    has_ref = "ref_logprobs" in buffer.tensors
    means = distributed.GlobalMeans()
    lengths = rollout.response_lengths.float()  # [B]
    for name, values_, mask in (
            ("score", batch.raw_scores, None), ("reward", token_rewards.sum(-1), None),
            ("accuracy", correct.float(), None),
            ("kl", kl.sum(-1), None if has_ref else 0.0), ("kl_k1", kl_k1.sum(-1), None if has_ref else 0.0),
            ("entropy_rollout", -buffer["old_logprobs"], response_mask), ("response_length", lengths, None),
            ("response_length_correct", lengths, correct), ("response_length_incorrect", lengths, ~correct),
            ("eos_rate", rollout.has_eos.float(), None), ("advantage_mean", advantages, response_mask),
            ("advantage_abs_mean", advantages.abs(), response_mask),
            ("dropped_sample_frac", (~finite).float(), None), ("well_formed_rate", batch.well_formed.float(), None)):
        # With beta = 0 there is no reference model, so the KL is not measured (NaN), not 0.
        means.add(name, values_, None if mask is None else torch.as_tensor(mask, device=values_.device))
    if batch.reward_components is not None:  # each named part of the score, before its weight
        for name, component in zip(REWARD_COMPONENTS, batch.reward_components.unbind(-1)):
            means.add(f"reward_{name}", component, finite)
    if rollout.prompt_truncated is not None:
        means.add("prompt_truncated_frac", rollout.prompt_truncated.float())
    no_ref = None if has_ref else torch.zeros((), device=kl.device)
    means.add("kl_k1_sampling", kl_sampling.sum(-1), no_ref)
    _add_incorrect_length_weights(means, cfg, lengths, correct, response_mask, skip_empty_rows)
    if cfg.reward_model_path:  # a reward model scores: the task's own score is the gold
        means.add("gold_score", batch.task_scores)
    if values is not None:
        means.add("value_mean", values, response_mask)
    if kept is not None:
        zero_groups = zero_advantage_groups(advantages * response_mask, cfg.group_size).float()  # [prompts]
        means.add("zero_advantage_group_frac", zero_groups)
        means.add("zero_advantage_group_frac_kept", zero_groups, kept)
        means.add("kept_group_frac", kept.float())
    means.add_weighted("sampling_rounds", float(batch.rounds), 1.0)
    responses_generated = float(distributed.global_sum(torch.tensor(float(batch.responses_generated))))
    state.samples_generated += int(responses_generated)
    for name, seconds in timer.seconds.items():
        means.add_weighted(f"time_{name}", seconds, 1.0)
    means.add_weighted("time_step", time.perf_counter() - timer.step_start, 1.0)
    metrics = {"step": state.step + 1, **means.result(), **scalars, "responses_generated": responses_generated,
               "samples_generated": state.samples_generated, "lr": lr}
    if cfg.retire_mastered:
        metrics["retired_prompts"] = len(state.prompt_pool.retired)
    metrics.update(per_level_advantage(batch.problems, advantages, response_mask))
    if values is not None:
        metrics["explained_variance"] = explained_variance(values, buffer["returns"], response_mask,
                                                           reduce_sum=distributed.global_sum)
    samples = distributed.gather_objects([
        {"step": state.step + 1, "rank": distributed.rank(), "prompt": p.prompt, "response": t, "score": float(s),
         "correct": bool(c), "has_eos": bool(e)}
        for p, t, s, c, e in list(zip(batch.problems, batch.texts, batch.raw_scores.tolist(), correct.tolist(),
                                      rollout.has_eos.tolist()))[: cfg.log_samples]
    ])
    return metrics, samples


def _add_incorrect_length_weights(means, cfg, lengths, correct, response_mask, skip_empty_rows: bool) -> None:
    """Per-token loss weight (relative to `token_mean`) of wrong answers longer and not
    longer than the mean wrong answer: `loss_weight_incorrect_long` / `_short`.

    Under GRPO's `seq_mean_token_mean` the long ones get less push per token (weight
    N / (B * L)); under `token_mean` and Dr. GRPO's constant both are equal. Weights are
    those of this rank's batch over the response mask (`ppo.algorithm.losses.token_loss_weights`).
    """
    groups = torch.arange(response_mask.shape[0], device=response_mask.device) // cfg.group_size  # [B]
    shares = group_shares(response_mask, groups, skip_empty_rows) if cfg.loss_agg == "prompt_mean" else None
    weights = token_loss_weights(response_mask, cfg.loss_agg, cfg.response_length, skip_empty_rows, shares)  # [B]
    incorrect = (~correct).double()
    totals = distributed.global_sum(torch.stack([(lengths.double() * incorrect).sum(), incorrect.sum()]))
    mean_length = totals[0] / totals[1].clamp(min=1)
    means.add("loss_weight_incorrect_long", weights, incorrect * (lengths > mean_length).double())
    means.add("loss_weight_incorrect_short", weights, incorrect * (lengths <= mean_length).double())


def per_level_advantage(problems, advantages: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """Mean |advantage| per difficulty level: where the gradient weight goes.

    Dividing by the group std (GRPO) inflates the advantages of groups with a small
    spread: prompts the policy almost always or almost never solves (Dr. GRPO).
    """
    levels = [p.level for p in problems]
    if any(level is None for level in levels):
        return {}
    per_sample = (advantages.abs() * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)  # [B]
    pairs = distributed.gather_objects(list(zip(levels, per_sample.tolist())))  # every rank's samples
    level_ids = torch.tensor([level for level, _ in pairs])
    per_sample = torch.tensor([value for _, value in pairs], dtype=torch.float64)
    total = float(per_sample.sum())
    metrics = {}
    for level in sorted(set(level_ids.tolist())):
        chosen = per_sample[level_ids == level]
        metrics[f"adv_abs_level{level}"] = float(chosen.mean())
        metrics[f"adv_share_level{level}"] = float(chosen.sum()) / total if total > 0 else float("nan")
    return metrics


FIRST_TOKENS = 4  # positions the advantage-bias metric averages over


def critic_diagnostics(advantages: torch.Tensor, token_rewards: torch.Tensor, values: torch.Tensor,
                       gae_mask: torch.Tensor, response_mask: torch.Tensor, gamma: float,
                       first_tokens: int = FIRST_TOKENS) -> dict[str, float]:
    """How well the critic serves the policy this step, measured against Monte-Carlo returns
    (GAE with lambda = 1: the discounted reward-to-go, no bootstrapping), over every rank:

    - ``value_error_mc``: mean squared error of the old values against those returns, per token
      (``value_error`` is the update's, against the critic's own GAE targets).
    - ``advantage_bias_first_tokens``: the mean, over the first `first_tokens` response
      tokens, of the policy's advantage (before whitening) minus the Monte-Carlo advantage
      ``G_t - V_t``. With lambda < 1 the final reward reaches the first tokens of a long
      response only as ``lambda**(T-t)``; their advantage is then mostly the critic's own
      bootstrap, and a critic that starts off biased (from a reward model or a zeroed head)
      biases them (VC-PPO, arXiv 2503.01491, section 3). 0 with coupled lambda = 1.

    Worked example (gamma = 1, one response of 2 tokens, reward [0, 1], values [0.5, 0.5],
    policy advantages [0.25, 0.5]): returns [1, 1], value_error_mc 0.25, Monte-Carlo
    advantages [0.5, 0.5], bias (0.25 - 0.5 + 0.5 - 0.5) / 2 = -0.125.
    """
    mc_advantages, mc_returns = compute_gae(token_rewards, values, gae_mask, gamma, 1.0)  # [B, T] each
    mask = response_mask.to(values.dtype)
    first = mask * (mask.cumsum(-1) <= first_tokens).to(mask.dtype)  # [B, T]: the first real tokens
    errors = torch.where(mask.bool(), (values - mc_returns).pow(2), torch.zeros_like(values))
    bias = torch.where(first.bool(), advantages - mc_advantages, torch.zeros_like(values))
    sums = distributed.global_sum(torch.stack([errors.sum(), mask.sum(), bias.sum(), first.sum()]).double())
    return {"value_error_mc": float(sums[0] / sums[1].clamp(min=1)),
            "advantage_bias_first_tokens": float(sums[2] / sums[3].clamp(min=1))}

"""The RL training loop: PPO, and the GRPO family as the same loop with other toggles.

One iteration (`RLTrainer.train_step`) reads top to bottom in the order the algorithm runs:

    1. rollout      sample a group of responses per prompt from the policy
    2. score        task reward (verifiable) or reward function per response
    3. forward      old log-probs (policy), reference log-probs, values (critic); no autograd
    4. KL           per-token KL estimate to the reference (ppo/kl.py)
    5. rewards      per-token rewards: score at the last token, -beta*KL (ppo/rewards.py)
    6. advantages   GAE with the critic, or group-relative (gae/)
    7. update       epochs x minibatches x micro-batches of clipped-surrogate + value loss
    8. KL control   adapt beta (adaptive controller only)

GRPO is not a second trainer: it is this loop with ``advantage_estimator="grpo"`` (no critic
is built), ``kl_placement="loss"`` and ``group_size > 1``. Everything that is not the
algorithm lives in modules named for it (`ppo/checkpoints.py`, `ppo/run_dir.py`,
`ppo/distributed.py`, `ppo/precision.py`, `ppo/optimization.py`) or in the helper methods
below `train_step`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from gae import estimate_advantages, whiten
from value_model import ScalarHeadModel
from value_model.reward_model import last_token_scores

from . import allocator, checkpoints, distributed, guards, lean_forward, run_dir
from .buffer import ExperienceBuffer, accumulation_weights
from .config import PPOConfig, describe
from .dynamic_sampling import ScoredBatch, sample_batch
from .evaluation import evaluate, preserve_rng_state, score_batch
from .filtering import PromptPool, group_pass_rates, keep_groups, zero_advantage_groups
from .kl import kl_penalty, make_kl_controller
from .logprobs import logprobs_from_logits, response_logprobs, response_logprobs_and_values, response_values
from .losses import entropy_loss, explained_variance, kl_loss, policy_loss, token_loss_weights, value_loss
from .lora import AdapterDisabledReference, apply_lora
from .policy import (declared_stop_token_ids, disable_dropout, enable_gradient_checkpointing, load_policy,
                     resolve_max_prompt_length, scoring_mode, set_training)
from .optimization import build_lr_scheduler, build_optimizers, optimizer_step
from .precision import cast_master_weights, master_dtype, prepare_frozen
from .rewards import (apply_missing_eos, clip_scores, format_reward, group_kimi_length_reward, length_reward_weight,
                      shape_rewards, whiten_rewards, whitening_gae_mask)
from .rollout import Rollout, decode_responses, generate
from .tasks import ArithmeticTask, CustomTask, GSM8KTask


@dataclass
class ReusedForward:
    """The update's first micro-batch (the head of the first epoch's shuffle `order`; `rows`,
    sorted) and its forward pass with autograd, run before the advantages: `outputs`
    (log-probs, entropies, values ``[b, T]``) in the order of `rows`, `update_outputs` in the
    micro-batch's order. `rest` are the other rows, which get their own old pass."""

    order: torch.Tensor
    rows: torch.Tensor
    rest: torch.Tensor
    outputs: dict
    update_outputs: dict


class PhaseTimer:
    """Wall time per phase of a step (generate, score, forward passes, update, ...)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.seconds[phase] += time.perf_counter() - start


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def build_task(config: PPOConfig, prompts: list[str] | None = None, reward_fn: Callable | None = None):
    """The task named by `config.task` (a custom task needs `prompts` and `reward_fn`)."""
    if config.task == "custom" or reward_fn is not None:
        if prompts is None or reward_fn is None:
            raise ValueError("PPOConfig.task='custom' needs both prompts and reward_fn")
        return CustomTask(prompts=list(prompts), reward_fn=reward_fn)
    if config.task == "gsm8k":
        return GSM8KTask(config.task_path, eval_path=config.eval_path, answer_mode=config.gsm8k_answer_mode)
    if config.task == "preference":
        from .tasks.preferences import PreferenceTask

        return PreferenceTask(reward_model_path=config.reward_model_path)
    return ArithmeticTask()


class RLTrainer:
    """Runs one PPO / GRPO training run described by a `PPOConfig`.

    Args:
        config: every setting of the run.
        task: a task object (see `ppo.tasks.base.Task`); built from the config if None.
        prompts, reward_fn: a user's own prompts and ``reward_fn(prompts, responses) ->
            list[float]``, as TRL users pass them (sets up a `CustomTask`).
        policy, tokenizer: an already loaded policy (otherwise `config.model_path`, or the
            testbed's SFT warm start when that is None).
    """

    def __init__(self, config: PPOConfig, task=None, prompts: list[str] | None = None,
                 reward_fn: Callable | None = None, policy=None, tokenizer=None):
        from accelerate import Accelerator

        config.validate_for_run()
        self.config = config
        self.accelerator = Accelerator(cpu=config.device == "cpu", mixed_precision=config.mixed_precision)
        self.device = self.accelerator.device
        # The warm start is found (or, the first time, trained) before the thread count and
        # the seeds are set: training it sets both its own way, and a run must not depend on
        # whether its warm start was already cached.
        model_path = self._warm_start_path() if policy is None else None
        if config.device == "cpu" or not torch.cuda.is_available():
            torch.set_num_threads(config.threads)
            if config.retain_freed_memory:  # freed activations reused, not faulted in again
                allocator.retain_freed_memory()
        # Data parallelism: `rollout_batch_size` is the global batch; each rank holds a share
        # and draws its own prompts from its own seed (rank 0 keeps `seed`).
        self.local_batch_size = config.per_process_batch_size(distributed.world_size())
        seed = distributed.rank_seed(config.seed, distributed.rank())
        random.seed(seed)
        torch.manual_seed(seed)
        self.task = task if task is not None else build_task(config, prompts, reward_fn)
        self.rng = random.Random(seed)  # prompt sampling
        self.prompt_pool = PromptPool(self.task, self.rng)
        self.shuffle_generator = torch.Generator().manual_seed(seed)  # minibatch order
        self.output_dir = Path(config.output_dir)

        # -- models -------------------------------------------------------------------------
        if policy is None:
            self.model_path = model_path
            policy, tokenizer = load_policy(model_path, dropout=not config.disable_dropout,
                                            dtype=master_dtype(config.model_dtype),
                                            attn_implementation=config.attn_implementation)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with the policy")
        else:
            self.model_path = None
            cast_master_weights(policy, config.model_dtype)
            if config.disable_dropout:
                disable_dropout(policy)
        self.tokenizer = tokenizer
        # Stop ids and the prompt limit are settled (and checked against the context) up front.
        self.stop_token_ids = config.stop_token_ids or declared_stop_token_ids(policy, tokenizer)
        self.max_prompt_length = resolve_max_prompt_length(policy, config.max_prompt_length, config.response_length)
        # The frozen reference is the initial policy. beta = 0 skips it entirely; with LoRA it
        # is the policy's own base model with the adapter disabled (set after prepare).
        self.ref_policy = None
        if config.uses_reference_model and not config.lora_r:
            self.ref_policy = copy.deepcopy(policy).eval().requires_grad_(False)
        self.value_model = self._build_value_model(policy) if config.uses_value_model else None
        policy = self._apply_memory_toggles(policy)
        self.reward_model = None
        if config.reward_model_path:
            self.reward_model = ScalarHeadModel.from_pretrained(
                config.reward_model_path, dtype=master_dtype(config.model_dtype),
                attn_implementation=config.attn_implementation).eval().requires_grad_(False)

        # -- optimisers: the critic gets its own AdamW by default --------------------------
        self.policy_optimizer, self.value_optimizer = build_optimizers(config, policy, self.value_model)
        self.schedulers = [build_lr_scheduler(opt, config.lr_schedule, config.warmup_steps, config.total_steps)
                           for opt in (self.policy_optimizer, self.value_optimizer) if opt is not None]
        prepared = self.accelerator.prepare(policy, *( [self.value_model] if self.value_model is not None else []),
                                            self.policy_optimizer,
                                            *([self.value_optimizer] if self.value_optimizer is not None else []))
        prepared = list(prepared)
        self.policy = prepared.pop(0)
        if self.value_model is not None:
            self.value_model = prepared.pop(0)
        self.policy_optimizer = prepared.pop(0)
        if self.value_optimizer is not None:
            self.value_optimizer = prepared.pop(0)
        # Looked up once: the unwrapped models (sampling, evaluation, the lean path) and each
        # model's parameters (gradient clipping, the finiteness guard); accelerate's unwrap and
        # the module walk cost 0.2-0.3 ms a step each on the identical work. Parameters are
        # never replaced (a checkpoint is loaded into them).
        self.policy_module = self.accelerator.unwrap_model(self.policy)
        value_module = self.accelerator.unwrap_model(self.value_model) if self.value_model is not None else None
        self._model_parameters = [list(model.parameters()) if model is not None else []
                                  for model in (self.policy, self.value_model)]
        # Frozen models run under the policy's autocast, or bf16 fakes a KL at step 1.
        if self.ref_policy is not None:
            self.ref_policy = prepare_frozen(self.accelerator, self.ref_policy)
        elif config.uses_reference_model:
            self.ref_policy = AdapterDisabledReference(self.policy, self.policy_module)
        if self.reward_model is not None:
            self.reward_model = prepare_frozen(self.accelerator, self.reward_model)
        # Speed (exact): the lean forward for GPT-2 / Llama, and the update's forward reused
        # for old log-probs and values when the policy cannot move before it.
        if config.lean_forward and config.mixed_precision == "no":  # autocast lives in the module call
            lean_forward.enable(self.policy_module, self.ref_policy, value_module, compile=config.compile_forward,
                                share_prompts=config.share_prompt_prefix, padding_free=config.padding_free)
            if config.paired_critic_pass:  # one stacked update pass of policy and critic when their shapes match
                lean_forward.pair(self.policy_module, value_module)
        self.reuses_update_forward = (
            config.reuse_update_forward and not config.logprobs_from_generation
            and not any(lean_forward.dropout_active(m) for m in (self.policy, self.value_model) if m is not None))
        self.kl_controller = make_kl_controller(config.kl_coef, config.adaptive_kl, config.kl_target, config.kl_horizon,
                                                rule=config.kl_controller, k_beta=config.kl_k_beta)
        self.step = 0
        self.samples_generated = 0  # responses generated over all ranks (dynamic sampling makes extra)
        self.writer = None

    def _warm_start_path(self) -> str:
        """`config.model_path`, or the testbed's cached SFT warm start (built if missing: the
        main process builds or finds it, the others wait for it)."""
        config = self.config
        if config.model_path is not None:
            return config.model_path
        from .sft import warm_start

        model_path = None
        if distributed.is_main_process():
            model_path = str(warm_start(progress=config.progress, stop_after=config.warm_start_steps))
        return distributed.broadcast_object(model_path)

    # ====================================================================================
    # The algorithm
    # ====================================================================================
    def train_step(self) -> dict:
        """One RL iteration; returns this step's metrics."""
        cfg = self.config
        timer = PhaseTimer()
        policy = self.policy_module
        step_start = time.perf_counter()

        # ---- 1-2. rollout and score: G samples per prompt, contiguous -------------------
        # One round, or (difficulty_filter_mode="resample") DAPO's dynamic sampling: rounds
        # until this rank's share is made of groups inside the pass-rate band.
        resample = cfg.difficulty_filter and cfg.difficulty_filter_mode == "resample"
        batch = sample_batch(lambda n: self._sample_and_score(policy, n, timer), self.local_batch_size // cfg.group_size,
                             cfg.group_size, band=(cfg.filter_min_pass_rate, cfg.filter_max_pass_rate),
                             max_rounds=cfg.dynamic_sampling_max_rounds if resample else 1,
                             pad_token_id=self.tokenizer.pad_token_id)
        problems, rollout, texts = batch.problems, batch.rollout, batch.texts  # B = prompts x G
        task_scores, raw_scores, correct = batch.task_scores, batch.raw_scores, batch.correct  # [B] each
        response_mask = rollout.response_mask.float()  # [B, T]
        # A NaN / inf score stops the run here, before any update or save (ppo/guards.py),
        # unless nonfinite_rewards='drop' keeps those samples out of the loss below.
        finite = guards.check_scores(raw_scores, [p.prompt for p in problems], texts, self._score_source(),
                                     drop=cfg.nonfinite_rewards == "drop")  # [B]
        raw_scores = guards.drop_nonfinite_scores(raw_scores, finite, cfg.group_size)  # [B]
        well_formed = batch.well_formed  # [B]

        # ---- 3. old log-probs, reference log-probs, values (no autograd) ---------------
        temperature = cfg.temperature if cfg.scale_logits_by_temperature else 1.0
        reused = self._reused_update_forward(rollout, temperature, timer)  # None unless reuse_update_forward
        with torch.no_grad(), scoring_mode(self.policy, self.value_model):
            with timer("policy_forward"):
                if cfg.logprobs_from_generation:
                    old_logprobs = logprobs_from_logits(rollout.generation_logits, rollout.response_ids, temperature)
                else:
                    old_logprobs = self._old_pass(rollout, reused, "logprobs", lambda *args: response_logprobs(
                        self.policy, *args, temperature=temperature))
            ref_logprobs = None
            if self.ref_policy is not None:
                with timer("reference_forward"):
                    ref_logprobs = response_logprobs(self.ref_policy, *self._rollout_args(rollout), temperature=temperature)
            values = None
            if self.value_model is not None:
                with timer("value_forward"):
                    values = self._old_pass(rollout, reused, "values", lambda *args: response_values(
                        self.value_model, *args)) * response_mask  # [B, T]

        # ---- 4. per-token KL to the reference -----------------------------------------
        beta = self.kl_controller.value
        if ref_logprobs is not None:
            kl = kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero) * response_mask  # [B, T]
            kl_k1 = (old_logprobs - ref_logprobs) * response_mask  # [B, T]: the unclamped k1 estimate
            kl_sampling = self._sampling_temperature_kl(rollout, kl_k1)  # [B, T]: k1 at the sampling temperature
        else:
            kl = kl_k1 = kl_sampling = torch.zeros_like(old_logprobs)

        # ---- 5. per-token rewards ---------------------------------------------------------
        with timer("rewards"):
            scores = apply_missing_eos(raw_scores, rollout.has_eos, cfg.missing_eos,
                                       cfg.missing_eos_penalty, cfg.missing_eos_value)  # [B]
            length_coef = length_reward_weight(self.step, cfg.length_reward_coef, cfg.length_reward_warmup_steps)
            if length_coef > 0:
                scores = scores + length_coef * group_kimi_length_reward(
                    rollout.response_lengths.float(), correct, cfg.group_size)
            scores = scores + format_reward(well_formed, cfg.format_reward_coef)
            scores = clip_scores(scores, cfg.reward_clip)
            kl_in_reward = cfg.kl_placement == "reward" and ref_logprobs is not None
            token_rewards = shape_rewards(scores, kl, response_mask, beta, kl_in_reward=kl_in_reward)  # [B, T]
            if cfg.whiten_rewards:
                token_rewards = whiten_rewards(token_rewards, response_mask, cfg.whiten_rewards_over_padding,
                                               reduce_sum=distributed.global_sum)
            # AlpacaFarm's exact form runs GAE over every column, padding included.
            gae_mask = whitening_gae_mask(response_mask, cfg.whiten_rewards_over_padding if cfg.whiten_rewards else "masked")

        # ---- 6. advantages and returns ----------------------------------------------------
        with timer("advantages"):
            advantages, returns = estimate_advantages(
                cfg.advantage_estimator, token_rewards=token_rewards, response_mask=gae_mask, values=values,
                group_size=cfg.group_size, gamma=cfg.gamma, lam=cfg.lam, grpo_scale=cfg.grpo_scale,
                grpo_eps=cfg.grpo_eps, grpo_std_correction=cfg.grpo_std_correction,
                reinforce_baseline=cfg.reinforce_baseline, rft_min_score=cfg.rft_min_score,
                reduce_sum=distributed.global_sum)  # [B, T] each; batch statistics over all ranks
            if cfg.whiten_advantages and not cfg.whiten_advantages_per_minibatch:
                advantages = whiten(advantages, response_mask, reduce_sum=distributed.global_sum)
        # Responses cut off at response_length can be left out of the loss (DAPO).
        loss_mask = response_mask * rollout.has_eos.float()[:, None] if cfg.mask_truncated_responses else response_mask
        loss_mask = loss_mask * finite.float()[:, None]  # dropped non-finite scores (nonfinite_rewards='drop')
        kept = None
        if cfg.group_size > 1:
            # Difficulty filtering: groups every sample solved (or none did) carry no signal.
            pass_rates = group_pass_rates(correct, cfg.group_size)  # [prompts]
            kept = torch.ones_like(pass_rates, dtype=torch.bool)
            if cfg.difficulty_filter:
                kept = keep_groups(pass_rates, cfg.filter_min_pass_rate, cfg.filter_max_pass_rate)  # [prompts]
                loss_mask = loss_mask * kept.repeat_interleave(cfg.group_size).float()[:, None]
            if cfg.retire_mastered:  # every rank retires what any rank mastered, in every round
                self.prompt_pool.retire(*self._gather_pass_rates(batch.seen_problems, batch.seen_pass_rates))

        # ---- 7. update: epochs x shuffled minibatches x micro-batches ------------------
        buffer_tensors = dict(query_ids=rollout.query_ids, query_mask=rollout.query_mask,
                              response_ids=rollout.response_ids, response_mask=response_mask, loss_mask=loss_mask,
                              old_logprobs=old_logprobs, advantages=advantages, returns=returns)
        if ref_logprobs is not None:
            buffer_tensors["ref_logprobs"] = ref_logprobs
        if values is not None:
            buffer_tensors["values"] = values
        buffer = ExperienceBuffer(buffer_tensors)
        with timer("update"):
            update_metrics = self._update(buffer, beta, temperature, reused)

        # ---- 8. KL controller and learning-rate schedule -------------------------------
        mean_sequence_kl = distributed.global_mean(kl.sum(-1))  # over the global batch
        self.kl_controller.update(mean_sequence_kl, cfg.rollout_batch_size)
        for scheduler in self.schedulers:
            scheduler.step()

        # ---- metrics: means over the global batch (all ranks) ------------------------------
        metrics = self._step_metrics(
            rollout=rollout, problems=problems, texts=texts, raw_scores=raw_scores, task_scores=task_scores,
            correct=correct, finite=finite, well_formed=well_formed, token_rewards=token_rewards, kl=kl, kl_k1=kl_k1,
            kl_sampling=kl_sampling, has_ref=ref_logprobs is not None, old_logprobs=old_logprobs, response_mask=response_mask,
            advantages=advantages, values=values, returns=returns, kept=kept,
            scalars={"kl_coef": beta, "length_reward_coef": length_coef, **update_metrics},
            batch=batch, timer=timer, step_start=step_start)
        self.step += 1
        return metrics

    def _step_metrics(self, *, rollout, problems, texts, raw_scores, task_scores, correct, finite, well_formed,
                      token_rewards, kl, kl_k1, kl_sampling, has_ref, old_logprobs, response_mask, advantages,
                      values, returns, kept, scalars, batch, timer, step_start) -> dict:
        """This step's metrics, each a mean over the global batch (one all-reduce for all of
        them), plus the decoded samples of every rank for samples.jsonl."""
        cfg = self.config
        means = distributed.GlobalMeans()
        lengths = rollout.response_lengths.float()  # [B]
        for name, values_, mask in (
                ("score", raw_scores, None), ("reward", token_rewards.sum(-1), None), ("accuracy", correct.float(), None),
                ("kl", kl.sum(-1), None if has_ref else 0.0), ("kl_k1", kl_k1.sum(-1), None if has_ref else 0.0),
                ("entropy_rollout", -old_logprobs, response_mask), ("response_length", lengths, None),
                ("response_length_correct", lengths, correct), ("response_length_incorrect", lengths, ~correct),
                ("eos_rate", rollout.has_eos.float(), None), ("advantage_mean", advantages, response_mask),
                ("advantage_abs_mean", advantages.abs(), response_mask),
                ("dropped_sample_frac", (~finite).float(), None), ("well_formed_rate", well_formed.float(), None)):
            # With beta = 0 there is no reference model, so the KL is not measured (NaN), not 0.
            means.add(name, values_, None if mask is None else torch.as_tensor(mask, device=values_.device))
        if rollout.prompt_truncated is not None:
            means.add("prompt_truncated_frac", rollout.prompt_truncated.float())
        # With beta = 0 there is no reference model, so the KLs are not measured (NaN), not 0.
        no_ref = None if has_ref else torch.zeros((), device=kl.device)
        means.add("kl_k1_sampling", kl_sampling.sum(-1), no_ref)
        self._add_incorrect_length_weights(means, lengths, correct, response_mask)
        if self.reward_model is not None:
            means.add("gold_score", task_scores)
        if values is not None:
            means.add("value_mean", values, response_mask)
        if kept is not None:
            zero_groups = zero_advantage_groups(advantages * response_mask, cfg.group_size).float()  # [prompts]
            means.add("zero_advantage_group_frac", zero_groups)
            means.add("zero_advantage_group_frac_kept", zero_groups, kept)
            means.add("kept_group_frac", kept.float())
        means.add_weighted("sampling_rounds", float(batch.rounds), 1.0)
        responses_generated = float(distributed.global_sum(torch.tensor(float(batch.responses_generated))))
        self.samples_generated += int(responses_generated)
        for phase, seconds in timer.seconds.items():
            means.add_weighted(f"time_{phase}", seconds, 1.0)
        means.add_weighted("time_step", time.perf_counter() - step_start, 1.0)
        metrics = {"step": self.step + 1, **means.result(), **scalars, "responses_generated": responses_generated,
                   "samples_generated": self.samples_generated, "lr": self.policy_optimizer.param_groups[0]["lr"]}
        if cfg.retire_mastered:
            metrics["retired_prompts"] = len(self.prompt_pool.retired)
        metrics.update(self._per_level_advantage(problems, advantages, response_mask))
        if values is not None:
            metrics["explained_variance"] = explained_variance(values, returns, response_mask,
                                                               reduce_sum=distributed.global_sum)
        self._last_samples = distributed.gather_objects([
            {"step": self.step + 1, "rank": distributed.rank(), "prompt": p.prompt, "response": t, "score": float(s),
             "correct": bool(c), "has_eos": bool(e)}
            for p, t, s, c, e in list(zip(problems, texts, raw_scores.tolist(), correct.tolist(),
                                          rollout.has_eos.tolist()))[: cfg.log_samples]
        ])
        return metrics

    def _update(self, buffer: ExperienceBuffer, beta: float, temperature: float,
                reused: ReusedForward | None = None) -> dict:
        """PPO epochs over the buffer; returns averaged loss and clipping metrics. The first
        micro-batch takes `reused`'s forward pass, run before the advantages, when given."""
        cfg = self.config
        means = distributed.GlobalMeans()  # loss metrics: each minibatch's, weighted like its loss
        maxima: dict[str, float] = {}  # e.g. ratio_max: the largest over every micro-batch and rank
        step_sums: dict[str, float] = defaultdict(float)  # per optimizer step (gradient norms)
        optimizer_steps = 0
        stop_early = False
        world = distributed.world_size()
        skip_empty_rows = self._skip_empty_rows
        self._set_training(True)
        for epoch, minibatch, micro_batches in buffer.iterate(cfg.ppo_epochs, cfg.num_minibatches,
                                                              cfg.gradient_accumulation_steps, self.shuffle_generator,
                                                              first_order=reused.order if reused else None):
            if stop_early:
                break
            if cfg.whiten_advantages and cfg.whiten_advantages_per_minibatch:
                micro_batches = self._whiten_minibatch_advantages(micro_batches)
            # Weight each micro-batch by its share of the *global* minibatch (tokens or
            # sequences, counted over all ranks), so the accumulated gradient equals one big
            # minibatch on one process; the critic's token-mean loss gets token shares.
            policy_weights, value_weights = accumulation_weights(
                [m["loss_mask"] for m in micro_batches], cfg.loss_agg, skip_empty_rows, distributed.global_sum)
            minibatch_approx_kl = 0.0
            minibatch_loss = 0.0  # checked for NaN / inf before the optimizer step
            for index, (micro, weight, value_weight) in enumerate(zip(micro_batches, policy_weights, value_weights)):
                args = (micro["query_ids"], micro["query_mask"], micro["response_ids"], micro["response_mask"])
                # The first micro-batch's pass ran before the advantages: it was the old policy's too.
                first = reused is not None and epoch == minibatch == index == 0
                forward = reused.update_outputs if first else self._update_forward(args, temperature)
                logprobs, entropy = forward["logprobs"], forward["entropy"]
                mask = micro["loss_mask"]
                loss, metrics = policy_loss(logprobs, micro["old_logprobs"], micro["advantages"], mask,
                                            clip_low=cfg.cliprange, clip_high=cfg.cliprange_high,
                                            dual_clip=cfg.dual_clip, loss_agg=cfg.loss_agg,
                                            max_len=cfg.response_length, skip_empty_rows=skip_empty_rows)
                metrics["pg_loss"] = float(loss.detach())
                if cfg.kl_placement == "loss" and "ref_logprobs" in micro:
                    kl_term, kl_metrics = kl_loss(logprobs, micro["ref_logprobs"], mask, cfg.kl_estimator,
                                                  loss_agg=cfg.loss_agg, max_len=cfg.response_length,
                                                  skip_empty_rows=skip_empty_rows)
                    loss = loss + beta * kl_term
                    metrics.update(kl_metrics)
                entropy_value, _ = entropy_loss(entropy, mask, cfg.loss_agg, max_len=cfg.response_length,
                                                skip_empty_rows=skip_empty_rows)
                # Logged as a per-token mean whatever loss_agg is, so runs are comparable.
                metrics["entropy"] = _masked_mean(entropy.detach(), mask)
                if cfg.entropy_coef > 0:
                    loss = loss - cfg.entropy_coef * entropy_value
                loss = loss * weight
                vf_metrics = {}
                if self.value_model is not None:
                    new_values = forward["values"]  # [b, T]
                    vf_loss, vf_metrics = value_loss(new_values, micro["values"], micro["returns"], mask,
                                                     clip_range_value=cfg.cliprange_value)
                    # One backward for both: the critic's graph is separate, so its gradients
                    # only reach the critic's parameters, scaled by vf_coef.
                    loss = loss + value_weight * cfg.vf_coef * vf_loss
                # DDP averages gradients over the ranks: scale by `world` to sum them instead.
                self.accelerator.backward(loss * world)
                minibatch_loss += float(loss.detach())
                for key, value in vf_metrics.items():  # a token mean: weighted by token share
                    means.add_weighted(key, value_weight * float(value), value_weight)
                minibatch_approx_kl += weight * float(metrics.get("approx_kl", 0.0))
                for key, value in metrics.items():
                    if key.endswith("_max"):  # a maximum over the whole update, not a mean
                        maxima[key] = max(maxima.get(key, -math.inf), float(value))
                    else:
                        means.add_weighted(key, weight * float(value), weight)
            for key, value in self._optimizer_step(minibatch_loss).items():
                step_sums[key] += value
            optimizer_steps += 1
            if cfg.target_kl is not None:  # cleanrl-style early stop of the remaining epochs
                minibatch_approx_kl = float(distributed.global_sum(torch.tensor(minibatch_approx_kl)))
                stop_early = distributed.any_rank(minibatch_approx_kl > cfg.target_kl)  # same on every rank
        averaged = means.result()
        if maxima:
            averaged.update(zip(maxima, distributed.global_max(torch.tensor(list(maxima.values()))).tolist()))
        averaged.update({key: value / max(optimizer_steps, 1) for key, value in step_sums.items()})
        averaged["early_stopped"] = float(stop_early)
        return averaged

    def _set_training(self, mode: bool) -> None:
        """Policy and critic in train (or eval) mode (`ppo.policy.set_training`)."""
        for model in (self.policy, self.value_model):
            if model is not None:
                set_training(model, mode)

    def _update_forward(self, args: tuple, temperature: float) -> dict:
        """The update's forward pass (with autograd): log-probs, entropies and, with a critic,
        values ``[b, T]``."""
        if self.value_model is not None:  # one pass of both when paired (PPOConfig.paired_critic_pass)
            return response_logprobs_and_values(self.policy, self.value_model, *args, temperature=temperature)
        logprobs, entropy = response_logprobs(self.policy, *args, temperature=temperature, with_entropy=True)
        return {"logprobs": logprobs, "entropy": entropy}

    def _reused_update_forward(self, rollout: Rollout, temperature: float, timer: PhaseTimer) -> ReusedForward | None:
        """The update's first micro-batch, drawn now (the first epoch's shuffle), and its forward
        pass with autograd: until that micro-batch's optimizer step the policy cannot move, so
        the pass gives its rows' old log-probs and values as well (PPOConfig.reuse_update_forward).
        None when not reused."""
        if not self.reuses_update_forward:
            return None
        order = torch.randperm(len(rollout.response_ids), generator=self.shuffle_generator)  # the first epoch's
        size = self.micro_batch_size(len(order))
        # The pass sees its rows in the batch's own order, as the other passes see them (with
        # one minibatch: the very same batch, so the reference KL of an unmoved policy is 0).
        rows, position = order[:size].sort()
        inverse = torch.empty_like(position).scatter_(0, position, torch.arange(size))  # micro-batch row -> pass row
        rows, inverse = rows.to(self.device), inverse.to(self.device)
        with timer("update"):
            self._set_training(True)
            outputs = self._update_forward(tuple(t[rows] for t in self._rollout_args(rollout)), temperature)
        return ReusedForward(order=order, rows=rows, rest=order[size:].sort().values.to(self.device), outputs=outputs,
                             update_outputs={name: value[inverse] for name, value in outputs.items()})

    def micro_batch_size(self, batch_size: int) -> int:
        """Rows per micro-batch of the update over a local batch of `batch_size` rows."""
        return batch_size // (self.config.num_minibatches * self.config.gradient_accumulation_steps)

    def _old_pass(self, rollout: Rollout, reused: ReusedForward | None, name: str, run) -> torch.Tensor:
        """Old log-probs or values ``[B, T]``: `run(*args)` over the rollout, or, with a reused
        forward, its detached outputs for its rows and `run` over the rest only."""
        args = self._rollout_args(rollout)
        if reused is None:
            return run(*args)
        first = reused.outputs[name].detach()  # [b, T]
        out = first.new_empty(len(args[0]), *first.shape[1:])
        out[reused.rows] = first
        if len(reused.rest):
            out[reused.rest] = run(*(t[reused.rest] for t in args))
        return out

    @staticmethod
    def _per_level_advantage(problems, advantages: torch.Tensor, response_mask: torch.Tensor) -> dict:
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

    @property
    def _skip_empty_rows(self) -> bool:
        """Filtered groups leave the loss's denominator too, unless the old masking is asked for."""
        return self.config.difficulty_filter and self.config.difficulty_filter_mode != "mask"

    def _sampling_temperature_kl(self, rollout: Rollout, kl_k1: torch.Tensor) -> torch.Tensor:
        """Per-token k1 KL to the reference at the *sampling* temperature, ``[B, T]``.

        `kl_k1` is measured at the temperature the loss uses: the sampling temperature with
        `scale_logits_by_temperature`, else 1. Runs that differ in that toggle would compare
        KLs of different distributions; this one is the same quantity for both (the KL of
        the distributions actually sampled from), at the cost of two extra no-grad forwards
        when the two temperatures differ.
        """
        cfg = self.config
        if cfg.scale_logits_by_temperature or cfg.temperature == 1.0:
            return kl_k1
        with torch.no_grad(), scoring_mode(self.policy, self.value_model):
            args = self._rollout_args(rollout)
            policy = response_logprobs(self.policy, *args, temperature=cfg.temperature)
            reference = response_logprobs(self.ref_policy, *args, temperature=cfg.temperature)
        return (policy - reference) * rollout.response_mask.float()

    def _add_incorrect_length_weights(self, means, lengths, correct, response_mask) -> None:
        """Per-token loss weight (relative to `token_mean`) of wrong answers longer and not
        longer than the mean wrong answer: `loss_weight_incorrect_long` / `_short`.

        Under GRPO's `seq_mean_token_mean` the long ones get less push per token (weight
        N / (B * L)); under `token_mean` and Dr. GRPO's constant both are equal. Weights are
        those of this rank's batch over the response mask (`ppo.losses.token_loss_weights`).
        """
        cfg = self.config
        weights = token_loss_weights(response_mask, cfg.loss_agg, cfg.response_length, self._skip_empty_rows)  # [B]
        incorrect = (~correct).double()
        totals = distributed.global_sum(torch.stack([(lengths.double() * incorrect).sum(), incorrect.sum()]))
        mean_length = totals[0] / totals[1].clamp(min=1)
        means.add("loss_weight_incorrect_long", weights, incorrect * (lengths > mean_length).double())
        means.add("loss_weight_incorrect_short", weights, incorrect * (lengths <= mean_length).double())

    @staticmethod
    def _gather_pass_rates(problems, pass_rates: torch.Tensor) -> tuple[list, torch.Tensor]:
        """Every rank's (problem, group pass rate) pairs, so all ranks retire the same prompts."""
        pairs = distributed.gather_objects(list(zip(problems, pass_rates.tolist())))
        return [problem for problem, _ in pairs], torch.tensor([rate for _, rate in pairs])

    # ====================================================================================
    # Plumbing: models, optimisers, devices
    # ====================================================================================
    def _build_value_model(self, policy) -> ScalarHeadModel:
        cfg = self.config
        if cfg.value_init == "reward_model":
            model = ScalarHeadModel.from_pretrained(cfg.reward_model_path, zero_head=True)
        elif cfg.value_init == "policy":
            model = ScalarHeadModel.from_policy(policy, head_init="zero")
        else:
            model = ScalarHeadModel.random_like(policy)
        if cfg.disable_dropout:
            disable_dropout(model)
        return cast_master_weights(model, cfg.model_dtype).to(self.device)

    def _apply_memory_toggles(self, policy):
        """LoRA adapters (ppo/lora.py) and gradient checkpointing, on the policy and critic."""
        cfg = self.config
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
            if self.value_model is not None:
                enable_gradient_checkpointing(self.value_model)
        if cfg.lora_r:
            policy = apply_lora(policy, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules)
            if self.value_model is not None and cfg.lora_critic:
                self.value_model.backbone = apply_lora(self.value_model.backbone, cfg.lora_r, cfg.lora_alpha,
                                                       cfg.lora_target_modules, task_type=None)
            if cfg.disable_dropout:
                disable_dropout(policy)
        return policy

    def _optimizer_step(self, loss: float | None = None) -> dict[str, float]:
        """Clip, guard and step (ppo/optimization.py); the gradient norms before clipping."""
        return optimizer_step(self.accelerator, self.policy_optimizer, self.value_optimizer, self._model_parameters,
                              self.config.max_grad_norm, self.step + 1, loss)

    def _whiten_minibatch_advantages(self, micro_batches: list[dict]) -> list[dict]:
        advantages = torch.cat([m["advantages"] for m in micro_batches])
        mask = torch.cat([m["response_mask"] for m in micro_batches])
        whitened = whiten(advantages, mask, reduce_sum=distributed.global_sum).split([m["advantages"].shape[0] for m in micro_batches])
        return [{**m, "advantages": w} for m, w in zip(micro_batches, whitened)]

    def _sample_and_score(self, policy, n_prompts: int, timer: PhaseTimer) -> ScoredBatch:
        """Draw `n_prompts` prompts, sample G responses each and score them (one round)."""
        cfg = self.config
        problems = [p for p in self.prompt_pool.sample(n_prompts) for _ in range(cfg.group_size)]  # [B]
        with timer("generate"):
            rollout = generate(policy, self.tokenizer, [p.prompt for p in problems], cfg.response_length,
                               temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                               return_logits=cfg.logprobs_from_generation, stop_token_ids=self.stop_token_ids,
                               max_prompt_length=self.max_prompt_length, prompt_truncation=cfg.prompt_truncation)
        rollout = self._to_device(rollout)
        texts = decode_responses(self.tokenizer, rollout)
        with timer("score"):
            score_objects = score_batch(self.task, problems, texts, rollout.has_eos.tolist())
            task_scores = torch.tensor([s.reward for s in score_objects], device=self.device)  # [B]
            # RLHF: the policy optimises the (proxy) reward model; the task's own score and
            # verdict are the gold, logged but never trained on (PPOConfig.validate refuses
            # the toggles that would read the verdict).
            raw_scores = self._reward_model_scores(rollout) if self.reward_model is not None else task_scores  # [B]
            correct = torch.tensor([s.correct for s in score_objects], device=self.device)  # [B]
            well_formed = torch.tensor([s.well_formed for s in score_objects], device=self.device)  # [B]
        return ScoredBatch(problems, rollout, texts, task_scores, raw_scores, correct, well_formed)

    def _to_device(self, rollout: Rollout) -> Rollout:
        for name in ("query_ids", "query_mask", "response_ids", "response_mask", "has_eos"):
            setattr(rollout, name, getattr(rollout, name).to(self.device))
        return rollout

    @staticmethod
    def _rollout_args(rollout: Rollout):
        return rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask

    def _score_source(self) -> str:
        """What produced the sequence scores, for error messages."""
        if self.reward_model is not None:
            return f"the reward model {self.config.reward_model_path}"
        reward_fn = getattr(self.task, "reward_fn", None)
        if reward_fn is not None:
            return f"reward_fn {getattr(reward_fn, '__qualname__', type(reward_fn).__name__)}"
        return f"task {getattr(self.task, 'name', type(self.task).__name__)}"

    def _reward_model_scores(self, rollout: Rollout) -> torch.Tensor:
        """Reward-model score read at the last response token, ``[B]`` (as in RM training)."""
        with torch.no_grad():
            return last_token_scores(self.reward_model, *self._rollout_args(rollout))

    # ====================================================================================
    # Plumbing: the run (logging, evaluation, checkpoints)
    # ====================================================================================
    def evaluate(self) -> dict:
        """Held-out metrics; with N processes each scores every N-th problem and all are reduced."""
        cfg = self.config
        problems = list(self.task.eval_problems())
        if cfg.eval_size is not None:
            problems = problems[: cfg.eval_size]
        shard = problems[distributed.rank()::distributed.world_size()]
        seed = distributed.rank_seed(cfg.seed, distributed.rank())
        metrics = evaluate(self.policy_module, self.tokenizer, self.task, cfg.response_length, temperature=1.0,
                           seed=seed, problems=shard, gather=distributed.gather_objects)
        if hasattr(self.task, "extra_eval"):
            # Task-specific held-out metrics (e.g. gold reward and win rate against the SFT
            # policy for the simulated-preference task); it reseeds, so every generator is restored.
            with preserve_rng_state():
                extra = self.task.extra_eval(self.policy_module, self.tokenizer, shard, cfg.response_length, seed)
            means = distributed.GlobalMeans()  # per-problem means: weight each shard by its size
            for name, value in extra.items():
                means.add_weighted(name, value * len(shard), len(shard))
            metrics.update(means.result())
        return metrics

    def train(self, resume: bool = False, stop_after: int | None = None, restart: bool = False,
              allow_changes: list[str] | tuple[str, ...] = ()) -> dict:
        """Run to `config.total_steps` (continuing from the latest intact checkpoint if `resume`).

        `restart` deletes an earlier attempt's outputs first; `allow_changes` names config
        fields a resume may change beyond `ppo.config.RESUMABLE_FIELDS` (see ppo/run_dir.py).

        `stop_after` ends this session early after that step, with a checkpoint, so a long
        run can be split across time-limited jobs and continued with ``resume=True``.
        """
        from torch.utils.tensorboard import SummaryWriter

        cfg = self.config
        start_time = time.perf_counter()
        # One writer: only the main process writes the run directory's files.
        main = distributed.is_main_process()
        if restart and main:
            run_dir.clear_outputs(self.output_dir)
        distributed.barrier()
        changes, loaded = {}, False
        if resume:
            # Refuses a changed config (unless allowed); a run killed before its first
            # checkpoint starts again from step 0.
            changes = run_dir.resume_changes(self.output_dir, cfg, allow_changes)
            loaded = self.load_checkpoint()
            if not loaded:
                warnings.warn(f"{self.output_dir}: no checkpoint yet; the run starts again from step 0")
        elif (self.output_dir / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.output_dir}: a run already exists here; pass resume=True (--resume) to "
                                  "continue it, restart=True (--restart) to start it over, or choose another "
                                  "output_dir")
        distributed.barrier()  # every rank has checked before the main process creates the run
        if main:
            run_dir.open_run(self.output_dir, cfg, resume, self.step if loaded else -1, changes)
            self.writer = SummaryWriter(str(self.output_dir))
            if self.step == 0:
                self.writer.add_text("config", describe(cfg), 0)
        initial_eval = None
        if self.step == 0:
            initial_eval = self.evaluate()
            self._log({"step": 0, **{f"eval_{k}": v for k, v in initial_eval.items()}})
            if main:
                (self.output_dir / "initial_eval.json").write_text(json.dumps(initial_eval, indent=2))
        elif (self.output_dir / "initial_eval.json").exists():
            initial_eval = json.loads((self.output_dir / "initial_eval.json").read_text())
        bar = tqdm(total=cfg.total_steps, initial=self.step, desc=f"RL ({cfg.advantage_estimator})",
                   disable=not (cfg.progress and main), dynamic_ncols=True)
        final_eval = None
        end = cfg.total_steps if stop_after is None else min(stop_after, cfg.total_steps)
        while self.step < end:
            metrics = self.train_step()
            last = self.step == cfg.total_steps
            if last or (cfg.eval_every and self.step % cfg.eval_every == 0):
                eval_metrics = self.evaluate()
                metrics.update({f"eval_{k}": v for k, v in eval_metrics.items()})
                final_eval = eval_metrics if last else final_eval
            self._log(metrics)
            self._write_samples()
            if last or self.step == end or (cfg.save_every and self.step % cfg.save_every == 0):
                self.save_checkpoint()
            bar.update(1)
            bar.set_postfix(acc=f"{metrics['accuracy']:.2f}", kl=f"{metrics['kl']:.3f}",
                            eval=f"{metrics.get('eval_sampled_accuracy', float('nan')):.2f}")
        bar.close()
        if self.writer is not None:
            self.writer.close()
        final_eval = final_eval or self.evaluate()
        summary = {
            "steps": self.step,
            "samples": self.samples_generated,  # responses generated (dynamic sampling generates extra)
            "wall_seconds_this_session": time.perf_counter() - start_time,
            "initial_eval": initial_eval,
            "final_eval": final_eval,
        }
        if initial_eval:
            summary["sampled_accuracy_gain"] = final_eval["sampled_accuracy"] - initial_eval["sampled_accuracy"]
        summary["processes"] = distributed.world_size()
        if main:
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _log(self, metrics: dict) -> None:
        if not distributed.is_main_process():
            return
        with open(self.output_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(metrics) + "\n")
        # One tensorboard event per step holding every scalar (the same tags, values and step
        # as one add_scalar call each, at a fraction of the cost).
        scalars = {key: float(value) for key, value in metrics.items()
                   if key != "step" and isinstance(value, (int, float)) and not math.isnan(value)}
        write_scalars(self.writer, scalars, metrics["step"])

    def _write_samples(self) -> None:
        if not distributed.is_main_process():
            return
        with open(self.output_dir / "samples.jsonl", "a") as handle:
            for sample in self._last_samples:
                handle.write(json.dumps(sample) + "\n")

    # -- checkpoints (ppo/checkpoints.py) ------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_N`` atomically; see `ppo.checkpoints.save`."""
        return checkpoints.save(self)

    def load_checkpoint(self) -> bool:
        """Restore the newest intact checkpoint; False when there is none (`ppo.checkpoints.load`)."""
        return checkpoints.load(self)


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    """Write `scalars` as one tensorboard event at `step`."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()])
    writer._get_file_writer().add_summary(summary, step)

"""The RL training loop: PPO, and the GRPO family as the same loop with other toggles.

This file is the algorithm only. One iteration (`RLTrainer.train_step`) reads top to bottom
in the order the algorithm runs:

    1-2. rollout, score  sample a group of responses per prompt; task or reward-model score
    3.   forward         old log-probs (policy), reference log-probs, values (critic)
    4.   KL              per-token KL estimate to the reference (ppo/algorithm/kl.py)
    5.   rewards         per-token rewards: score at the last token, -beta*KL (ppo/algorithm/rewards.py)
    6.   advantages      GAE with the critic, or group-relative (gae/)
    7.   update          epochs x minibatches x micro-batches of clipped surrogate + value loss
                         (+ the reverse KL to a teacher: on-policy distillation, ppo/algorithm/distillation.py)
    8.   KL control      adapt beta (adaptive controller), step the learning-rate schedule

GRPO is not a second trainer: it is this loop with ``advantage_estimator="grpo"`` (no critic
is built), ``kl_placement="loss"`` and ``group_size > 1``. New to the code? Read
`ppo/minimal.py` first: the same two algorithms in one file, tested equal to this one.

What a reader may skip lives in modules named for it, one call each from here: building the
models and optimizers (`ppo/models/setup.py`), the forward passes and their exact speed paths
(`ppo/models/forward_passes.py`), what a step logs (`ppo/run/metrics.py`), the run loop, evaluation
and logging (`ppo/run/run_loop.py`), checkpoints (`ppo/run/checkpoints.py`), the optimizer step
(`ppo/models/optimization.py`), collectives across processes (`ppo/parallel/distributed.py`), sharded
models (`ppo/parallel/sharding.py`).

The trainer composes its collaborators, each built once and handed to what needs it: the
models and optimizers (``self.models``, a `ppo.models.setup.Models`), where the run stands
(``self.state``, a `ppo.run.checkpoints.TrainingState`: step, RNG streams, KL controller, ...),
the forward passes (``self.passes``), the run directory (``self.output_dir``) and, while
`train` runs, the loop (`ppo.run.run_loop.TrainingRun`). No function outside this file takes
the trainer. Attributes that moved into a collaborator stay readable here
(``trainer.policy`` is ``trainer.models.policy``, ``trainer.step`` is ``trainer.state.step``).
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Callable

import torch

from gae import estimate_advantages, whiten

from ppo.speed import allocator
from ppo.run import checkpoints, guards, run_dir, run_loop
from ppo.run.checkpoints import TrainingState
from ppo.settings import config_checks
from ppo.parallel import distributed, sharding, vllm_sampler
from ppo.algorithm import rollout_correction
from ppo.algorithm.buffer import ExperienceBuffer, accumulation_weights, with_group_shares
from ppo.config import PPOConfig
from ppo.algorithm.dynamic_sampling import ScoredBatch, sample_batch
from ppo.run.evaluation import score_batch
from ppo.algorithm.filtering import PromptPool, gather_pass_rates, group_pass_rates, keep_groups
from ppo.models.forward_passes import ForwardPasses
from ppo.algorithm.kl import make_kl_controller
from ppo.algorithm.losses import critic_loss_mask, entropy_loss, kl_loss, positive_nll_loss, value_loss
from ppo.run.metrics import PhaseTimer, UpdateTally, critic_diagnostics, masked_mean, phase, step_metrics, timed_step
from ppo.models.setup import build_models, warm_start_path
from ppo.models.staleness import PolicyHistory
from ppo.algorithm.policy_losses import EntropyControl, policy_loss, policy_loss_options, top_entropy_mask
from ppo.algorithm.remax import greedy_baselines
from ppo.algorithm.rewards import (apply_missing_eos, clip_scores, format_reward, group_kimi_length_reward, length_reward_weight,
                      overlong_penalty, reward_components, score_positions, shape_rewards, whiten_rewards,
                      whitening_gae_mask)
from ppo.models.rollout import Rollout, decode_responses, generate, pad_to_width
from ppo.tasks import build_task, chat, custom_task_config


class _Held:
    """A trainer attribute held by one of its collaborators: ``_Held("models")`` named
    ``policy`` reads and sets ``trainer.models.policy``."""

    def __init__(self, collaborator: str, name: str | None = None):
        self.collaborator, self.name = collaborator, name

    def __set_name__(self, owner, name: str) -> None:
        self.name = self.name or name

    def __get__(self, trainer, owner=None):
        return self if trainer is None else getattr(getattr(trainer, self.collaborator), self.name)

    def __set__(self, trainer, value) -> None:
        setattr(getattr(trainer, self.collaborator), self.name, value)


class RLTrainer:
    """Runs one PPO / GRPO training run described by a `PPOConfig`.

    Args:
        config: every setting of the run.
        task: a task object (see `ppo.tasks.base.Task`); built from the config if None.
        prompts, reward_fn: a user's own prompts (a list or tuple of strings) and
            ``reward_fn(prompts, responses) -> list[float]``, as TRL users pass them: they set
            up a `CustomTask`, and the default ``task='arithmetic'`` becomes ``'custom'`` in the
            run's config; a task with its own data ('gsm8k', 'preference') refuses them.
        policy, tokenizer: an already loaded policy (otherwise `config.model_path`, or the
            testbed's SFT warm start when that is None).

    Example (runs on a CPU in about a minute; the first call builds the warm start)::

        from ppo.config import preset
        from ppo.trainer import RLTrainer

        def reward_fn(prompts, responses):  # any Python scorer: one float per response
            return [float(r.strip().startswith("1")) for r in responses]

        config = preset("grpo", testbed=True, total_steps=5, eval_every=0, output_dir="runs/mine")
        trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "4+4=", "9+1="], reward_fn=reward_fn)
        summary = trainer.train()          # writes runs/mine: metrics.jsonl, checkpoints, ...
        print(summary["final_eval"])       # held-out metrics after training
    """

    def __init__(self, config: PPOConfig, task=None, prompts: list[str] | None = None,
                 reward_fn: Callable | None = None, policy=None, tokenizer=None):
        config = sharding.from_launcher(config)  # an accelerate FSDP launch config asks for sharding="fsdp"
        config.validate_for_run()
        if task is not None and (prompts is not None or reward_fn is not None):
            raise ValueError("RLTrainer: pass a task, or prompts and reward_fn, not both (the task would ignore them)")
        config = custom_task_config(config, prompts, reward_fn) if task is None else config
        self.config = config
        self.accelerator = distributed.make_accelerator(config)  # one precision per process
        # Settings this configuration never reads: warned once, kept for summary.json and the model card.
        self.config_warnings = config_checks.run_warnings(config, distributed.world_size())
        if distributed.is_main_process():
            for message in self.config_warnings:
                warnings.warn(message, config_checks.InertSettingWarning, stacklevel=2)
        self.device = self.accelerator.device
        # The warm start is found (or, the first time, trained) before the thread count and
        # the seeds are set: a run must not depend on whether its warm start was cached.
        model_path = warm_start_path(config) if policy is None else None
        if config.device == "cpu" or not torch.cuda.is_available():
            torch.set_num_threads(config.threads)
            if config.retain_freed_memory:
                allocator.retain_freed_memory()
        # Data parallelism: `rollout_batch_size` is the global batch; each rank holds a share
        # and draws its own prompts from its own seed (rank 0 keeps `seed`).
        self.local_batch_size = config.per_process_batch_size(distributed.world_size())
        seed = distributed.rank_seed(config.seed, distributed.rank())
        random.seed(seed)
        torch.manual_seed(seed)
        self.task = task if task is not None else build_task(config, prompts, reward_fn)
        rng = random.Random(seed)  # prompt sampling
        self.state = TrainingState(  # step 0: everything a checkpoint restores besides the models
            rng=rng, prompt_pool=PromptPool(self.task, rng),
            shuffle_generator=torch.Generator().manual_seed(seed),  # minibatch order
            kl_controller=make_kl_controller(config.kl_coef, config.adaptive_kl, config.kl_target, config.kl_horizon,
                                             rule=config.kl_controller, k_beta=config.kl_k_beta),
            entropy_control=EntropyControl(config.entropy_coef, config.entropy_target, config.entropy_coef_step))
        self.output_dir = run_dir.resolve(config.output_dir)  # as the filesystem sees it, once
        self.models = build_models(config, self.accelerator, model_path, policy, tokenizer)  # policy, ref, critic, ...
        # An instruct tokenizer's chat template renders every prompt; its end-of-turn token stops responses.
        self.task, self.models.stop_token_ids = chat.for_tokenizer(self.task, self.tokenizer, config, self.stop_token_ids)
        self.prompt_pool.task = self.task
        # rollout_staleness = k: rollouts sampled by the weights of k steps earlier, kept exactly
        self.state.policy_history = PolicyHistory(self.policy_module, config.rollout_staleness)
        # generation_backend='vllm': this process's engine (synced from the weights sampling uses), else None
        self.vllm_sampler = vllm_sampler.build(config, self.state.policy_history.sampler, self.policy_optimizer,
                                               self.device)
        self.timer = PhaseTimer()
        self.passes = ForwardPasses(self.policy, self.value_model, self.ref_policy, config, self.shuffle_generator,
                                    self.micro_batch_size, self.timer, teacher=self.teacher)
        self.last_samples: list[dict] = []  # the last step's decoded samples, for samples.jsonl
        self.already_finished = False  # set by a resume of a run that had already finished (`train`)

    # Attributes users, tests and docs read, held by the collaborators.
    model_path, tokenizer, stop_token_ids, max_prompt_length = (_Held("models") for _ in range(4))
    policy, policy_module, value_model, ref_policy, reward_model, teacher = (_Held("models") for _ in range(6))
    policy_optimizer, value_optimizer = _Held("optimizers", "policy"), _Held("optimizers", "value")
    schedulers, model_parameters = _Held("optimizers"), _Held("optimizers", "parameters")
    step, samples_generated, latest_eval = (_Held("state") for _ in range(3))
    rng, shuffle_generator, prompt_pool, kl_controller, entropy_control = (_Held("state") for _ in range(5))

    @property
    def optimizers(self):
        """The run's optimizers and schedules (`ppo.models.optimization.Optimizers`)."""
        return self.models.optimizers

    # ====================================================================================
    # The algorithm
    # ====================================================================================
    @timed_step
    def train_step(self) -> dict:
        """One RL iteration; returns this step's metrics."""
        cfg = self.config

        # ---- 1-2. rollout and score: G samples per prompt, contiguous -------------------
        # One round, or (difficulty_filter_mode="resample") DAPO's dynamic sampling: rounds
        # until this rank's share is made of groups inside the pass-rate band.
        resample = cfg.difficulty_filter and cfg.difficulty_filter_mode == "resample"
        batch = sample_batch(self._sample_and_score, self.local_batch_size // cfg.group_size, cfg.group_size,
                             band=(cfg.filter_min_pass_rate, cfg.filter_max_pass_rate),
                             max_rounds=cfg.dynamic_sampling_max_rounds if resample else 1,
                             pad_token_id=self.tokenizer.pad_token_id)  # B = prompts x G
        if cfg.pad_to_response_length:  # AlpacaFarm's fixed width: statistics over padding see it all
            batch.rollout = pad_to_width(batch.rollout, cfg.response_length, self.tokenizer.pad_token_id)
        rollout = batch.rollout
        response_mask = rollout.response_mask.float()  # [B, T]
        # A NaN / inf score stops the run here, before any update or save (ppo/run/guards.py),
        # unless nonfinite_rewards='drop' keeps those samples out of the loss below.
        finite = guards.check_scores(batch.raw_scores, [p.prompt for p in batch.problems], batch.texts,
                                     self._score_source(), drop=cfg.nonfinite_rewards == "drop")  # [B]
        batch.raw_scores = guards.drop_nonfinite_scores(batch.raw_scores, finite, cfg.group_size)  # [B]

        # ---- 3. old log-probs, reference log-probs, values (no autograd) ---------------
        old_logprobs = self.passes.old_logprobs(rollout)  # [B, T]
        ref_logprobs = self.passes.ref_logprobs(rollout)  # [B, T]; None when beta = 0
        values = self.passes.values(rollout)  # [B, T]; None without a critic

        # ---- 4. per-token KL to the reference -----------------------------------------
        beta = self.kl_controller.value
        kl = kl_k1 = kl_sampling = torch.zeros_like(old_logprobs)  # [B, T]; not measured when beta = 0
        if ref_logprobs is not None:
            kl = self.passes.kl_estimate(rollout, old_logprobs, ref_logprobs) * response_mask  # "full": exact
            kl_k1 = (old_logprobs - ref_logprobs) * response_mask  # [B, T]: the unclamped k1 estimate
            kl_sampling = self.passes.sampling_temperature_kl(rollout, kl_k1)  # [B, T]: k1 at the sampling T

        # ---- 5-6. per-token rewards, then advantages and returns ------------------------
        kl_in_reward = cfg.kl_placement == "reward" and ref_logprobs is not None
        token_rewards, gae_mask, length_coef = self._token_rewards(batch, kl, response_mask, beta, kl_in_reward)
        remax = cfg.advantage_estimator == "remax"  # ReMax: the greedy response's score is the baseline
        baselines = greedy_baselines(cfg, self.models, self.task, batch) if remax else None  # [B]
        advantages, returns, critic_stats = self._advantages(token_rewards, gae_mask, values, response_mask, baselines,
                                                             rollout.response_lengths, batch, finite)
        # Responses cut off at response_length can be left out of the loss (DAPO).
        loss_mask = response_mask * rollout.has_eos.float()[:, None] if cfg.mask_truncated_responses else response_mask
        loss_mask = loss_mask * finite.float()[:, None]  # dropped non-finite scores (nonfinite_rewards='drop')
        kept = None
        if cfg.group_size > 1:
            # Difficulty filtering: groups every sample solved (or none did) carry no signal.
            pass_rates = group_pass_rates(batch.correct, cfg.group_size)  # [prompts]
            kept = torch.ones_like(pass_rates, dtype=torch.bool)
            if cfg.difficulty_filter:
                kept = keep_groups(pass_rates, cfg.filter_min_pass_rate, cfg.filter_max_pass_rate)  # [prompts]
                loss_mask = loss_mask * kept.repeat_interleave(cfg.group_size).float()[:, None]
            if cfg.retire_mastered:  # every rank retires what any rank mastered, in every round
                self.prompt_pool.retire(*gather_pass_rates(batch.seen_problems, batch.seen_pass_rates))

        advantages, loss_mask, mismatch = rollout_correction.correct(  # sampler vs trainer log-probs: TIS / MIS
            cfg, rollout, old_logprobs, advantages, loss_mask, self.passes.temperature, distributed.global_sum)

        # ---- 7. update: epochs x shuffled minibatches x micro-batches ------------------
        tensors = dict(query_ids=rollout.query_ids, query_mask=rollout.query_mask, response_ids=rollout.response_ids,
                       response_mask=response_mask, loss_mask=loss_mask, old_logprobs=old_logprobs,
                       advantages=advantages, returns=returns, ref_logprobs=ref_logprobs, values=values,
                       ref_log_probs_full=self.passes.ref_log_probs_full,  # [B, T, V] for "full" in the loss
                       behaviour_logprobs=rollout_correction.behaviour_logprobs(cfg, rollout, self.passes.temperature),
                       positive_mask=loss_mask * batch.correct.float()[:, None] if cfg.positive_nll_coef > 0 else None)
        if values is not None and (cfg.value_loss_over_padding or cfg.score_position != "last_token"):
            # The critic's loss covers padding (AlpacaFarm) or the column after the last token (TRL).
            tensors["critic_mask"] = critic_loss_mask(loss_mask, cfg.value_loss_over_padding, cfg.score_position)
        buffer = ExperienceBuffer({name: t for name, t in tensors.items() if t is not None})
        update_metrics = self._update(buffer, beta)

        # ---- 8. KL controller and learning-rate schedule -------------------------------
        self.kl_controller.update(distributed.global_mean(kl.sum(-1)), cfg.rollout_batch_size)  # mean sequence KL
        self.optimizers.step_schedules()
        self.passes.refresh_reference(self.step + 1)  # ref_update_every: reset or mix the reference (off by default)

        metrics, self.last_samples = step_metrics(
            cfg, self.state, self.timer, batch, buffer, token_rewards=token_rewards, kl=kl, kl_k1=kl_k1,
            kl_sampling=kl_sampling, finite=finite, kept=kept, skip_empty_rows=self.skip_empty_rows,
            lr=self.optimizers.lr, scalars={"kl_coef": beta, "length_reward_coef": length_coef, **critic_stats,
                                            **update_metrics, **self.passes.kl_metrics(), **mismatch})
        self.step += 1
        return metrics

    @phase("rewards")
    def _token_rewards(self, batch: ScoredBatch, kl, response_mask, beta: float, kl_in_reward: bool):
        """Phase 5: sequence scores -> per-token rewards ``[B, T]`` (score at the last token,
        -beta * KL per token when the KL is in the reward), the mask GAE runs over, and this
        step's Kimi length-reward weight."""
        cfg, rollout = self.config, batch.rollout
        scores = apply_missing_eos(batch.raw_scores, rollout.has_eos, cfg.missing_eos,
                                   cfg.missing_eos_penalty, cfg.missing_eos_value)  # [B]
        length_coef = length_reward_weight(self.step, cfg.length_reward_coef, cfg.length_reward_warmup_steps)
        # The score's named parts, logged one by one and normalised one by one under GDPO.
        batch.reward_components, batch.reward_weights = reward_components(
            scores, batch.correct, batch.well_formed, rollout.response_lengths, cfg.group_size, length_coef,
            cfg.format_reward_coef)  # [B, 3], [3]
        if length_coef > 0:
            scores = scores + length_coef * group_kimi_length_reward(
                rollout.response_lengths.float(), batch.correct, cfg.group_size)
        scores = scores + format_reward(batch.well_formed, cfg.format_reward_coef)
        if cfg.overlong_buffer_length > 0:  # DAPO's soft overlong punishment
            scores = scores + overlong_penalty(rollout.response_lengths, cfg.response_length,
                                               cfg.overlong_buffer_length, cfg.overlong_penalty_factor)
        scores = clip_scores(scores, cfg.reward_clip)  # [B]
        token_rewards = shape_rewards(scores, kl, response_mask, beta, kl_in_reward=kl_in_reward,
                                      score_position=cfg.score_position)  # [B, T]
        # TRL's score position adds the column after the last token to what sees the score.
        reward_mask = score_positions(response_mask, cfg.score_position)  # [B, T]
        whitening = cfg.reward_whitening_mode if cfg.whiten_rewards else "masked"
        if cfg.whiten_rewards:  # over the global batch, or each process's share (whitening_scope: AlpacaFarm's)
            token_rewards = whiten_rewards(token_rewards, reward_mask, whitening,
                                           reduce_sum=distributed.whitening_sum(cfg.whitening_scope))
        # AlpacaFarm's exact form runs GAE over every column, padding included; so does a
        # critic with values on padding (value_loss_over_padding), whose loss fits those returns.
        gae_mask = whitening_gae_mask(reward_mask, whitening)  # [B, T]
        if cfg.value_loss_over_padding:
            gae_mask = torch.ones_like(response_mask)  # [B, T]
        return token_rewards, gae_mask, length_coef

    @phase("advantages")
    def _advantages(self, token_rewards, gae_mask, values, response_mask, reward_baselines=None, lengths=None,
                    batch: ScoredBatch | None = None, valid=None):
        """Phase 6: advantages and returns ``[B, T]`` by the configured estimator, batch
        statistics over all ranks; whitened over the whole batch unless per minibatch (over each
        rank's share under ``whitening_scope="process"``). Also
        the critic's diagnostics, taken before whitening (`ppo.run.metrics.critic_diagnostics`).
        `valid` ``[B]``: the samples whose score counts in the group statistics (dropped
        non-finite scores do not); `batch` carries the reward components GDPO normalises."""
        cfg = self.config
        advantages, returns = estimate_advantages(
            cfg.advantage_estimator, token_rewards=token_rewards, response_mask=gae_mask, values=values,
            group_size=cfg.group_size, gamma=cfg.gamma, lam=cfg.lam, grpo_scale=cfg.grpo_scale,
            grpo_eps=cfg.grpo_eps, grpo_std_correction=cfg.grpo_std_correction,
            reinforce_baseline=cfg.reinforce_baseline, rft_min_score=cfg.rft_min_score,
            lam_critic=cfg.lam_critic, lam_length_alpha=cfg.lam_length_alpha, response_lengths=lengths,
            reward_baselines=reward_baselines, sample_mask=valid,
            reward_components=None if batch is None else batch.reward_components,
            reward_weights=None if batch is None else batch.reward_weights,
            reduce_sum=distributed.global_sum)  # [B, T] each
        critic_stats = {} if values is None else critic_diagnostics(advantages, token_rewards, values, gae_mask,
                                                                   response_mask, cfg.gamma)
        if cfg.whiten_advantages and not cfg.whiten_advantages_per_minibatch:
            over = None if cfg.whiten_advantages_over_padding else response_mask  # AlpacaFarm: unmasked
            advantages = whiten(advantages, over, reduce_sum=distributed.whitening_sum(cfg.whitening_scope))
        return advantages, returns, critic_stats

    @phase("update")
    def _update(self, buffer: ExperienceBuffer, beta: float) -> dict:
        """Phase 7: PPO epochs over the buffer, one optimizer step per minibatch (its
        micro-batches' gradients accumulated); returns averaged loss and clipping metrics."""
        cfg = self.config
        tally = UpdateTally(cfg.metric_denominator)  # "all_positions": AlpacaFarm's clipfrac over [B, T]
        stop_early = False
        train_policy = self.step >= cfg.critic_warmup_steps  # critic warm-up: the policy waits (verl, OpenRLHF)
        self.models.set_training(True)
        for _, _, micro_batches in buffer.iterate(cfg.ppo_epochs, cfg.num_minibatches,
                                                  cfg.gradient_accumulation_steps, self.shuffle_generator):
            if stop_early:
                break
            if cfg.whiten_advantages and cfg.whiten_advantages_per_minibatch:
                micro_batches = self._whiten_minibatch_advantages(micro_batches)
            if cfg.loss_agg == "prompt_mean":  # each prompt weighs the same, however its group was split
                micro_batches = with_group_shares(micro_batches, cfg.group_size, self.skip_empty_rows)
            # Weight each micro-batch by its share of the *global* minibatch (tokens or
            # sequences, counted over all ranks), so the accumulated gradient equals one big
            # minibatch on one process; the critic's token-mean loss gets token shares.
            critic_masks = [m["critic_mask"] for m in micro_batches] if "critic_mask" in micro_batches[0] else None
            policy_weights, value_weights = accumulation_weights(
                [m["loss_mask"] for m in micro_batches], cfg.loss_agg, self.skip_empty_rows, distributed.global_sum,
                value_masks=critic_masks, group_shares=[m.get("group_share") for m in micro_batches])
            nll_weights = accumulation_weights([m.get("positive_mask", m["loss_mask"]) for m in micro_batches],
                                               "token_mean", reduce_sum=distributed.global_sum)[0]  # VAPO's NLL
            minibatch_approx_kl = minibatch_loss = 0.0  # the loss is checked for NaN before stepping
            entropy_coef = self.entropy_control.applied  # one coefficient for the whole minibatch
            for micro, weight, value_weight, nll_weight in zip(micro_batches, policy_weights, value_weights, nll_weights):
                outputs = self.passes.update(micro)  # logprobs, entropy (, values): [b, T], with autograd
                logprobs, entropy, mask = outputs["logprobs"], outputs["entropy"], micro["loss_mask"]
                agg = dict(loss_agg=cfg.loss_agg, max_len=cfg.response_length, skip_empty_rows=self.skip_empty_rows,
                           group_share=micro.get("group_share"))
                train_on = (top_entropy_mask(entropy, mask, cfg.top_entropy_quantile)
                            if cfg.top_entropy_quantile < 1.0 else None)  # [b, T] or all tokens
                loss, metrics = policy_loss(logprobs, micro["old_logprobs"], micro["advantages"], mask,
                                            **policy_loss_options(cfg), train_on=train_on,
                                            behaviour_logprobs=micro.get("behaviour_logprobs"),
                                            generator=self.shuffle_generator, **agg)
                metrics["pg_loss"] = float(loss.detach())
                if cfg.kl_placement == "loss" and "ref_logprobs" in micro:
                    kl_term, kl_metrics = kl_loss(logprobs, micro["ref_logprobs"], mask, cfg.kl_estimator, **agg,
                                                      **self.passes.kl_loss_inputs(micro))
                    loss = loss + beta * kl_term
                    metrics.update(kl_metrics)
                entropy_value, _ = entropy_loss(entropy, mask, **agg)
                metrics["entropy"] = masked_mean(entropy.detach(), mask)  # per token whatever loss_agg is
                self.entropy_control.observe(entropy, mask)
                if entropy_coef > 0:
                    loss = loss - entropy_coef * entropy_value
                if cfg.distill_coef > 0 or cfg.distill_only:  # on-policy distillation: reverse KL to the teacher
                    distill_term, kl_sum, tokens = self.passes.distillation_loss(micro, **agg)
                    # distill_only: the teacher's KL is the whole objective (Qwen3); else one more term.
                    loss = distill_term if cfg.distill_only else loss + cfg.distill_coef * distill_term
                    tally.add_token_sum("distill_kl", kl_sum, tokens)  # logged per real token
                loss = loss * weight
                if cfg.positive_nll_coef > 0 and not cfg.distill_only:  # VAPO: also imitate the correct responses
                    nll_term, nll_metrics = positive_nll_loss(logprobs, micro["positive_mask"])
                    loss = loss + cfg.positive_nll_coef * nll_weight * nll_term
                    metrics.update(nll_metrics)
                loss = loss if train_policy else 0.0  # warm-up: no policy gradient at all
                value_metrics = {}
                if self.value_model is not None:
                    vf_loss, value_metrics = value_loss(outputs["values"], micro["values"], micro["returns"],
                                                        micro.get("critic_mask", mask), clip_range_value=cfg.cliprange_value)
                    # One backward for both: the critic's graph is separate, so its gradients
                    # only reach the critic's parameters, scaled by vf_coef.
                    loss = loss + value_weight * cfg.vf_coef * vf_loss
                # DDP averages gradients over the ranks: scale by the world size to sum them.
                self.accelerator.backward(loss * distributed.world_size())
                minibatch_loss += float(loss.detach())
                minibatch_approx_kl += weight * float(metrics.get("approx_kl", 0.0))
                tally.add(metrics, weight, value_metrics, value_weight, loss_mask=mask)
            tally.add_optimizer_step({**self._optimizer_step(minibatch_loss, train_policy), "entropy_coef": entropy_coef})
            self.entropy_control.update(distributed.global_sum)
            if cfg.target_kl is not None:  # cleanrl-style early stop; token_sum's weights add up to more than 1
                kl_sum, weight_sum = distributed.global_sum(torch.tensor([minibatch_approx_kl, sum(policy_weights)]))
                minibatch_approx_kl = float(kl_sum) / max(float(weight_sum), 1e-12)
                stop_early = distributed.any_rank(minibatch_approx_kl > cfg.target_kl)  # same on every rank
        return tally.result(stop_early)

    def _sample_and_score(self, n_prompts: int) -> ScoredBatch:
        """Phases 1-2 for one round: draw `n_prompts` prompts, sample G responses each, score them."""
        cfg = self.config
        problems = [p for p in self.prompt_pool.sample(n_prompts) for _ in range(cfg.group_size)]  # [B]
        sampler = self.state.policy_history.sampling_policy(self.step)  # the policy itself, or k steps old
        precision = rollout_correction.sampling_autocast(cfg.sampling_precision, self.device, sampler)
        sample = generate if self.vllm_sampler is None else self.vllm_sampler.generate  # generation_backend
        with self.timer("generate"), precision:  # bf16 sampling: a real sampler-trainer mismatch
            rollout = sample(sampler, self.tokenizer, [p.prompt for p in problems], cfg.response_length,
                             temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                             return_logits=cfg.logprobs_from_generation or rollout_correction.wants_sampler_logprobs(cfg),
                             stop_token_ids=self.stop_token_ids,
                             max_prompt_length=self.max_prompt_length, prompt_truncation=cfg.prompt_truncation)
        rollout = self._to_device(rollout)
        texts = decode_responses(self.tokenizer, rollout)
        with self.timer("score"):
            score_objects = score_batch(self.task, problems, texts, rollout.has_eos.tolist())
            # float64 until guards.check_scores has looked: a reward beyond float32's range is
            # named with its own value, not as the inf float32 would make of it.
            task_scores = torch.tensor([s.reward for s in score_objects], dtype=torch.float64, device=self.device)  # [B]
            # RLHF: the policy optimises the (proxy) reward model; the task's own score and
            # verdict are the gold, logged but never trained on (PPOConfig.validate refuses
            # the toggles that would read the verdict).
            raw_scores = (self.models.reward_model_scores(rollout, problems, texts) if self.reward_model is not None
                          else task_scores)
            correct = torch.tensor([s.correct for s in score_objects], device=self.device)  # [B]
            well_formed = torch.tensor([s.well_formed for s in score_objects], device=self.device)  # [B]
        return ScoredBatch(problems, rollout, texts, task_scores, raw_scores, correct, well_formed)

    def _whiten_minibatch_advantages(self, micro_batches: list[dict]) -> list[dict]:
        """Advantages whitened over one minibatch (all its micro-batches; all ranks, unless
        ``whitening_scope="process"``)."""
        advantages = torch.cat([m["advantages"] for m in micro_batches])
        mask = torch.cat([m["response_mask"] for m in micro_batches])
        over = None if self.config.whiten_advantages_over_padding else mask
        whitened = whiten(advantages, over, reduce_sum=distributed.whitening_sum(self.config.whitening_scope))
        sizes = [m["advantages"].shape[0] for m in micro_batches]
        return [{**m, "advantages": w} for m, w in zip(micro_batches, whitened.split(sizes))]

    @property
    def skip_empty_rows(self) -> bool:
        """Filtered groups leave the loss's denominator too, unless the old masking is asked for."""
        return self.config.difficulty_filter and self.config.difficulty_filter_mode != "mask"

    # ====================================================================================
    # Plumbing: one call each into the modules that hold it
    # ====================================================================================
    def micro_batch_size(self, batch_size: int) -> int:
        """Rows per micro-batch of the update over a local batch of `batch_size` rows."""
        return batch_size // (self.config.num_minibatches * self.config.gradient_accumulation_steps)

    def _optimizer_step(self, loss: float | None = None, train_policy: bool = True) -> dict[str, float]:
        """Clip, guard and step (ppo/models/optimization.py); the gradient norms before clipping."""
        return self.optimizers.step(self.accelerator, self.config.max_grad_norm, self.step + 1, loss,
                                    train_policy=train_policy)

    def _to_device(self, rollout: Rollout) -> Rollout:
        return rollout.to(self.device)

    def _score_source(self) -> str:
        """What produced the sequence scores, for error messages (`ppo.run.guards.score_source`)."""
        return guards.score_source(self.task, self.config.reward_model_path if self.reward_model is not None else None)

    def evaluate(self) -> dict:
        """Held-out metrics (`ppo.run.run_loop.evaluate`)."""
        return run_loop.evaluate(self.config, self.task, self.models, self.step, self._score_source())

    def train(self, resume: bool = False, stop_after: int | None = None, restart: bool = False,
              allow_changes: list[str] | tuple[str, ...] = ()) -> dict:
        """Run to `config.total_steps` (continuing from the latest intact checkpoint if `resume`).

        `restart` deletes an earlier attempt's outputs first; `allow_changes` names config
        fields a resume may change beyond `ppo.config.RESUMABLE_FIELDS` (see ppo/run/run_dir.py).
        `stop_after` ends this session early after that step, with a checkpoint, so a long
        run can be split across time-limited jobs and continued with ``resume=True``.
        """
        run = run_loop.TrainingRun(self.config, self.output_dir, self.state, model_path=self.model_path,
                                   config_warnings=self.config_warnings, train_step=self.train_step,
                                   evaluate=self.evaluate, save_checkpoint=self.save_checkpoint,
                                   load_checkpoint=self.load_checkpoint, last_samples=lambda: self.last_samples)
        summary = run.train(resume=resume, stop_after=stop_after, restart=restart, allow_changes=allow_changes)
        self.already_finished = run.already_finished
        return summary

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_N`` atomically; see `ppo.run.checkpoints.save`."""
        return checkpoints.save(self.models, self.state, self.config, self.output_dir)

    def load_checkpoint(self, allow_changes=()) -> bool:
        """Restore the newest intact checkpoint of this run; False when there is none
        (`ppo.run.checkpoints.load`; `allow_changes`: config fields this resume may change)."""
        loaded = checkpoints.load(self.models, self.state, self.config, self.output_dir, allow_changes)
        if loaded and self.vllm_sampler is not None:
            self.vllm_sampler.stale = True  # the engine holds the weights from before the load
        return loaded

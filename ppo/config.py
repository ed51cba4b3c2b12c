"""`PPOConfig`: every implementation detail of the PPO / GRPO loop as one named field.

The config *is* the documentation: fields are grouped in the order the algorithm runs (run
and models, rollout and difficulty filtering, rewards, KL, advantages, the update's losses,
optimisation), then logging, devices, precision and memory, and the exact speed toggles last. Each carries a short help string with its
source (AlpacaFarm, TRL, "The N+ Implementation Details of RLHF with PPO" (Huang et al. 2024,
arXiv:2403.17031; "N+ implementation details" in the help strings), DeepSeekMath,
Dr. GRPO, DAPO, Kimi k1.5, ...); ``ppo-train --help`` prints them as a checklist, the long
story of each is its row in docs/implementation-details.md, and two runs are compared by
diffing their ``config.yaml``.

Presets: each one's settings (`PRESETS`, `TESTBED_SCALE`, `TESTBED_ADJUSTMENTS`) are plain
data in ``ppo/presets.py``, re-exported here; `preset` (at the end of this file) builds one.

Validation (`PPOConfig.validate`) runs on construction and names the bad field; one rule
rejects NaN and infinity in every float field. `RESUMABLE_FIELDS` lists the fields a resumed
run may change (docs/reliability.md). `RENAMED_FIELDS` maps old field names to new ones:
an old name still loads (config files, ``--set``, flags, keywords) with a FutureWarning, and
reads as a property with a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ppo.presets import PRESETS, TESTBED_ADJUSTMENTS, TESTBED_SCALE  # re-exported: public API
from ppo.settings import config_checks
from ppo.settings.choices import (ADVANTAGE_ESTIMATOR_NAMES, DIFFICULTY_FILTER_MODES, GSM8K_ANSWER_MODES,  # noqa: F401
                                  KL_CONTROLLER_NAMES, KL_ESTIMATOR_NAMES, LOSS_AGG_NAMES, MAX_SEED,
                                  METRIC_DENOMINATORS, REWARD_WHITENING_MODES, SCORE_POSITIONS, WHITENING_SCOPES)
from ppo.settings.choices import CHAT_TEMPLATE_MODES, TASK_NAMES  # noqa: F401
from ppo.settings.suggest import did_you_mean

# The fields a resumed run may change: they decide how long and how visibly the run goes
# on, never what one step computes. Any other difference between a run's config.yaml and
# the resuming config is refused unless explicitly allowed (`resume_conflicts`).
# More torch threads than this per CPU is a typo, not a setting (checked when a run starts).
MAX_THREADS_PER_CPU = 8
RESUMABLE_FIELDS = ("total_steps", "output_dir", "device", "threads", "progress", "eval_every", "save_every",
                    "keep_checkpoints", "log_samples", "retain_freed_memory", "offload_frozen_models", "report_to",
                    "tracker_project", "run_name", "run_group", "run_tags")
# Old field name -> current name. A name is changed only where it misled: a boolean-sounding
# name that takes strings. Old config.yaml files must still load and resume.
RENAMED_FIELDS = {"whiten_rewards_over_padding": "reward_whitening_mode"}


def renamed(old: str) -> str:
    """The current name of the old field name `old`, with a warning naming it."""
    # FutureWarning, not DeprecationWarning: config files and flags come from users, and
    # Python hides DeprecationWarning outside __main__.
    warnings.warn(f"PPOConfig: {old!r} is renamed {RENAMED_FIELDS[old]!r}; the old name still works for now",
                  FutureWarning, stacklevel=3)
    return RENAMED_FIELDS[old]


def upgrade_field_names(values: dict) -> dict:
    """`values` with every old field name (`RENAMED_FIELDS`) replaced by its current one;
    the same field given under both names must agree."""
    upgraded = dict(values)
    for old in RENAMED_FIELDS:
        if old not in upgraded:
            continue
        new, value = renamed(old), upgraded.pop(old)
        if new in upgraded and upgraded[new] != value:
            raise ValueError(f"PPOConfig.{new}: given twice, as {upgraded[new]!r} and under its old name "
                             f"{old} as {value!r}")
        upgraded[new] = value
    return upgraded


def _f(default: Any, help: str, **kwargs) -> Any:
    """A dataclass field with its help string (shown by ``ppo-train --help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass
class PPOConfig:
    """All settings of one RL run. Each field's help says what it does and cites its source;
    its row in docs/implementation-details.md says why, what it costs and how it is tested."""

    # ------------------------------------------------------------------ run and model
    model_path: str | None = _f(None, "Policy checkpoint: any local Hugging Face causal LM directory. None starts from the testbed's cached SFT warm start.")
    warm_start_steps: int | None = _f(None, "With model_path None: start from the SFT warm start after this many of its steps, a weaker model standing in for a base model; None = the finished one (DeepSeek R1-Zero).")
    task: str = _f("arithmetic", "'arithmetic' (the testbed), 'preference' (the testbed trained against reward_model_path, scored by a hidden gold scorer), 'gsm8k' (JSONL at task_path), 'math' (dataset's answers checked by math-verify) or 'custom' (prompts and reward_fn passed to RLTrainer, which set it in place of 'arithmetic', or dataset and reward_fn).")
    task_path: str | None = _f(None, "Training JSONL for task='gsm8k': question, and an answer ending '#### <number>'.")
    eval_path: str | None = _f(None, "Held-out JSONL for task='gsm8k'; None evaluates on the training file.")
    gsm8k_answer_mode: str = _f("flexible", "Which number of a gsm8k response is its answer: 'strict' (after the first '####') or 'flexible' (the last \\boxed{} number, else the last number) (lm-evaluation-harness gsm8k).")
    output_dir: str = _f("runs/ppo", "Run directory: config.yaml, metrics.jsonl, samples.jsonl, tensorboard events, checkpoints/, summary.json.")
    seed: int = _f(0, "Seed for prompt sampling, rollouts, minibatch shuffles and initialisation.")
    total_steps: int = _f(100, "RL iterations, one rollout batch and its updates each; the linear schedule decays to 0 at the last.")

    # ------------------------------------------------------------------ your data, chat template and reward functions
    dataset: str | None = _f(None, "Prompts for task='custom' or 'math': a local JSON, JSONL, Parquet or CSV file, or a directory written by datasets' save_to_disk, read with Hugging Face datasets (no hub access).")
    dataset_split: str = _f("train", "Split of dataset to train on; a file is one split, 'train' (TRL dataset_train_split).")
    eval_dataset: str | None = _f(None, "Held-out prompts, a file or saved directory as for dataset; None = eval_split of dataset, or else the training prompts.")
    eval_split: str | None = _f(None, "Split to evaluate on, of eval_dataset when set, else of dataset; None = 'train' of eval_dataset (TRL dataset_test_split).")
    prompt_column: str = _f("prompt", "Column of dataset holding each prompt's text (TRL's 'prompt' column).")
    answer_column: str = _f("answer", "Column of dataset holding each gold answer, for task='math' (verl reward_model.ground_truth).")
    reward_fn: list[str] = _f([], "Reward functions of task='custom' by import path, 'module:function' or 'file.py:function', each f(prompts, responses) -> list[float], summed (TRL reward_funcs; verl custom_reward_function.path and name).")
    reward_fn_weights: list[float] | None = _f(None, "Weight of each reward_fn in the sum, in order; None = 1 each (TRL reward_weights).")
    chat_template: str = _f("auto", "Render each prompt as a user turn with the tokenizer's chat template and its generation prompt: 'auto' (when the tokenizer has one), 'on' (required) or 'off' (the text as it is, for base models) (TRL, verl apply_chat_template).")
    system_prompt: str | None = _f(None, "System message before each prompt when the chat template is applied; None = none.")
    math_verify_timeout: int = _f(5, "Seconds one math-verify parse or comparison of task='math' may take before the answer counts as wrong; a whole number (math-verify parsing_timeout, timeout_seconds).")

    # ------------------------------------------------------------------ value model and reward model
    reward_model_path: str | None = _f(None, "Reward model directory, a scalar-head model or a Hugging Face sequence-classification checkpoint (num_labels 1; TRL RewardTrainer's output): when set, its score replaces the task's reward, and value_init='reward_model' starts the critic from it.")
    value_init: str = _f("policy", "Critic initialisation: 'reward_model' or 'policy' (that backbone with a zeroed head), 'reward_model_head' (the reward model, trained head kept), 'random', or 'pretrained' (the critic at value_init_path) (AlpacaFarm: reward_model; TRL: reward_model_head).")
    value_init_path: str | None = _f(None, "Critic directory for value_init='pretrained', as written by python -m ppo.models.value_pretrain (VC-PPO value pretraining).")
    critic_warmup_steps: int = _f(0, "RL steps at the start in which only the critic trains, the policy's weights untouched; 0 = off (verl trainer.critic_warmup, OpenRLHF critic.freezing_steps).")
    value_loss_over_padding: bool = _f(False, "Under pad_to_response_length the critic also predicts values on padding (masked out as keys), GAE runs over every column, and the value loss averages over the whole padded tensor (AlpacaFarm ppo_trainer.py compute_loss; rl_models.py AutoregressiveValue).")

    # ------------------------------------------------------------------ rollout (sampling)
    rollout_batch_size: int = _f(64, "Responses sampled per step (prompts x group_size) over all data-parallel processes together, so a preset means the same on any number of them (AlpacaFarm 512).")
    group_size: int = _f(1, "Samples per prompt G, contiguous in the batch; PPO uses 1, the GRPO family needs at least 2 (DeepSeekMath 64).")
    response_length: int = _f(64, "Maximum new tokens per response; one that reaches it without a stop token is 'missing EOS'.")
    temperature: float = _f(1.0, "Sampling temperature (AlpacaFarm 1.0, TRL 0.7).")
    top_k: int = _f(0, "Top-k truncation of sampling; 0 = off, pure sampling, so the rollout distribution is the one being trained (N+ implementation details).")
    top_p: float = _f(1.0, "Nucleus truncation of sampling; 1.0 = off (AlpacaFarm, TRL: pure sampling).")
    scale_logits_by_temperature: bool = _f(True, "Divide logits by temperature before every log-prob, so they belong to the distribution sampled; False reproduces scoring at T=1 (N+ implementation details; AlpacaFarm, TRL).")
    stop_token_ids: list[int] | None = _f(None, "Token ids that end a response. None = every EOS id the checkpoint declares (tokenizer, generation_config, config), as instruct models list several; [] = no stop token, responses run to response_length (TRL's default).")
    max_prompt_length: int | None = _f(None, "Longest prompt in tokens, BOS included; None = the model's context minus response_length (TRL max_prompt_length).")
    prompt_truncation: str = _f("left", "A prompt over max_prompt_length: 'left' drops its oldest tokens, 'right' its end, 'error' refuses it (TRL truncation_side).")
    split_special_tokens: bool = _f(False, "Prompt text spelling a special token ('a<eos>b'): False encodes it as that token (the tokenizer's rule), True as its characters (HF split_special_tokens).")
    pad_to_response_length: bool = _f(False, "Right-pad every rollout batch to response_length, so whitening over padding and the seq_mean_token_sum_norm divisor see that fixed width, not the batch's longest response (AlpacaFarm rl_models.py right_pad to response_len).")
    logprobs_from_generation: bool = _f(False, "Old log-probs from the generation logits instead of a teacher-forced pass: a pass fewer, but kernels can differ numerically (TRL PPOTrainer: on; AlpacaFarm: off).")
    rollout_staleness: int = _f(0, "Sample each step's rollouts with the policy as it was this many training steps earlier, its weights kept exactly: an asynchronous pipeline's staleness reproduced in one synchronous, seeded process; 0 = on-policy (AReaL max_head_offpolicyness, areal/api/cli_args.py@56bad8b; verl fully async, prime-rl max_async_level).")
    generation_backend: str = _f("hf", "Rollout sampler: 'hf' (Hugging Face generate, or the lean KV-cached loop) or 'vllm' (a vLLM engine in each training process, weights synced after the policy moves; TRL use_vllm colocate mode, verl, OpenRLHF).")
    vllm_kv_cache_gb: float = _f(1.0, "CPU runs with generation_backend='vllm': the engine's KV-cache space in GiB (vLLM VLLM_CPU_KVCACHE_SPACE).")
    vllm_gpu_memory_utilization: float = _f(0.3, "GPU runs with generation_backend='vllm': share of the GPU's memory the colocated engine takes for weights and KV cache, the rest left to training (TRL GRPOConfig vllm_gpu_memory_utilization 0.3, colocate mode).")
    vllm_sleep: bool = _f(False, "GPU runs with generation_backend='vllm': offload the engine's weights and free its KV cache between rollouts (vLLM sleep mode level 1; TRL vllm_enable_sleep_mode, default off); vLLM has no sleep mode on CPU.")

    # ------------------------------------------------------------------ difficulty filtering (Kimi k1.5, DAPO)
    difficulty_filter: bool = _f(False, "Train only on groups whose pass rate lies inside the band (filter_min_pass_rate, filter_max_pass_rate); needs the task's verdict, not a reward model (Kimi k1.5; DAPO dynamic sampling).")
    difficulty_filter_mode: str = _f("resample", "'resample' (sample more rounds until the batch is full of kept groups), 'renormalize' (filtered groups leave the loss and its denominator) or 'mask' (they stay in a seq_mean denominator) (DAPO).")
    dynamic_sampling_max_rounds: int = _f(4, "Cap on sampling rounds per step under difficulty_filter_mode='resample'; a batch still short is filled with groups left out of the loss (verl max_num_gen_batches).")
    filter_min_pass_rate: float = _f(0.0, "Lower edge (exclusive) of the kept pass-rate band; 0 drops prompts no sample solved (Kimi k1.5).")
    filter_max_pass_rate: float = _f(1.0, "Upper edge (exclusive) of the kept pass-rate band; 1 drops prompts every sample solved (Kimi k1.5).")
    retire_mastered: bool = _f(False, "Never draw again a prompt that all G samples solved (Kimi k1.5).")

    # ------------------------------------------------------------------ rewards
    nonfinite_rewards: str = _f("stop", "A NaN or infinite score: 'stop' the run before the update, or 'drop' those samples from the loss and from their group's baseline statistics (counted in dropped_samples; TRL unscorable completions).")
    missing_eos: str = _f("none", "Responses without a stop token: 'none' (keep the score), 'penalty' (subtract missing_eos_penalty) or 'replace' (score becomes missing_eos_value) (TRL missing_eos_penalty; N+ implementation details).")
    missing_eos_penalty: float = _f(1.0, "Amount subtracted from the score under missing_eos='penalty' (TRL).")
    missing_eos_value: float = _f(-1.0, "Score given under missing_eos='replace' (N+ implementation details).")
    length_reward_coef: float = _f(0.0, "Weight of the in-group length reward added to the score; needs group_size >= 2, 0 = off (Kimi k1.5).")
    length_reward_warmup_steps: int = _f(0, "RL steps at the start with the length reward off, so the policy learns to solve before it is pushed to be brief (Kimi k1.5).")
    format_reward_coef: float = _f(0.0, "Bonus added to the score of a well-formed response (a parseable answer after the marker, and an EOS); 0 = off (DeepSeek R1 format reward).")
    reward_clip: float | None = _f(None, "Clamp sequence scores to [-reward_clip, reward_clip]; None = off (TRL score_clip; AlpacaFarm and TRL: off).")
    score_position: str = _f("last_token", "Where the sequence score is added: 'last_token' (the last real response token) or 'after_last_token' (the column after it when the width has one; the critic's values and loss then cover that column too) (TRL ppo_trainer.py actual_end).")
    whiten_rewards: bool = _f(False, "Whiten the per-token rewards before advantages, scale only with the mean kept (AlpacaFarm: on; TRL: off).")
    reward_whitening_mode: str = _f("masked", "Which positions reward whitening sees: 'masked' (real response tokens), 'stats' (statistics of the padded [B, T] tensor) or 'alpacafarm' (the padded tensor whitened and kept, GAE over every column). Formerly whiten_rewards_over_padding (AlpacaFarm ppo_trainer.py).")

    # ------------------------------------------------------------------ KL to the reference
    kl_coef: float = _f(0.05, "KL coefficient beta; 0 skips the reference model entirely (AlpacaFarm 0.0067, TRL 0.05, DeepSeekMath 0.04).")
    kl_estimator: str = _f("k1", "Per-token KL estimator: 'k1' = logp - ref, 'k2' = (logp - ref)^2 / 2, 'k3' = exp(ref - logp) - (ref - logp) - 1, 'abs', 'k1+' / 'k3+' / 'abs+' (value of k1 / k3 / abs, gradient of k2; verl), or 'full' (exact over the vocabulary) (AlpacaFarm, TRL: k1; GRPO: k3).")
    kl_clip_at_zero: bool = _f(False, "Clamp the per-token KL estimate at 0, so a negative k1 estimate is never a reward; biased upward (AlpacaFarm _shape_reward).")
    kl_loss_importance_weight: bool = _f(False, "With kl_placement='loss', weight each token's KL by pi / sg(pi_old), which makes k3's gradient unbiased (TRL use_bias_correction_kl, DeepSeek-V3.2; TRL default False).")
    log_full_kl: bool = _f(False, "Log kl_full, the exact per-token KL over the whole vocabulary, every step even when kl_estimator is not 'full' (which always logs it); two extra passes.")
    kl_placement: str = _f("reward", "'reward': -beta*KL added to the per-token rewards (PPO, InstructGPT); 'loss': beta*KL added to the policy loss (GRPO).")
    adaptive_kl: bool = _f(False, "Adapt beta toward kl_target with the rule named by kl_controller (AlpacaFarm rlhf_ppo.sh and TRL: fixed).")
    kl_controller: str = _f("ziegler", "Adaptive rule: 'ziegler' (step scaled by samples / kl_horizon; Ziegler et al. 2019, TRL) or 'alpacafarm' (step scaled by kl_k_beta, once per RL step; AlpacaFarm kl_controller.py).")
    kl_k_beta: float = _f(0.1, "Gain of the 'alpacafarm' controller (AlpacaFarm ppo_utils.py k_beta 0.1).")
    kl_target: float = _f(6.0, "Target sequence KL of the adaptive controller (Ziegler et al. 2019: 6.0).")
    kl_horizon: int = _f(10000, "Horizon, in samples, of the 'ziegler' controller (Ziegler et al. 2019: 10000).")
    ref_update_every: int = _f(0, "Every this many steps move the reference toward the current policy; 0 = a frozen reference (slime / ProRL reference reset; TRL sync_ref_model, ref_model_sync_steps).")
    ref_update_alpha: float = _f(1.0, "How far a refresh moves the reference: 1 = hard reset to the policy, below 1 = ref <- alpha * policy + (1 - alpha) * ref (TR-DPO; TRL ref_model_mixup_alpha 0.6).")

    # ------------------------------------------------------------------ off-policy correction (ppo/algorithm/rollout_correction.py)
    rollout_correction: str = _f("none", "Correct the sampler (behaviour) / trainer (proximal) mismatch by w = pi_old / pi_sampler: 'none'; truncate, 'token_tis' / 'sequence_tis' / 'geo_tis' (loss times min(w, cap), per token, sequence product or geometric mean); drop ratios outside [floor, cap], 'token_mis' / 'sequence_mis' / 'geo_mis'; weight by w inside the band and 0 outside, denominator kept, 'token_icepop' / 'sequence_icepop'; decoupled PPO, 'decoupled' (w, 0 above cap); or reject by a KL statistic, 'token_k1' ... 'seq_max_k3'. Sources: verl rollout_is / rollout_rs (volcengine/verl@b178a3cd rollout_corr_helper.py), TRL token_mask (huggingface/trl@f2cd5771), AReaL decoupled loss (inclusionAI/AReaL@4aef98d8), SkyRL geometric mask (NovaSky-AI/SkyRL@a9564572).")
    rollout_correction_cap: float = _f(2.0, "TIS truncation, the upper edge of the MIS / IcePop band, and decoupled PPO's largest kept weight, for the trainer / sampler ratio (verl rollout_is_threshold 2.0; AReaL behave_imp_weight_cap).")
    rollout_correction_floor: float = _f(0.5, "Lower edge of the MIS / IcePop band; the k1 rejections keep the sampler / trainer ratio in [floor, cap] (IcePop 0.5; verl rollout_rs_threshold lower_upper).")
    rollout_correction_kl_threshold: float = _f(0.01, "Largest k2 / k3 statistic the 'token_k2' ... 'seq_max_k3' rejections keep (verl rollout_rs_threshold; 0.01 in its k3 presets, volcengine/verl@b178a3cd algorithm.py).")
    rollout_correction_batch_normalize: bool = _f(False, "Divide the truncated TIS weights by their batch mean, so they average 1 (verl rollout_is_batch_normalize, volcengine/verl@b178a3cd rollout_corr_helper.py).")
    off_policy_mask_threshold: float | None = _f(None, "Drop from the loss's numerator the negative-advantage tokens of a sequence whose mean log(pi_sampler / pi_current) exceeds this; None = off (DeepSeek-V3.2 off-policy sequence masking; TRL off_policy_mask_threshold, huggingface/trl@f2cd5771).")
    sampling_precision: str = _f("fp32", "'fp32', or 'bf16' to sample under bf16 autocast while the trainer scores in fp32: a real mismatch to correct (arXiv 2510.26788).")
    log_rollout_mismatch: bool = _f(False, "Log the sampler-trainer mismatch (rollout_mismatch_kl, rollout_ratio_min / max) every step without correcting it; on whenever rollout_correction is.")

    # ------------------------------------------------------------------ on-policy distillation (ppo/algorithm/distillation.py)
    teacher_model_path: str | None = _f(None, "Teacher of on-policy distillation, frozen and scoring the student's own samples: a local Hugging Face causal LM directory with the policy's vocabulary, or 'testbed' (python -m ppo.models.teacher build, run on first use) (Qwen3 Technical Report, arXiv 2505.09388; Thinking Machines 'On-Policy Distillation' 2025).")
    distill_coef: float = _f(0.0, "Weight of the per-token reverse KL(policy || teacher), exact over the vocabulary, added to the policy loss; 0 = off (Thinking Machines on-policy distillation 2025; TRL GKDTrainer lmbda=1, beta=1; prime-rl teacher_tau).")
    distill_only: bool = _f(False, "The reverse KL to the teacher is the whole policy objective: no reward-driven policy gradient, KL to the reference or entropy term; rewards are still scored and logged (Qwen3 on-policy strong-to-weak distillation, arXiv 2505.09388; prime-rl adv_tau=0).")

    # ------------------------------------------------------------------ advantages
    advantage_estimator: str = _f("gae", "'gae' (PPO with a value model), or without one 'grpo', 'dr_grpo', 'rloo', 'reinforce', 'rft' (rejection-sampling fine-tuning on the kept samples), 'reinforce_plus_plus', 'reinforce_plus_plus_baseline' (REINFORCE++, arXiv 2501.03262) 'remax' (greedy-response baseline, arXiv 2310.10505), 'maxrl' ((r - mean) / mean; MaxRL, SkyRL, prime-rl), 'grpo_passk' (only the group's best response is credited, for pass@k; verl) or 'gdpo' (each reward component z-scored in its group, summed, then batch-normalised; GDPO, TRL normalize_then_sum).")
    gamma: float = _f(1.0, "GAE discount (AlpacaFarm, TRL: 1.0).")
    lam: float = _f(0.95, "GAE lambda; with gamma = lam = 1 the advantage is return minus value (AlpacaFarm 1.0, TRL 0.95).")
    lam_critic: float | None = _f(None, "GAE lambda of the critic's targets, lam then being the policy's; None = lam for both (VC-PPO decoupled GAE: critic 1.0, policy 0.95).")
    lam_length_alpha: float | None = _f(None, "Policy lambda per response, 1 - 1/(alpha * length) clamped to [0, 1], instead of lam; None = off (VAPO length-adaptive GAE: alpha 0.05).")
    whiten_advantages: bool = _f(True, "Whiten advantages (masked, mean shifted to 0) once per rollout batch (AlpacaFarm, TRL: on; GRPO family: off).")
    whiten_advantages_over_padding: bool = _f(False, "Advantage whitening takes its statistics over the whole padded [B, T] tensor, padding included, instead of the real tokens; padding stays out of the loss (AlpacaFarm ppo_trainer.py _estimate_advantage).")
    whiten_advantages_per_minibatch: bool = _f(False, "Whiten the advantages per minibatch instead of once over the rollout batch (OpenAI baselines, cleanrl).")
    whitening_scope: str = _f("global", "Whose rows reward and advantage whitening take their statistics over in data parallel: 'global' (every process's, all-reduced) or 'process' (each process its own share: AlpacaFarm's torch_ops.whiten has no all-reduce, tatsu-lab/alpaca_farm@30717dd src/alpaca_farm/torch_ops.py L61-67).")
    grpo_scale: str = _f("group", "Group-advantage scale: 'group' (divide by the group std; DeepSeekMath), 'batch' (the batch's population std) or 'none' (Dr. GRPO).")
    grpo_std_correction: int = _f(0, "Bessel correction of the group std: 0 = population std, 1 = sample std, which makes every advantage smaller (nano-aha-moment: 0; TRL GRPOTrainer, verl: 1).")
    grpo_eps: float = _f(1e-4, "Epsilon added to the std in group-advantage scaling; a group of equal scores gets advantage 0 (nano-aha-moment 1e-4).")
    reinforce_baseline: bool = _f(False, "For advantage_estimator='reinforce': subtract the batch-mean score (Williams 1992).")
    rft_min_score: float = _f(1.0, "For advantage_estimator='rft': responses scoring at least this get advantage 1, the rest 0; 1.0 keeps exactly the correct answers of a 0/1 reward (STaR, RAFT).")

    # ------------------------------------------------------------------ the update: losses
    ppo_epochs: int = _f(4, "Passes over each rollout batch, GRPO's num_iterations (AlpacaFarm 2, TRL 4).")
    num_minibatches: int = _f(1, "Shuffled minibatches per epoch, one optimizer step each (AlpacaFarm 512/256 = 2; TRL 1).")
    gradient_accumulation_steps: int = _f(1, "Micro-batches per minibatch on each process. Each is weighted by its share of the minibatch's tokens or sequences, so it changes memory, not the gradient.")
    cliprange: float = _f(0.2, "PPO ratio clip epsilon: the low side, and the high side unless cliprange_high is set (AlpacaFarm, TRL: 0.2).")
    cliprange_high: float | None = _f(None, "Separate upper clip epsilon, e.g. 0.28; None = symmetric (DAPO clip-higher).")
    dual_clip: float | None = _f(None, "Constant c > 1 bounding the loss of negative-advantage tokens; None = off (Ye et al. 2020).")
    cliprange_value: float | None = _f(0.2, "Value clipping around the old values; None = off (AlpacaFarm, TRL: 0.2).")
    vf_coef: float = _f(0.1, "Weight of the value loss (AlpacaFarm, TRL: 0.1).")
    entropy_coef: float = _f(0.0, "Weight of the entropy bonus (AlpacaFarm, TRL: 0).")
    loss_agg: str = _f("token_mean", "How per-token losses are averaged: 'token_mean' (AlpacaFarm, TRL, DAPO), 'seq_mean_token_mean' (GRPO's per-sequence normalisation) or 'seq_mean_token_sum' (each sequence's token sum, averaged over sequences; TRL RLOO, verl) or 'seq_mean_token_sum_norm' (Dr. GRPO's constant normaliser) or 'prompt_mean' (token mean within each prompt's group, then mean over prompts; SkyRL) or 'token_sum' (the plain sum, no normaliser; verl token-sum).")
    target_kl: float | None = _f(None, "Stop a step's remaining minibatches and epochs once a minibatch's approximate KL to the rollout policy exceeds this; None = off (cleanrl target_kl).")
    mask_truncated_responses: bool = _f(False, "Leave responses that hit response_length without a stop token out of the loss (DAPO overlong filtering).")
    policy_loss: str = _f("vanilla", "Policy loss (ppo/algorithm/policy_losses.py): 'vanilla' (PPO clip), 'gspo' / 'gspo_token' (sequence ratio; Qwen GSPO), 'cispo' (clipped stop-gradient weight; MiniMax-M1), 'geo_mean' (GMPO), 'clip_cov' / 'kl_cov' (Cui et al.), 'dppo_tv' / 'dppo_kl' (DPPO: a trust region on the probability's TV or binary KL, cliprange / cliprange_high its thresholds; prime-rl's default loss at PrimeIntellect-ai/prime-rl@559b4477, SkyRL@a9564572), 'sapo' (sigmoid-gated soft trust region; Qwen SAPO, verl, TRL) 'gpg' (-A log pi, no ratio; GPG, verl) or 'kimi' (Kimi k1.5's squared surrogate: REINFORCE with the group-mean baseline plus an l2 pull toward the sampling policy; needs advantage_estimator='dr_grpo') (verl policy_loss.loss_mode).")
    cov_fraction: float = _f(2e-4, "Share of tokens clip_cov detaches and kl_cov penalises, at least one (Cui et al.; verl clip_cov_ratio / kl_cov_ratio 2e-4).")
    clip_cov_low: float = _f(1.0, "Lower bound of the covariance of the tokens clip_cov may detach (verl clip_cov_lb 1).")
    clip_cov_high: float = _f(5.0, "Upper bound of the covariance of the tokens clip_cov may detach (verl clip_cov_ub 5).")
    kl_cov_coef: float = _f(1.0, "Weight of kl_cov's |log-ratio| penalty on the highest-covariance tokens (verl ppo_kl_coef 1).")
    sapo_tau_pos: float = _f(1.0, "policy_loss='sapo': gate temperature for positive advantages (verl tau_pos, TRL sapo_temperature_pos: 1.0).")
    sapo_tau_neg: float = _f(1.05, "policy_loss='sapo': gate temperature for negative advantages, larger so their gradient fades sooner (verl tau_neg, TRL sapo_temperature_neg: 1.05).")
    positive_nll_coef: float = _f(0.0, "Weight of the NLL loss on the tokens of correct responses added to the policy loss; 0 = off (VAPO positive-example LM loss: 0.1; NeMo-RL positive_example_nll_weight).")
    kimi_tau: float = _f(1.0, "tau of policy_loss='kimi': the weight of its KL to the policy that sampled the batch, which pulls each sequence's log-ratio back toward 0 once the policy has moved (Kimi k1.5 sec. 2.3.2 eq. 2-3; the report gives no value).")
    top_entropy_quantile: float = _f(1.0, "Train the policy loss only on this top share of tokens by entropy; 1 = all (Beyond the 80/20 Rule: 0.2; TRL top_entropy_quantile).")
    entropy_target: float | None = _f(None, "Adapt entropy_coef toward this mean token entropy, applying it only while entropy is at or below; None = fixed entropy_coef (Skywork-OR1: 0.2; TRL use_adaptive_entropy).")
    entropy_coef_step: float = _f(0.005, "Change of the adaptive entropy coefficient per optimizer step (Skywork-OR1, TRL entropy_coef_delta: 0.005).")
    overlong_buffer_length: int = _f(0, "DAPO soft overlong punishment: the last this-many tokens before response_length cost a score penalty rising linearly to overlong_penalty_factor; 0 = off (DAPO L_cache 4096 of 20480).")
    overlong_penalty_factor: float = _f(1.0, "Penalty at response_length under overlong_buffer_length (DAPO, verl overlong_buffer.penalty_factor: 1).")

    # ------------------------------------------------------------------ optimisation
    lr: float = _f(1e-5, "Policy learning rate (AlpacaFarm 1e-5; TRL's example command 3e-6).")
    value_lr: float | None = _f(None, "Value-model learning rate; None = lr.")
    separate_value_optimizer: bool = _f(True, "Give the value model its own AdamW and gradient clip; False = one optimizer over both, as AlpacaFarm and TRL.")
    adam_eps: float = _f(1e-5, "AdamW epsilon (AlpacaFarm 1e-5, N+ implementation details; torch default 1e-8).")
    adam_beta1: float = _f(0.9, "AdamW beta1, the decay of the gradient's running mean (torch default 0.9).")
    adam_beta2: float = _f(0.999, "AdamW beta2, the decay of the squared gradient's running mean (torch default 0.999; Dr. GRPO via oat: 0.95).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    warmup_steps: int = _f(0, "Linear learning-rate warmup in RL steps; step s < warmup trains at lr*s/warmup, so step 0 at 0 (AlpacaFarm 5).")
    lr_schedule: str = _f("linear", "'linear' (warmup, then linear decay to 0 at total_steps) or 'constant' after warmup (transformers' schedules; AlpacaFarm: linear).")
    max_grad_norm: float | None = _f(1.0, "Gradient-norm clipping; None = off (AlpacaFarm 1.0).")
    disable_dropout: bool = _f(True, "Turn dropout off in policy, reference and value model so log-probs are deterministic (N+ implementation details; AlpacaFarm, TRL).")

    # ------------------------------------------------------------------ logging and checkpoints
    eval_every: int = _f(10, "Held-out evaluation every N steps, and at the start and end; 0 = only start and end.")
    eval_size: int | None = _f(None, "Held-out problems to evaluate (the first N); None = all.")
    eval_samples_per_prompt: int = _f(1, "Sampled responses per held-out problem; sampled accuracy is then the mean per-problem pass rate, its evaluation noise shrinking as 1/sqrt(N) (pass@k: Chen et al. 2021). The testbed uses 16.")
    eval_thinking_budget: int | None = _f(None, "Held-out evaluations cap the thinking (the response before the task's answer marker, '#' on the testbed) at this many tokens, then force the marker and score the answer that follows; None = no cap (Qwen3 thinking budget, arXiv 2505.09388 sec. 4.3). python -m ppo.run.thinking_budget draws the curve.")
    eval_batch_size: int = _f(128, "Held-out responses generated per batch during evaluation (memory and speed). Each batch is seeded on its own, so a different size changes which draws are made, not their distribution.")
    log_samples: int = _f(4, "Decoded rollouts written to samples.jsonl per step.")
    metric_denominator: str = _f("tokens", "What the logged clip fractions and approx_kl average over: 'tokens' (the loss's real tokens) or 'all_positions' (every position of the padded [B, T] tensor, as AlpacaFarm's compute_loss .mean()s them, tatsu-lab/alpaca_farm@30717dd src/alpaca_farm/rl/ppo_trainer.py L253, L258); logging only, the update is the same.")
    save_every: int = _f(50, "Checkpoint every N steps, and at the end; 0 = only at the end.")
    keep_checkpoints: int = _f(2, "Most recent checkpoints kept on disk; 0 keeps every one.")
    progress: bool = _f(True, "Show a progress bar.")
    report_to: list[str] = _f(["tensorboard"], "Where step metrics go besides metrics.jsonl: any of 'tensorboard' (event files in output_dir), 'wandb', 'mlflow', 'trackio' (accelerate's trackers, each an optional extra); [] = none (TRL report_to).")
    tracker_project: str = _f("ppo-details", "Project (W&B, Trackio) or experiment (MLflow) the run is filed under in a tracker.")
    run_name: str | None = _f(None, "The run's name in a tracker; None = output_dir.")
    run_group: str | None = _f(None, "Group of runs in a tracker (W&B and Trackio group, MLflow tag 'group'); a sweep sets sweep/ablation/variant.")
    run_tags: dict = _f({}, "Labels on the run in a tracker, name: value (W&B tags 'name:value', MLflow tags); a sweep sets sweep, ablation, variant and seed.")

    # ------------------------------------------------------------------ devices, precision and memory
    device: str = _f("auto", "'auto' (accelerate picks), 'cpu' or 'cuda'.")
    threads: int = _f(2, "torch intra-op threads on CPU, fixed so CPU runs are reproducible.")
    mixed_precision: str = _f("no", "accelerate mixed precision, 'no', 'fp16' or 'bf16', the same autocast for every model. fp16 uses one loss scaler, unscaled once per step.")
    model_dtype: str = _f("float32", "dtype of the loaded weights: 'float32' (fp32 master weights, so small updates are not rounded away), 'bfloat16', 'float16' or 'auto' (as saved) (Micikevicius et al. 2018).")
    attn_implementation: str | None = _f(None, "Attention kernel passed to from_pretrained ('eager', 'sdpa', 'flash_attention_2', ...); None = transformers' choice. The math is the same.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass of policy and critic: memory for compute, same gradients (Chen et al. 2016; TRL, OpenRLHF).")
    lora_r: int = _f(0, "LoRA rank of the policy's adapters, 0 = full fine-tuning; the reference is then the base model with the adapter disabled (Hu et al. 2021; peft).")
    lora_alpha: float = _f(16.0, "LoRA scale: the adapter adds (alpha / r) B A (peft lora_alpha).")
    lora_target_modules: str = _f("all-linear", "Layers that get adapters: 'all-linear' (every linear layer but the output head; QLoRA) or comma-separated module names such as 'q_proj,v_proj' (the LoRA paper).")
    lora_critic: bool = _f(False, "Also train the critic through LoRA adapters on its backbone, its scalar head fully trainable; needs lora_r > 0.")
    sharding: str = _f("none", "'none': every process holds whole models (DDP); 'fsdp': PyTorch FSDP2 splits the four models' weights, and policy and critic's gradients and AdamW state, across the processes (Zhao et al. 2023; AlpacaFarm trains with FSDP).")
    offload_frozen_models: bool = _f(False, "With sharding='fsdp', keep the frozen models' shards (reference, reward model, distillation teacher) in CPU memory and move them to the device one block at a time (FSDP CPUOffloadPolicy): device memory for transfer time.")

    # ------------------------------------------------------------------ speed toggles
    # Exact optimisations, each tested equal on and off (tests/test_lean_forward.py,
    # tests/test_allocator.py); the catalogue's Speed section says what each costs and saves.
    lean_forward: bool = _f(True, "Run GPT-2 and Llama models through their own modules and a KV-cached sampling loop instead of the Hugging Face forward() / generate() plumbing; same math.")
    compile_forward: bool = _f(False, "torch.compile the lean forward (needs lean_forward); the first step compiles, so it pays on long runs only (PyTorch 2).")
    share_prompt_prefix: bool = _f(True, "Lean teacher-forced passes run each distinct prompt of the batch once and only the responses per row: pays when prompts repeat, as in GRPO groups.")
    padding_free: bool = _f(True, "Lean teacher-forced passes carry only the real tokens between attention calls, not the padded batch (TRL padding_free; flash-attention variable-length batches).")
    paired_critic_pass: bool = _f(True, "Run the update's policy and critic as one stacked pass when their lean backbones have the same shapes (PyTorch model ensembling: stack_module_state + vmap).")
    reuse_update_forward: bool = _f(True, "Take the old log-probs and values of the update's first micro-batch from its forward pass, run before the policy moves, so the old passes skip those rows (TRL GRPOTrainer, num_iterations=1).")
    retain_freed_memory: bool = _f(True, "CPU runs: keep the memory the process frees for reuse instead of returning it to the system each step; process-wide, glibc only (mallopt(3)).")

    def __post_init__(self):
        if isinstance(self.reward_whitening_mode, bool):  # configs written before it had three modes
            self.reward_whitening_mode = "stats" if self.reward_whitening_mode else "masked"
        self._coerce_types()
        self.validate()

    def _coerce_types(self) -> None:
        config_checks.coerce_types(self)

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the field for any inconsistent setting (ppo/settings/config_checks.py)."""
        config_checks.validate(self)

    def validate_for_run(self) -> None:
        """Checks that only matter when a run starts (a preset may name a reward model that
        the user supplies later)."""
        if self.offload_frozen_models and self.sharding != "fsdp":  # checked here: a launcher may switch it on
            raise ValueError("PPOConfig.offload_frozen_models: offloads the shards of sharding='fsdp'; set "
                             "sharding='fsdp' or launch with an accelerate FSDP config")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if self.threads > max(MAX_THREADS_PER_CPU * cpus, 64):  # torch starts them all: past the OS limit it crashes
            raise ValueError(f"PPOConfig.threads: {self.threads} torch threads on {cpus} CPU(s); this machine cannot "
                             f"start that many (a crash while loading the model). Use at most {cpus} (one per CPU) "
                             "or a few more to match another machine's thread count")
        if self.value_init.startswith("reward_model") and self.uses_value_model and not self.reward_model_path:
            raise ValueError(f"PPOConfig.value_init: {self.value_init!r} needs reward_model_path (the verifiable testbed "
                             "has no reward model; use 'policy', or --testbed which does so)")

    def per_process_batch_size(self, world_size: int) -> int:
        """The rollout responses each of `world_size` data-parallel processes samples per step.

        `rollout_batch_size` is the *global* batch, so a preset means the same update
        whatever the number of processes; each process holds an equal share, made of whole
        GRPO groups (a group never spans processes), split into `num_minibatches` x
        `gradient_accumulation_steps` the same way on every process.
        """
        where = f"with {world_size} processes"
        if self.rollout_batch_size % world_size:
            raise ValueError(f"PPOConfig.rollout_batch_size: the global batch ({self.rollout_batch_size}) must be "
                             f"divisible by the number of processes ({world_size})")
        local = self.rollout_batch_size // world_size
        if local % self.group_size:
            raise ValueError(f"PPOConfig.group_size: {where} each process samples {local} responses "
                             f"(rollout_batch_size {self.rollout_batch_size} / {world_size}), which is not a "
                             f"whole number of groups of group_size {self.group_size}")
        if local % self.num_minibatches:
            raise ValueError(f"PPOConfig.num_minibatches: {where} each process's {local} responses cannot be "
                             f"split into num_minibatches={self.num_minibatches}")
        if (local // self.num_minibatches) % self.gradient_accumulation_steps:
            raise ValueError(f"PPOConfig.gradient_accumulation_steps: {where} each process's minibatch of "
                             f"{local // self.num_minibatches} cannot be split into "
                             f"gradient_accumulation_steps={self.gradient_accumulation_steps} micro-batches")
        return local

    # -- derived quantities ----------------------------------------------------------------
    @property
    def minibatch_size(self) -> int:
        return self.rollout_batch_size // self.num_minibatches

    @property
    def micro_batch_size(self) -> int:
        return self.minibatch_size // self.gradient_accumulation_steps

    @property
    def prompts_per_step(self) -> int:
        return self.rollout_batch_size // self.group_size

    @property
    def uses_value_model(self) -> bool:
        """Only GAE needs a critic; the GRPO family deletes it."""
        return self.advantage_estimator == "gae"

    @property
    def uses_reference_model(self) -> bool:
        """beta = 0 means no KL anywhere: skip the reference forward pass and its memory."""
        return self.kl_coef > 0 or self.adaptive_kl

    @property
    def whiten_rewards_over_padding(self) -> str:
        """Read-only old name of `reward_whitening_mode`, for code not yet updated."""
        warnings.warn("PPOConfig.whiten_rewards_over_padding is renamed reward_whitening_mode",
                      DeprecationWarning, stacklevel=2)
        return self.reward_whitening_mode

    # -- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, values: dict) -> "PPOConfig":
        values = upgrade_field_names(values)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hints = "".join(did_you_mean(name, known) for name in unknown)
            raise ValueError(f"PPOConfig: unknown field(s) {unknown}{hints}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PPOConfig":
        data = read_yaml_mapping(path)
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def replace(self, **overrides) -> "PPOConfig":
        return PPOConfig.from_dict({**self.to_dict(), **upgrade_field_names(overrides)})


# Keywords with an old field name (`RENAMED_FIELDS`) keep working: PPOConfig(old_name=...).
_dataclass_init = PPOConfig.__init__
PPOConfig.__init__ = functools.wraps(_dataclass_init)(
    lambda self, *args, **kwargs: _dataclass_init(self, *args, **upgrade_field_names(kwargs)))


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file of ``field: value`` lines; every way it can be unreadable names the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such config file") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}:{where} not valid YAML ({getattr(error, 'problem', None) or error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of field: value")
    return data


def resume_conflicts(stored: PPOConfig, requested: PPOConfig) -> dict[str, tuple[Any, Any]]:
    """Fields outside `RESUMABLE_FIELDS` whose value differs: ``{name: (stored, requested)}``."""
    old, new = stored.to_dict(), requested.to_dict()
    return {name: (old[name], new[name]) for name in old
            if name not in RESUMABLE_FIELDS and old[name] != new[name]}


def field_help() -> dict[str, str]:
    """Field name -> help string, in declaration order."""
    return {f.name: f.metadata.get("help", "") for f in fields(PPOConfig)}


def parse_override(text: str) -> tuple[str, Any]:
    """``"kl_coef=0.1"`` -> ``("kl_coef", 0.1)``; values are parsed as YAML scalars."""
    if "=" not in text:
        raise ValueError(f"override {text!r}: expected FIELD=VALUE")
    name, raw = text.split("=", 1)
    name = name.strip().replace("-", "_")
    if name in RENAMED_FIELDS:
        name = renamed(name)
    if name not in field_help():
        raise ValueError(f"override {text!r}: unknown field {name!r}{did_you_mean(name, field_help())}")
    return name, yaml.safe_load(raw) if raw.strip() else None


def describe(config: PPOConfig) -> str:
    """The config as a markdown table (logged to tensorboard at the start of a run)."""
    rows = ["| field | value |", "|---|---|"]
    rows += [f"| {key} | {json.dumps(value)} |" for key, value in config.to_dict().items()]
    return "\n".join(rows)


def preset(name: str, testbed: bool = False, **overrides) -> PPOConfig:
    """The named preset as a `PPOConfig`, optionally scaled for the CPU testbed."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    values = dict(PRESETS[name])
    if testbed:
        values.update(TESTBED_SCALE)
        values.update(TESTBED_ADJUSTMENTS.get(name, {}))
    values.update(upgrade_field_names(overrides))
    return PPOConfig.from_dict(values)

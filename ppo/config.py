"""`PPOConfig`: every implementation detail of the PPO / GRPO loop as one named field.

The config *is* the documentation: each field carries a help string saying what it does,
why, and where the choice comes from (AlpacaFarm, TRL, "The N+ Implementation Details of
RLHF with PPO", DeepSeekMath, Dr. GRPO, DAPO, Kimi k1.5, ...). ``ppo-train --help`` prints
them as a checklist, and two runs are compared by diffing their ``config.yaml``.

Presets (`PRESETS`, `preset`) are plain dictionaries of overrides on top of the defaults,
so ``python -c "from ppo.config import PRESETS; print(PRESETS['alpacafarm'])"`` shows
exactly what a preset changes. `TESTBED_SCALE` shrinks batch sizes and step counts for the
CPU testbed without touching algorithmic settings (see `preset(..., testbed=True)`).

Validation (`PPOConfig.validate`) runs on construction and names the bad field; one rule
rejects NaN and infinity in every float field. `RESUMABLE_FIELDS` lists the fields a resumed
run may change (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "abs")
ADVANTAGE_ESTIMATOR_NAMES = ("gae", "grpo", "dr_grpo", "rloo", "reinforce", "rft")
GSM8K_ANSWER_MODES = ("strict", "flexible")  # implemented in ppo/tasks/gsm8k.py `extract_answer`
# Seeds are 64-bit in torch; per-rank seeds are hashed into [0, 2**63) (ppo/distributed.py).
MAX_SEED = 2**63 - 1
# The fields a resumed run may change: they decide how long and how visibly the run goes
# on, never what one step computes. Any other difference between a run's config.yaml and
# the resuming config is refused unless explicitly allowed (`resume_conflicts`).
RESUMABLE_FIELDS = ("total_steps", "output_dir", "device", "threads", "progress", "eval_every", "save_every",
                    "keep_checkpoints", "log_samples", "retain_freed_memory")
LOSS_AGG_NAMES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
REWARD_WHITENING_MODES = ("masked", "stats", "alpacafarm")  # ppo/rewards.py whiten_rewards
KL_CONTROLLER_NAMES = ("ziegler", "alpacafarm")  # ppo/kl.py make_kl_controller
DIFFICULTY_FILTER_MODES = ("resample", "renormalize", "mask")  # ppo/filtering.py


def _f(default: Any, help: str, **kwargs) -> Any:
    """A dataclass field with its help string (shown by ``ppo-train --help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass
class PPOConfig:
    """All settings of one RL run. Field help strings give what, why and source."""

    # ------------------------------------------------------------------ run and model
    model_path: str | None = _f(None, "Policy checkpoint (any local HF causal LM dir). None: the testbed's cached SFT warm start.")
    warm_start_steps: int | None = _f(None, "With model_path None: start from the testbed SFT run's checkpoint after this many of its steps (an earlier, weaker model standing in for a base model, as DeepSeek R1-Zero starts RL from the base model); None = the finished warm start.")
    task: str = _f("arithmetic", "Task: 'arithmetic' (the testbed), 'preference' (the testbed scored by a hidden gold scorer; train against reward_model_path: AlpacaFarm-style RLHF), 'gsm8k' (JSONL at task_path), or 'custom' (prompts + reward_fn from Python).")
    task_path: str | None = _f(None, "Training JSONL for task='gsm8k' (GSM8K layout: question, answer ending '#### <number>').")
    eval_path: str | None = _f(None, "Held-out JSONL for task='gsm8k' (default: the training file).")
    gsm8k_answer_mode: str = _f("flexible", "Which number of a task='gsm8k' response is its answer, as lm-evaluation-harness's gsm8k scoring: 'strict' (strict-match: the number right after the first '#### '; no marker, no answer) or 'flexible' (flexible-extract: the last \\boxed{} number, else the last number). Default flexible: base models rarely write '####', and under strict nearly every group scores 0 and gives no gradient; strict also rewards the format. Both cut at an invented next 'Question:' / 'Q:'.")
    output_dir: str = _f("runs/ppo", "Run directory: config.yaml, metrics.jsonl, samples.jsonl, tensorboard events, checkpoints/, summary.json.")
    seed: int = _f(0, "Seed for prompt sampling, rollouts and initialisation.")
    total_steps: int = _f(100, "RL iterations (one rollout batch + its updates each).")
    device: str = _f("auto", "'auto' (accelerate picks), 'cpu' or 'cuda'.")
    threads: int = _f(2, "torch intra-op threads on CPU (fixed so CPU runs are reproducible).")
    mixed_precision: str = _f("no", "accelerate mixed precision: 'no', 'fp16', 'bf16'. Policy, reference, reward and value model all run under the same autocast (ppo/precision.py); fp16 uses one loss scaler unscaled once per step.")
    model_dtype: str = _f("float32", "dtype of the loaded weights: 'float32' (fp32 master weights, also for bf16 checkpoints: bf16 weights round lr-1e-6 updates away), 'bfloat16', 'float16', or 'auto' (as saved, transformers' default). Mixed precision comes from mixed_precision.")
    attn_implementation: str | None = _f(None, "Attention kernel passed to from_pretrained: 'eager', 'sdpa', 'flash_attention_2', ...; None = transformers' choice. A memory/speed toggle: the math is the same.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass for policy and critic (non-reentrant torch checkpointing): activation memory ~ one layer instead of all, for ~1/3 more compute. Same gradients.")
    lean_forward: bool = _f(True, "Run GPT-2 and Llama models (policy, reference, critic, reward model backbones) through ppo/lean_forward.py: their own modules called directly with one precomputed mask and matmul attention, and a KV-cached sampling loop with generate()'s sampling rule, instead of the Hugging Face forward() / generate() plumbing. Same math (log-probs agree to float rounding, a seed gives the same samples); other architectures, active dropout, gradient checkpointing, DDP-wrapped or peft models keep the module call. A speed toggle.")
    reuse_update_forward: bool = _f(True, "The policy cannot move before the update's first optimizer step, so the forward pass of the update's first micro-batch (the head of the first epoch's shuffle, drawn early; run before the advantages, with autograd) also gives its rows' old log-probs and the critic's old values, detached; the separate old-policy and old-critic passes run only over the other rows. With one epoch of one minibatch of one micro-batch that is every row: one policy and one critic forward pass fewer per step (TRL's GRPOTrainer does the same with num_iterations=1); with AlpacaFarm's 2 epochs x 2 minibatches, half of each. Needs no active dropout. Exact up to rounding; ignored with logprobs_from_generation.")
    share_prompt_prefix: bool = _f(True, "In the teacher-forced passes of lean_forward (old, reference and update log-probs, values), run each distinct prompt of the batch once and only the responses per row, attending to their prompt's keys and values: a GRPO batch repeats every prompt group_size times, so its prompt positions cost 1/G of the full pass. With padding_free, a small batch (its grouped attention grid at most batch_layouts.ONE_PASS_MAX_SCORES scores per head) runs in one pass instead of two: one attention row per prompt group, holding its prompt once and then its rows' response tokens back to back, each attending to its prompt and its own row (batch_layouts.PromptGroups; the identical-work GRPO step 0.82-0.86x). Rows do not interact, so it is the same arithmetic (log-probs and gradients equal the per-row pass to 1e-12 in float64, three training steps' weights agree to float rounding, tests/test_lean_forward.py). Ignored when no prompt repeats, and with compile_forward (the compiled full pass runs instead). A speed toggle.")
    padding_free: bool = _f(True, "In the teacher-forced passes of lean_forward (old, reference and update log-probs, values), carry only the real tokens between attention calls: products, norms and activations run on [tokens, width] instead of the batch padded to its longest row, and only attention scatters its queries, keys and values onto the padded grid (padding keys masked, padding queries never read). TRL's padding_free and flash-attention's variable-length batches skip padding the same way. Each real token meets the same numbers, so it is the same arithmetic (log-probs, values and three training steps' weights agree with it off to float rounding, tests/test_lean_forward.py). On the testbed presets a third of the tokens of a scoring or update pass are padding: one AlpacaFarm micro-batch's policy and critic forward + backward 0.75x (1 thread), whole testbed steps 0.78-0.86x at 1 thread and 0.87-0.91x at 2, the full sweep projected 0.88x (docs/performance.md); nothing on the identical-work tiny model. Ignored with compile_forward and in the sampler. A speed toggle.")
    paired_critic_pass: bool = _f(True, "PPO's update pass runs the policy and the critic as one stacked pass when their lean backbones have the same architecture and shapes (the critic built from the policy, or from a reward model of the policy's size): the batch runs twice over, its first copy through the policy's layers and its second through the critic's, each product a batched product over both models' stacked weights (torch.bmm), every other kernel once over both halves (ppo/model_pairs.py `Stacked`, `same_architecture`; ppo/lean_forward.py `paired_response_outputs`). The same idea as PyTorch's model-ensembling recipe (torch.func.stack_module_state + vmap): one kernel call for several same-shaped models. Each half meets its own model's weights, so it is the same arithmetic (outputs bitwise equal to the two passes on the identical PPO work, float64 gradients equal, three training steps agree to float rounding: tests/test_lean_forward.py). At 2 threads the identical-work PPO update's forward + backward 0.9x and the testbed AlpacaFarm update 0.85x; at 1 thread (a sweep's runs) no change. Ignored without a critic, with models of different shapes, with compile_forward, and on batches made of repeated prompts, at most one distinct prompt per two rows (share_prompt_prefix runs each model's pass instead). A speed toggle.")
    compile_forward: bool = _f(False, "torch.compile (inductor, dynamic shapes) the lean forward of lean_forward (needs it): elementwise work (norms, activations, softmax, the residual adds) fused into few kernels, in generation, the scoring passes and the update. Results agree to float rounding. The first step compiles (about 2 minutes on a 2-core CPU; inductor caches the kernels on disk, so later runs start in under a minute), so it pays on long runs only.")
    retain_freed_memory: bool = _f(True, "CPU runs: tell glibc's allocator to keep the memory the process frees for reuse (mallopt: mmap threshold 256 MiB, trim threshold 512 MiB; ppo/allocator.py), so each step's large activations reuse pages instead of being unmapped and page-faulted in again (up to 60,000 faults per testbed step fall to a few; testbed steps 0-6% shorter on the AlpacaFarm preset and 7-16% on GRPO, docs/performance.md). Changes no number; the process keeps its peak memory. Process-wide, for the rest of the process; glibc only. A speed toggle.")
    lora_r: int = _f(0, "LoRA rank for the policy through peft (Hu et al. 2021); 0 = full fine-tuning. With LoRA the reference is the base model with the adapter disabled: no second copy of the weights.")
    lora_alpha: float = _f(16.0, "LoRA scale alpha: the adapter's update is (alpha / r) B A (peft's lora_alpha).")
    lora_target_modules: str = _f("all-linear", "Layers that get adapters: 'all-linear' (every linear layer but the output head, QLoRA's choice) or comma-separated module names, e.g. 'q_proj,v_proj' (the LoRA paper's).")
    lora_critic: bool = _f(False, "Also train the critic through LoRA adapters on its backbone (its scalar head stays fully trainable); needs lora_r > 0.")

    # ------------------------------------------------------------------ rollout
    rollout_batch_size: int = _f(64, "Responses sampled per step (prompts x group_size) over all data-parallel processes together: the global batch, so a preset means the same update whatever the number of processes (each samples an equal share of whole groups). AlpacaFarm: 512.")
    group_size: int = _f(1, "Samples per prompt G, contiguous in the batch. PPO: 1; GRPO family: e.g. 8 (DeepSeekMath: 64).")
    response_length: int = _f(64, "Maximum new tokens per response; a response that hits it without EOS is 'missing EOS'.")
    temperature: float = _f(1.0, "Sampling temperature. AlpacaFarm 1.0, TRL 0.7.")
    top_k: int = _f(0, "Top-k truncation of sampling; 0 = off. Pure sampling keeps the rollout distribution equal to the trained one (N+ details).")
    top_p: float = _f(1.0, "Nucleus truncation; 1.0 = off (pure sampling, as AlpacaFarm and TRL).")
    scale_logits_by_temperature: bool = _f(True, "Divide logits by `temperature` before taking log-probs, so they are the log-probs of the distribution actually sampled (N+ implementation details; TRL and AlpacaFarm do this). False reproduces the bug of scoring with T=1 logits.")
    stop_token_ids: list[int] | None = _f(None, "Token ids that end a response. None = every EOS id the checkpoint declares (tokenizer eos, generation_config.eos_token_id, config.eos_token_id): instruct models list several end-of-turn ids.")
    max_prompt_length: int | None = _f(None, "Longest prompt in tokens (BOS included); None = the model's context minus response_length. prompt + response must fit the model's positions (checked at start).")
    prompt_truncation: str = _f("left", "A prompt over max_prompt_length: 'left' drops its oldest tokens (keeps BOS and the question's end; TRL's truncation_side), 'right' drops its end, 'error' refuses it with an error naming max_prompt_length.")
    logprobs_from_generation: bool = _f(False, "Take old log-probs from the generation logits (divided by the temperature) instead of a teacher-forced forward pass. AlpacaFarm: off (recomputes); TRL's PPOTrainer: on (generation logits). Saves a forward pass but generation kernels can differ numerically.")

    # ------------------------------------------------------------------ rewards
    missing_eos: str = _f("none", "Responses without EOS: 'none' (keep score), 'penalty' (subtract missing_eos_penalty; TRL's missing_eos_penalty), 'replace' (score := missing_eos_value; N+ details, OpenAI lm-human-preferences).")
    missing_eos_penalty: float = _f(1.0, "Amount subtracted from the score when missing_eos='penalty'.")
    missing_eos_value: float = _f(-1.0, "Score assigned when missing_eos='replace'.")
    reward_clip: float | None = _f(None, "Clamp sequence scores to [-reward_clip, reward_clip]; None = off (AlpacaFarm and TRL: off).")
    whiten_rewards: bool = _f(False, "Whiten per-token rewards (shift_mean=False: scale only, mean kept) before GAE. AlpacaFarm: on; TRL: off.")
    whiten_rewards_over_padding: str = _f("masked", "Which positions reward whitening sees: 'masked' (statistics over real response tokens), 'stats' (statistics over the whole [B, T] tensor, padding zeros included, then padding zeroed again), 'alpacafarm' (AlpacaFarm exactly: the padded tensor is whitened and kept, so every padding position carries mean*(1 - 1/std), and GAE runs over all T columns, feeding those values into each real token's return: a length-dependent reward). Old configs' true/false read as 'stats'/'masked'.")
    nonfinite_rewards: str = _f("stop", "A NaN or infinite sequence score: 'stop' the run before the update (the newest checkpoint stays the last good one) or 'drop' those samples from the loss (their score becomes their group's finite mean) and count them in the metric dropped_samples.")
    length_reward_coef: float = _f(0.0, "Weight of Kimi k1.5's in-group length reward added to the score (needs group_size >= 2); 0 = off.")
    length_reward_warmup_steps: int = _f(0, "RL steps at the start with the length reward switched off (weight 0), then length_reward_coef: Kimi k1.5's warm-up, so the policy first learns to solve before it is pushed to be brief. 0 = on from the first step.")
    format_reward_coef: float = _f(0.0, "Bonus added to the score of a well-formed response (answer marker with a parseable answer, and an EOS): DeepSeek R1's format reward next to the accuracy reward. 0 = off.")

    # ------------------------------------------------------------------ KL to the reference
    kl_coef: float = _f(0.05, "KL coefficient beta. AlpacaFarm 0.0067 (fixed), TRL 0.05, DeepSeekMath GRPO 0.04. 0 skips the reference model entirely.")
    kl_estimator: str = _f("k1", "Per-token KL estimator: k1 = logp - ref (AlpacaFarm, TRL), k2 = 0.5 (logp - ref)^2, k3 = exp(ref - logp) - (ref - logp) - 1 (GRPO), abs.")
    kl_clip_at_zero: bool = _f(False, "Clamp the per-token KL estimate at 0 (AlpacaFarm _shape_reward). Biased, but AlpacaFarm's runs blow up without it.")
    kl_placement: str = _f("reward", "'reward': -beta*KL added to per-token rewards (PPO, InstructGPT). 'loss': beta*KL added to the policy loss (GRPO).")
    adaptive_kl: bool = _f(False, "Adapt beta toward kl_target with the controller named by kl_controller. AlpacaFarm's rlhf_ppo.sh and TRL: fixed.")
    kl_controller: str = _f("ziegler", "Adaptive rule: 'ziegler' (Ziegler et al. 2019, TRL's AdaptiveKLController: beta *= 1 + clip(kl/target - 1, -0.2, 0.2) * samples / kl_horizon) or 'alpacafarm' (AlpacaFarm kl_controller.py: beta *= 1 + kl_k_beta * clip(kl/target - 1, -0.2, 0.2) once per step, no horizon).")
    kl_k_beta: float = _f(0.1, "Gain of the 'alpacafarm' controller (AlpacaFarm ppo_utils.py k_beta: 0.1).")
    kl_target: float = _f(6.0, "Target sequence KL of the adaptive controller (Ziegler et al.: 6.0).")
    kl_horizon: int = _f(10000, "Horizon (in samples) of the adaptive controller (Ziegler et al.: 10000).")

    # ------------------------------------------------------------------ advantages
    advantage_estimator: str = _f("gae", "'gae' (PPO with a value model), 'grpo', 'dr_grpo', 'rloo', 'reinforce', 'rft' (rejection-sampling fine-tuning: SFT on the kept samples) (no value model).")
    gamma: float = _f(1.0, "Discount. AlpacaFarm and TRL: 1.0.")
    lam: float = _f(0.95, "GAE lambda. AlpacaFarm 1.0 (gamma=lambda=1: a bandit, advantage = return - value), TRL 0.95.")
    whiten_advantages: bool = _f(True, "Whiten advantages (masked, mean shifted to 0). AlpacaFarm and TRL: on. GRPO family: off.")
    whiten_advantages_per_minibatch: bool = _f(False, "Whiten advantages per minibatch (OpenAI baselines/cleanrl) instead of once over the rollout batch (AlpacaFarm, TRL).")
    grpo_scale: str = _f("group", "Group-advantage scale: 'group' (divide by group std, DeepSeekMath), 'batch' (batch std), 'none' (Dr. GRPO).")
    grpo_std_correction: int = _f(0, "Bessel correction of the group std: 0 = population std (nano-aha-moment), 1 = sample std (TRL GRPOTrainer, verl: torch.std's default). Sample std makes advantages smaller by sqrt((G-1)/G) (0.935 at G=8).")
    grpo_eps: float = _f(1e-4, "Epsilon added to the std in group-advantage scaling (nano-aha-moment: 1e-4); a group of equal scores gets advantage 0.")
    reinforce_baseline: bool = _f(False, "For advantage_estimator='reinforce': subtract the batch-mean score.")
    rft_min_score: float = _f(1.0, "For advantage_estimator='rft' (rejection-sampling fine-tuning / expert iteration, e.g. STaR, RAFT): keep (advantage 1) the responses whose sequence score is at least this, drop the rest (advantage 0). 1.0 keeps exactly the correct answers of a 0/1 verifiable reward.")

    # ------------------------------------------------------------------ the update
    ppo_epochs: int = _f(4, "Passes over each rollout batch (GRPO's num_iterations). AlpacaFarm 2, TRL 4. With 1 epoch and 1 minibatch, old log-probs recomputed by a forward pass and deterministic kernels, the ratio is exactly 1 and clipping never fires (from generation logits it is only close to 1).")
    num_minibatches: int = _f(1, "Shuffled minibatches per epoch (one optimizer step each). AlpacaFarm: 512/256 = 2; TRL: 1.")
    gradient_accumulation_steps: int = _f(1, "Micro-batches per minibatch on each process (gradient accumulation); changes memory, not the math: each micro-batch's loss is weighted by its share of the minibatch's tokens or sequences, so the gradient equals one big minibatch's in every loss_agg (up to float rounding).")
    cliprange: float = _f(0.2, "PPO ratio clip epsilon (low side, and high side unless cliprange_high). AlpacaFarm and TRL: 0.2.")
    cliprange_high: float | None = _f(None, "Separate upper clip epsilon (DAPO's clip-higher, e.g. 0.28); None = symmetric.")
    dual_clip: float | None = _f(None, "Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (Ye et al. 2020); None = off.")
    cliprange_value: float | None = _f(0.2, "Value clipping around the old values; None = off. AlpacaFarm and TRL: 0.2.")
    vf_coef: float = _f(0.1, "Weight of the value loss. AlpacaFarm and TRL: 0.1.")
    entropy_coef: float = _f(0.0, "Entropy bonus weight. AlpacaFarm and TRL: 0.")
    loss_agg: str = _f("token_mean", "Loss aggregation: 'token_mean' (PPO as AlpacaFarm and TRL; DAPO's token-level loss), 'seq_mean_token_mean' (GRPO's per-sequence length normalisation), 'seq_mean_token_sum_norm' (Dr. GRPO).")
    target_kl: float | None = _f(None, "Stop the update of a step (remaining minibatches and epochs) once a minibatch's approx KL (mean of 0.5*(logp-old)^2) to the rollout policy exceeds this; None = off. Like cleanrl's target_kl, but cleanrl checks once per epoch with its (ratio-1)-log(ratio) estimator of the last minibatch.")
    mask_truncated_responses: bool = _f(False, "Drop responses that hit response_length without EOS from the loss (DAPO's overlong filtering).")

    # ------------------------------------------------------------------ difficulty filtering (Kimi k1.5)
    difficulty_filter: bool = _f(False, "Train only on groups whose pass rate (mean correctness over the G samples) lies inside (filter_min_pass_rate, filter_max_pass_rate), the way difficulty_filter_mode says. Kimi k1.5, DAPO dynamic sampling. Needs the task's verdict, so not with a reward model.")
    difficulty_filter_mode: str = _f("resample", "'resample' (DAPO's dynamic sampling: keep generating until the batch holds rollout_batch_size/G groups inside the band, at most dynamic_sampling_max_rounds rounds; the loss averages over kept groups), 'renormalize' (one round; filtered groups leave the loss and its denominator), 'mask' (one round; filtered groups are masked but still count in a seq_mean denominator, so the filter only rescales the gradient and drops their KL-loss term).")
    dynamic_sampling_max_rounds: int = _f(4, "Cap on generation rounds per step for difficulty_filter_mode='resample' (verl's max_num_gen_batches); if the batch is still short, the last rounds' filtered groups fill it and are left out of the loss.")
    filter_min_pass_rate: float = _f(0.0, "Lower edge (exclusive) of the kept pass-rate band; 0 drops prompts no sample solved.")
    filter_max_pass_rate: float = _f(1.0, "Upper edge (exclusive) of the kept pass-rate band; 1 drops prompts every sample solved.")
    retire_mastered: bool = _f(False, "Never draw again a prompt that all G samples solved (Kimi k1.5 retires mastered problems).")

    # ------------------------------------------------------------------ optimisation
    lr: float = _f(1e-5, "Policy learning rate. AlpacaFarm 1e-5 (rlhf_ppo.sh). TRL v0.19 PPOConfig sets none, so TrainingArguments' 5e-5 applies (its examples/scripts/ppo/ppo.py passes 3e-6; the pre-0.12 PPOConfig defaulted to 1.41e-5).")
    value_lr: float | None = _f(None, "Value-model learning rate; None = lr.")
    separate_value_optimizer: bool = _f(True, "Give the value model its own AdamW (and value_lr). False = one optimizer over policy and value parameters, as AlpacaFarm and TRL.")
    adam_eps: float = _f(1e-5, "AdamW epsilon. AlpacaFarm 1e-5 (N+ details); torch default 1e-8.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    warmup_steps: int = _f(0, "Linear learning-rate warmup, in RL steps (the schedule advances once per RL step, as AlpacaFarm): step s < warmup gets lr*s/warmup, so step 0 trains at lr 0. AlpacaFarm: 5.")
    lr_schedule: str = _f("linear", "transformers' schedules: 'linear' (get_linear_schedule_with_warmup: piecewise, full lr at the end of warmup, then linear to 0 at total_steps; AlpacaFarm) or 'constant' (get_constant_schedule_with_warmup).")
    max_grad_norm: float | None = _f(1.0, "Gradient-norm clipping; None = off. AlpacaFarm 1.0.")
    disable_dropout: bool = _f(True, "Turn off dropout in policy, reference and value model so log-probs are deterministic (N+ details; AlpacaFarm, TRL).")

    # ------------------------------------------------------------------ value model
    value_init: str = _f("policy", "Critic initialisation: 'reward_model' (reward model backbone, zeroed head: AlpacaFarm, OpenAI), 'policy' (SFT policy backbone, zeroed head), 'random'.")
    reward_model_path: str | None = _f(None, "Scalar-head reward model directory (used as the reward when set, and by value_init='reward_model').")

    # ------------------------------------------------------------------ logging and checkpoints
    eval_every: int = _f(10, "Held-out evaluation every N steps (and at the start and end); 0 = only start and end.")
    eval_size: int | None = _f(None, "Held-out problems to evaluate (first N); None = all.")
    log_samples: int = _f(4, "Decoded rollouts written to samples.jsonl per step.")
    save_every: int = _f(50, "Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = _f(2, "Most recent checkpoints kept on disk.")
    progress: bool = _f(True, "Show a progress bar.")

    def __post_init__(self):
        if isinstance(self.whiten_rewards_over_padding, bool):  # configs written before it had three modes
            self.whiten_rewards_over_padding = "stats" if self.whiten_rewards_over_padding else "masked"
        self._coerce_types()
        self.validate()

    def _coerce_types(self) -> None:
        """Accept numbers written as strings (YAML reads ``1e-5`` as a string) and ints for
        floats; anything else of the wrong type is an error naming the field."""
        for f in fields(self):
            value, kind = getattr(self, f.name), str(f.type)
            if value is None:
                if "None" not in kind:
                    raise ValueError(f"PPOConfig.{f.name}: may not be None")
                continue
            base = kind.split("|")[0].strip()
            if base == "str" and isinstance(value, bool):
                # YAML 1.1 (and so the CLI and config files) reads a bare `no` / `off` as
                # False: `--mixed-precision no` must mean the string "no".
                value = "no" if value is False else "yes"
                setattr(self, f.name, value)
            if base == "list[int]" and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, [value])  # `--stop-token-ids 2`
            try:
                if base == "float" and not isinstance(value, bool) and isinstance(value, (int, float, str)):
                    setattr(self, f.name, float(value))
                elif base == "int" and isinstance(value, str):
                    setattr(self, f.name, int(value))
                elif base == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
                    setattr(self, f.name, value.lower() == "true")
            except ValueError:
                raise ValueError(f"PPOConfig.{f.name}: expected {base}, got {value!r}") from None
            value = getattr(self, f.name)
            expected = {"float": float, "int": int, "bool": bool, "str": str}.get(base)
            if expected and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
                raise ValueError(f"PPOConfig.{f.name}: expected {base}, got {value!r}")
            # One rule for every float field: NaN slips through every `< 0` / `> 0` check
            # (comparisons with NaN are False) and inf overflows the update; neither is a setting.
            if expected is float and not math.isfinite(value):
                raise ValueError(f"PPOConfig.{f.name}: must be a finite number, got {value!r}")

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the field for any inconsistent setting."""

        def bad(name: str, message: str):
            raise ValueError(f"PPOConfig.{name}: {message} (got {getattr(self, name)!r})")

        def choice(name: str, options):
            if getattr(self, name) not in options:
                bad(name, f"must be one of {list(options)}")

        for name in ("total_steps", "rollout_batch_size", "group_size", "response_length", "ppo_epochs",
                     "num_minibatches", "gradient_accumulation_steps", "threads", "kl_horizon",
                     "dynamic_sampling_max_rounds"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, "must be a positive integer")
        if self.compile_forward and not self.lean_forward:
            bad("compile_forward", "compiles the lean forward: needs lean_forward=True")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad(name, "must be in [0, 1]")
        for name in ("temperature", "lr", "adam_eps", "cliprange", "kl_target"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        for name in ("kl_coef", "vf_coef", "entropy_coef", "weight_decay", "length_reward_coef", "format_reward_coef", "grpo_eps",
                     "missing_eos_penalty"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        for name in ("cliprange_high", "cliprange_value", "reward_clip", "max_grad_norm", "target_kl", "value_lr"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                bad(name, "must be > 0 or None")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            bad("dual_clip", "must be > 1 or None")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 = off)")
        if not 0 <= self.seed <= MAX_SEED:
            bad("seed", f"must be in [0, {MAX_SEED}] (torch's generators take a 64-bit seed)")
        if self.warm_start_steps is not None and self.warm_start_steps < 1:
            bad("warm_start_steps", "must be a positive integer or None")
        for name in ("warmup_steps", "length_reward_warmup_steps", "eval_every", "save_every", "log_samples", "keep_checkpoints"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        if self.eval_size is not None and self.eval_size < 1:
            bad("eval_size", "must be a positive integer or None")
        choice("task", ("arithmetic", "preference", "gsm8k", "custom"))
        choice("gsm8k_answer_mode", GSM8K_ANSWER_MODES)
        if self.task == "preference" and not self.reward_model_path:
            bad("reward_model_path", "is required for task='preference' (RLHF trains against a reward model)")
        choice("kl_estimator", KL_ESTIMATOR_NAMES)
        choice("kl_placement", ("reward", "loss"))
        choice("advantage_estimator", ADVANTAGE_ESTIMATOR_NAMES)
        choice("grpo_scale", ("group", "batch", "none"))
        choice("loss_agg", LOSS_AGG_NAMES)
        choice("missing_eos", ("none", "penalty", "replace"))
        choice("nonfinite_rewards", ("stop", "drop"))
        choice("value_init", ("reward_model", "policy", "random"))
        choice("lr_schedule", ("linear", "constant"))
        choice("whiten_rewards_over_padding", REWARD_WHITENING_MODES)
        choice("kl_controller", KL_CONTROLLER_NAMES)
        choice("difficulty_filter_mode", DIFFICULTY_FILTER_MODES)
        if self.grpo_std_correction not in (0, 1):
            bad("grpo_std_correction", "must be 0 (population std) or 1 (sample std)")
        if self.reward_model_path and (self.difficulty_filter or self.retire_mastered or self.length_reward_coef > 0):
            # The task's verdict is the hidden gold in RLHF: training may see only the proxy.
            name = ("difficulty_filter" if self.difficulty_filter else
                    "retire_mastered" if self.retire_mastered else "length_reward_coef")
            bad(name, "uses the task's correctness verdict, which is the hidden gold reward when "
                "reward_model_path is set (RLHF trains on the reward model only); turn it off")
        choice("device", ("auto", "cpu", "cuda"))
        choice("mixed_precision", ("no", "fp16", "bf16"))
        if self.rollout_batch_size % self.group_size:
            bad("rollout_batch_size", f"must be divisible by group_size ({self.group_size})")
        if self.rollout_batch_size % self.num_minibatches:
            bad("rollout_batch_size", f"must be divisible by num_minibatches ({self.num_minibatches})")
        if self.minibatch_size % self.gradient_accumulation_steps:
            bad("gradient_accumulation_steps",
                f"must divide the minibatch size ({self.minibatch_size} = rollout_batch_size / num_minibatches)")
        if self.advantage_estimator in ("grpo", "dr_grpo", "rloo") and self.group_size < 2:
            bad("group_size", f"must be >= 2 for advantage_estimator={self.advantage_estimator!r}")
        if not 0.0 <= self.filter_min_pass_rate < self.filter_max_pass_rate <= 1.0:
            bad("filter_min_pass_rate", f"need 0 <= filter_min_pass_rate < filter_max_pass_rate "
                f"({self.filter_max_pass_rate}) <= 1")
        if (self.difficulty_filter or self.retire_mastered) and self.group_size < 2:
            bad("group_size", "must be >= 2 for difficulty_filter / retire_mastered (pass rates come from groups)")
        if self.length_reward_coef > 0 and self.group_size < 2:
            bad("length_reward_coef", "needs group_size >= 2 (the length reward compares a group's responses)")
        if self.task == "gsm8k" and not self.task_path:
            bad("task_path", "is required for task='gsm8k'")
        choice("model_dtype", ("float32", "bfloat16", "float16", "auto"))
        if self.attn_implementation is not None and not self.attn_implementation.strip():
            bad("attn_implementation", "must be a kernel name or None")
        if self.stop_token_ids is not None:
            if (not isinstance(self.stop_token_ids, list) or not self.stop_token_ids
                    or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.stop_token_ids)):
                bad("stop_token_ids", "must be a non-empty list of token ids (integers >= 0) or None")
        if self.max_prompt_length is not None and self.max_prompt_length < 2:
            bad("max_prompt_length", "must be an integer >= 2 (BOS and one token) or None")
        choice("prompt_truncation", ("left", "right", "error"))
        if self.lora_r < 0:
            bad("lora_r", "must be >= 0 (0 = full fine-tuning)")
        if not self.lora_alpha > 0:
            bad("lora_alpha", "must be > 0")
        if not self.lora_target_modules.strip() or self.lora_target_modules.strip(" ,") == "":
            bad("lora_target_modules", "must be 'all-linear' or comma-separated module names")
        if self.lora_critic and self.lora_r == 0:
            bad("lora_critic", "needs lora_r > 0 (the critic's adapters use the policy's rank and alpha)")

    def validate_for_run(self) -> None:
        """Checks that only matter when a run starts (a preset may name a reward model that
        the user supplies later)."""
        if self.value_init == "reward_model" and self.uses_value_model and not self.reward_model_path:
            raise ValueError("PPOConfig.value_init: 'reward_model' needs reward_model_path (the verifiable testbed "
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

    # -- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, values: dict) -> "PPOConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"PPOConfig: unknown field(s) {unknown}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PPOConfig":
        data = read_yaml_mapping(path)
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def replace(self, **overrides) -> "PPOConfig":
        return PPOConfig.from_dict({**self.to_dict(), **overrides})


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
    if name not in field_help():
        raise ValueError(f"override {text!r}: unknown field {name!r}")
    return name, yaml.safe_load(raw) if raw.strip() else None


# ---------------------------------------------------------------------- presets
# Plain data: each preset lists only the fields it changes from the defaults above.
PRESETS: dict[str, dict[str, Any]] = {
    # AlpacaFarm's PPO (examples/scripts/rlhf_ppo.sh, src/alpaca_farm/rl/ppo_trainer.py,
    # ppo_utils.py, rl_trainer.py). docs/implementation-details.md lists each field's source.
    "alpacafarm": dict(
        kl_coef=0.0067,  # rlhf_ppo.sh --kl_coef 0.0067, fixed controller
        adaptive_kl=False,
        kl_estimator="k1",  # logprobs - ref_logprobs
        kl_clip_at_zero=True,  # _shape_reward: torch.clamp(kl, min=0.0)
        kl_placement="reward",
        whiten_rewards=True,  # whiten_rewards=True, shift_mean=False
        whiten_rewards_over_padding="alpacafarm",  # whitens the padded [B, T] tensor, GAE over every column
        kl_controller="alpacafarm",  # used when adaptive_kl: kl_controller.py, k_beta 0.1
        kl_k_beta=0.1,
        whiten_advantages=True,
        gamma=1.0,
        lam=1.0,
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        entropy_coef=0.0,
        ppo_epochs=2,  # noptepochs 2
        rollout_batch_size=512,  # rollout_batch_size 512
        num_minibatches=2,  # step_batch_size 256
        lr=1e-5,  # shared by policy and value
        separate_value_optimizer=False,
        adam_eps=1e-5,
        warmup_steps=5,
        lr_schedule="linear",
        max_grad_norm=1.0,
        temperature=1.0,
        missing_eos="none",
        disable_dropout=True,
        value_init="reward_model",  # value model = reward model with a zeroed head
        logprobs_from_generation=False,  # old log-probs recomputed by a forward pass
        # AlpacaFarm derives its steps from total_epochs x dataset size / rollout_batch_size;
        # 250 is this preset's choice, not a value AlpacaFarm states.
        total_steps=250,
    ),
    # TRL's PPOTrainer / PPOConfig as of v0.19 (trl/trainer/ppo_config.py, ppo_trainer.py;
    # sampling settings from OnPolicyConfig in trl/trainer/utils.py).
    "trl_ppo": dict(
        kl_coef=0.05,
        kl_estimator="k1",
        kl_clip_at_zero=False,
        kl_placement="reward",
        gamma=1.0,
        lam=0.95,
        whiten_rewards=False,
        whiten_advantages=True,
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        ppo_epochs=4,
        num_minibatches=1,
        temperature=0.7,
        lr=3e-6,  # examples/scripts/ppo/ppo.py; PPOConfig itself inherits TrainingArguments' 5e-5
        logprobs_from_generation=True,  # old log-probs from the generation logits / temperature
        separate_value_optimizer=False,
        adam_eps=1e-8,  # TRL used the torch default
        missing_eos="none",  # TRL's missing_eos_penalty defaults to None
        value_init="reward_model",
    ),
    # DeepSeekMath GRPO (Shao et al. 2024, sec. 4.1): G samples per prompt, group-std
    # advantages, per-sequence length normalisation, k3 KL in the loss with beta 0.04, no
    # value model. Their RL used G = 64, lr 1e-6, one policy update per rollout batch.
    "grpo": dict(
        advantage_estimator="grpo",
        grpo_scale="group",
        grpo_eps=1e-4,  # nano-aha-moment; DeepSeekMath does not state its epsilon
        group_size=8,
        kl_placement="loss",
        kl_estimator="k3",
        kl_coef=0.04,
        loss_agg="seq_mean_token_mean",
        whiten_advantages=False,
        whiten_rewards=False,
        ppo_epochs=1,
        num_minibatches=1,
        cliprange=0.2,
        lr=1e-6,
        temperature=1.0,
    ),
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without the
    # std division and without per-sequence length normalisation (a constant normaliser),
    # and no KL term (beta = 0).
    "dr_grpo": dict(
        advantage_estimator="dr_grpo",
        grpo_scale="none",
        group_size=8,
        kl_coef=0.0,
        kl_placement="loss",
        kl_estimator="k3",
        loss_agg="seq_mean_token_sum_norm",
        whiten_advantages=False,
        ppo_epochs=1,
        num_minibatches=1,
        cliprange=0.2,
        lr=1e-6,
    ),
    # RLOO (Ahmadian et al. 2024, "Back to Basics"): leave-one-out baseline, REINFORCE-style
    # single update, KL in the reward (k1) as in their RLHF setup.
    "rloo": dict(
        advantage_estimator="rloo",
        group_size=8,
        kl_coef=0.05,
        kl_placement="reward",
        kl_estimator="k1",
        loss_agg="token_mean",
        whiten_advantages=False,
        ppo_epochs=1,
        num_minibatches=1,
        lr=1e-6,
    ),
    # nano-aha-moment's GRPO: group-std advantages with eps 1e-4, token-level loss averaged
    # over all tokens of the batch, k3 KL in the loss with a small beta, one update per batch.
    "grpo_nano": dict(
        advantage_estimator="grpo",
        grpo_scale="group",
        grpo_eps=1e-4,
        group_size=4,
        kl_placement="loss",
        kl_estimator="k3",
        kl_coef=0.001,
        loss_agg="token_mean",
        whiten_advantages=False,
        ppo_epochs=1,
        num_minibatches=1,
        lr=1e-6,
    ),
}

# Shrinks batch sizes and step counts (and only those, plus settings a 0.9M-parameter
# model needs, listed below) so a preset runs in minutes on the CPU testbed.
TESTBED_SCALE: dict[str, Any] = dict(
    rollout_batch_size=64,  # keeps each preset's rollout/minibatch ratio (num_minibatches unchanged)
    total_steps=100,
    response_length=64,
    eval_every=20,
    eval_size=256,
    save_every=0,
    # Learning rates scale with model size: the presets' values are for 7B models and
    # barely move a 0.9M-parameter model in 100 steps. Every testbed run uses the same
    # rate, so comparisons between presets isolate their algorithmic toggles.
    lr=1e-4,
)

# Per-preset testbed adjustments that are not pure scaling, each with its reason.
TESTBED_ADJUSTMENTS: dict[str, dict[str, Any]] = {
    # The verifiable testbed has no reward model to initialise the critic from; the
    # nearest equivalent is the SFT backbone with a zeroed head.
    "alpacafarm": dict(value_init="policy"),
    "trl_ppo": dict(value_init="policy"),
}


def preset(name: str, testbed: bool = False, **overrides) -> PPOConfig:
    """The named preset as a `PPOConfig`, optionally scaled for the CPU testbed."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    values = dict(PRESETS[name])
    if testbed:
        values.update(TESTBED_SCALE)
        values.update(TESTBED_ADJUSTMENTS.get(name, {}))
    values.update(overrides)
    return PPOConfig.from_dict(values)


def describe(config: PPOConfig) -> str:
    """The config as a markdown table (logged to tensorboard at the start of a run)."""
    rows = ["| field | value |", "|---|---|"]
    rows += [f"| {key} | {json.dumps(value)} |" for key, value in config.to_dict().items()]
    return "\n".join(rows)

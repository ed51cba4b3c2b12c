"""Checking a `PPOConfig`: type coercion and validation, each error naming its field.

`PPOConfig.__post_init__` runs `coerce_types` then `validate`, so a config that exists is a
valid one: numbers written as strings (YAML reads ``1e-5`` as a string) become numbers, one
rule rejects NaN and infinity in every float field, and every range, choice and
combination a run could not use is refused with the field named (docs/reliability.md).
"""

from __future__ import annotations

import math
from dataclasses import fields

def coerce_types(config) -> None:
    """Accept numbers written as strings (YAML reads ``1e-5`` as a string) and ints for
    floats; anything else of the wrong type is an error naming the field."""
    for f in fields(config):
        value, kind = getattr(config, f.name), str(f.type)
        if value is None:
            if "None" not in kind:
                raise ValueError(f"PPOConfig.{f.name}: may not be None")
            continue
        base = kind.split("|")[0].strip()
        if base == "str" and isinstance(value, bool):
            # YAML 1.1 (and so the CLI and config files) reads a bare `no` / `off` as
            # False: `--mixed-precision no` must mean the string "no".
            value = "no" if value is False else "yes"
            setattr(config, f.name, value)
        if base == "list[int]" and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, f.name, [value])  # `--stop-token-ids 2`
        if base == "list[str]" and isinstance(value, str):
            # `--report-to wandb`, `--report-to wandb,mlflow`; 'none' is TRL's spelling of [].
            names = [name.strip() for name in value.split(",") if name.strip()]
            setattr(config, f.name, [] if names == ["none"] else names)
        try:
            if base == "float" and not isinstance(value, bool) and isinstance(value, (int, float, str)):
                setattr(config, f.name, float(value))
            elif base == "int" and isinstance(value, str):
                setattr(config, f.name, int(value))
            elif base == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
                setattr(config, f.name, value.lower() == "true")
        except ValueError:
            raise ValueError(f"PPOConfig.{f.name}: expected {base}, got {value!r}") from None
        value = getattr(config, f.name)
        expected = {"float": float, "int": int, "bool": bool, "str": str}.get(base)
        if expected and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            raise ValueError(f"PPOConfig.{f.name}: expected {base}, got {value!r}")
        # One rule for every float field: NaN slips through every `< 0` / `> 0` check
        # (comparisons with NaN are False) and inf overflows the update; neither is a setting.
        if expected is float and not math.isfinite(value):
            raise ValueError(f"PPOConfig.{f.name}: must be a finite number, got {value!r}")

def validate(config) -> None:
    """Raise ValueError naming the field for any inconsistent setting."""
    from .config import (ADVANTAGE_ESTIMATOR_NAMES, DIFFICULTY_FILTER_MODES, GSM8K_ANSWER_MODES, KL_CONTROLLER_NAMES,
                         KL_ESTIMATOR_NAMES, LOSS_AGG_NAMES, MAX_SEED, REWARD_WHITENING_MODES, SCORE_POSITIONS)

    def bad(name: str, message: str):
        raise ValueError(f"PPOConfig.{name}: {message} (got {getattr(config, name)!r})")

    def choice(name: str, options):
        if getattr(config, name) not in options:
            bad(name, f"must be one of {list(options)}")

    for name in ("total_steps", "rollout_batch_size", "group_size", "response_length", "ppo_epochs",
                 "num_minibatches", "gradient_accumulation_steps", "threads", "kl_horizon",
                 "dynamic_sampling_max_rounds"):
        if not isinstance(getattr(config, name), int) or getattr(config, name) < 1:
            bad(name, "must be a positive integer")
    if config.critic_warmup_steps < 0:
        bad("critic_warmup_steps", "must be >= 0")
    if config.critic_warmup_steps and not config.uses_value_model:
        bad("critic_warmup_steps", "warms up a critic: needs advantage_estimator='gae'")
    if config.lam_critic is not None and not 0.0 <= config.lam_critic <= 1.0:
        bad("lam_critic", "must be in [0, 1] or None")
    if config.lam_length_alpha is not None and not config.lam_length_alpha > 0:
        bad("lam_length_alpha", "must be > 0 or None")
    if config.value_init == "pretrained" and not config.value_init_path:
        bad("value_init_path", "is required for value_init='pretrained' (python -m ppo.value_pretrain writes one)")
    if config.compile_forward and not config.lean_forward:
        bad("compile_forward", "compiles the lean forward: needs lean_forward=True")
    for name in ("gamma", "lam"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            bad(name, "must be in [0, 1]")
    for name in ("temperature", "lr", "adam_eps", "cliprange", "kl_target"):
        if not getattr(config, name) > 0:
            bad(name, "must be > 0")
    for name in ("kl_coef", "vf_coef", "entropy_coef", "weight_decay", "length_reward_coef", "format_reward_coef", "grpo_eps",
                 "missing_eos_penalty"):
        if getattr(config, name) < 0:
            bad(name, "must be >= 0")
    for name in ("cliprange_high", "cliprange_value", "reward_clip", "max_grad_norm", "target_kl", "value_lr"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            bad(name, "must be > 0 or None")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(config, name) < 1.0:
            bad(name, "must be in [0, 1)")
    if config.dual_clip is not None and not config.dual_clip > 1.0:
        bad("dual_clip", "must be > 1 or None")
    _validate_policy_loss(config, bad)
    if not 0.0 < config.top_p <= 1.0:
        bad("top_p", "must be in (0, 1]")
    if config.top_k < 0:
        bad("top_k", "must be >= 0 (0 = off)")
    if not 0 <= config.seed <= MAX_SEED:
        bad("seed", f"must be in [0, {MAX_SEED}] (torch's generators take a 64-bit seed)")
    if config.warm_start_steps is not None and config.warm_start_steps < 1:
        bad("warm_start_steps", "must be a positive integer or None")
    for name in ("warmup_steps", "length_reward_warmup_steps", "eval_every", "save_every", "log_samples", "keep_checkpoints"):
        if getattr(config, name) < 0:
            bad(name, "must be >= 0")
    if not isinstance(config.eval_samples_per_prompt, int) or config.eval_samples_per_prompt < 1:
        bad("eval_samples_per_prompt", "must be a positive integer")
    if not isinstance(config.eval_batch_size, int) or config.eval_batch_size < 1:
        bad("eval_batch_size", "must be a positive integer")
    if config.eval_size is not None and config.eval_size < 1:
        bad("eval_size", "must be a positive integer or None")
    _validate_trackers(config, bad)
    choice("task", ("arithmetic", "preference", "gsm8k", "custom"))
    choice("gsm8k_answer_mode", GSM8K_ANSWER_MODES)
    if config.task == "preference" and not config.reward_model_path:
        bad("reward_model_path", "is required for task='preference' (RLHF trains against a reward model)")
    choice("kl_estimator", KL_ESTIMATOR_NAMES)
    choice("kl_placement", ("reward", "loss"))
    choice("advantage_estimator", ADVANTAGE_ESTIMATOR_NAMES)
    choice("grpo_scale", ("group", "batch", "none"))
    choice("loss_agg", LOSS_AGG_NAMES)
    choice("missing_eos", ("none", "penalty", "replace"))
    choice("nonfinite_rewards", ("stop", "drop"))
    choice("value_init", ("reward_model", "reward_model_head", "policy", "random", "pretrained"))
    choice("lr_schedule", ("linear", "constant"))
    choice("reward_whitening_mode", REWARD_WHITENING_MODES)
    choice("score_position", SCORE_POSITIONS)
    if config.score_position != "last_token" and config.advantage_estimator != "gae":
        bad("score_position", "places the score past the last token for the critic: needs advantage_estimator='gae'")
    if config.value_loss_over_padding and not config.pad_to_response_length:
        bad("value_loss_over_padding", "trains the critic on the padding of a fixed-width batch: needs "
            "pad_to_response_length=True (AlpacaFarm pads every batch to response_len)")
    choice("kl_controller", KL_CONTROLLER_NAMES)
    from .rollout_correction import ROLLOUT_CORRECTIONS, SAMPLING_PRECISIONS

    choice("rollout_correction", ROLLOUT_CORRECTIONS)
    choice("sampling_precision", SAMPLING_PRECISIONS)
    if not 0 < config.rollout_correction_floor < 1 < config.rollout_correction_cap:
        bad("rollout_correction_cap", f"needs 0 < rollout_correction_floor ({config.rollout_correction_floor}) < 1 < "
            "rollout_correction_cap")
    choice("generation_backend", ("hf", "vllm"))  # ppo/vllm_sampler.py GENERATION_BACKENDS
    if config.generation_backend == "vllm" and config.sampling_precision != "fp32":
        bad("sampling_precision", "bf16 autocast is Hugging Face sampling; with generation_backend='vllm' the "
            "engine's dtype is model_dtype")
    if config.vllm_kv_cache_gb <= 0:
        bad("vllm_kv_cache_gb", "must be > 0")
    if not 0 < config.vllm_gpu_memory_utilization <= 1:
        bad("vllm_gpu_memory_utilization", "must be in (0, 1]")
    if config.sampling_precision == "bf16" and config.lean_forward:
        bad("sampling_precision", "'bf16' samples through the module call: set lean_forward=False too")
    if not isinstance(config.ref_update_every, int) or config.ref_update_every < 0:
        bad("ref_update_every", "must be an integer >= 0 (0 = a frozen reference)")
    if not 0 < config.ref_update_alpha <= 1:
        bad("ref_update_alpha", "must be in (0, 1] (1 = hard reset to the policy)")
    choice("difficulty_filter_mode", DIFFICULTY_FILTER_MODES)
    if config.grpo_std_correction not in (0, 1):
        bad("grpo_std_correction", "must be 0 (population std) or 1 (sample std)")
    if config.reward_model_path and (config.difficulty_filter or config.retire_mastered or config.length_reward_coef > 0):
        # The task's verdict is the hidden gold in RLHF: training may see only the proxy.
        name = ("difficulty_filter" if config.difficulty_filter else
                "retire_mastered" if config.retire_mastered else "length_reward_coef")
        bad(name, "uses the task's correctness verdict, which is the hidden gold reward when "
            "reward_model_path is set (RLHF trains on the reward model only); turn it off")
    choice("device", ("auto", "cpu", "cuda"))
    choice("mixed_precision", ("no", "fp16", "bf16"))
    if config.rollout_batch_size % config.group_size:
        bad("rollout_batch_size", f"must be divisible by group_size ({config.group_size})")
    if config.rollout_batch_size % config.num_minibatches:
        bad("rollout_batch_size", f"must be divisible by num_minibatches ({config.num_minibatches})")
    if config.minibatch_size % config.gradient_accumulation_steps:
        bad("gradient_accumulation_steps",
            f"must divide the minibatch size ({config.minibatch_size} = rollout_batch_size / num_minibatches)")
    if config.advantage_estimator in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline") and config.group_size < 2:
        bad("group_size", f"must be >= 2 for advantage_estimator={config.advantage_estimator!r}")
    if not 0.0 <= config.filter_min_pass_rate < config.filter_max_pass_rate <= 1.0:
        bad("filter_min_pass_rate", f"need 0 <= filter_min_pass_rate < filter_max_pass_rate "
            f"({config.filter_max_pass_rate}) <= 1")
    if (config.difficulty_filter or config.retire_mastered) and config.group_size < 2:
        bad("group_size", "must be >= 2 for difficulty_filter / retire_mastered (pass rates come from groups)")
    if config.length_reward_coef > 0 and config.group_size < 2:
        bad("length_reward_coef", "needs group_size >= 2 (the length reward compares a group's responses)")
    if config.task == "gsm8k" and not config.task_path:
        bad("task_path", "is required for task='gsm8k'")
    choice("model_dtype", ("float32", "bfloat16", "float16", "auto"))
    if config.attn_implementation is not None and not config.attn_implementation.strip():
        bad("attn_implementation", "must be a kernel name or None")
    if config.stop_token_ids is not None:
        if (not isinstance(config.stop_token_ids, list)
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in config.stop_token_ids)):
            bad("stop_token_ids", "must be a list of token ids (integers >= 0; [] = no stop token) or None")
    if config.max_prompt_length is not None and config.max_prompt_length < 2:
        bad("max_prompt_length", "must be an integer >= 2 (BOS and one token) or None")
    choice("prompt_truncation", ("left", "right", "error"))
    if config.lora_r < 0:
        bad("lora_r", "must be >= 0 (0 = full fine-tuning)")
    if not config.lora_alpha > 0:
        bad("lora_alpha", "must be > 0")
    if not config.lora_target_modules.strip() or config.lora_target_modules.strip(" ,") == "":
        bad("lora_target_modules", "must be 'all-linear' or comma-separated module names")
    choice("sharding", ("none", "fsdp"))
    if config.sharding == "fsdp" and config.mixed_precision == "fp16":
        bad("mixed_precision", "'fp16' needs a loss scaler, which sharded gradients (sharding='fsdp') do not get here; "
                               "use 'bf16'")
    if config.sharding == "fsdp" and config.difficulty_filter and config.difficulty_filter_mode == "resample":
        bad("difficulty_filter_mode", "'resample' lets each process take its own number of sampling rounds, and under "
                                      "sharding='fsdp' every forward pass needs all processes; use 'renormalize'")
    if config.sharding == "fsdp" and config.generation_backend == "vllm":
        bad("generation_backend", "'vllm' loads the whole policy into each process's engine after every update, and "
                                  "under sharding='fsdp' each process holds only its shard; sample with 'hf', or "
                                  "shard with sharding='none'")
    if config.lora_critic and config.lora_r == 0:
        bad("lora_critic", "needs lora_r > 0 (the critic's adapters use the policy's rank and alpha)")

def _validate_policy_loss(config, bad) -> None:
    """The policy-loss fields, and the combinations a loss has no use for."""
    from .policy_losses import POLICY_LOSSES, SEQUENCE_LEVEL_LOSSES

    if config.policy_loss not in POLICY_LOSSES:
        bad("policy_loss", f"must be one of {sorted(POLICY_LOSSES)}")
    if config.dual_clip is not None and config.policy_loss != "vanilla":
        bad("dual_clip", f"caps the per-token clipped surrogate of policy_loss='vanilla'; "
            f"policy_loss={config.policy_loss!r} has no such term: set dual_clip=None")
    if config.cliprange_high is not None and config.policy_loss == "kl_cov":
        bad("cliprange_high", "policy_loss='kl_cov' does not clip the ratio (its KL penalty replaces the clip): "
            "set cliprange_high=None")
    if config.top_entropy_quantile < 1.0 and config.policy_loss in SEQUENCE_LEVEL_LOSSES:
        bad("top_entropy_quantile", f"masks single tokens, but policy_loss={config.policy_loss!r} has one ratio "
            "and one loss per sequence, whose gradient reaches every token: use 1.0, or 'gspo_token'")
    if not 0.0 <= config.top_entropy_quantile <= 1.0:
        bad("top_entropy_quantile", "must be in [0, 1] (1 = every token)")
    if not 0.0 < config.cov_fraction <= 1.0:
        bad("cov_fraction", "must be in (0, 1]")
    if not config.clip_cov_low < config.clip_cov_high:
        bad("clip_cov_low", f"must be below clip_cov_high ({config.clip_cov_high})")
    for name in ("kl_cov_coef", "entropy_coef_step", "overlong_penalty_factor"):
        if getattr(config, name) < 0:
            bad(name, "must be >= 0")
    if config.entropy_target is not None and not config.entropy_target > 0:
        bad("entropy_target", "must be > 0 or None")
    if not 0 <= config.overlong_buffer_length < config.response_length:
        bad("overlong_buffer_length", f"must be in [0, response_length) = [0, {config.response_length})")


def _validate_trackers(config, bad) -> None:
    """report_to names known trackers (ppo/trackers.py); the labels a tracker files the run under are text."""
    from .trackers import TRACKERS

    if not isinstance(config.report_to, list) or not all(isinstance(name, str) for name in config.report_to):
        bad("report_to", f"must be a list of tracker names from {list(TRACKERS)}")
    unknown = [name for name in config.report_to if name not in TRACKERS]
    if unknown:
        bad("report_to", f"unknown tracker(s) {unknown}; known: {list(TRACKERS)} ([] or 'none' = metrics.jsonl only)")
    if len(set(config.report_to)) != len(config.report_to):
        bad("report_to", "names a tracker twice")
    if not config.tracker_project.strip():
        bad("tracker_project", "must be a non-empty name")
    for name in ("run_name", "run_group"):
        if getattr(config, name) is not None and not getattr(config, name).strip():
            bad(name, "must be a non-empty name or None")
    tags = config.run_tags
    if not isinstance(tags, dict) or not all(
            isinstance(k, str) and k and isinstance(v, (str, int, float)) and not isinstance(v, bool)
            for k, v in tags.items()):
        bad("run_tags", "must be a mapping of name: value (text or numbers)")

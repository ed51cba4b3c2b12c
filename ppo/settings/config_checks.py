"""Checking a `PPOConfig`: type coercion and validation, each error naming its field.

`PPOConfig.__post_init__` runs `coerce_types` then `validate`, so a config that exists is a
valid one: numbers written as strings (YAML reads ``1e-5`` as a string) become numbers, one
rule rejects NaN and infinity in every float field, and every range, choice and
combination a run could not use is refused with the field named (docs/reliability.md).

`inert_settings` lists the fields set away from their default that the configuration never
reads, each with the setting that makes it inert and what to do: `validate` refuses the plain
mistakes among them (`REFUSED_WHEN_INERT`), the trainer warns about the rest
(`run_warnings`, `InertSettingWarning`) and records them in summary.json; docs/liveness.md
(`ppo/settings/liveness.py`) is the table of every field's verdict in every preset.
"""

from __future__ import annotations

import math
from dataclasses import fields

from ppo.settings.choices import (ADVANTAGE_ESTIMATOR_NAMES, CHAT_TEMPLATE_MODES, DIFFICULTY_FILTER_MODES,
                                  GSM8K_ANSWER_MODES, KL_CONTROLLER_NAMES, KL_ESTIMATOR_NAMES, LOSS_AGG_NAMES, MAX_SEED,
                                  METRIC_DENOMINATORS, REWARD_WHITENING_MODES, SCORE_POSITIONS, TASK_NAMES, TRACKERS,
                                  WHITENING_SCOPES)

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
        if f.name == "chat_template" and isinstance(value, bool):  # YAML reads `off` / `on` as booleans
            value = "on" if value else "off"
            setattr(config, f.name, value)
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
        if base == "list[float]" and isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(config, f.name, [value])  # `--reward-fn-weights 0.5`
        if base == "list[float]" and isinstance(getattr(config, f.name), list):
            setattr(config, f.name, [float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                                     for v in getattr(config, f.name)])
        if base == "list[str]" and getattr(config, f.name) == ["none"]:
            setattr(config, f.name, [])  # TRL's report_to=["none"], as a list: the same request
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
        bad("value_init_path", "is required for value_init='pretrained' (python -m ppo.models.value_pretrain writes one)")
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
    if config.eval_thinking_budget is not None and (not isinstance(config.eval_thinking_budget, int)
                                                    or config.eval_thinking_budget < 1):
        bad("eval_thinking_budget", "must be a positive integer (tokens of thinking) or None")
    if config.eval_thinking_budget is not None and config.task in ("preference", "custom"):
        bad("eval_thinking_budget", f"forces a task's answer marker, and task={config.task!r} has none; use "
            "'arithmetic' or 'gsm8k', or None")
    if config.eval_size is not None and config.eval_size < 1:
        bad("eval_size", "must be a positive integer or None")
    _validate_trackers(config, bad)
    choice("task", TASK_NAMES)
    _validate_data_and_reward_fns(config, bad, choice)
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
    choice("whitening_scope", WHITENING_SCOPES)
    choice("metric_denominator", METRIC_DENOMINATORS)
    choice("score_position", SCORE_POSITIONS)
    if config.score_position != "last_token" and config.advantage_estimator != "gae":
        bad("score_position", "places the score past the last token for the critic: needs advantage_estimator='gae'")
    if config.value_loss_over_padding and not config.pad_to_response_length:
        bad("value_loss_over_padding", "trains the critic on the padding of a fixed-width batch: needs "
            "pad_to_response_length=True (AlpacaFarm pads every batch to response_len)")
    choice("kl_controller", KL_CONTROLLER_NAMES)
    from ppo.algorithm.rollout_correction import ROLLOUT_CORRECTIONS, SAMPLING_PRECISIONS

    choice("rollout_correction", ROLLOUT_CORRECTIONS)
    choice("sampling_precision", SAMPLING_PRECISIONS)
    if not 0 < config.rollout_correction_floor < 1:
        bad("rollout_correction_floor", "must be in (0, 1): the lower edge of the band around ratio 1")
    if not config.rollout_correction_cap > 1:
        bad("rollout_correction_cap", "must be > 1: the upper edge of the band around ratio 1")
    if not config.rollout_correction_kl_threshold > 0:
        bad("rollout_correction_kl_threshold", "must be > 0: the largest k2 / k3 statistic kept")
    if config.off_policy_mask_threshold is not None and config.off_policy_mask_threshold < 0:
        bad("off_policy_mask_threshold", "must be >= 0 or None: the largest mean log(pi_sampler / pi_current) a "
            "negative-advantage sequence may drift before it leaves the loss")
    choice("generation_backend", ("hf", "vllm"))  # ppo/parallel/vllm_sampler.py GENERATION_BACKENDS
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
    if config.reward_model_path and (config.difficulty_filter or config.retire_mastered or config.length_reward_coef > 0
                                     or config.positive_nll_coef > 0):
        # The task's verdict is the hidden gold in RLHF: training may see only the proxy.
        name = ("difficulty_filter" if config.difficulty_filter else
                "retire_mastered" if config.retire_mastered else
                "length_reward_coef" if config.length_reward_coef > 0 else "positive_nll_coef")
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
    if config.advantage_estimator == "gdpo":  # it normalises the named components, not the summed score
        if config.kl_placement == "reward" and config.kl_coef > 0:
            bad("kl_placement", "advantage_estimator='gdpo' reads the reward components (correctness, format, length), "
                "so a KL in the reward would never reach the advantage: use kl_placement='loss'")
        for name in ("overlong_buffer_length", "reward_clip", "whiten_rewards"):
            if getattr(config, name):
                bad(name, "acts on the summed score, which advantage_estimator='gdpo' does not read (it normalises "
                    "the components correctness, format, length); turn it off")
    if config.advantage_estimator in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "maxrl", "grpo_passk",
                                      "gdpo") and config.group_size < 2:
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
    if not isinstance(config.rollout_staleness, int) or isinstance(config.rollout_staleness, bool) \
            or config.rollout_staleness < 0:
        bad("rollout_staleness", "must be an integer >= 0 (training steps the sampling weights lag; 0 = on-policy)")
    elif config.rollout_staleness and config.sharding == "fsdp":
        bad("rollout_staleness", "keeps whole copies of the policy's weights to sample with, and under sharding='fsdp' "
                                 "each process holds only its shard; use sharding='none' (one process or DDP)")
    if config.lora_critic and config.lora_r == 0:
        bad("lora_critic", "needs lora_r > 0 (the critic's adapters use the policy's rank and alpha)")
    _validate_distillation(config, bad)
    refuse_inert(config)  # a setting this configuration never reads, where that is a plain mistake

def _validate_policy_loss(config, bad) -> None:
    """The policy-loss fields, and the combinations a loss has no use for."""
    from ppo.algorithm.policy_losses import POLICY_LOSSES, SEQUENCE_LEVEL_LOSSES

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
    if not config.kimi_tau > 0:
        bad("kimi_tau", "must be > 0 (tau, the weight of Kimi k1.5's KL to the sampling policy)")
    if config.policy_loss == "kimi":
        # Kimi k1.5 (sec. 2.3.2) derives its loss with r_bar, the group's mean reward, for tau log Z,
        # and averages the k responses' squared losses: any other baseline or weighting is not its loss.
        if config.advantage_estimator != "dr_grpo" or config.whiten_advantages:
            name = "advantage_estimator" if config.advantage_estimator != "dr_grpo" else "whiten_advantages"
            bad(name, "policy_loss='kimi' uses r - mean(group), the group-mean baseline of Kimi k1.5 (no std "
                "division, no whitening): set advantage_estimator='dr_grpo' and whiten_advantages=False")
        if config.loss_agg != "seq_mean_token_mean":
            bad("loss_agg", "policy_loss='kimi' has one squared loss per sequence, averaged over the sequences as "
                "Kimi k1.5 eq. 3 does: set loss_agg='seq_mean_token_mean' (any other weighs sequences by length)")
    if not 0.0 <= config.top_entropy_quantile <= 1.0:
        bad("top_entropy_quantile", "must be in [0, 1] (1 = every token)")
    if not 0.0 < config.cov_fraction <= 1.0:
        bad("cov_fraction", "must be in (0, 1]")
    if not config.clip_cov_low < config.clip_cov_high:
        bad("clip_cov_low", f"must be below clip_cov_high ({config.clip_cov_high})")
    for name in ("kl_cov_coef", "entropy_coef_step", "overlong_penalty_factor"):
        if getattr(config, name) < 0:
            bad(name, "must be >= 0")
    for name in ("sapo_tau_pos", "sapo_tau_neg"):
        if not getattr(config, name) > 0:
            bad(name, "must be > 0 (the sigmoid gate's temperature)")
    if config.positive_nll_coef < 0:
        bad("positive_nll_coef", "must be >= 0 (0 = off)")
    if config.entropy_target is not None and not config.entropy_target > 0:
        bad("entropy_target", "must be > 0 or None")
    if not 0 <= config.overlong_buffer_length < config.response_length:
        bad("overlong_buffer_length", f"must be in [0, response_length) = [0, {config.response_length})")


def _validate_distillation(config, bad) -> None:
    """On-policy distillation (ppo/algorithm/distillation.py): a teacher to distil from, and no
    critic trained for nothing. The teacher's directory and vocabulary are checked when it is
    loaded (ppo/models/teacher.py)."""
    if config.distill_coef < 0:
        bad("distill_coef", "must be >= 0 (0 = off)")
    if config.teacher_model_path is not None and not config.teacher_model_path.strip():
        bad("teacher_model_path", "must be a model directory, 'testbed', or None")
    for name in ("distill_only", "distill_coef"):
        if getattr(config, name) and not config.teacher_model_path:
            bad(name, "distils from a teacher: set teacher_model_path (a local Hugging Face model directory with the "
                "policy's tokenizer, or 'testbed' for the testbed's teacher, python -m ppo.models.teacher build)")
    if config.distill_only and config.uses_value_model:
        bad("distill_only", "makes the reverse KL to the teacher the whole policy objective, so the critic of "
            "advantage_estimator='gae' would train on returns nothing reads; use a critic-free estimator such as 'grpo'")


def _validate_trackers(config, bad) -> None:
    """report_to names known trackers (ppo/run/trackers.py); the labels a tracker files the run under are text."""

    if not isinstance(config.report_to, list) or not all(isinstance(name, str) for name in config.report_to):
        bad("report_to", f"must be a list of tracker names from {list(TRACKERS)}")
    if "none" in config.report_to:
        bad("report_to", "'none' means no tracker and cannot be listed with trackers; give [] or 'none' alone for "
            "metrics.jsonl only, or list the trackers")
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


def _validate_data_and_reward_fns(config, bad, choice) -> None:
    """`dataset`, `reward_fn` and the chat template: each read by the tasks that name them."""
    choice("chat_template", CHAT_TEMPLATE_MODES)
    if config.dataset is not None and config.task not in ("custom", "math"):
        bad("dataset", f"task={config.task!r} reads no dataset; set task='custom' (with reward_fn) or task='math' "
            "(answers checked by math-verify)")
    if config.task == "math" and not config.dataset:
        bad("dataset", "is required for task='math' (a file with a prompt and an answer column)")
    for name in ("dataset", "eval_dataset", "eval_split", "system_prompt"):
        if getattr(config, name) is not None and not getattr(config, name).strip():
            bad(name, "must be non-empty text or None")
    for name in ("dataset_split", "prompt_column", "answer_column"):
        if not getattr(config, name).strip():
            bad(name, "must be a non-empty name")
    functions = config.reward_fn
    if not isinstance(functions, list) or not all(isinstance(f, str) for f in functions):
        bad("reward_fn", "must be a list of 'module:function' import paths")
    for spec in functions:
        module, _, name = spec.rpartition(":")
        if not module.strip() or not name.strip():
            bad("reward_fn", f"{spec!r} is not 'module:function' or 'path/to/file.py:function'")
    if functions and config.task != "custom":
        bad("reward_fn", f"task={config.task!r} scores responses itself; reward functions by path are for task='custom'")
    weights = config.reward_fn_weights
    if weights is not None:
        if (not isinstance(weights, list) or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                                      and math.isfinite(w) for w in weights)):
            bad("reward_fn_weights", "must be a list of finite numbers, one per reward_fn, or None")
        if len(weights) != len(functions):
            bad("reward_fn_weights", f"has {len(weights)} weights for {len(functions)} reward_fn entries")
    if config.math_verify_timeout < 1:
        bad("math_verify_timeout", "must be a whole number of seconds >= 1 (math-verify times out by signal.alarm)")


# ------------------------------------------------------------------------------ inert settings
# A setting the configuration never reads is worse than an error: a sweep over it reports
# "no difference" and the reader concludes the detail does not matter. Each rule below names
# a field, when it has no effect, and what to do; `validate` refuses the REFUSED ones (a
# plain mistake), the trainer warns about the rest (typically a preset's choice carried into
# a configuration that switches its mechanism off), and docs/liveness.md tabulates both.
REFUSED_WHEN_INERT = ("value_init_path", "lam_critic", "lam_length_alpha", "lora_critic", "critic_warmup_steps",
                      "ref_update_every", "ref_update_alpha")
# Estimators that discount returns with gamma (GAE and the REINFORCE++ / ReMax returns-to-go).
_GAMMA_ESTIMATORS = ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax")


def inert_settings(config) -> list[tuple[str, str]]:
    """``(field, message)`` for every field set away from its default where `config` never
    reads it; each message names the field, its value, the setting that makes it inert, and
    what to do. Pure: the same config always gives the same list, in field order."""
    defaults = _defaults(type(config))
    found: dict[str, str] = {}

    def inert(name: str, because: str, fix: str) -> None:
        value = getattr(config, name)
        if value != defaults[name] and name not in found:
            found[name] = (f"PPOConfig.{name}: {value!r} has no effect because {because}; {fix} "
                           f"(default {defaults[name]!r})")

    from ppo.algorithm.rollout_correction import CAP_ONLY_CORRECTIONS, THRESHOLD_CORRECTIONS, TRUNCATED_CORRECTIONS

    est = config.advantage_estimator
    if not config.uses_value_model:
        no_critic = f"advantage_estimator={est!r} trains no critic"
        for name in ("value_init", "value_init_path", "lam_critic", "lam_length_alpha", "lora_critic",
                     "critic_warmup_steps", "value_loss_over_padding", "cliprange_value", "vf_coef", "value_lr",
                     "separate_value_optimizer", "paired_critic_pass", "lam"):
            inert(name, no_critic, "remove it, or use advantage_estimator='gae'")
    elif config.value_init != "pretrained":
        inert("value_init_path", f"value_init={config.value_init!r} does not read it",
              "set value_init='pretrained' to start the critic from it")
    if est not in _GAMMA_ESTIMATORS:
        inert("gamma", f"advantage_estimator={est!r} does not discount", f"use one of {list(_GAMMA_ESTIMATORS)}")
    if config.uses_value_model and config.critic_warmup_steps >= config.total_steps:
        found["critic_warmup_steps"] = (
            f"PPOConfig.critic_warmup_steps: {config.critic_warmup_steps} has no effect beyond total_steps "
            f"({config.total_steps}): the policy would never train; use fewer warm-up steps than total_steps")
    scaled = est in ("grpo", "grpo_passk")  # the estimators that read grpo_scale
    if not (scaled or (est == "dr_grpo" and config.grpo_scale == "none")):
        inert("grpo_scale", f"advantage_estimator={est!r} does not read it", "use advantage_estimator='grpo'")
    if not (est == "gdpo" or (scaled and config.grpo_scale != "none")):
        why = ("grpo_scale='none' divides by no std" if scaled
               else f"advantage_estimator={est!r} divides by no std")
        inert("grpo_eps", why, "use advantage_estimator='grpo' with grpo_scale 'group' or 'batch'")
    if not (est == "gdpo" or (scaled and config.grpo_scale == "group")):
        inert("grpo_std_correction", "only a group std (advantage_estimator 'grpo' or 'grpo_passk' with "
              "grpo_scale='group', or 'gdpo') reads it", "set those, or remove it")
    if est != "reinforce":
        inert("reinforce_baseline", f"advantage_estimator={est!r} is not 'reinforce'",
              "use advantage_estimator='reinforce'")
    if est != "rft":
        inert("rft_min_score", f"advantage_estimator={est!r} is not 'rft'", "use advantage_estimator='rft'")
    if not config.whiten_advantages:
        for name in ("whiten_advantages_over_padding", "whiten_advantages_per_minibatch"):
            inert(name, "whiten_advantages=False", "set whiten_advantages=True")
    if not config.whiten_rewards:
        inert("reward_whitening_mode", "whiten_rewards=False", "set whiten_rewards=True")
    if not config.whiten_rewards and not config.whiten_advantages:
        inert("whitening_scope", "whiten_rewards=False and whiten_advantages=False (nothing is whitened)",
              "set whiten_rewards or whiten_advantages")

    # KL to the reference.
    if not config.uses_reference_model:
        no_reference = "kl_coef=0 (and adaptive_kl=False) skips the reference model"
        for name in ("kl_estimator", "kl_clip_at_zero", "kl_loss_importance_weight", "kl_placement", "log_full_kl",
                     "ref_update_every", "ref_update_alpha"):
            inert(name, no_reference, "set kl_coef > 0")
    if config.kl_placement != "loss":
        inert("kl_loss_importance_weight", "kl_placement='reward' has no KL term in the loss", "set kl_placement='loss'")
    else:
        inert("kl_clip_at_zero", "kl_placement='loss' puts the unclamped estimator in the loss (only the logged kl "
              "would change)", "set kl_placement='reward'")
    if config.ref_update_every == 0:
        inert("ref_update_alpha", "ref_update_every=0 never refreshes the reference", "set ref_update_every > 0")
    elif config.lora_r > 0 and config.uses_reference_model:
        found["ref_update_every"] = (
            f"PPOConfig.ref_update_every: {config.ref_update_every!r} cannot act with lora_r={config.lora_r}: the "
            "reference is the base model under the adapter, which no refresh can move; set ref_update_every=0 or "
            "lora_r=0")
    if not config.adaptive_kl:
        for name in ("kl_controller", "kl_k_beta", "kl_target", "kl_horizon"):
            inert(name, "adaptive_kl=False keeps kl_coef fixed", "set adaptive_kl=True")
    elif config.kl_controller == "ziegler":
        inert("kl_k_beta", "the 'ziegler' controller steps by kl_horizon", "set kl_controller='alpacafarm'")
    else:
        inert("kl_horizon", "the 'alpacafarm' controller steps by kl_k_beta", "set kl_controller='ziegler'")

    # On-policy distillation.
    if not (config.distill_only or config.distill_coef > 0):
        inert("teacher_model_path", "distill_coef=0 and distill_only=False never read the teacher",
              "set distill_coef > 0 or distill_only=True")
    if config.distill_only:
        inert("distill_coef", "distill_only=True makes the teacher's KL the whole objective, weight 1", "remove it")
        for name in ("kl_coef", "entropy_coef", "entropy_target", "positive_nll_coef", "length_reward_coef",
                     "format_reward_coef"):
            if name == "kl_coef" and config.kl_coef == 0:  # no reference at all: nothing to warn about
                continue
            inert(name, "distill_only=True trains on the reverse KL to the teacher alone (rewards are only logged)",
                  "set distill_only=False, or add the teacher's KL with distill_coef")

    # Rewards, sampling and filtering.
    if config.missing_eos != "penalty":
        inert("missing_eos_penalty", f"missing_eos={config.missing_eos!r}", "set missing_eos='penalty'")
    if config.missing_eos != "replace":
        inert("missing_eos_value", f"missing_eos={config.missing_eos!r}", "set missing_eos='replace'")
    if config.length_reward_coef == 0:
        inert("length_reward_warmup_steps", "length_reward_coef=0", "set length_reward_coef > 0")
    if config.overlong_buffer_length == 0:
        inert("overlong_penalty_factor", "overlong_buffer_length=0", "set overlong_buffer_length > 0")
    if config.temperature == 1.0:
        inert("scale_logits_by_temperature", "dividing logits by temperature 1.0 changes nothing",
              "set a temperature other than 1")
    if not config.difficulty_filter:
        for name in ("difficulty_filter_mode", "dynamic_sampling_max_rounds", "filter_min_pass_rate",
                     "filter_max_pass_rate"):
            inert(name, "difficulty_filter=False", "set difficulty_filter=True")
    elif config.difficulty_filter_mode != "resample":
        inert("dynamic_sampling_max_rounds", f"difficulty_filter_mode={config.difficulty_filter_mode!r} samples "
              "one round", "set difficulty_filter_mode='resample'")
    correction = config.rollout_correction
    correction_fields = ("rollout_correction_cap", "rollout_correction_floor", "rollout_correction_kl_threshold",
                         "rollout_correction_batch_normalize")
    if correction != "none" and config.logprobs_from_generation:
        # The old log-probs are then the sampler's own: every trainer / sampler ratio is exactly 1.
        for name in ("rollout_correction", *correction_fields):
            inert(name, "logprobs_from_generation=True takes the old log-probs from the sampler, so every trainer / "
                  "sampler ratio is 1", "set logprobs_from_generation=False (the old log-probs recomputed: the "
                  "proximal policy)")
    if correction == "none":
        for name in correction_fields:
            inert(name, "rollout_correction='none'", "choose a rollout_correction")
    else:
        inert("log_rollout_mismatch", f"rollout_correction={correction!r} logs the mismatch anyway", "remove it")
        if correction in CAP_ONLY_CORRECTIONS:
            inert("rollout_correction_floor", f"rollout_correction={correction!r} only caps",
                  "use a '_mis' or '_icepop' correction")
        if correction in THRESHOLD_CORRECTIONS:
            for name in ("rollout_correction_cap", "rollout_correction_floor"):
                inert(name, f"rollout_correction={correction!r} thresholds a k2 / k3 statistic "
                      "(rollout_correction_kl_threshold)", "use a ratio correction or a k1 statistic")
        else:
            inert("rollout_correction_kl_threshold", f"rollout_correction={correction!r} reads no k2 / k3 statistic",
                  "use one of " + ", ".join(repr(mode) for mode in THRESHOLD_CORRECTIONS))
        if correction not in TRUNCATED_CORRECTIONS:
            inert("rollout_correction_batch_normalize", f"rollout_correction={correction!r} has no truncated "
                  "importance weights to normalise", "use 'token_tis', 'sequence_tis' or 'geo_tis'")
    if config.generation_backend != "vllm":
        for name in ("vllm_kv_cache_gb", "vllm_gpu_memory_utilization", "vllm_sleep"):
            inert(name, f"generation_backend={config.generation_backend!r}", "set generation_backend='vllm'")
    if config.task != "gsm8k":
        for name in ("task_path", "eval_path", "gsm8k_answer_mode"):
            inert(name, f"task={config.task!r} reads no gsm8k file", "set task='gsm8k'")
    if config.dataset is None:
        for name in ("dataset_split", "eval_dataset", "eval_split", "prompt_column"):
            inert(name, "dataset is None (no dataset to read)", "set dataset")
    if config.task != "math":
        for name in ("answer_column", "math_verify_timeout"):
            inert(name, f"task={config.task!r} checks no math answers", "set task='math'")
    if not config.reward_fn:
        inert("reward_fn_weights", "reward_fn is empty", "name the reward functions in reward_fn")
    if config.chat_template == "off" and config.reward_model_path is None:
        inert("system_prompt", "chat_template='off' renders no conversation", "set chat_template 'auto' or 'on'")
    if config.model_path is not None:
        inert("warm_start_steps", "model_path is set (the SFT warm start is not used)", "set model_path=None")

    # The update's losses and optimisation.
    # One optimizer step per rollout batch on the log-probs that sampled it: every ratio is
    # exactly 1 and the critic has not moved, so no clip can bind and no minibatch is left to stop.
    if config.ppo_epochs == 1 and config.num_minibatches == 1 and not config.logprobs_from_generation:
        one_step = "ppo_epochs=1 and num_minibatches=1 take one step on-policy (every ratio is exactly 1)"
        for name in ("cliprange", "cliprange_high", "dual_clip", "cliprange_value", "target_kl"):
            inert(name, one_step, "raise ppo_epochs or num_minibatches")
        if config.policy_loss == "kimi":  # Kimi's log-ratios are 0 too: its gradient is REINFORCE's whatever tau is
            inert("kimi_tau", one_step, "raise ppo_epochs or num_minibatches")
    if config.num_minibatches == 1:
        inert("whiten_advantages_per_minibatch", "num_minibatches=1 makes the minibatch the whole batch",
              "raise num_minibatches")
    if config.policy_loss not in ("clip_cov", "kl_cov"):
        inert("cov_fraction", f"policy_loss={config.policy_loss!r}", "use policy_loss 'clip_cov' or 'kl_cov'")
    if config.policy_loss != "clip_cov":
        for name in ("clip_cov_low", "clip_cov_high"):
            inert(name, f"policy_loss={config.policy_loss!r}", "use policy_loss='clip_cov'")
    if config.policy_loss != "kl_cov":
        inert("kl_cov_coef", f"policy_loss={config.policy_loss!r}", "use policy_loss='kl_cov'")
    if config.policy_loss != "sapo":
        for name in ("sapo_tau_pos", "sapo_tau_neg"):
            inert(name, f"policy_loss={config.policy_loss!r} has no sigmoid gate", "use policy_loss='sapo'")
    if config.policy_loss in ("sapo", "gpg"):  # a soft gate, or no ratio at all: nothing is clipped
        for name in ("cliprange", "cliprange_high"):
            inert(name, f"policy_loss={config.policy_loss!r} clips no ratio", "use a clipped policy_loss")
    if config.policy_loss != "kimi":
        inert("kimi_tau", f"policy_loss={config.policy_loss!r}", "use policy_loss='kimi'")
    else:
        for name in ("cliprange", "cliprange_high"):
            inert(name, "policy_loss='kimi' clips no ratio (its squared loss replaces the clip)", "remove it")
    if config.entropy_target is None:
        inert("entropy_coef_step", "entropy_target=None keeps entropy_coef fixed", "set entropy_target")
    if config.warmup_steps >= config.total_steps:
        inert("lr_schedule", f"warmup_steps ({config.warmup_steps}) >= total_steps ({config.total_steps}) leaves "
              "no step after the warm-up", "shorten warmup_steps")
    if config.warmup_steps > config.total_steps:
        found.setdefault("warmup_steps", (
            f"PPOConfig.warmup_steps: {config.warmup_steps} is longer than total_steps ({config.total_steps}): the "
            "learning rate never reaches lr and the schedule's decay never starts; use warmup_steps <= total_steps"))
    if config.lam_critic is not None and config.lam_critic == config.lam and config.lam_length_alpha is None:
        found.setdefault("lam_critic", f"PPOConfig.lam_critic: {config.lam_critic!r} has no effect because it equals "
                         f"lam: the critic and the policy share one lambda, as with None; set a different value, or None")
    if config.lora_r == 0:
        for name in ("lora_alpha", "lora_target_modules"):
            inert(name, "lora_r=0 trains the full model", "set lora_r > 0")
    if not config.lean_forward:
        for name in ("share_prompt_prefix", "padding_free", "paired_critic_pass"):
            inert(name, "lean_forward=False runs the Hugging Face module calls", "set lean_forward=True")
    if config.logprobs_from_generation:
        inert("reuse_update_forward", "logprobs_from_generation=True takes the old log-probs from sampling",
              "set logprobs_from_generation=False")
    order = {name: index for index, name in enumerate(defaults)}
    return sorted(found.items(), key=lambda item: order[item[0]])


def _defaults(cls) -> dict:
    """Field name -> its default value, in declaration order."""
    import dataclasses

    values = {}
    for f in fields(cls):
        values[f.name] = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    return values


def refuse_inert(config) -> None:
    """Raise ValueError for the first inert setting that is a plain mistake (`REFUSED_WHEN_INERT`)."""
    for name, message in inert_settings(config):
        if name in REFUSED_WHEN_INERT or (name == "value_init" and config.value_init == "pretrained"):
            raise ValueError(message)


class InertSettingWarning(UserWarning):
    """A setting the run accepts although its configuration never reads it."""


def run_warnings(config, world_size: int) -> list[str]:
    """`config_warnings` plus what only the launch decides: sharding or per-process whitening in a
    single process."""
    messages = config_warnings(config)
    if config.sharding == "fsdp" and world_size == 1:
        messages.append("PPOConfig.sharding: 'fsdp' has no effect in one process (there is nothing to split the "
                        "models across); launch several processes (accelerate launch --num_processes N), or leave "
                        "sharding='none'")
    if config.whitening_scope == "process" and world_size == 1 and (config.whiten_rewards or config.whiten_advantages):
        messages.append("PPOConfig.whitening_scope: 'process' has no effect in one process (its share of the rollout "
                        "batch is the whole batch, so its statistics are the global ones); launch several processes, "
                        "or leave whitening_scope='global'")
    return messages


def config_warnings(config) -> list[str]:
    """The inert settings `validate` lets through: the run warns about each and records it."""
    refused = {name for name, _ in inert_settings(config)
               if name in REFUSED_WHEN_INERT or (name == "value_init" and config.value_init == "pretrained")}
    return [message for name, message in inert_settings(config) if name not in refused]

"""Liveness: every `PPOConfig` field, in every preset, acts, or the run says why it cannot.

A toggle that is accepted and then ignored is the worst bug an ablation codebase can have:
the sweep runs, the report says "not detected", and the reader concludes the detail does not
matter. This module gives each field of `PPOConfig` (the config is flat: no nested groups)
one verdict per preset, as the preset runs on the testbed:

- **live**: a valid non-default value (`PROBES`) changes what the run computes. The
  evidence is either the one-step probe (`observe`: two RL steps on a tiny model, the
  default and the probe compared on their metrics and their trained weights; the slow test
  in tests/test_liveness.py runs it for every such cell) or, where that probe cannot show
  it (a resource it lacks: a reward model, a gsm8k file, several processes; an outcome a
  random tiny model never produces: a correct answer, a well-formed one), the named test
  in `EVIDENCE` that shows the effect on a hand-made input. Exact speed and memory paths
  are live in what they change (time, memory) and tested equal in results.
- **refused**: the config cannot be built (or the run cannot start) with that value, and
  the error names the field and the setting that makes it inert
  (`ppo.settings.config_checks.inert_settings` and `PPOConfig.validate`).
- **warned**: the run starts, warns with a message naming the field and what makes it
  inert, and records the message in summary.json and the model card.
- **not applicable**: fields with no effect on what is trained by nature: output paths,
  logging, trackers, evaluation and checkpoint schedules (`NO_EFFECT_BY_NATURE`).

`verdicts()` computes the table from configs alone (pure and fast); ``python -m
ppo.settings.liveness`` writes it to docs/liveness.md, and ``python -m ppo.settings.liveness --check`` runs
the one-step probe of every live cell. A field added to `PPOConfig` without a probe or a
declaration fails tests/test_liveness.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from ppo.config import PRESETS, PPOConfig, preset
from ppo.settings.config_checks import inert_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "liveness.md"

# What cannot change what a run trains, whatever its value.
NO_EFFECT_BY_NATURE: dict[str, str] = {
    "output_dir": "where the run's files go",
    "progress": "a progress bar",
    "report_to": "where step metrics go besides metrics.jsonl",
    "tracker_project": "a label in a tracker",
    "run_name": "a label in a tracker",
    "run_group": "a label in a tracker",
    "run_tags": "labels in a tracker",
    "eval_every": "when the held-out evaluation runs (on its own generator: training is unchanged)",
    "eval_size": "how many held-out problems are evaluated",
    "eval_samples_per_prompt": "how many draws per held-out problem the evaluation takes (its precision, not the training)",
    "eval_batch_size": "how many held-out responses are generated at once (which draws, not the training)",
    "eval_thinking_budget": "how the held-out evaluation caps the thinking before the answer marker (what is measured, "
                            "not the training)",
    "log_samples": "how many decoded rollouts samples.jsonl gets",
    "metric_denominator": "the denominator of the logged clip fractions and approx_kl (target_kl reads the token mean "
                          "whatever it is)",
    "save_every": "when checkpoints are written",
    "keep_checkpoints": "how many checkpoints stay on disk",
    "device": "where the run computes",
    "threads": "torch's thread count on CPU (the rounding of reductions, not the algorithm)",
}

# Exact paths: they change time or memory, and tests hold the results equal on and off.
SPEED_OR_MEMORY: dict[str, str] = {
    "lean_forward": "tests/test_lean_forward.py",
    "compile_forward": "tests/test_lean_forward.py",
    "share_prompt_prefix": "tests/test_lean_forward.py",
    "padding_free": "tests/test_lean_forward.py",
    "paired_critic_pass": "tests/test_lean_forward.py",
    "reuse_update_forward": "tests/test_lean_forward.py",
    "retain_freed_memory": "tests/test_allocator.py",
    "gradient_checkpointing": "tests/test_checkpoint_quirks.py",
    "gradient_accumulation_steps": "tests/test_presets_sources.py",
    "attn_implementation": "tests/test_checkpoint_quirks.py",
    "offload_frozen_models": "tests/test_sharding.py",
    "vllm_kv_cache_gb": "tests/vllm (the vLLM suite)",
    "vllm_gpu_memory_utilization": "tests/vllm (the vLLM suite)",
    "vllm_sleep": "tests/vllm (the vLLM suite)",
}

# Live fields the one-step probe on a random tiny model cannot show, each with the test
# that shows its effect.
EVIDENCE: dict[str, str] = {
    "model_path": "tests/test_trainer.py (every run there loads its policy from model_path)",
    "warm_start_steps": "tests/test_sft.py::test_stop_after_is_the_full_runs_intermediate_checkpoint",
    "task": "tests/test_gsm8k_scoring.py, tests/test_rlhf.py::test_preference_task_scores_with_the_gold_reward",
    "reward_model_path": "tests/test_rlhf.py::test_scores_are_read_where_the_trainer_reads_them",
    "total_steps": "tests/test_trainer.py::test_run_directory_contents (the number of steps run)",
    "prompt_truncation": "tests/test_checkpoint_quirks.py::test_prompt_longer_than_the_limit_is_cut_or_refused",
    "split_special_tokens": "tests/test_run_directory.py::"
                            "test_special_tokens_spelled_in_a_prompt_follow_split_special_tokens",
    "generation_backend": "tests/test_vllm_backend.py (the vLLM engine samples)",
    "chat_template": "tests/test_chat_template.py::test_chat_template_applied_in_a_run_and_visible_in_samples (a "
                     "tokenizer with a chat template; the testbed's has none)",
    "system_prompt": "tests/test_chat_template.py::test_chat_template_applied_in_a_run_and_visible_in_samples (a "
                     "tokenizer with a chat template; the testbed's has none, and refuses it at start)",
    "retire_mastered": "tests/test_filtering.py::test_retired_prompts_are_never_drawn_again",
    "nonfinite_rewards": "tests/test_reliability.py::test_drop_mode_trains_on_and_counts_dropped_samples",
    "format_reward_coef": "tests/test_toggles.py::test_format_reward_adds_the_bonus_to_well_formed_responses",
    "positive_nll_coef": "tests/test_field_2026.py::test_positive_nll_hand_computed_and_nemo_rl (the probe's random "
                         "model answers nothing correctly, so no token is positive)",
    "reward_clip": "tests/test_rewards.py::test_clip_scores_clamps_both_sides",
    "disable_dropout": "tests/test_checkpoint_quirks.py::test_set_training_sets_what_module_train_sets (a model "
                       "with dropout; the testbed's has none)",
    "mixed_precision": "tests/test_precision.py::test_bf16_reference_runs_under_the_policys_autocast",
    "sharding": "tests/test_sharding.py (two processes; in one process the run warns)",
    "whitening_scope": "tests/test_data_parallel.py::test_whitening_scope_process_whitens_each_ranks_rows_alone "
                       "(two processes; in one process the run warns)",
    "rollout_correction": "tests/test_rollout_correction.py::test_weights_and_masks_by_hand (a sampler-trainer "
                          "mismatch; fp32 sampling has almost none)",
    "off_policy_mask_threshold": "tests/test_rollout_correction.py::test_off_policy_sequence_mask_acts_in_the_update "
                                 "(a policy that has drifted from the sampler: a second epoch)",
    "log_rollout_mismatch": "tests/test_rollout_correction.py::test_without_the_toggles_nothing_is_logged_or_kept",
    "sampling_precision": "tests/test_rollout_correction.py::test_bf16_sampling_shows_a_mismatch_and_fp32_none",
    "separate_value_optimizer": "tests/test_precision.py::test_fp16_with_separate_value_optimizer_matches_fp32 (one "
                                "joint gradient clip or two; AdamW is per parameter, so with max_grad_norm=None only "
                                "the non-finite-gradient guard tells them apart)",
    "pad_to_response_length": "tests/test_presets_sources.py::test_padding_width_changes_alpacafarm_whitening (a "
                              "batch whose responses all stop short of response_length)",
    "difficulty_filter": "tests/test_toggles.py::test_difficulty_filter_masks_groups (groups outside the band)",
    "score_position": "tests/test_presets_sources.py::test_trl_ppo_score_after_the_stop_token_equals_trl (a "
                      "response that stops short of the width)",
    "teacher_model_path": "tests/test_teacher_distillation.py::test_distill_kl_decreases_in_a_short_distillation_run "
                          "(a teacher directory; the probe has none)",
    "distill_coef": "tests/test_teacher_distillation.py::"
                    "test_distill_only_training_loss_equals_the_dense_reverse_kl_by_hand (a teacher directory; the "
                    "probe has none)",
    "distill_only": "tests/test_teacher_distillation.py::"
                    "test_distill_only_training_loss_equals_the_dense_reverse_kl_by_hand (a teacher directory; the "
                    "probe has none)",
}


def _flip(config: PPOConfig, name: str) -> bool:
    return not getattr(config, name)


def _other(*choices):
    """The first of `choices` that differs from the config's value."""
    return lambda config, name: next(c for c in choices if c != getattr(config, name))


def _scaled(factor: float, cast=float):
    return lambda config, name: cast(getattr(config, name) * factor)


# The valid non-default value each field is tried with, given the preset's config: a value,
# or a function (config, name) -> value. A field's companions, where the value needs them
# to be valid, go in `COMPANIONS`.
PROBES: dict[str, Any] = {
    "model_path": "checkpoints/any-causal-lm",
    "warm_start_steps": 200,
    "task": "gsm8k",
    "task_path": "data/gsm8k_train.jsonl",
    "eval_path": "data/gsm8k_test.jsonl",
    "gsm8k_answer_mode": "strict",
    "seed": 1,
    "total_steps": lambda config, name: config.total_steps + 1,
    "dataset": "data/prompts.jsonl",
    "dataset_split": "test",
    "eval_dataset": "data/held_out.jsonl",
    "eval_split": "test",
    "prompt_column": "question",
    "answer_column": "solution",
    "reward_fn": ["my_rewards:brevity"],
    "reward_fn_weights": [0.5],
    "chat_template": "off",
    "system_prompt": "Answer briefly.",
    "math_verify_timeout": 2,
    "reward_model_path": "reward_models/any",
    "value_init": "random",
    "value_init_path": "critics/pretrained",
    "critic_warmup_steps": 1,
    "value_loss_over_padding": _flip,
    "rollout_batch_size": _scaled(2, int),
    "group_size": lambda config, name: 2 if config.group_size == 1 else config.group_size // 2,
    "response_length": lambda config, name: config.response_length // 2,
    "temperature": _other(0.7, 1.0),
    "top_k": 5,
    "top_p": _other(0.9, 1.0),
    "scale_logits_by_temperature": _flip,
    "stop_token_ids": lambda config, name: [] if config.stop_token_ids is None else None,
    "max_prompt_length": 4,
    "prompt_truncation": "right",
    "split_special_tokens": _flip,
    "pad_to_response_length": _flip,
    "logprobs_from_generation": _flip,
    "rollout_staleness": 1,
    "generation_backend": "vllm",
    "vllm_kv_cache_gb": 2.0,
    "vllm_gpu_memory_utilization": 0.5,
    "vllm_sleep": True,
    "difficulty_filter": True,
    "difficulty_filter_mode": "renormalize",
    "dynamic_sampling_max_rounds": 2,
    "filter_min_pass_rate": 0.1,
    "filter_max_pass_rate": 0.9,
    "retire_mastered": True,
    "nonfinite_rewards": "drop",
    "missing_eos": _other("penalty", "replace"),
    "missing_eos_penalty": 2.0,
    "missing_eos_value": -2.0,
    "length_reward_coef": 0.5,
    "length_reward_warmup_steps": 1,
    "format_reward_coef": 0.5,
    "reward_clip": 0.5,
    "score_position": _other("after_last_token", "last_token"),
    "whiten_rewards": _flip,
    "reward_whitening_mode": _other("stats", "masked"),
    "kl_coef": lambda config, name: 0.1 if config.kl_coef == 0 else config.kl_coef * 2,
    "kl_estimator": _other("k2", "k1"),
    "kl_clip_at_zero": _flip,
    "kl_loss_importance_weight": _flip,
    "log_full_kl": _flip,
    "kl_placement": _other("loss", "reward"),
    "adaptive_kl": _flip,
    "kl_controller": _other("alpacafarm", "ziegler"),
    "kl_k_beta": 0.2,
    "kl_target": 1.0,
    "kl_horizon": 500,
    "ref_update_every": 1,
    "ref_update_alpha": 0.5,
    "rollout_correction": "token_tis",
    "rollout_correction_cap": 3.0,
    "rollout_correction_floor": 0.25,
    "rollout_correction_kl_threshold": 0.1,
    "rollout_correction_batch_normalize": _flip,
    "off_policy_mask_threshold": 0.05,
    "sampling_precision": "bf16",
    "log_rollout_mismatch": _flip,
    "teacher_model_path": "teachers/any",
    "distill_coef": 0.5,
    "distill_only": True,
    "advantage_estimator": lambda config, name: "reinforce" if config.group_size == 1 else _other("rloo", "grpo")(
        config, name),
    "gamma": 0.9,
    "lam": _other(0.9, 0.95),
    "lam_critic": lambda config, name: 0.9 if config.lam == 1.0 else 1.0,
    "lam_length_alpha": 0.05,
    "whiten_advantages": _flip,
    "whiten_advantages_over_padding": _flip,
    "whiten_advantages_per_minibatch": _flip,
    "whitening_scope": "process",
    "grpo_scale": _other("batch", "group"),
    "grpo_std_correction": 1,
    "grpo_eps": 1e-3,
    "reinforce_baseline": True,
    "rft_min_score": 0.5,
    "ppo_epochs": lambda config, name: config.ppo_epochs + 1,
    "num_minibatches": lambda config, name: 2 if config.num_minibatches == 1 else config.num_minibatches // 2,
    "gradient_accumulation_steps": 2,
    "cliprange": 0.05,
    "cliprange_high": 0.05,
    "dual_clip": 1.05,
    "cliprange_value": 0.01,
    "vf_coef": 0.5,
    "entropy_coef": 0.01,
    "loss_agg": _other("seq_mean_token_sum", "token_mean"),
    "target_kl": 1e-5,
    "mask_truncated_responses": _flip,
    "policy_loss": "cispo",
    "cov_fraction": 0.5,
    "clip_cov_low": 0.5,
    "clip_cov_high": 4.0,
    "kl_cov_coef": 0.5,
    "sapo_tau_pos": 2.0,
    "sapo_tau_neg": 2.0,
    "positive_nll_coef": 0.5,
    "kimi_tau": 0.5,
    "top_entropy_quantile": 0.5,
    "entropy_target": 10.0,
    "entropy_coef_step": 0.01,
    "overlong_buffer_length": lambda config, name: config.response_length // 2,
    "overlong_penalty_factor": 0.5,
    "lr": _scaled(2),
    "value_lr": 1e-3,
    "separate_value_optimizer": _flip,
    "adam_eps": 1e-6,
    "adam_beta1": 0.8,
    "adam_beta2": _other(0.99, 0.999),
    "weight_decay": 0.01,
    "warmup_steps": _other(1, 0),
    "lr_schedule": _other("constant", "linear"),
    "max_grad_norm": 0.01,
    "disable_dropout": _flip,
    "mixed_precision": "bf16",
    "model_dtype": "bfloat16",
    "attn_implementation": "eager",
    "gradient_checkpointing": True,
    "lora_r": 8,
    "lora_alpha": 32.0,
    "lora_target_modules": "q_proj,v_proj",
    "lora_critic": True,
    "sharding": "fsdp",
    "offload_frozen_models": True,
    "lean_forward": False,
    "compile_forward": True,
    "share_prompt_prefix": False,
    "padding_free": False,
    "paired_critic_pass": False,
    "reuse_update_forward": False,
    "retain_freed_memory": False,
}
# Settings a probe value needs to be valid at all (the field is still the one judged).
COMPANIONS: dict[str, dict] = {
    "task": {"task_path": "data/gsm8k_train.jsonl"},
    "teacher_model_path": {"distill_coef": 0.5},  # a teacher alone is never read
    "distill_coef": {"teacher_model_path": "teachers/any"},
    "distill_only": {"teacher_model_path": "teachers/any"},
}


@dataclass(frozen=True)
class Verdict:
    """One cell of the table: `kind` in live / refused / warned / n/a, and why."""

    kind: str
    reason: str
    probe_value: Any = None
    probed: bool = False  # live by the one-step probe (checked by `observe`), not by a named test


def probe_overrides(name: str, config: PPOConfig) -> dict:
    """The overrides that set `name` to its probe value over `config` (plus its companions)."""
    probe = PROBES[name]
    value = probe(config, name) if callable(probe) else probe
    if value == getattr(config, name):
        raise ValueError(f"liveness: the probe of {name} equals the preset's value {value!r}; give a probe that differs")
    return {**COMPANIONS.get(name, {}), name: value}


def _names(message: str, name: str) -> bool:
    """Whether an error message names the field `name` (as a word)."""
    import re

    return re.search(rf"\b{re.escape(name)}\b", message) is not None


def verdict(name: str, preset_name: str) -> Verdict:
    """The verdict of field `name` in `preset_name` as the testbed runs it."""
    if name in NO_EFFECT_BY_NATURE:
        return Verdict("n/a", NO_EFFECT_BY_NATURE[name])
    base = preset(preset_name, testbed=True)
    overrides = probe_overrides(name, base)
    value = overrides[name]
    try:
        config = base.replace(**overrides)
        config.validate_for_run()
    except ValueError as error:
        message = str(error)
        if not _names(message, name):
            raise ValueError(f"liveness: probing {name}={value!r} on {preset_name} was refused for another "
                             f"reason ({message}); choose a probe valid there") from None
        return Verdict("refused", message, value)
    inert = dict(inert_settings(config))
    if name in inert:
        return Verdict("warned", inert[name], value)
    if name in SPEED_OR_MEMORY:
        return Verdict("live", f"speed or memory, results held equal: {SPEED_OR_MEMORY[name]}", value)
    if name in EVIDENCE:
        return Verdict("live", EVIDENCE[name], value)
    return Verdict("live", "one-step probe", value, probed=True)


def undecided_fields(cls=PPOConfig) -> list[str]:
    """Fields of `cls` with neither a probe nor a declaration: each needs a verdict."""
    return [f.name for f in fields(cls) if f.name not in PROBES and f.name not in NO_EFFECT_BY_NATURE]


def verdicts() -> dict[str, dict[str, Verdict]]:
    """``{field: {preset: Verdict}}`` for every field and every preset, in field order."""
    missing = undecided_fields()
    if missing:
        raise ValueError(f"liveness: no verdict for {missing}: add a probe value to PROBES (ppo/settings/liveness.py), or "
                         "declare the field in NO_EFFECT_BY_NATURE with the reason")
    return {f.name: {name: verdict(f.name, name) for name in PRESETS} for f in fields(PPOConfig)}


# ------------------------------------------------------------------------------ the table
def _cell(v: Verdict) -> str:
    if v.kind == "n/a":
        return "n/a"
    text = f"**{v.kind}** `{v.probe_value!r}`"
    if v.kind in ("refused", "warned"):
        # The message without its "PPOConfig.field: value" opening, which the row already says.
        why = v.reason.split(": ", 1)[-1]
        if why.startswith(f"{v.probe_value!r} "):
            why = why[len(repr(v.probe_value)) + 1:]
        text += f": {why}"
    elif not v.probed:
        text += f": {v.reason}"
    return text.replace("|", "\\|")


def render(table: dict[str, dict[str, Verdict]] | None = None) -> str:
    """docs/liveness.md: one row per field, one column per preset."""
    table = table or verdicts()
    presets = list(PRESETS)
    counts = {kind: sum(v.kind == kind for row in table.values() for v in row.values())
              for kind in ("live", "refused", "warned", "n/a")}
    lines = [
        "# Liveness: every field in every preset",
        "",
        "<!-- Generated by `python -m ppo.settings.liveness`; tests/test_liveness.py checks it is current. -->",
        "",
        "Each `PPOConfig` field, set to a valid value other than the preset's (the value in the cell), "
        "in each preset as the testbed runs it (`preset(name, testbed=True)`). **live**: it changes what "
        "the run computes; with no note, the one-step probe shows it (two RL steps on a tiny model, "
        "metrics and trained weights compared with the preset's; `python -m ppo.settings.liveness --check`), "
        "otherwise the named test does. **refused**: the config or the run refuses it, with the message "
        "shown. **warned**: the run warns with the message shown and records it in `summary.json` and the "
        "model card. **n/a**: the field cannot change what is trained (output, logging, schedules of "
        "evaluation and checkpoints). The rules live in `ppo/settings/config_checks.py` (`inert_settings`), the "
        "probes and declarations in [`ppo/settings/liveness.py`](../ppo/settings/liveness.py).",
        "",
        f"In all: {counts['live']} live, {counts['refused']} refused, {counts['warned']} warned and "
        f"{counts['n/a']} not applicable cells, {len(table)} fields by {len(presets)} presets.",
        "",
        "| field | " + " | ".join(f"`{name}`" for name in presets) + " |",
        "|---|" + "---|" * len(presets),
    ]
    for name, row in table.items():
        lines.append(f"| `{name}` | " + " | ".join(_cell(row[p]) for p in presets) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ the one-step probe
# What the probe scales down, beyond the testbed preset: a fresh tiny model, a small batch,
# two steps, no files.
# The learning rate is high and there is no warm-up so that two steps move the policy far
# enough for clips and early stops to bind.
PROBE_SCALE = dict(rollout_batch_size=16, response_length=8, total_steps=2, warmup_steps=0, lr=1e-2, eval_size=4,
                   progress=False, report_to=[], threads=1, log_samples=0)


def tiny_model(folder: str | Path) -> str:
    """Save a freshly initialised tiny model and its tokenizer in `folder`; returns the path."""
    import torch

    from ppo.models.tiny_model import TinyModelConfig, build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def probe_config(preset_name: str, model_path: str, **overrides) -> PPOConfig:
    """The preset on the testbed, scaled down by `PROBE_SCALE`, with `overrides`."""
    values = {**PROBE_SCALE, "model_path": model_path}
    base = preset(preset_name, testbed=True, **values)
    return base.replace(**overrides)


# The probe's task: a few prompts and a reward that spreads over a random model's samples
# (the share of odd digits in the response), so every group has a gradient; the arithmetic
# task's 0/1 verdict gives a random model none, and a probe would then see no change at all.
PROBE_PROMPTS = ("1+2=", "3+4=", "12+7=", "9-5=", "20+22=", "8*3=", "45-9=", "6+6=")


def probe_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """The share of odd digits in each response: 0 to 1, different for most samples."""
    return [sum(c in "13579" for c in response) / max(1, len(response)) for response in responses]


def observe(config: PPOConfig, steps: int = 2) -> tuple[list[dict], list]:
    """Run `steps` RL steps of `config` on the probe's task (no files written): the metrics of
    each step, timings left out, and the trained weights of policy and critic."""
    from ppo.trainer import RLTrainer

    trainer = RLTrainer(config, prompts=list(PROBE_PROMPTS), reward_fn=probe_reward)
    rows = []
    for _ in range(steps):
        metrics = trainer.train_step()
        rows.append({k: v for k, v in metrics.items() if not k.startswith("time_")})
    weights = [p.detach().clone() for model in (trainer.policy, trainer.value_model) if model is not None
               for p in model.parameters()]
    return rows, weights


def differs(a: tuple[list[dict], list], b: tuple[list[dict], list], rtol: float = 0.0,
            weights_only: bool = False) -> bool:
    """Whether two `observe` results differ in any metric (present or value) or any weight;
    with `rtol` > 0, by more than that relative tolerance (rounding is not a change); with
    `weights_only`, in the trained weights alone (what the run computes, not what it logs)."""
    import torch

    rows_a, weights_a = a
    rows_b, weights_b = b

    def same(x, y) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rtol, abs_tol=rtol * 1e-3)
        return x == y

    metrics_differ = len(rows_a) != len(rows_b) or any(
        set(ra) != set(rb) or not all(same(ra[k], rb[k]) for k in ra) for ra, rb in zip(rows_a, rows_b))
    if metrics_differ and not weights_only:
        return True
    return len(weights_a) != len(weights_b) or any(
        not torch.allclose(x, y, rtol=rtol, atol=rtol * 1e-3) for x, y in zip(weights_a, weights_b))


def check_live(model_path: str, table: dict[str, dict[str, Verdict]] | None = None,
               only: Callable[[str, str], bool] | None = None) -> list[str]:
    """Run the one-step probe of every cell the probe can decide: a 'live' cell must change
    what the run computes, a 'warned' one must not (else its warning is false). Returns the
    cells that disagree, as ``"field in preset: ..."``; `only(field, preset)` picks cells."""
    import warnings

    from ppo.settings.config_checks import InertSettingWarning

    table = table or verdicts()
    failures = []
    for preset_name in PRESETS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InertSettingWarning)
            baseline = None
            for name, row in table.items():
                cell = row[preset_name]
                if not (cell.probed or cell.kind == "warned") or (only and not only(name, preset_name)):
                    continue
                base = probe_config(preset_name, model_path)
                overrides = probe_overrides(name, base)
                if cell.kind == "warned" and name not in dict(inert_settings(base.replace(**overrides))):
                    continue  # inert at the testbed's scale, not at the probe's (a schedule longer than 2 steps)
                baseline = baseline or observe(base)
                # A warned setting may change a logged statistic or the rounding (a sum in
                # another order), not the weights the run trains.
                changed = (differs(baseline, observe(base.replace(**overrides))) if cell.probed else
                           differs(baseline, observe(base.replace(**overrides)), rtol=1e-4, weights_only=True))
                if cell.probed and not changed:
                    failures.append(f"{name} in {preset_name}: live, but the probe changed nothing")
                elif cell.kind == "warned" and changed:
                    failures.append(f"{name} in {preset_name}: warned as inert, but the probe changed the run")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.settings.liveness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="run the one-step probe of every live cell (a few minutes on a CPU) instead of writing")
    parser.add_argument("--output", type=Path, default=DOC, help="where the table goes (default docs/liveness.md)")
    args = parser.parse_args(argv)
    table = verdicts()
    if args.check:
        with tempfile.TemporaryDirectory() as folder:
            failures = check_live(tiny_model(folder), table)
        for failure in failures:
            print(failure)
        print(f"{len(failures)} cell(s) where the probe disagrees with the table")
        return 1 if failures else 0
    args.output.write_text(render(table))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The registry of named ablations: a question, variants as config overrides, a metric.

Each ablation answers one question a researcher asks about an implementation detail
("does clipping the KL at zero matter?"). A variant is a preset plus `PPOConfig`
overrides, always scaled for the CPU testbed; the ablation names the metrics.jsonl key
that answers its question, so the report can plot it next to the learning curves.

Adding an ablation is adding one `register(...)` call; the runner and the report need no
change. ``python -m ablations list`` prints them all. An ablation of one's own needs no code
at all: an ablation file (YAML or TOML, `ablations.ablation_files`) names the same things and
``python -m ablations run my.yaml`` registers and runs it exactly as one of these.

The first variant is the base: the report pairs every other variant with it, seed by seed.
"""

from __future__ import annotations

from ppo.presets import PRESETS

# The types and the table live in ablations/definitions.py; re-exported here.
from .definitions import (ABLATIONS, GRPO, PPO, RESERVED_NAMES, Ablation, Variant, check_name,  # noqa: F401
                          get_ablation, register)


LEVELS = tuple(range(4))

# ---------------------------------------------------------------------- PPO vs the GRPO family
# The families compare at 128 responses per step, twice the testbed's 64. At 64 a GRPO step sees
# 8 prompts (groups of 8), and its seed-to-seed spread left 5 seeds able to detect only 0.0275
# between PPO and GRPO; at 128 they detect 0.019 (docs/testbed.md, "The instrument"; the
# registered pilot docs/results/batch_pilot/batch128.yaml, 14 seed pairs). Every arm, so the
# comparison stays at equal samples.
FAMILY_BATCH = {"rollout_batch_size": 128}


def _family(name: str, preset_name: str, overrides: dict | None = None) -> Variant:
    return Variant(name, preset_name, {**FAMILY_BATCH, **(overrides or {})})


register(
    "ppo_vs_grpo",
    "At equal samples, how do AlpacaFarm-style PPO (with a critic), GRPO, Dr. GRPO and RLOO compare?",
    [_family("ppo", PPO), _family("grpo", "grpo"), _family("dr_grpo", "dr_grpo"), _family("rloo", "rloo"),
     # AlpacaFarm's PPO takes 2 epochs x 2 minibatches = 4 optimizer steps per batch, the GRPO
     # family 1: this arm takes PPO to 1, so "learns faster" is not just "steps more".
     _family("ppo_1_step", PPO, {"ppo_epochs": 1, "num_minibatches": 1}),
     # The clean pairs of the claims (ablations/claims.py): each differs from its partner in the
     # advantage estimator alone. grpo_critic is the grpo preset with a learned critic and GAE
     # (its own optimizer, so the policy's update is otherwise GRPO's); dr_grpo_rloo is the
     # dr_grpo preset with RLOO's leave-one-out baseline (G/(G-1) times Dr. GRPO's advantage).
     _family("grpo_critic", "grpo", {"advantage_estimator": "gae"}),
     _family("dr_grpo_rloo", "dr_grpo", {"advantage_estimator": "rloo"})],
    metric="accuracy", extra_metrics=("kl_k1", "response_length", "entropy"),
)

# ---------------------------------------------------------------------- PPO tricks
register(
    "kl_clip_at_zero",
    "Does clamping the per-token KL at zero (AlpacaFarm) change the KL actually incurred?",
    # log_full_kl: the exact KL over the vocabulary, which the clamp cannot bias (the claims' test).
    [Variant("clip", PPO, {"kl_clip_at_zero": True, "log_full_kl": True}),
     Variant("no_clip", PPO, {"kl_clip_at_zero": False, "log_full_kl": True})],
    metric="kl", extra_metrics=("kl_k1", "kl_full", "accuracy"),
)
register(
    "gamma_lambda",
    "gamma = lambda = 1 (a bandit, AlpacaFarm) vs GAE with lambda 0.95 (TRL) vs discounting.",
    [Variant("g1_l1", PPO, {"gamma": 1.0, "lam": 1.0}), Variant("g1_l095", PPO, {"gamma": 1.0, "lam": 0.95}),
     Variant("g099_l095", PPO, {"gamma": 0.99, "lam": 0.95})],
    metric="accuracy", extra_metrics=("explained_variance", "value_error"),
)
register(
    "whitening",
    "Do reward whitening and advantage whitening help?",
    [Variant("both", PPO, {"whiten_rewards": True, "whiten_advantages": True}),
     Variant("rewards_only", PPO, {"whiten_rewards": True, "whiten_advantages": False}),
     Variant("advantages_only", PPO, {"whiten_rewards": False, "whiten_advantages": True}),
     Variant("neither", PPO, {"whiten_rewards": False, "whiten_advantages": False})],
    metric="accuracy", extra_metrics=("response_length_incorrect", "kl_k1", "advantage_abs_mean", "vf_loss"),
)
register(
    "reward_whitening_scope",
    "Reward whitening as AlpacaFarm does it (padding whitened and fed through GAE) vs its statistics only vs masked.",
    [Variant("alpacafarm", PPO, {"reward_whitening_mode": "alpacafarm"}),
     Variant("stats", PPO, {"reward_whitening_mode": "stats"}),
     Variant("masked", PPO, {"reward_whitening_mode": "masked"})],
    metric="accuracy", extra_metrics=("response_length", "response_length_incorrect", "kl_k1", "vf_loss"),
)
register(
    "value_clip",
    "Does clipping the value update around the old values help the critic?",
    [Variant("clip_0.2", PPO, {"cliprange_value": 0.2}), Variant("no_clip", PPO, {"cliprange_value": None})],
    metric="explained_variance", extra_metrics=("vf_clipfrac", "value_error", "accuracy"),
)
register(
    "kl_estimator",
    "k1, k2 or k3 as the per-token KL penalty in the reward?",
    [Variant(k, PPO, {"kl_estimator": k, "kl_clip_at_zero": False, "kl_coef": 0.05}) for k in ("k1", "k2", "k3")],
    metric="kl_k1", extra_metrics=("kl", "accuracy"),
)
register(
    "kl_placement",
    "KL as a per-token reward penalty (PPO) or as a loss term (GRPO)?",
    [Variant("reward", PPO, {"kl_placement": "reward", "kl_estimator": "k1", "kl_clip_at_zero": False, "kl_coef": 0.05}),
     Variant("loss", PPO, {"kl_placement": "loss", "kl_estimator": "k3", "kl_clip_at_zero": False, "kl_coef": 0.05}),
     # "reward" vs "loss" above changes the estimator too (k1 vs k3); these pairs keep it fixed.
     Variant("loss_k1", PPO, {"kl_placement": "loss", "kl_estimator": "k1", "kl_clip_at_zero": False, "kl_coef": 0.05}),
     Variant("reward_k3", PPO, {"kl_placement": "reward", "kl_estimator": "k3", "kl_clip_at_zero": False,
                                "kl_coef": 0.05})],
    metric="kl_k1", extra_metrics=("accuracy",),
)
register(
    "value_init",
    "Critic initialised from the SFT policy with a zeroed head, or from scratch? (Reward-model init needs a reward model.)",
    [Variant("policy", PPO, {"value_init": "policy"}), Variant("random", PPO, {"value_init": "random"})],
    metric="explained_variance", extra_metrics=("value_error", "accuracy"),
)
register(
    "value_optimizer",
    "A separate optimizer for the critic vs one optimizer (and one grad-norm clip) shared with the policy.",
    [Variant("separate", PPO, {"separate_value_optimizer": True}), Variant("shared", PPO, {"separate_value_optimizer": False})],
    metric="explained_variance", extra_metrics=("policy_grad_scale", "value_grad_norm", "kl_k1", "value_error", "accuracy"),
)
register(
    "temperature_logprobs",
    "Sampling at T = 0.7: must log-probs use logits / T? (Unscaled log-probs train on a different distribution.)",
    [Variant("scaled", PPO, {"temperature": 0.7, "scale_logits_by_temperature": True}),
     Variant("unscaled", PPO, {"temperature": 0.7, "scale_logits_by_temperature": False})],
    # kl_k1 is measured at the temperature each arm's loss uses (T = 0.7 vs 1); kl_k1_sampling
    # at the sampling temperature for both, the one KL the two arms can be compared on.
    metric="kl_k1_sampling", extra_metrics=("accuracy", "kl_k1", "entropy"),
)
register(
    "missing_eos",
    "Responses cut off without EOS: keep their score, subtract a penalty (TRL), or replace it (N+ details)?",
    [Variant(mode, PPO, {"missing_eos": mode, "response_length": 32}) for mode in ("none", "penalty", "replace")],
    metric="eos_rate", extra_metrics=("response_length", "accuracy"),
)
register(
    "ppo_epochs",
    "How many passes over each rollout batch?",
    [Variant(f"epochs_{n}", PPO, {"ppo_epochs": n}) for n in (1, 2, 4)],
    metric="accuracy", extra_metrics=("clipfrac", "approx_kl", "kl_k1"),
)

# ---------------------------------------------------------------------- GRPO-family tricks
register(
    "grpo_std_norm",
    "Dividing by the group std: where does the gradient weight go across difficulty levels?",
    [Variant("std", GRPO, {"grpo_scale": "group"}), Variant("no_std", GRPO, {"grpo_scale": "none"}),
     # Without the std the advantages of a 0/1 reward are about half as large (a group std is
     # at most 0.5), so the KL term weighs about twice as much; this arm halves beta to match.
     Variant("no_std_half_kl", GRPO, {"grpo_scale": "none", "kl_coef": 0.02})],
    metric="accuracy",
    extra_metrics=tuple(f"adv_share_level{k}" for k in LEVELS) + tuple(f"adv_abs_level{k}" for k in LEVELS),
)
register(
    "length_norm",
    "GRPO's per-sequence length normalisation vs Dr. GRPO's constant normaliser: do wrong answers grow longer?",
    [Variant("per_sequence", GRPO, {"loss_agg": "seq_mean_token_mean"}),
     Variant("constant", GRPO, {"loss_agg": "seq_mean_token_sum_norm"})],
    metric="response_length_incorrect",
    extra_metrics=("response_length_correct", "accuracy", "loss_weight_incorrect_long", "loss_weight_incorrect_short"),
)
register(
    "kimi_length_reward",
    "Kimi k1.5's in-group length reward: shorter correct answers without hurting accuracy?",
    [Variant("off", GRPO, {"length_reward_coef": 0.0}), Variant("on", GRPO, {"length_reward_coef": 0.5})],
    metric="response_length_correct", extra_metrics=("response_length_incorrect", "accuracy"),
)
register(
    "difficulty_filter",
    "Training only on groups some but not all samples solved: masked (old), renormalised, or resampled (DAPO)?",
    [Variant("off", GRPO, {"difficulty_filter": False}),
     Variant("mask", GRPO, {"difficulty_filter": True, "difficulty_filter_mode": "mask", "retire_mastered": True}),
     Variant("renormalize", GRPO, {"difficulty_filter": True, "difficulty_filter_mode": "renormalize",
                                   "retire_mastered": True}),
     Variant("resample", GRPO, {"difficulty_filter": True, "difficulty_filter_mode": "resample",
                                "retire_mastered": True})],
    metric="zero_advantage_group_frac_kept",
    extra_metrics=("kept_group_frac", "sampling_rounds", "responses_generated", "samples_generated", "accuracy",
                   "kl"),
)

# ---------------------------------------------------------------------- lecture ideas (20 steps: sized for a shared 2-core CPU)
# A weaker start: the SFT run's own checkpoint after WEAK_START_STEPS of its 700 steps,
# standing in for a base model (R1-Zero starts RL from the base model).
WEAK_START_STEPS = 200
register(
    "format_reward",
    "From a weak start (R1-Zero style), does a bonus for a well-formed answer (R1's format reward) "
    "raise the well-formed rate faster, and does it help or dilute the accuracy reward?",
    [Variant("off", GRPO, {"warm_start_steps": WEAK_START_STEPS}),
     Variant("on", GRPO, {"warm_start_steps": WEAK_START_STEPS, "format_reward_coef": 0.5})],
    metric="well_formed_rate", extra_metrics=("eos_rate", "accuracy", "response_length"),
    steps=20,
)
register(
    "rft_vs_grpo",
    "Rejection-sampling fine-tuning (sample G, SFT on the correct ones: expert iteration) vs GRPO "
    "in the same loop at equal samples; only the advantage differs.",
    [Variant("grpo", GRPO), Variant("rft", GRPO, {"advantage_estimator": "rft"})],
    metric="accuracy", extra_metrics=("entropy", "kl_k1", "response_length_incorrect"),
    steps=20,
)
register(
    "weak_start",
    "RL from a weaker, less trained SFT checkpoint (a stand-in for a base model, R1-Zero style) vs "
    "from the full warm start: how much does RL recover, and how fast?",
    [Variant("full_sft", GRPO), Variant("weak_sft", GRPO, {"warm_start_steps": WEAK_START_STEPS})],
    metric="accuracy", extra_metrics=("well_formed_rate", "response_length", "kl_k1"),
    steps=20,
)
register(
    "length_norm_room",
    "length_norm where wrong answers have room to grow: the weak start (less formed answers) and twice the "
    "response budget. Does GRPO's per-sequence mean lengthen wrong answers against Dr. GRPO's constant?",
    [Variant("per_sequence", GRPO, {"loss_agg": "seq_mean_token_mean", "warm_start_steps": WEAK_START_STEPS,
                                    "response_length": 128}),
     Variant("constant", GRPO, {"loss_agg": "seq_mean_token_sum_norm", "warm_start_steps": WEAK_START_STEPS,
                                "response_length": 128})],
    metric="response_length_incorrect",
    extra_metrics=("response_length_correct", "accuracy", "loss_weight_incorrect_long", "loss_weight_incorrect_short"),
)
register(
    "grpo_updates_per_batch",
    "GRPO with one update per rollout batch (ratio 1, the clip never fires) vs four (the clip fires).",
    [Variant("1_update", GRPO), Variant("4_updates", GRPO, {"ppo_epochs": 4})],
    metric="clipfrac", extra_metrics=("approx_kl", "kl_k1", "accuracy", "entropy"),
    steps=20,
)
register(
    "kimi_length_warmup",
    "Kimi's length reward from the first step vs after a warm-up of 10 of 20 steps: does the "
    "warm-up keep accuracy while still shortening answers?",
    [Variant("off", GRPO),
     Variant("on", GRPO, {"length_reward_coef": 0.5}),
     Variant("warmup_10", GRPO, {"length_reward_coef": 0.5, "length_reward_warmup_steps": 10})],
    metric="response_length_correct", extra_metrics=("response_length_incorrect", "accuracy", "length_reward_coef"),
    steps=20,
)

# ---------------------------------------------------------------------- remaining toggles, one entry each
register(
    "clip_variants",
    "Symmetric clipping vs DAPO's clip-higher vs dual-clip, with 4 PPO epochs so the ratio moves.",
    [Variant("symmetric", PPO, {"ppo_epochs": 4}),
     Variant("clip_higher", PPO, {"ppo_epochs": 4, "cliprange_high": 0.28}),
     Variant("dual_clip", PPO, {"ppo_epochs": 4, "dual_clip": 3.0})],
    metric="clipfrac", extra_metrics=("clipfrac_low", "clipfrac_high", "dualclip_frac", "entropy", "accuracy"),
)
register(
    "adaptive_kl",
    "Fixed beta vs the adaptive controllers (Ziegler et al.; AlpacaFarm's per-step rule) steering the KL to a target.",
    [Variant("fixed", PPO, {"adaptive_kl": False, "kl_coef": 0.05}),
     Variant("adaptive", PPO, {"adaptive_kl": True, "kl_coef": 0.05, "kl_target": 1.0, "kl_horizon": 2000,
                               "kl_controller": "ziegler"}),
     Variant("adaptive_alpacafarm", PPO, {"adaptive_kl": True, "kl_coef": 0.05, "kl_target": 1.0,
                                          "kl_controller": "alpacafarm", "kl_k_beta": 0.1})],
    metric="kl_k1", extra_metrics=("kl_coef", "accuracy"),
)
register(
    "advantage_whitening_scope",
    "Whiten advantages once per rollout batch (AlpacaFarm, TRL) or per minibatch (cleanrl)?",
    [Variant("batch", PPO, {"whiten_advantages_per_minibatch": False}),
     Variant("minibatch", PPO, {"whiten_advantages_per_minibatch": True})],
    metric="accuracy", extra_metrics=("advantage_abs_mean",),
)
register(
    "old_logprobs_source",
    "Old log-probs recomputed by a forward pass vs taken from the generation logits.",
    [Variant("recompute", PPO, {"logprobs_from_generation": False}),
     Variant("generation", PPO, {"logprobs_from_generation": True})],
    metric="approx_kl", extra_metrics=("time_policy_forward", "accuracy"),
)
register(
    "entropy_bonus",
    "Does an entropy bonus keep exploration (and hurt the sharpening RL does here)?",
    [Variant("off", PPO, {"entropy_coef": 0.0}), Variant("on", PPO, {"entropy_coef": 0.01})],
    metric="entropy", extra_metrics=("accuracy",),
)
register(
    "target_kl_early_stop",
    "Early stop of a step's epochs once the approx KL to the rollout policy passes a target.",
    [Variant("off", PPO, {"ppo_epochs": 4, "target_kl": None}),
     Variant("target_0.01", PPO, {"ppo_epochs": 4, "target_kl": 0.01})],
    metric="early_stopped", extra_metrics=("approx_kl", "accuracy"),
)
register(
    "reward_clip",
    "Clamping sequence scores (here with a missing-EOS penalty that can push them below -1).",
    [Variant("off", PPO, {"missing_eos": "penalty", "missing_eos_penalty": 3.0, "response_length": 32}),
     Variant("clip_1", PPO, {"missing_eos": "penalty", "missing_eos_penalty": 3.0, "response_length": 32,
                             "reward_clip": 1.0})],
    metric="score", extra_metrics=("eos_rate", "accuracy"),
)
register(
    "truncation_mask",
    "Responses cut off at response_length: keep them in the loss or mask them out (DAPO)?",
    [Variant("keep", GRPO, {"response_length": 32, "mask_truncated_responses": False}),
     Variant("mask", GRPO, {"response_length": 32, "mask_truncated_responses": True})],
    metric="eos_rate", extra_metrics=("response_length", "accuracy"),
)
register(
    "group_std_correction",
    "Group std as a population std (nano-aha-moment) or a sample std (TRL, verl): advantages 0.935x at G = 8.",
    [Variant("population", GRPO, {"grpo_std_correction": 0}), Variant("sample", GRPO, {"grpo_std_correction": 1})],
    metric="accuracy", extra_metrics=("advantage_abs_mean", "kl"),
)
register(
    "group_estimators",
    "Group-relative baselines: GRPO (group std), batch std, REINFORCE with a batch-mean baseline.",
    [Variant("grpo_group", GRPO, {"grpo_scale": "group"}), Variant("grpo_batch", GRPO, {"grpo_scale": "batch"}),
     Variant("reinforce", GRPO, {"advantage_estimator": "reinforce", "reinforce_baseline": True})],
    metric="accuracy", extra_metrics=("advantage_abs_mean", "zero_advantage_group_frac"),
)
register(
    "sampling_truncation",
    "Pure sampling (top_k 0, top_p 1) vs nucleus sampling: training on a distribution other than the sampled one.",
    [Variant("pure", PPO, {"top_p": 1.0}), Variant("top_p_0.9", PPO, {"top_p": 0.9})],
    metric="accuracy", extra_metrics=("approx_kl", "entropy"),
)

# ---------------------------------------------------------------------- memory
register(
    "lora",
    "GRPO with LoRA adapters (reference = the adapter-disabled base, no weight copy) against full fine-tuning: "
    "how much held-out accuracy does the memory saving cost? LoRA gets the usual 10x learning rate. "
    "Memory itself: python -m ppo.benchmarks memory.",
    [Variant("full", GRPO), Variant("lora_r8", GRPO, {"lora_r": 8, "lora_alpha": 16.0, "lr": 1e-3})],
    metric="accuracy", extra_metrics=("kl_k1", "entropy", "time_update"),
)

# ---------------------------------------------------------------------- speed (exact toggles)
register(
    "speed",
    "The exact speed toggles cost nothing in results and save wall time: GRPO with each switched off "
    "(lean forward, reused update forward, one pass per distinct prompt, padding skipped, freed memory kept for reuse) "
    "and with the compiled forward on; PPO with its policy and critic in one update pass or in two. "
    "Accuracy should agree within seed noise; time_step is the point. "
    "python -m ppo.benchmarks bench / speed measure them alone.",
    [Variant("default", GRPO), Variant("module_calls", GRPO, {"lean_forward": False}),
     Variant("separate_old_forward", GRPO, {"reuse_update_forward": False}),
     Variant("per_row_prompts", GRPO, {"share_prompt_prefix": False}),
     Variant("padded_passes", GRPO, {"padding_free": False}),
     Variant("glibc_freeing", GRPO, {"retain_freed_memory": False}),
     Variant("compiled", GRPO, {"compile_forward": True}),
     Variant("ppo", PPO), Variant("ppo_separate_critic_pass", PPO, {"paired_critic_pass": False})],
    metric="time_step", extra_metrics=("accuracy", "time_generate", "time_reference_forward", "time_update"),
)

# ---------------------------------------------------------------------- several processes only
# Toggles that act only across processes. The runner launches each run as one process, where
# the two arms of such an ablation would be one computation (the run warns that the setting
# cannot act), so each is shown in two processes by the named test instead of by a sweep.
DATA_PARALLEL_ONLY: dict[str, str] = {
    "whitening_scope": "tests/test_data_parallel.py::test_whitening_scope_process_whitens_each_ranks_rows_alone "
                       "(AlpacaFarm's per-process whitening against the whole batch's, on each of 2 ranks)",
    "sharding": "tests/test_sharding.py (FSDP in 2 processes equals the one-process update)",
}

# ---------------------------------------------------------------------- the demo
# `make demo` runs it at 3 seeds and must end within a few minutes on 2 cores, installs included.
# It compares the families, so it trains on their batch (FAMILY_BATCH: 128 responses per step;
# at 64 GRPO's gain is too spread for 3 seeds to separate) for 30 steps instead of the standard
# 60, with held-out evaluations only at the start and the end, 8 draws per problem instead of 16.
# Chosen by the pilot registered in docs/results/batch_pilot/demo128.yaml (seeds 4-8). A run's
# start and end are scored on the same draws, so its gain keeps little evaluation noise
# (docs/testbed.md, "What `make demo` shows"). Both arms change alike: the comparison stays paired.
_DEMO = {**FAMILY_BATCH, "eval_every": 0, "eval_samples_per_prompt": 8}
register(
    "quick",
    "Quick cross-section for the demo: PPO and GRPO from the same SFT start, 30 steps of 128 responses, "
    "evaluated at the start and the end.",
    [Variant("ppo", PPO, _DEMO), Variant("grpo", "grpo", _DEMO)],
    metric="accuracy", extra_metrics=("kl_k1", "response_length"),
    steps=30,
)

# Does every preset learn on the testbed? Each arm is one preset as `preset(name, testbed=True)`
# builds it; docs/testbed.md reports each one's gain over the start.
register(
    "testbed_presets",
    "Does every preset, scaled to the CPU testbed, gain held-out accuracy over the warm start in 60 steps?",
    [Variant(name, name) for name in PRESETS],
    metric="accuracy", extra_metrics=("kl_k1", "response_length"),
    steps=60,
)

# The instrument's own check (ablations/aa.py): two identical GRPO arms whose seeds differ by an
# offset. Every difference between them is noise; run it with 20+ seeds.
register(
    "aa_grpo",
    "A/A check of the verdicts: two identical GRPO arms (the second's seeds offset by 1000), so every "
    "difference is noise. How often does a 5-seed paired verdict call one (nominal 5%)?",
    [Variant("a", "grpo"), Variant("b", "grpo", seed_offset=1000)],
    metric="accuracy", extra_metrics=("kl_k1", "response_length"),
    steps=60,
)

# ---------------------------------------------------------------------- RLHF: reward over-optimisation
# The default reward model is shipped (ppo/tasks/reward_model/); other settings are built first with
# `python -m ppo.tasks.rlhf build` (docs/alpacafarm.md). Its path is a pure function of the settings,
# so registering builds nothing.
from ppo.tasks.rlhf import reward_model_path  # noqa: E402

register(
    "alpacafarm_overoptimization",
    "Simulated-preference RLHF (AlpacaFarm preset, reward model from noisy pairwise labels): as the KL "
    "coefficient shrinks, does the proxy reward keep rising while the hidden gold reward and the win rate "
    "against the SFT policy stop improving or fall (reward over-optimisation)?",
    [Variant(f"kl_{c}", PPO, {"task": "preference", "reward_model_path": str(reward_model_path()),
                              "value_init": "reward_model", "kl_coef": c})
     for c in (0.0, 0.0067, 0.05, 0.2)],
    metric="eval_gold_reward",
    extra_metrics=("score", "gold_score", "kl_k1", "eval_win_rate_vs_sft", "eval_proxy_reward"),
)

# The 2025-26 implementation details (fixed width, policy losses, the critic, KL, off-policy
# correction) register themselves from their own module.
from . import registry_details  # noqa: E402,F401

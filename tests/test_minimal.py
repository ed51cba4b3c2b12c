"""The single-file reading `ppo/minimal.py` computes what the full trainer computes.

Both run from the same seed and the same cached SFT warm start for three steps, PPO with a
critic (`PPOConfig` defaults at the testbed's scale) and GRPO (`preset("grpo", testbed=True)`),
with the same smaller batch. The full trainer keeps its speed paths on (KV-cached sampler, lean
forward with shared prompts and no padding, the reused update forward, the paired critic pass,
fused AdamW): they are exact, so the two runs differ only in float rounding.

Tolerances, and why they are what they are:

- Sampled tokens are equal, so the per-step score, accuracy and mean response length are
  compared *exactly*: any difference in the seeding, the prompt draws, the sampling rule or
  the weights beyond rounding changes a drawn token and shows up here.
- Float metrics (losses, KL, reward, clip fraction) to 1e-5 absolute plus 1e-4 relative: the
  two runs sum in different orders (padding-free and shared-prompt passes, fused AdamW), about
  1e-7 relative per float32 operation; a step's KL sums ~30 tokens' log-ratios over 12
  optimizer steps and lands within 1e-6 of the full trainer's, so 1e-5 leaves a factor of ten.
- Weights to 1e-6 absolute, ten float32 ulps at the size of a norm weight (1.0): the runs
  agree to about one ulp, while the updates move weights by up to 8e-4 (PPO) and 2e-4 (GRPO).
  Torch's default AdamW weight decay of 0.01 (the full trainer uses 0) is off by 6e-6 after one
  PPO step (four optimizer steps) and fails here; `test_a_changed_setting_fails_the_comparison` checks that a changed
  clip range (PPO) or learning rate (GRPO) fails too.
"""

from __future__ import annotations

import math

import pytest
import torch

from ppo import minimal
from ppo.config import TESTBED_SCALE, PPOConfig, preset
from ppo.trainer import RLTrainer

STEPS = 3
SMALL = dict(rollout_batch_size=16, total_steps=STEPS, threads=1)  # GRPO: 2 prompts x 8 samples
EXACT = ("score", "accuracy", "response_length")
COMPARED = EXACT + ("reward", "kl", "pg_loss", "clipfrac", "vf_loss", "kl_loss")
METRIC_ABS, METRIC_REL, WEIGHT_ABS = 1e-5, 1e-4, 1e-6


def full_config(algo: str, tmp_path, **overrides) -> PPOConfig:
    """The full trainer's settings that `minimal.make_args(algo)` mirrors."""
    run = dict(output_dir=str(tmp_path / algo), eval_every=0, save_every=0, progress=False, log_samples=0)
    if algo == "ppo":
        return PPOConfig(**{**TESTBED_SCALE, **run, **overrides})
    return preset("grpo", testbed=True, **run, **overrides)


# What minimal.py writes into its code rather than into `Args`: the full trainer must agree.
FIXED = {
    "ppo": dict(advantage_estimator="gae", kl_estimator="k1", kl_placement="reward", kl_clip_at_zero=False,
                whiten_advantages=True, whiten_advantages_per_minibatch=False, loss_agg="token_mean",
                separate_value_optimizer=True, value_lr=None, value_init="policy"),
    "grpo": dict(advantage_estimator="grpo", grpo_scale="group", grpo_std_correction=0, kl_estimator="k3",
                 kl_placement="loss", whiten_advantages=False, loss_agg="seq_mean_token_mean"),
}
FIXED_BOTH = dict(task="arithmetic", model_path=None, warm_start_steps=None, top_k=0, top_p=1.0,
                  scale_logits_by_temperature=True, stop_token_ids=None, logprobs_from_generation=False,
                  missing_eos="none", reward_clip=None, whiten_rewards=False, length_reward_coef=0.0,
                  format_reward_coef=0.0, adaptive_kl=False, cliprange_high=None, dual_clip=None, entropy_coef=0.0,
                  target_kl=None, mask_truncated_responses=False, difficulty_filter=False, retire_mastered=False,
                  gradient_accumulation_steps=1, weight_decay=0.0, warmup_steps=0, lr_schedule="linear",
                  disable_dropout=True, lora_r=0, mixed_precision="no", model_dtype="float32",
                  reward_model_path=None, value_loss_over_padding=False, score_position="last_token",
                  policy_loss="vanilla", top_entropy_quantile=1.0, entropy_target=None, overlong_buffer_length=0,
                  critic_warmup_steps=0, lam_critic=None, lam_length_alpha=None, pad_to_response_length=False,
                  whiten_advantages_over_padding=False, adam_beta1=0.9, adam_beta2=0.999,  # torch's AdamW betas
                  split_special_tokens=False)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_minimal_defaults_are_the_full_trainers(algo, tmp_path):
    """Every `Args` default is the mirrored config's value, and every setting minimal.py
    fixes in its code is the config's: a changed default of the full trainer fails here."""
    args, config = minimal.make_args(algo), full_config(algo, tmp_path)
    for name, value in vars(args).items():
        if name != "algo":
            assert getattr(config, name) == value, name
    for name, value in {**FIXED_BOTH, **FIXED[algo]}.items():
        assert getattr(config, name) == value, name


def run_minimal(algo: str, **overrides):
    history, policy, critic = minimal.train(minimal.make_args(algo, **{**SMALL, **overrides}))
    return history, _weights(policy, critic)


def run_full(algo: str, tmp_path):
    trainer = RLTrainer(full_config(algo, tmp_path, **SMALL))
    history = [trainer.train_step() for _ in range(STEPS)]
    return history, _weights(trainer.policy, trainer.value_model)


def _weights(policy, critic) -> dict[str, torch.Tensor]:
    named = {f"policy.{k}": v.detach().clone() for k, v in policy.named_parameters()}
    if critic is not None:
        named.update({f"critic.{k}": v.detach().clone() for k, v in critic.named_parameters()})
    return named


def differences(a, b) -> list[str]:
    """What differs between two runs `(history, weights)` beyond the tolerances above."""
    (history_a, weights_a), (history_b, weights_b) = a, b
    found = []
    assert len(history_a) == len(history_b) == STEPS
    for step, (row_a, row_b) in enumerate(zip(history_a, history_b), 1):
        for key in COMPARED:
            if key not in row_a:
                continue
            tolerance = 0.0 if key in EXACT else METRIC_ABS + METRIC_REL * abs(row_b[key])
            if not abs(row_a[key] - row_b[key]) <= tolerance:
                found.append(f"step {step} {key}: {row_a[key]!r} != {row_b[key]!r}")
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        gap = float((weights_a[name] - weights_b[name]).abs().max())
        if not gap <= WEIGHT_ABS:
            found.append(f"{name}: differs by {gap:.2e}")
    return found


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Each algorithm run by the full trainer and by minimal.py, once for the module."""
    tmp_path = tmp_path_factory.mktemp("full")
    return {algo: (run_full(algo, tmp_path), run_minimal(algo)) for algo in ("ppo", "grpo")}


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_minimal_computes_what_the_full_trainer_computes(runs, algo):
    full, mini = runs[algo]
    assert differences(mini, full) == []
    # Not a comparison of two idle runs: every step trained, and the critic too (PPO).
    start = warm_start_weights()
    moved = max(float((full[1][name] - start[name]).abs().max()) for name in start)
    assert moved > 100 * WEIGHT_ABS
    if algo == "ppo":
        assert any(name.startswith("critic.") for name in full[1])
        assert max(row["clipfrac"] for row in full[0]) > 0  # clipping fired, so the clip range matters
    assert all(math.isfinite(row["kl"]) for row in full[0]) and full[0][-1]["kl"] != 0


def warm_start_weights() -> dict[str, torch.Tensor]:
    """The warm start's policy weights, named as `_weights` names them."""
    from transformers import AutoModelForCausalLM

    from ppo.models.sft import warm_start

    policy = AutoModelForCausalLM.from_pretrained(warm_start(progress=False), dtype=torch.float32)
    return {f"policy.{k}": v.detach() for k, v in policy.named_parameters()}


@pytest.mark.parametrize("algo, change", [("ppo", dict(cliprange=0.15)), ("grpo", dict(lr=1.1e-4))])
def test_a_changed_setting_fails_the_comparison(runs, algo, change):
    """The comparison can fail: minimal.py with one setting changed no longer agrees."""
    full, _ = runs[algo]
    assert differences(run_minimal(algo, **change), full) != []

"""Named presets: each one a plain dictionary of the `PPOConfig` fields it changes.

``python -c "from ppo.presets import PRESETS; print(PRESETS['alpacafarm'])"`` shows exactly
what a preset sets; `ppo.config.preset(name)` builds the config from it. docs/presets.md compares every field a
preset's source names with that source (file, line, commit), and tests/test_presets_sources.py
checks the tables against `PRESETS`. `TESTBED_SCALE` shrinks batch sizes
and step counts for the CPU testbed without touching algorithmic settings, and
`TESTBED_ADJUSTMENTS` holds the few per-preset changes the testbed needs beyond scaling
(`preset(name, testbed=True)`). docs/implementation-details.md ("Presets") describes each.
This module is plain data and imports nothing from the project; ``ppo.config`` re-exports
`PRESETS`, `TESTBED_SCALE` and `TESTBED_ADJUSTMENTS` beside `preset`.
"""

from __future__ import annotations

from typing import Any

# Plain data: each preset lists only the fields it changes from the `PPOConfig` defaults.
PRESETS: dict[str, dict[str, Any]] = {
    # AlpacaFarm's PPO (examples/scripts/rlhf_ppo.sh, src/alpaca_farm/rl/ppo_trainer.py,
    # ppo_utils.py, models/rl_models.py). docs/presets.md lists each field's source line.
    "alpacafarm": dict(
        kl_coef=0.0067,  # rlhf_ppo.sh --kl_coef 0.0067, fixed controller
        adaptive_kl=False,
        kl_estimator="k1",  # logprobs - ref_logprobs
        kl_clip_at_zero=True,  # _shape_reward: torch.clamp(kl, min=0.0)
        kl_placement="reward",
        whiten_rewards=True,  # whiten_rewards=True, shift_mean=False
        reward_whitening_mode="alpacafarm",  # whitens the padded [B, T] tensor, GAE over every column
        pad_to_response_length=True,  # rl_models.py right-pads every batch to response_len
        whiten_advantages_over_padding=True,  # torch_ops.whiten over the whole padded tensor
        # AlpacaFarm whitens each of its 8 processes' rollouts alone; the preset keeps the
        # statistics global so its numbers do not depend on the process count (docs/presets.md).
        whitening_scope="global",
        value_loss_over_padding=True,  # the critic predicts on padding; vf_loss .mean() over [B, response_len]
        loss_agg="seq_mean_token_sum_norm",  # .mean() over [B, response_len]: a constant divisor
        response_length=300,  # response_len
        max_prompt_length=192,  # query_len
        # AlpacaFarm's adaptive rule (kl_controller.py, k_beta 0.1) is kl_controller="alpacafarm";
        # rlhf_ppo.sh keeps the KL fixed, so the preset leaves the controller unset.
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
    # TRL's PPOTrainer as of v0.19.1 (trl/trainer/ppo_config.py, ppo_trainer.py; sampling
    # from OnPolicyConfig in trl/trainer/utils.py; the example command of
    # examples/scripts/ppo/ppo.py for lr and the EOS penalty).
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
        response_length=53,  # OnPolicyConfig.response_length
        stop_token_ids=[],  # OnPolicyConfig stop_token / stop_token_id None: responses run to response_length
        score_position="after_last_token",  # actual_end = sequence_lengths + 1 where the width has room
        lr=3e-6,  # examples/scripts/ppo/ppo.py; PPOConfig itself inherits TrainingArguments' 5e-5
        logprobs_from_generation=True,  # old log-probs from the generation logits / temperature
        separate_value_optimizer=False,
        adam_eps=1e-8,  # TrainingArguments' adam_epsilon
        max_grad_norm=None,  # the PPO loop steps the optimizer without clipping
        missing_eos="penalty",  # the example passes --missing_eos_penalty 1.0
        missing_eos_penalty=1.0,
        value_init="reward_model_head",  # the critic is the reward model, score head and all
    ),
    # DeepSeekMath GRPO (Shao et al. 2024, sec. 4.1): G samples per prompt, group-std
    # advantages, per-sequence length normalisation, k3 KL in the loss with beta 0.04, no
    # value model. Their RL used G = 64 (kept at 8 here: a size), lr 1e-6, one policy
    # update per rollout batch.
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
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"; understand-r1-zero
    # examples/qwen2.5-math-1.5b.sh on oat): GRPO without the std division and with a
    # constant normaliser (the generation budget), no KL term (beta = 0).
    "dr_grpo": dict(
        advantage_estimator="dr_grpo",
        grpo_scale="none",
        group_size=8,  # --num_samples 8
        kl_coef=0.0,  # --beta 0: no reference model, so no KL placement or estimator (GRPO's are "loss", "k3")
        loss_agg="seq_mean_token_sum_norm",  # oat masked_sum over constant_normalizer
        response_length=3000,  # --generate_max_length 3000, also the normaliser
        max_prompt_length=1024,  # --prompt_max_length 1024
        rollout_batch_size=1024,  # 128 prompts x 8 samples
        num_minibatches=8,  # --train_batch_size 128: 8 optimizer steps per rollout batch
        whiten_advantages=False,
        ppo_epochs=1,  # --num_ppo_epochs 1
        cliprange=0.2,
        lr=1e-6,  # --learning_rate 0.000001
        lr_schedule="constant",  # --lr_scheduler constant
        adam_beta2=0.95,  # oat args.py adam_beta_2
        adam_eps=1e-8,  # DeepSpeed's Adam default, which oat does not change
    ),
    # RLOO as TRL's RLOOTrainer v0.19.1 runs it (Ahmadian et al. 2024, "Back to Basics"):
    # leave-one-out baseline, each sequence's log-probs summed, KL in the reward (k1).
    "rloo": dict(
        advantage_estimator="rloo",
        group_size=2,  # RLOOConfig.rloo_k
        kl_coef=0.05,
        kl_placement="reward",
        kl_estimator="k1",
        loss_agg="seq_mean_token_sum",  # log-probs summed per sequence, mean over sequences
        temperature=0.7,  # OnPolicyConfig.temperature
        whiten_advantages=False,
        ppo_epochs=1,
        num_minibatches=1,
        lr=1e-6,
    ),
    # nano-aha-moment's GRPO (nano_r1_script.py): group-std advantages with eps 1e-4,
    # token-level loss averaged over all tokens of the batch, k3 KL in the loss with a small
    # beta, one update per batch, constant learning rate.
    "grpo_nano": dict(
        advantage_estimator="grpo",
        grpo_scale="group",
        grpo_eps=1e-4,
        group_size=4,  # GENERATIONS_PER_SAMPLE
        kl_placement="loss",
        kl_estimator="k3",
        kl_coef=0.001,  # --kl_coeff
        loss_agg="token_mean",
        whiten_advantages=False,
        ppo_epochs=1,
        num_minibatches=1,
        lr=1e-6,
        lr_schedule="constant",  # no scheduler in its DeepSpeed config
        adam_eps=1e-8,
        top_p=0.999,  # TOP_P
        response_length=1024,  # --max_response_tokens
    ),
}

# Shrinks batch sizes and step counts (and only those, plus settings a 0.9M-parameter
# model needs, listed below) so a preset runs in minutes on the CPU testbed.
TESTBED_SCALE: dict[str, Any] = dict(
    # Keeps each preset's rollout/minibatch ratio (num_minibatches unchanged). Comparisons of the
    # families (PPO against GRPO, and the demo) train on 128: ablations/registry.py, FAMILY_BATCH.
    rollout_batch_size=64,
    total_steps=100,
    response_length=64,
    eval_every=20,
    eval_size=256,
    # Sixteen draws per held-out problem: with one draw the evaluation's own noise is as large
    # as the seed-to-seed spread of trained runs; sixteen cut it fourfold (ppo/run/evaluation.py).
    eval_samples_per_prompt=16,
    eval_batch_size=512,
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
    # The arithmetic scorer reads the answer after the response's last '#': without a stop
    # token the model writes on past its EOS to 64 tokens, and that text decides the answer.
    # TRL's own stop_token='eos' setting is kept instead (the score then sits after the EOS).
    "trl_ppo": dict(value_init="policy", stop_token_ids=None),
    # A 1024-token prompt limit does not fit the testbed model's 256 positions; its prompts
    # are a few tokens long, so no limit is the same thing there.
    # Dr. GRPO takes 8 optimizer steps per rollout batch (num_minibatches=8, oat's
    # train_batch_size / rollout_batch_size), GRPO one: at the testbed's rate per step it moved
    # 8 times as far per batch and fell below its start on every seed (docs/testbed.md, "Every
    # preset learns"). The rate divided by the steps per batch keeps the move per batch GRPO's.
    "dr_grpo": dict(max_prompt_length=None, lr=TESTBED_SCALE["lr"] / 8),
}


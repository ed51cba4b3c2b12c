"""ReMax's baseline: the score of the policy's greedy response to each prompt.

ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
Method for Aligning Large Language Models", arXiv 2310.10505) replaces PPO's critic by one
extra decode per prompt: the greedy response is scored like a sampled one and its score is
subtracted from the return of every sample of that prompt (`gae.registry` ``"remax"``).
verl does the same (``ray_trainer.py``, ``gen_baseline_batch.meta_info["do_sample"] = False``).

The greedy response is scored through the same steps as the samples it is a baseline for
(task or reward model, missing-EOS rule, format reward, clipping), so a sample equal to the
greedy response gets advantage 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ppo.run.evaluation import score_batch
from ppo.algorithm.rewards import apply_missing_eos, clip_scores, format_reward
from ppo.models.rollout import decode_responses, generate

if TYPE_CHECKING:
    from ppo.models.setup import Models


@torch.no_grad()
def greedy_baselines(config, models: Models, task, batch) -> torch.Tensor:
    """``[B]``: for each sample of `batch`, the score of the greedy response to its prompt
    (decoded once per group of G samples, then repeated over the group). `models` is the
    run's `ppo.models.setup.Models` (the policy samples, the reward model scores if there is
    one, else `task` does)."""
    cfg, group_size = config, config.group_size
    problems = batch.problems[::group_size]  # [prompts]: the G samples of a prompt are contiguous
    rollout = generate(
        models.policy_module, models.tokenizer, [p.prompt for p in problems], cfg.response_length, greedy=True,
        stop_token_ids=models.stop_token_ids, max_prompt_length=models.max_prompt_length,
        prompt_truncation=cfg.prompt_truncation).to(models.device)
    texts = decode_responses(models.tokenizer, rollout)
    scored = score_batch(task, problems, texts, rollout.has_eos.tolist())
    scores = (models.reward_model_scores(rollout, problems, texts) if models.reward_model is not None
              else torch.tensor([s.reward for s in scored], device=models.device))  # [prompts]
    scores = apply_missing_eos(scores, rollout.has_eos, cfg.missing_eos, cfg.missing_eos_penalty, cfg.missing_eos_value)
    well_formed = torch.tensor([s.well_formed for s in scored], device=models.device)
    scores = clip_scores(scores + format_reward(well_formed, cfg.format_reward_coef), cfg.reward_clip)
    return scores.repeat_interleave(group_size)  # [B]

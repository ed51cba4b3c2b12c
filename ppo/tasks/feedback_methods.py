"""``python -m ppo.tasks.feedback_methods``: AlpacaFarm's method comparison on the simulated-preference testbed.

AlpacaFarm (Dubois et al. 2023, arXiv 2305.14387, Table 2) ranks its reference methods for
learning from pairwise feedback by their simulated win rate against Davinci003. This module
runs the same methods here, every one from the same SFT warm start and the same reward model
(`ppo.tasks.rlhf`), and judges them by the hidden gold reward of the testbed:

    sft                  the SFT start itself (its win rate against its own reference samples is ~0.5)
    best_of_n            n samples per prompt, the reward model picks one; no training
    expert_iteration     rounds of: best-of-n on training prompts, then SFT on the picked samples
    quark                reward-quantile control tokens, log-likelihood + KL to the SFT + entropy
    quark_best_quantile  the same loss on the best quantile only, no tokens (the default of AlpacaFarm's script)
    reward_conditioning  SFT on both responses of each preference pair behind a good / bad token
    feedme               SFT on the preferred response of each preference pair
    ppo, grpo, rloo      the trainer with the `alpacafarm`, `grpo` and `rloo` presets (testbed scale)

The objectives are in `ppo.algorithm.feedback_methods`; this module builds their data, runs
their training loops and evaluates every method the same way (`evaluate_method`).

**Budgets.** The methods that query the reward model while training (expert iteration, Quark,
PPO, GRPO, RLOO, both Quarks) each get `ComparisonConfig.rm_queries` reward-model-scored samples of
their own policy. FeedME and reward conditioning query no reward model: they read the
training split of the preference pairs the reward model was fitted to, for
`ComparisonConfig.sft_epochs` epochs. Best-of-n trains nothing and scores n samples per
evaluated response. Every method trains at the testbed learning rate (`TESTBED_SCALE`).
Each row of the results records its reward-model queries and optimizer steps.

**Evaluation** (`evaluate_method`): the held-out problems, `eval_samples_per_prompt`
samples each at temperature 1. Sample j of problem i is compared with sample j of the SFT
policy (drawn once per seed with its own seed) by the gold reward: 1 for a win, 1/2 for a
tie. Also the mean gold and proxy reward, the KL to the SFT policy (the sampled estimate
sum_t log pi - log pi_sft over each response, the conditioned methods read under their good
token; for best-of-n the formula `best_of_n_kl`), the response length in tokens and the
accuracy.

Run it (the reward model is built first if needed)::

    python -m ppo.tasks.feedback_methods run --seeds 3 --out docs/results/feedback_methods
    python -m ppo.tasks.feedback_methods table docs/results/feedback_methods --update docs/alpacafarm.md

``run`` appends one row per (method, seed) to ``OUT/results.csv`` as each finishes and skips
the rows already there, so an interrupted run continues where it stopped. Each row carries
the provenance of `ppo.run.provenance` (``prov_*``) and the reward model's weights digest
(``prov_reward_model``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ppo.algorithm.feedback_methods import (best_of_n_choice, best_of_n_kl, full_kl_and_entropy, quantile_tokens,
                                            quark_loss, supervised_nll)
from ppo.models.logprobs import concat_query_response, response_logprobs
from ppo.models.policy import encode_prompts, left_pad
from ppo.speed.lean_forward import response_logits
from ppo.tasks.base import Problem
from ppo.tasks.preferences import PreferenceTask, gold_score, sample_responses
from ppo.tasks.rlhf import RLHFConfig

METHODS = ("sft", "best_of_n", "expert_iteration", "quark", "quark_best_quantile", "reward_conditioning", "feedme",
           "ppo", "grpo", "rloo")
RL_PRESETS = {"ppo": "alpacafarm", "grpo": "grpo", "rloo": "rloo"}
GOOD_TOKEN, BAD_TOKEN = "<good>", "<bad>"
# Seeds of the evaluation's samples, offset by the run's seed: the SFT reference samples and
# every method's samples are drawn with different seeds, so the SFT row is a fresh draw.
REFERENCE_SEED, EVAL_SEED = 10_000, 20_000
RESULT_COLUMNS = ("method", "seed", "status", "error", "win_rate_vs_sft", "gold_reward", "proxy_reward", "kl_to_sft",
                  "kl_kind", "response_length", "accuracy", "eval_responses", "rm_queries_train",
                  "rm_queries_per_response", "optimizer_steps", "train_seconds", "eval_seconds")
PROVENANCE_COLUMNS = ("prov_commit", "prov_dirty", "prov_warm_start", "prov_reward_model", "prov_torch",
                      "prov_transformers", "prov_python", "prov_threads", "prov_cpu", "prov_processes")


@dataclass
class ComparisonConfig:
    """Every setting of one comparison run; each method reads only its own."""

    rm_queries: int = 2560  # reward-model-scored training samples of each online method
    rollout_batch_size: int = 64  # samples per step of Quark and the trainer's presets (TESTBED_SCALE)
    lr: float = 1e-4  # every method's rate: TESTBED_SCALE's lr, so methods differ in their objective only
    response_length: int = 64  # generation budget (the SFT warm start's max_new_tokens)
    best_of_n: int = 16  # n of best-of-n at evaluation (AlpacaFarm's README example: --num_return_sequences 16)
    expert_rounds: int = 3  # best-of-n then SFT, repeated
    expert_n: int = 16  # n of expert iteration's best-of-n (README "Expert Iteration": 16)
    sft_epochs: int = 3  # expiter.sh / sft.sh --num_train_epochs 3 (expert iteration, FeedME, conditioning)
    sft_batch_size: int = 32
    quark_tokens: int = 4  # quark_utils.py num_reward_tokens 4
    quark_kl_coef: float = 0.05  # rlhf_quark.sh kl_coef ${5:-0.05}
    quark_entropy_coef: float = 0.0  # quark_utils.py entropy_coef 0.0
    quark_step_batch: int = 32  # rollout 512 / step 256 in rlhf_quark.sh: half of each rollout per gradient step
    quark_gradient_steps: int = 1  # quark_utils.py num_gradient_steps_per_step 1
    eval_size: int | None = None  # held-out problems (None: all 256)
    eval_samples_per_prompt: int = 2
    threads: int = 1  # torch intra-op threads (one: deterministic, and fast on a shared machine)
    rlhf: RLHFConfig = field(default_factory=RLHFConfig)  # the reward model's build

    def __post_init__(self):
        for name in ("rm_queries", "rollout_batch_size", "response_length", "best_of_n", "expert_rounds", "expert_n",
                     "sft_epochs", "sft_batch_size", "quark_step_batch", "quark_gradient_steps",
                     "eval_samples_per_prompt", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ComparisonConfig.{name}: must be positive, got {getattr(self, name)}")
        if self.rm_queries % self.rollout_batch_size:
            raise ValueError(f"ComparisonConfig.rm_queries ({self.rm_queries}) must be a multiple of "
                             f"rollout_batch_size ({self.rollout_batch_size})")
        if self.rm_queries < self.expert_rounds * self.expert_n:
            raise ValueError("ComparisonConfig.rm_queries: fewer than one prompt per expert-iteration round")
        if self.quark_tokens < 2 or self.quark_step_batch > self.rollout_batch_size:
            raise ValueError("ComparisonConfig: Quark needs >= 2 tokens and a step batch no larger than a rollout")


# ==========================================================================================
# Data: conditioned prompts and the preference pairs' two supervised data sets
# ==========================================================================================
def conditioned(prompt: str, token: str) -> str:
    """The prompt behind a control token: AlpacaFarm prepends it to the query text
    (``RewardConditioningPromptPostprocessor``, ``DataPool.sort_and_get``), so the model reads
    ``<bos><token><prompt>``.

    >>> conditioned("12+3=", "<reward_0>")
    '<reward_0>12+3='
    """
    return f"{token}{prompt}"


def quark_token(quantile: int) -> str:
    return f"<reward_{quantile}>"


def _preferred(row: dict) -> tuple[str, bool]:
    side = row["preferred"]
    return row[f"response_{side}"], bool(row[f"eos_{side}"])


def _rejected(row: dict) -> tuple[str, bool]:
    side = "b" if row["preferred"] == "a" else "a"
    return row[f"response_{side}"], bool(row[f"eos_{side}"])


def feedme_examples(rows: Sequence[dict]) -> list[tuple[str, str, bool]]:
    """Binary FeedME's data: ``(prompt, preferred response, its EOS flag)`` per pair (AlpacaFarm
    section 3.4; the preferred side is the one ``preprocess_for_dpo`` takes as ``output_w``).

    >>> feedme_examples([{"prompt": "1+1=", "response_a": "#2", "response_b": "#3", "preferred": "a",
    ...                   "eos_a": True, "eos_b": False}])
    [('1+1=', '#2', True)]
    """
    return [(row["prompt"], *_preferred(row)) for row in rows]


def reward_conditioning_examples(rows: Sequence[dict], good: str = GOOD_TOKEN,
                                 bad: str = BAD_TOKEN) -> list[tuple[str, str, bool]]:
    """Binary reward conditioning's data: each pair gives two examples, the preferred response
    behind `good` and the other behind `bad` (AlpacaFarm section 3.4).

    >>> reward_conditioning_examples([{"prompt": "1+1=", "response_a": "#2", "response_b": "#3",
    ...                                "preferred": "b", "eos_a": True, "eos_b": True}])
    [('<good>1+1=', '#3', True), ('<bad>1+1=', '#2', True)]
    """
    examples = []
    for row in rows:
        examples.append((conditioned(row["prompt"], good), *_preferred(row)))
        examples.append((conditioned(row["prompt"], bad), *_rejected(row)))
    return examples


def add_control_tokens(policy, tokenizer, tokens: Sequence[str], seed: int):
    """A copy of `tokenizer` with `tokens` added, and `policy` (in place) with an embedding row each.

    Each new row is the mean of the old embeddings plus Gaussian noise of their per-dimension
    std (AlpacaFarm ``utils.stable_resize_token_embeddings`` with ``jitter_new_embeddings``,
    which ``quark_trainer.make_models`` uses). The control tokens are never sampled: a hook sets
    their logits to -inf, so the policy's next-token distribution is over the original
    vocabulary (AlpacaFarm keeps them in the softmax and drops them from Quark's KL and entropy,
    ``logits[..., :original_vocab_size]``). Returns ``(tokenizer, original_vocab_size)``.
    """
    tokenizer = copy.deepcopy(tokenizer)
    original = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    policy.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # rows set below
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for embedding in {id(m): m for m in (policy.get_input_embeddings(), policy.get_output_embeddings())}.values():
            old = embedding.weight[:original]  # [V0, d]
            noise = torch.randn(len(tokenizer) - original, old.shape[1], generator=generator)
            embedding.weight[original:] = old.mean(0, keepdim=True) + noise * old.std(0, keepdim=True)

    def never_sample_control_tokens(module, inputs, logits):
        return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= original, float("-inf"))

    policy.get_output_embeddings().register_forward_hook(never_sample_control_tokens)
    return tokenizer, original


def _batch(tokenizer, prompts: Sequence[str], responses: Sequence[str], has_eos: Sequence[bool], device="cpu"):
    """``(query_ids, query_mask, response_ids, response_mask)``: queries left-padded, responses
    right-padded with EOS appended where the response had one (the rollout layout)."""
    from value_model.reward_model import encode_responses

    query_ids, query_mask = left_pad(encode_prompts(tokenizer, list(prompts)), tokenizer.pad_token_id)  # [B, Q]
    response_ids, response_mask = encode_responses(tokenizer, responses, has_eos)  # [B, T]
    return tuple(t.to(device) for t in (query_ids, query_mask, response_ids, response_mask))


def _response_logits(model, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
    """Logits ``[B, T, V]`` at the positions that predict each response token."""
    input_ids, attention_mask, position_ids = concat_query_response(query_ids, query_mask, response_ids, response_mask)
    return response_logits(model, input_ids, attention_mask, position_ids, query_ids.shape[1])


# ==========================================================================================
# Training loops
# ==========================================================================================
def fine_tune(policy, tokenizer, examples: Sequence[tuple[str, str, bool]], epochs: int, batch_size: int, lr: float,
              seed: int) -> int:
    """Supervised fine-tuning on ``(prompt, response, has_eos)`` examples (`supervised_nll`):
    AdamW at a constant `lr`, gradients clipped at norm 1, the examples reshuffled every
    epoch. Returns the number of optimizer steps."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    steps = 0
    policy.train()
    for _ in range(epochs):
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order), batch_size):
            chunk = [examples[i] for i in order[start:start + batch_size]]
            batch = _batch(tokenizer, *zip(*chunk))
            logprobs = response_logprobs(policy, *batch)  # [b, T]
            loss = supervised_nll(logprobs, batch[3])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            steps += 1
    policy.eval()
    return steps


def quark_update(policy, ref_policy, tokenizer, ref_tokenizer, examples: Sequence[tuple[Problem, str, bool, int]],
                 config: ComparisonConfig, original_vocab: int, optimizer) -> dict:
    """One Quark gradient step on ``(problem, response, has_eos, quantile)`` examples: the
    policy reads each prompt behind its quantile's token (none when the quantile is None), the
    reference the plain prompt (in AlpacaFarm the reference sees the token masked out,
    ``ignore_tokens``)."""
    problems, responses, has_eos, quantiles = zip(*examples)
    prompts = [p.prompt if q is None else conditioned(p.prompt, quark_token(q)) for p, q in zip(problems, quantiles)]
    batch = _batch(tokenizer, prompts, responses, has_eos)
    ref_batch = _batch(ref_tokenizer, [p.prompt for p in problems], responses, has_eos)
    policy.train()
    logits = _response_logits(policy, *batch)  # [B, T, V0 + K], control tokens at -inf
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, batch[2].unsqueeze(-1)).squeeze(-1)  # [B, T]
    with torch.no_grad():
        ref_logits = _response_logits(ref_policy, *ref_batch)  # [B, T, V0]
    kl, entropy = full_kl_and_entropy(logits, ref_logits, original_vocab)  # [B, T] each
    loss, metrics = quark_loss(logprobs, kl, entropy, batch[3], config.quark_kl_coef, config.quark_entropy_coef,
                               config.response_length)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    policy.eval()
    return metrics


class RewardModel:
    """The proxy reward model of the comparison (a `ScalarHeadModel` and its tokenizer)."""

    def __init__(self, path: str | Path):
        from ppo.models.policy import load_tokenizer
        from value_model import ScalarHeadModel

        self.path = Path(path)
        self.model = ScalarHeadModel.from_pretrained(str(path)).eval().requires_grad_(False)
        self.tokenizer = load_tokenizer(path)
        self.queries = 0  # every response scored, training and evaluation

    def score(self, prompts: Sequence[str], responses: Sequence[str], has_eos: Sequence[bool]) -> torch.Tensor:
        from value_model.reward_model import score_texts

        self.queries += len(responses)
        return score_texts(self.model, self.tokenizer, list(prompts), list(responses), list(has_eos))  # [N]


@dataclass
class Trained:
    """A method's result: what to sample from (a policy behind an optional control token, or
    best-of-n over the SFT policy) and what its training cost."""

    policy: object
    tokenizer: object
    token: str = ""  # prepended to every evaluation prompt
    best_of_n: int = 0  # > 0: best-of-n sampling with this n
    rm_queries: int = 0
    optimizer_steps: int = 0


def train_expert_iteration(policy, tokenizer, task, reward_model: RewardModel, config: ComparisonConfig,
                           seed: int) -> Trained:
    """`expert_rounds` rounds of best-of-`expert_n` on fresh training prompts, each followed by
    supervised fine-tuning of the current policy on the picked samples (a fresh optimizer
    per round, as each ``expiter.sh`` run is its own ``supervised.py``)."""
    rng = random.Random(seed)
    prompts_per_round = config.rm_queries // (config.expert_rounds * config.expert_n)
    queries = steps = 0
    for round_index in range(config.expert_rounds):
        problems = task.sample_problems(prompts_per_round, rng)
        repeated = [p for p in problems for _ in range(config.expert_n)]  # [P * n], a prompt's samples contiguous
        texts, has_eos, _ = sample_responses(policy, tokenizer, repeated, config.response_length,
                                             seed=seed * 1000 + round_index)
        scores = reward_model.score([p.prompt for p in repeated], texts, has_eos)  # [P * n]
        queries += len(texts)
        picked = best_of_n_choice(scores.view(len(problems), config.expert_n))  # [P]
        examples = [(problem.prompt, texts[i * config.expert_n + j], has_eos[i * config.expert_n + j])
                    for i, (problem, j) in enumerate(zip(problems, picked.tolist()))]
        steps += fine_tune(policy, tokenizer, examples, config.sft_epochs, config.sft_batch_size, config.lr,
                           seed=seed * 1000 + round_index)
    return Trained(policy, tokenizer, rm_queries=queries, optimizer_steps=steps)


def shuffled_draw(size: int, count: int, generator: torch.Generator) -> list[int]:
    """`count` indices into a pool of `size`, from reshuffled passes over it (AlpacaFarm draws
    each Quark step batch from an ``InfiniteLoader`` over the pool, so a pool smaller than the
    step batch is cycled through more than once).

    >>> sorted(shuffled_draw(3, 6, torch.Generator().manual_seed(0)))  # the pool twice
    [0, 0, 1, 1, 2, 2]
    """
    indices: list[int] = []
    while len(indices) < count:
        indices += torch.randperm(size, generator=generator).tolist()
    return indices[:count]


def train_quark(policy, tokenizer, ref_policy, task, reward_model: RewardModel, config: ComparisonConfig,
                seed: int, best_quantile_only: bool = False) -> Trained:
    """Quark as AlpacaFarm's ``QuarkTrainer``: each step samples a rollout batch, scores it,
    clears the pool and refills it with this batch (``clear_data_pool_on_each_rollout``) and
    takes `quark_gradient_steps` steps of `quark_loss` on batches of `quark_step_batch` drawn
    from it. With ``train_on_best_quantile=False`` (here the default) every response is trained
    on behind its quantile's token and rollouts are conditioned on ``<reward_0>`` (the first
    step unconditioned, its token still untrained). `best_quantile_only` is AlpacaFarm's
    default ``train_on_best_quantile=True``, which ``rlhf_quark.sh`` keeps: no tokens at all,
    only the best quantile of each pool is trained on."""
    tokens = [quark_token(k) for k in range(config.quark_tokens)]
    if best_quantile_only:
        policy_tokenizer, original_vocab, token = tokenizer, len(tokenizer), ""
    else:
        (policy_tokenizer, original_vocab), token = add_control_tokens(policy, tokenizer, tokens, seed), tokens[0]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr)
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    queries = steps = 0
    for step in range(config.rm_queries // config.rollout_batch_size):
        problems = task.sample_problems(config.rollout_batch_size, rng)
        prompts = [p if step == 0 or not token else dataclasses.replace(p, prompt=conditioned(p.prompt, token))
                   for p in problems]
        texts, has_eos, _ = sample_responses(policy, policy_tokenizer, prompts, config.response_length,
                                             seed=seed * 1000 + step)
        rewards = reward_model.score([p.prompt for p in problems], texts, has_eos)  # [B]
        queries += len(texts)
        quantiles = quantile_tokens(rewards, config.quark_tokens).tolist()  # [B], 0 = best
        pool = list(zip(problems, texts, has_eos, quantiles))
        if best_quantile_only:
            pool = [(p, t, e, None) for p, t, e, q in pool if q == 0]
        for _ in range(config.quark_gradient_steps):
            batch = [pool[i] for i in shuffled_draw(len(pool), config.quark_step_batch, generator)]
            quark_update(policy, ref_policy, policy_tokenizer, tokenizer, batch, config, original_vocab, optimizer)
            steps += 1
    return Trained(policy, policy_tokenizer, token=token, rm_queries=queries, optimizer_steps=steps)


def train_with_trainer(method: str, config: ComparisonConfig, reward_model_dir: Path, seed: int,
                       run_dir: Path) -> Trained:
    """PPO, GRPO or RLOO: the project's trainer with the named preset at testbed scale, against
    the reward model, for ``rm_queries / rollout_batch_size`` steps. The trainer's own start
    and end evaluations are cut to 16 problems (the comparison evaluates with `evaluate_method`)."""
    from ppo.config import preset
    from ppo.trainer import RLTrainer

    overrides = dict(task="preference", reward_model_path=str(reward_model_dir), seed=seed, threads=config.threads,
                     total_steps=config.rm_queries // config.rollout_batch_size,
                     rollout_batch_size=config.rollout_batch_size, response_length=config.response_length,
                     lr=config.lr, eval_every=0, eval_size=16, eval_samples_per_prompt=1, save_every=0,
                     progress=False, report_to=[], output_dir=str(run_dir))
    if method == "ppo":
        overrides["value_init"] = "reward_model"  # AlpacaFarm's critic (docs/alpacafarm.md)
    trainer = RLTrainer(preset(RL_PRESETS[method], testbed=True, **overrides))
    summary = trainer.train(restart=True)
    cfg = trainer.config
    policy, tokenizer = trainer.policy_module, trainer.tokenizer
    policy.eval()
    steps = summary["steps"] * cfg.ppo_epochs * cfg.num_minibatches
    return Trained(policy, tokenizer, rm_queries=summary["samples"], optimizer_steps=steps)


# ==========================================================================================
# Evaluation
# ==========================================================================================
def _sequence_logprobs(model, tokenizer, prompts, rollouts) -> torch.Tensor:
    """Each sampled response's summed log-prob under `model` reading `prompts`, ``[N]``."""
    sums, start = [], 0
    for rollout in rollouts:
        end = start + len(rollout)
        query_ids, query_mask = left_pad(encode_prompts(tokenizer, list(prompts[start:end])), tokenizer.pad_token_id)
        with torch.no_grad():
            logprobs = response_logprobs(model, query_ids, query_mask, rollout.response_ids, rollout.response_mask)
        sums.append((logprobs * rollout.response_mask).sum(-1))  # [b]
        start = end
    return torch.cat(sums)


def evaluate_method(trained: Trained, sft_policy, sft_tokenizer, task: PreferenceTask, reward_model: RewardModel,
                    reference: dict, config: ComparisonConfig, seed: int) -> dict:
    """Held-out metrics of one method (see the module docstring); `reference` is `sft_reference`'s."""
    problems = reference["problems"]
    n = max(trained.best_of_n, 1)
    sampled = [p if not trained.token else dataclasses.replace(p, prompt=conditioned(p.prompt, trained.token))
               for p in problems for _ in range(n)]  # [N * n], a problem's n samples contiguous
    texts, has_eos, rollouts = sample_responses(trained.policy, trained.tokenizer, sampled, config.response_length,
                                                seed=EVAL_SEED + seed)
    plain = [p.prompt for p in problems for _ in range(n)]
    proxy = reward_model.score(plain, texts, has_eos)  # [N * n]
    if n > 1:
        picked = best_of_n_choice(proxy.view(len(problems), n))  # [N]
        rows = [i * n + j for i, j in enumerate(picked.tolist())]
        texts, has_eos, proxy = [texts[r] for r in rows], [has_eos[r] for r in rows], proxy[rows]
        kl, kl_kind = best_of_n_kl(n), "best_of_n_formula"
    elif trained.policy is sft_policy and not trained.token:
        kl, kl_kind = 0.0, "same_policy"
    else:
        policy_sums = _sequence_logprobs(trained.policy, trained.tokenizer, [p.prompt for p in sampled], rollouts)
        sft_sums = _sequence_logprobs(sft_policy, sft_tokenizer, plain, rollouts)
        kl, kl_kind = float((policy_sums - sft_sums).mean()), "sampled_k1"
    gold = [gold_score(p, t, e) for p, t, e in zip(problems, texts, has_eos)]
    wins = [1.0 if g > r else 0.5 if g == r else 0.0 for g, r in zip(gold, reference["gold"])]
    lengths = [len(sft_tokenizer(t, add_special_tokens=False)["input_ids"]) + int(e) for t, e in zip(texts, has_eos)]
    correct = [task.score(p, t, e).correct for p, t, e in zip(problems, texts, has_eos)]
    count = len(problems)
    return {"win_rate_vs_sft": sum(wins) / count, "gold_reward": sum(gold) / count,
            "proxy_reward": float(proxy.mean()), "kl_to_sft": kl, "kl_kind": kl_kind,
            "response_length": sum(lengths) / count, "accuracy": sum(correct) / count, "eval_responses": count,
            "rm_queries_per_response": n if trained.best_of_n else 0}


def sft_reference(sft_policy, sft_tokenizer, task: PreferenceTask, config: ComparisonConfig, seed: int) -> dict:
    """The held-out problems (each `eval_samples_per_prompt` times) and the SFT policy's
    samples of them, with their gold rewards: what every method's win rate is counted against."""
    held_out = list(task.eval_problems())[:config.eval_size]
    problems = [p for p in held_out for _ in range(config.eval_samples_per_prompt)]
    texts, has_eos, _ = sample_responses(sft_policy, sft_tokenizer, problems, config.response_length,
                                         seed=REFERENCE_SEED + seed)
    return {"problems": problems, "gold": [gold_score(p, t, e) for p, t, e in zip(problems, texts, has_eos)]}


# ==========================================================================================
# One (method, seed), and the whole comparison
# ==========================================================================================
def preference_rows(reward_model_dir: Path, rlhf: RLHFConfig) -> list[dict]:
    """The training split of the pairs the reward model was fitted to (its own held-out split
    left out, `value_model.reward_model.split_pairs` with the build's fraction and seed)."""
    from ppo.tasks.preferences import load_preferences
    from value_model.reward_model import split_pairs

    train, _ = split_pairs(load_preferences(reward_model_dir / "preferences.jsonl"), rlhf.heldout_fraction, rlhf.seed)
    return train


def run_method(method: str, seed: int, config: ComparisonConfig, sft_dir: Path, reward_model_dir: Path,
               work_dir: Path, reference_cache: dict | None = None) -> dict:
    """Train (if the method trains) and evaluate `method` for `seed`; one results row."""
    from ppo.models.policy import load_policy

    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    torch.set_num_threads(config.threads)
    torch.manual_seed(seed)
    task = PreferenceTask()
    reward_model = RewardModel(reward_model_dir)
    sft_policy, sft_tokenizer = load_policy(sft_dir)
    sft_policy.eval().requires_grad_(False)
    reference_cache = {} if reference_cache is None else reference_cache
    if seed not in reference_cache:
        reference_cache[seed] = sft_reference(sft_policy, sft_tokenizer, task, config, seed)
    start = time.perf_counter()
    if method == "sft":
        trained = Trained(sft_policy, sft_tokenizer)
    elif method == "best_of_n":
        trained = Trained(sft_policy, sft_tokenizer, best_of_n=config.best_of_n)
    elif method in RL_PRESETS:
        run_dir = work_dir / method / f"seed{seed}"
        trained = train_with_trainer(method, config, reward_model_dir, seed, run_dir)
        torch.set_num_threads(config.threads)
    else:
        policy, tokenizer = load_policy(sft_dir)
        if method == "expert_iteration":
            trained = train_expert_iteration(policy, tokenizer, task, reward_model, config, seed)
        elif method in ("quark", "quark_best_quantile"):
            trained = train_quark(policy, tokenizer, sft_policy, task, reward_model, config, seed,
                                  best_quantile_only=method == "quark_best_quantile")
        else:
            rows = preference_rows(reward_model_dir, config.rlhf)
            if method == "feedme":
                examples, token, tok = feedme_examples(rows), "", tokenizer
            else:
                tok, _ = add_control_tokens(policy, tokenizer, [GOOD_TOKEN, BAD_TOKEN], seed)
                examples, token = reward_conditioning_examples(rows), GOOD_TOKEN
            steps = fine_tune(policy, tok, examples, config.sft_epochs, config.sft_batch_size, config.lr, seed)
            trained = Trained(policy, tok, token=token, optimizer_steps=steps)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    metrics = evaluate_method(trained, sft_policy, sft_tokenizer, task, reward_model, reference_cache[seed], config,
                              seed)
    return {"method": method, "seed": seed, "status": "ok", "error": "", **metrics,
            "rm_queries_train": trained.rm_queries, "optimizer_steps": trained.optimizer_steps,
            "train_seconds": round(train_seconds, 1), "eval_seconds": round(time.perf_counter() - start, 1)}


def provenance(sft_dir: Path, reward_model_dir: Path, threads: int) -> dict:
    """`ppo.run.provenance.collect` as ``prov_*`` columns (the reward model's weights digest among them)."""
    from ppo.run.provenance import collect

    return {f"prov_{k}": v for k, v in collect(str(sft_dir), threads, reward_model_path=str(reward_model_dir)).items()}


def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def append_result(path: Path, row: dict) -> None:
    columns = list(RESULT_COLUMNS) + list(PROVENANCE_COLUMNS)
    new = not path.is_file()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in columns})


def run(config: ComparisonConfig, methods: Sequence[str], seeds: Sequence[int], out: Path,
        reward_model_dir: Path | None = None, keep_runs: bool = False, progress: bool = True) -> Path:
    """Every (method, seed) not yet in ``out/results.csv``, appended as it finishes."""
    from ppo.models.sft import warm_start
    from ppo.tasks.rlhf import reward_model_dir as build_reward_model

    out.mkdir(parents=True, exist_ok=True)
    sft_dir = warm_start(config.rlhf.sft, progress=progress)
    reward_model_dir = Path(reward_model_dir) if reward_model_dir else build_reward_model(config.rlhf,
                                                                                           progress=progress)
    prov = provenance(sft_dir, reward_model_dir, config.threads)
    results = out / "results.csv"
    done = {(r["method"], int(r["seed"])) for r in read_results(results) if r["status"] == "ok"}
    work_dir = out / "runs"
    references: dict = {}
    for seed in seeds:
        for method in methods:
            if (method, seed) in done:
                continue
            start = time.perf_counter()
            try:
                row = run_method(method, seed, config, sft_dir, reward_model_dir, work_dir, references)
            except Exception as error:  # one failed method must not lose the others' rows
                row = {"method": method, "seed": seed, "status": "failed", "error": f"{type(error).__name__}: {error}"}
            append_result(results, {**row, **prov})
            if progress:
                shown = {k: row.get(k) for k in ("win_rate_vs_sft", "gold_reward", "proxy_reward", "kl_to_sft")}
                print(f"{method} seed {seed}: {row['status']} in {time.perf_counter() - start:.0f}s {shown} "
                      f"{row.get('error', '')}", flush=True)
    if not keep_runs:
        shutil.rmtree(work_dir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.tasks.feedback_methods", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train and evaluate every method over seeds; "
                                                 "appends to OUT/results.csv")
    run_parser.add_argument("--out", required=True, help="directory of results.csv")
    run_parser.add_argument("--seeds", type=int, default=3, help="how many seeds: FIRST..FIRST+N-1")
    run_parser.add_argument("--first-seed", type=int, default=1,
                            help="the first seed (default 1; the ranking claims are tested on seeds 4-10)")
    run_parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    run_parser.add_argument("--reward-model", default=None, help="reward model directory (default: the cached build)")
    run_parser.add_argument("--keep-runs", action="store_true", help="keep the trainer's run directories (OUT/runs)")
    defaults = ComparisonConfig()
    for name in ("rm_queries", "best_of_n", "expert_rounds", "expert_n", "sft_epochs", "eval_samples_per_prompt",
                 "eval_size", "threads"):
        run_parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name),
                                help=f"ComparisonConfig.{name} (default {getattr(defaults, name)})")
    table_parser = commands.add_parser("table", help="the markdown table of a results directory")
    table_parser.add_argument("directory", help="a directory holding results.csv")
    table_parser.add_argument("--update", default=None,
                              help="rewrite the generated:feedback_methods block of this file")
    claims_parser = commands.add_parser("claims", help="AlpacaFarm's ranking as registered claims: verdicts on a "
                                                       "results directory, and the power analysis on the pilot")
    claims_parser.add_argument("directory", help="a directory holding results.csv (the claims' seeds)")
    claims_parser.add_argument("--pilot", default=None, help="the pilot's directory (default: the committed "
                                                             "method table, docs/results/feedback_methods)")
    claims_parser.add_argument("--update", default=None,
                               help="rewrite the generated:feedback_claims block of this file")
    args = parser.parse_args(argv)
    if args.command == "table":
        from ppo.tasks.feedback_report import main_table

        return main_table(Path(args.directory), args.update)
    if args.command == "claims":
        from ppo.tasks.feedback_report import PILOT_DIR, main_claims

        return main_claims(Path(args.directory), args.update, Path(args.pilot) if args.pilot else PILOT_DIR)
    if args.seeds < 1 or args.first_seed < 1:
        parser.error(f"--seeds and --first-seed must be at least 1 (got {args.seeds} and {args.first_seed})")
    try:
        config = ComparisonConfig(**{name: getattr(args, name) for name in (
            "rm_queries", "best_of_n", "expert_rounds", "expert_n", "sft_epochs", "eval_samples_per_prompt",
            "eval_size", "threads")})
    except ValueError as error:
        parser.error(str(error))
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    results = run(config, args.methods, seeds, Path(args.out), args.reward_model, args.keep_runs)
    failed = [r for r in read_results(results) if r["status"] != "ok"]
    print(f"results: {results}" + (f" ({len(failed)} failed rows)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""PPO and GRPO for language models in one file, to be read top to bottom.

This is the algorithm of `ppo/trainer.py` with its default toggles only, on the CPU testbed
(the arithmetic task, started from the cached SFT warm start of `ppo.models.sft.warm_start`). One
iteration runs the phases of the full trainer in the same order, each under a banner:
rollout, score, reference and values, KL, rewards, advantages, update. Tensor shapes are
written where a tensor is made: B responses, Q prompt tokens, T response tokens, V vocab.

    --algo ppo   PPO with a critic: `PPOConfig()` with the testbed's scale (`TESTBED_SCALE`):
                 k1 KL in the reward (beta 0.05), GAE (gamma 1, lambda 0.95) with the critic's
                 values, whitened advantages, 4 epochs of the clipped surrogate (0.2) plus the
                 clipped value loss (0.2, weight 0.1), token-mean losses, a separate AdamW for
                 the critic, each model's gradient clipped at norm 1.
    --algo grpo  `preset("grpo", testbed=True)`: 8 samples per prompt, no critic, group
                 advantages (score - group mean) / (group std + 1e-4), k3 KL in the loss
                 (beta 0.04), per-sequence mean of token means, one epoch.

Both sample purely (temperature 1, no top-k or top-p), score log-probs with the logits
divided by the temperature, and decay the learning rate linearly to 0 over `total_steps`.
AlpacaFarm's preset is not the one mirrored: its warm-up trains at lr 0 on the first step
and its reward whitening keeps values on padding, neither of which is a default.

Left out, each a toggle of the full trainer `ppo/trainer.py`: other presets and advantage
estimators (Dr. GRPO, RLOO, REINFORCE, rejection sampling), adaptive KL controllers, reward
whitening, missing-EOS penalties and score clipping, Kimi's length reward, the format reward,
difficulty filtering and dynamic sampling, entropy bonus, clip-higher and dual clip, target-KL
early stopping, gradient accumulation, reward models, LoRA, mixed precision, data-parallel
processes, held-out evaluation, checkpoints and logging; and its exact speed paths (the
KV-cached sampler, the lean forward, the reused update forward). Here sampling is plain
`model.generate` and every log-prob a plain Hugging Face forward pass, so this file computes
what the full trainer computes, to float rounding (tests/test_minimal.py).

Run:

    python -m ppo.minimal --algo ppo
    python -m ppo.minimal --algo grpo --total-steps 20
"""

from __future__ import annotations

import argparse
import copy
import random
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from einops import rearrange
from transformers import AutoModelForCausalLM, AutoTokenizer


def _arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    algo: str = _arg("ppo", "'ppo' (clipped surrogate + critic, GAE) or 'grpo' (group advantages, no critic)")
    seed: int = _arg(0, "seeds prompt sampling, rollouts and the minibatch order")
    total_steps: int = _arg(100, "RL iterations; the learning rate decays linearly to 0 over them")
    threads: int = _arg(2, "torch CPU threads")
    rollout_batch_size: int = _arg(64, "responses sampled per step (prompts x group_size)")
    group_size: int = _arg(1, "samples per prompt G, contiguous in the batch")
    response_length: int = _arg(64, "maximum new tokens per response")
    temperature: float = _arg(1.0, "sampling temperature; log-probs use logits / temperature too")
    kl_coef: float = _arg(0.05, "beta: the KL penalty's weight, in the reward (PPO, k1) or in the loss (GRPO, k3)")
    gamma: float = _arg(1.0, "GAE discount (PPO)")
    lam: float = _arg(0.95, "GAE lambda (PPO)")
    grpo_eps: float = _arg(1e-4, "added to the group std before dividing (GRPO)")
    ppo_epochs: int = _arg(4, "passes over each rollout batch")
    num_minibatches: int = _arg(1, "shuffled minibatches per epoch, one optimizer step each")
    cliprange: float = _arg(0.2, "PPO ratio clip epsilon")
    cliprange_value: float = _arg(0.2, "value clipping around the rollout's values (PPO)")
    vf_coef: float = _arg(0.1, "weight of the value loss (PPO)")
    lr: float = _arg(1e-4, "AdamW learning rate of policy and critic")
    adam_eps: float = _arg(1e-5, "AdamW epsilon")
    max_grad_norm: float = _arg(1.0, "gradient norm clip, each model on its own norm")


# The GRPO preset's changes to the defaults above (ppo/presets.py PRESETS["grpo"]).
ALGO_DEFAULTS = {"ppo": {}, "grpo": dict(group_size=8, kl_coef=0.04, ppo_epochs=1)}


def make_args(algo: str = "ppo", **overrides) -> Args:
    return Args(algo=algo, **{**ALGO_DEFAULTS[algo], **overrides})


class Critic(torch.nn.Module):
    """The value model: a copy of the policy's transformer and a zeroed linear head, one value
    per token (`value_model.ScalarHeadModel` with value_init='policy')."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)  # the policy's layers without the LM head
        self.head = torch.nn.Linear(policy.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)  # predicts 0 at first: no made-up baseline
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, **inputs) -> torch.Tensor:
        return self.head(self.backbone(**inputs).last_hidden_state).squeeze(-1)  # [B, L]


# ------------------------------------------------------------------------ forward passes
def model_inputs(batch: dict) -> dict:
    """Left-padded prompt + right-padded response, positions counted from the first real token."""
    input_ids = torch.cat([batch["query_ids"], batch["response_ids"]], 1)  # [B, Q+T]
    attention_mask = torch.cat([batch["query_mask"], batch["response_mask"]], 1)  # [B, Q+T]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, Q+T]
    return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def response_logprobs(policy, batch: dict, temperature: float) -> torch.Tensor:
    """Log-prob of each response token under softmax(logits / temperature), the distribution
    it was sampled from. The logits at position t predict token t+1, so the response is
    scored from the last prompt token up to its second-to-last token."""
    start = batch["query_ids"].shape[1] - 1
    logits = policy(**model_inputs(batch)).logits[:, start:-1].float() / temperature  # [B, T, V]
    log_probs = F.log_softmax(logits, dim=-1)  # [B, T, V]
    return log_probs.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)  # [B, T]


def response_values(critic, batch: dict) -> torch.Tensor:
    """The critic's value of the state before each response token."""
    start = batch["query_ids"].shape[1] - 1
    return critic(**model_inputs(batch))[:, start:-1]  # [B, T]


# ------------------------------------------------------------------------ the math
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, 0.0).sum() / mask.sum().clamp(min=1)


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO's aggregation: each response's mean over its tokens, then the mean over responses."""
    return (torch.where(mask.bool(), x, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the real tokens (population variance, float64 statistics)."""
    real = x[mask.bool()].double()  # [N]
    mean, var = real.mean().to(x.dtype), real.var(correction=0).to(x.dtype)
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + eps), 0.0)  # [B, T]


def gae(rewards, values, mask, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over response tokens, the value after the last token 0:
    delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1},  R_t = A_t + V_t.
    Rewards and values are 0 on padding, so padding adds nothing to any real token. With
    gamma = lam = 1, rewards [0, 0, 1] and values [0.5, 0.5, 0.5] give advantages [0.5, 0.5, 0.5]."""
    advantages = torch.zeros_like(rewards)  # [B, T]
    next_value = next_advantage = rewards.new_zeros(rewards.shape[0])  # [B]
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        next_advantage = delta + gamma * lam * next_advantage  # [B]
        advantages[:, t] = next_advantage * mask[:, t]
        next_value = values[:, t]
    return advantages, advantages + values  # returns are taken before any whitening


def group_advantages(scores: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """GRPO (DeepSeekMath): each score against the other samples of its prompt,
    (s - group mean) / (group population std + eps). Scores [1, 0, 0, 0] give
    [1.73, -0.58, -0.58, -0.58]; a group of equal scores gives 0."""
    grouped = rearrange(scores, "(b g) -> b g", g=group_size)  # [B/G, G]
    std = grouped.std(dim=-1, correction=0, keepdim=True)  # [B/G, 1]
    advantages = (grouped - grouped.mean(dim=-1, keepdim=True)) / (std + eps)  # [B/G, G]
    return rearrange(advantages, "b g -> (b g)")  # [B]


def kl_k1(logprobs, ref_logprobs):
    return logprobs - ref_logprobs  # [B, T]: unbiased, negative on some tokens


def kl_k3(logprobs, ref_logprobs):
    log_ratio = logprobs - ref_logprobs  # [B, T]
    return torch.expm1(-log_ratio) + log_ratio  # [B, T]: exp(-x) + x - 1 >= 0, unbiased


def clipped_surrogate(logprobs, old_logprobs, advantages, cliprange: float):
    """PPO's per-token loss -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A), and where the
    clipped (flat, zero-gradient) branch won. With eps 0.2 and A = 1, ratios [1.1, 1.5, 0.5]
    give [-1.1, -1.2 (clipped), -0.5]: moves the wrong way are never clipped."""
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    unclipped = -advantages * ratio  # [B, T]
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)  # [B, T]
    return torch.maximum(unclipped, clipped), clipped > unclipped  # [B, T] each


def clipped_value_loss(values, old_values, returns, cliprange_value: float):
    """0.5 max((V - R)^2, (V_clipped - R)^2), V_clipped within cliprange_value of the old value."""
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)  # [B, T]
    return 0.5 * torch.maximum((values - returns).square(), (values_clipped - returns).square())  # [B, T]


# ------------------------------------------------------------------------ the loop
def train(args: Args):
    """Run `args.total_steps` iterations; returns (per-step metrics, policy, critic or None)."""
    from ppo.models.sft import warm_start
    from ppo.tasks import ArithmeticTask

    ppo = args.algo == "ppo"
    # The seeds are set in ppo/trainer.py's order, so a seed draws the same prompts and samples.
    model_path = warm_start(progress=False)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    task = ArithmeticTask()
    prompt_rng = random.Random(args.seed)
    shuffle_rng = torch.Generator().manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    # Dropout would make the same tokens' log-probs differ between passes; the warm start has none.
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    reference = copy.deepcopy(policy).requires_grad_(False)  # the frozen SFT policy
    critic = Critic(policy) if ppo else None  # GRPO deletes the value model
    optimizers = [torch.optim.AdamW(model.parameters(), lr=args.lr, eps=args.adam_eps, weight_decay=0.0)
                  for model in (policy, critic) if model is not None]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    history = []

    for step in range(args.total_steps):
        for optimizer in optimizers:  # transformers' linear schedule without warm-up, once per RL step
            optimizer.param_groups[0]["lr"] = args.lr * ((args.total_steps - step) / args.total_steps)

        # ---- 1. rollout: G samples per prompt, contiguous ------------------------------
        problems = [p for p in task.sample_problems(args.rollout_batch_size // args.group_size, prompt_rng)
                    for _ in range(args.group_size)]  # [B]
        query = tokenizer([tokenizer.bos_token + p.prompt for p in problems], padding=True, return_tensors="pt")
        with torch.no_grad():  # pure sampling: no top-k, no top-p, so the samples follow the policy
            sequences = policy.generate(**query, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                                        max_new_tokens=args.response_length, eos_token_id=eos,
                                        pad_token_id=pad)  # [B, Q+T]
        response_ids = sequences[:, query["input_ids"].shape[1]:]  # [B, T]
        is_eos = (response_ids == eos).long()  # [B, T]
        response_mask = (is_eos.cumsum(-1) - is_eos == 0).long()  # [B, T]: up to and including EOS
        response_ids = response_ids.masked_fill(response_mask == 0, pad)  # [B, T]
        has_eos = is_eos.bool().any(-1)  # [B]
        batch = dict(query_ids=query["input_ids"], query_mask=query["attention_mask"], response_ids=response_ids,
                     response_mask=response_mask)
        mask = response_mask.float()  # [B, T]

        # ---- 2. score: the task's verifiable reward, 1 for a right answer ----------------
        texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        verdicts = [task.score(p, text, e) for p, text, e in zip(problems, texts, has_eos.tolist())]
        scores = torch.tensor([v.reward for v in verdicts])  # [B]
        correct = torch.tensor([float(v.correct) for v in verdicts])  # [B]

        # ---- 3. old log-probs, reference log-probs, values (no autograd) ---------------
        with torch.no_grad():
            old_logprobs = response_logprobs(policy, batch, args.temperature)  # [B, T]
            ref_logprobs = response_logprobs(reference, batch, args.temperature)  # [B, T]
            values = response_values(critic, batch) * mask if ppo else None  # [B, T]

        # ---- 4. KL to the reference: k1 in PPO's reward, k3 in GRPO's loss ------------
        kl = (kl_k1 if ppo else kl_k3)(old_logprobs, ref_logprobs) * mask  # [B, T]

        # ---- 5. rewards: -beta KL on every token, the score on the last one (PPO) -------
        if ppo:
            token_rewards = torch.where(mask.bool(), -args.kl_coef * kl, 0.0)  # [B, T]
            last = response_mask.sum(-1) - 1  # [B]
            token_rewards[torch.arange(len(last)), last] += scores

        # ---- 6. advantages --------------------------------------------------------------
        if ppo:
            advantages, returns = gae(token_rewards, values, mask, args.gamma, args.lam)  # [B, T] each
            advantages = whiten(advantages, mask)  # [B, T]
        else:
            advantages = group_advantages(scores, args.group_size, args.grpo_eps)[:, None] * mask  # [B, T]
        batch.update(old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, advantages=advantages)
        if ppo:
            batch.update(values=values, returns=returns)

        # ---- 7. update: epochs x shuffled minibatches ----------------------------------
        losses = {"pg_loss": [], "clipfrac": [], "vf_loss" if ppo else "kl_loss": []}
        for _ in range(args.ppo_epochs):
            order = torch.randperm(args.rollout_batch_size, generator=shuffle_rng)  # [B]
            for rows in order.chunk(args.num_minibatches):
                mb = {name: tensor[rows] for name, tensor in batch.items()}
                mb_mask = mb["response_mask"].float()  # [b, T]
                logprobs = response_logprobs(policy, mb, args.temperature)  # [b, T], with autograd
                pg_per_token, is_clipped = clipped_surrogate(logprobs, mb["old_logprobs"], mb["advantages"],
                                                             args.cliprange)  # [b, T] each
                if ppo:  # every token weighs the same (token mean), the critic in the same backward
                    pg_loss = masked_mean(pg_per_token, mb_mask)
                    new_values = response_values(critic, mb)  # [b, T]
                    extra = masked_mean(clipped_value_loss(new_values, mb["values"], mb["returns"],
                                                           args.cliprange_value), mb_mask)
                    loss = pg_loss + args.vf_coef * extra
                else:  # every response weighs the same; KL to the reference in the loss
                    pg_loss = seq_mean_token_mean(pg_per_token, mb_mask)
                    extra = seq_mean_token_mean(kl_k3(logprobs, mb["ref_logprobs"]), mb_mask)
                    loss = pg_loss + args.kl_coef * extra
                loss.backward()
                for model in (policy, critic):
                    if model is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                for optimizer in optimizers:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                for name, value in zip(losses, (pg_loss, masked_mean(is_clipped.float(), mb_mask), extra)):
                    losses[name].append(value.item())

        # ---- metrics: batch means ----------------------------------------------------------
        metrics = dict(step=step + 1, reward=float((token_rewards.sum(-1) if ppo else scores).mean()),
                       score=float(scores.mean()), accuracy=float(correct.mean()), kl=float(kl.sum(-1).mean()),
                       response_length=float(mask.sum(-1).mean()),
                       **{name: sum(values_) / len(values_) for name, values_ in losses.items()})
        history.append(metrics)
        print("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()),
              flush=True)
    return history, policy, critic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(Args):
        grpo = ALGO_DEFAULTS["grpo"].get(f.name)
        default = f"{f.default}" + (f"; grpo: {grpo}" if grpo is not None else "")
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                            choices=tuple(ALGO_DEFAULTS) if f.name == "algo" else None,
                            help=f"{f.metadata['help']} (default: {default})")
    given = {name: value for name, value in vars(parser.parse_args(argv)).items() if value is not None}
    train(make_args(**given))


if __name__ == "__main__":
    main()

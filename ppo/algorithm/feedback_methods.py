"""The objectives of AlpacaFarm's other methods for learning from pairwise feedback.

Besides PPO, AlpacaFarm (Dubois et al. 2023, arXiv 2305.14387, section 3.4 and appendix A;
tatsu-lab/alpaca_farm@30717dd) ships five reference methods. Each one reuses a piece of
the PPO pipeline (the SFT policy, the reward model, the preference data) and replaces the
RL update by something simpler. Their math lives here, tensors in and tensors out; the
comparison that trains and evaluates them on the testbed is `ppo.tasks.feedback_methods`.

- **Best-of-n** (`best_of_n_choice`): sample n responses, keep the one the proxy reward model
  scores highest. No training; the cost moves to inference (``examples/best_of_n.py``
  ``run_best_of_n``: decode, then ``run_rerank``, whose ``src/alpaca_farm/inference/score.py``
  ``rerank_sequences_with_huggingface`` keeps ``rewards.topk(1)``).
- **Expert iteration** (`supervised_nll`): fine-tune on the best-of-n samples of training
  prompts (README "Expert Iteration": ``best_of_n.py`` on the unlabeled split, then
  ``examples/scripts/expiter.sh``, which is ``supervised.py``), repeated for a few rounds here.
- **Quark** (`quantile_tokens`, `quark_loss`): sort a pool of sampled responses by reward,
  cut it into K equal quantiles, prepend quantile k's control token ``<reward_k>`` (0 the
  best) to the prompts of its responses, and train on them with the log-likelihood plus a
  full-distribution KL to the reference and an entropy term (``src/alpaca_farm/rl/
  quark_trainer.py`` ``DataPool.sort_and_get``, ``QuarkTrainer.compute_loss``). At
  evaluation the policy is conditioned on ``<reward_0>``.
- **Binary reward conditioning** and **binary FeedME** (`supervised_nll` again): supervised
  fine-tuning on the preference pairs, either on both responses each behind a good / bad
  token (conditioned on the good token at evaluation), or on the preferred responses only.
  Their data is built in `ppo.tasks.feedback_methods`.

Shapes: ``B`` responses, ``T`` response positions, ``V`` vocabulary; masks are 1 on real
response tokens (the stop token included).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppo.algorithm.kl import full_kl


def best_of_n_choice(proxy_scores: torch.Tensor) -> torch.Tensor:
    """Which of each prompt's n samples best-of-n returns: the argmax of the proxy reward.

    `proxy_scores` is ``[P, n]`` (n samples of each of P prompts); returns ``[P]`` indices.
    A tie goes to the first sample. The gold scorer never enters the choice: best-of-n can
    only be as good as the reward model's ranking.

    >>> best_of_n_choice(torch.tensor([[0.1, 0.7, 0.3], [2.0, -1.0, 2.0]])).tolist()
    [1, 0]
    """
    if proxy_scores.dim() != 2 or proxy_scores.shape[1] < 1:
        raise ValueError(f"proxy_scores: expected [prompts, n] with n >= 1, got shape {tuple(proxy_scores.shape)}")
    return proxy_scores.argmax(dim=1)  # [P]; torch returns the first maximal index


def best_of_n_kl(n: int) -> float:
    """``log n - (n - 1) / n``: the KL of best-of-n from the policy it samples, the formula
    Gao et al. 2022 (arXiv 2210.10760, section 2) use; exact when no two samples tie, an upper
    bound otherwise (Beirami et al. 2024, arXiv 2401.01879).

    >>> round(best_of_n_kl(16), 4)
    1.8351
    """
    if n < 1:
        raise ValueError(f"n: must be at least 1, got {n}")
    return float(torch.log(torch.tensor(float(n)))) - (n - 1) / n


def quantile_tokens(rewards: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Quark's quantile of each response, ``[N]``: 0 for the best-rewarded share, up to
    ``num_tokens - 1`` for the worst.

    AlpacaFarm's ``DataPool.sort_and_get``: sort the pool by reward, highest first (ties keep
    their order), cut it into ``num_tokens`` chunks of ``N // num_tokens``, the remainder
    going to the last (worst) chunk.

    >>> quantile_tokens(torch.tensor([0.5, 3.0, -1.0, 2.0, 1.0]), 2).tolist()  # chunks of 2, then 3
    [1, 0, 1, 0, 1]
    """
    if num_tokens < 2:
        raise ValueError(f"num_tokens: Quark needs at least 2 quantiles, got {num_tokens}")
    n = rewards.shape[0]
    if n < num_tokens:
        raise ValueError(f"rewards: {n} responses cannot fill {num_tokens} quantiles")
    order = torch.argsort(-rewards, stable=True)  # [N] best first, ties in pool order
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(n, device=rewards.device)  # [N] 0 = best
    return (ranks // (n // num_tokens)).clamp(max=num_tokens - 1)  # [N]


def supervised_nll(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The fine-tuning loss of expert iteration, FeedME and reward conditioning: the negative
    log-likelihood of the response tokens, averaged over every response token of the batch
    (what ``transformers.Trainer``'s cross-entropy with ignored prompt labels computes for
    AlpacaFarm's ``supervised.py``).

    >>> supervised_nll(torch.tensor([[-1.0, -3.0], [-2.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])).item()
    2.0
    """
    mask = response_mask.to(logprobs.dtype)  # [B, T]
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)


def full_kl_and_entropy(logits: torch.Tensor, ref_logits: torch.Tensor, vocab_size: int | None = None):
    """Per-token KL(pi || pi_ref) summed over the vocabulary, and the policy's entropy, ``[B, T]``.

    Quark's terms are exact sums over the next-token distribution, not the sampled-token
    estimates PPO uses. `vocab_size` keeps the first ``vocab_size`` logits of both: AlpacaFarm
    drops its added control tokens (``logits[..., :original_vocab_size]``) before both terms.
    """
    if vocab_size is not None:
        logits, ref_logits = logits[..., :vocab_size], ref_logits[..., :vocab_size]
    log_p = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    log_q = F.log_softmax(ref_logits.float(), dim=-1)  # [B, T, V]
    entropy = -(log_p.exp() * log_p).sum(-1)  # [B, T]
    return full_kl(log_p, log_q), entropy


def quark_loss(logprobs: torch.Tensor, kl: torch.Tensor, entropy: torch.Tensor, response_mask: torch.Tensor,
               kl_coef: float, entropy_coef: float, response_length: int) -> tuple[torch.Tensor, dict]:
    """Quark's loss, ``mean(-logprob + kl_coef * KL - entropy_coef * entropy)``.

    Each term is zero on padding and the mean runs over ``B * response_length`` positions: AlpacaFarm
    pads every response to ``response_len`` and takes ``.mean()`` over the padded tensor
    (``QuarkTrainer.compute_loss``), so the divisor is a constant, not the token count.
    `logprobs`, `kl`, `entropy` are ``[B, T]`` with ``T <= response_length``; the log-probs are of
    the responses under the conditioned policy, the KL and entropy from `full_kl_and_entropy`.
    Returns ``(loss, metrics)``.

    >>> lp, kl, ent = torch.tensor([[-1.0, -2.0]]), torch.tensor([[0.5, 0.1]]), torch.tensor([[1.0, 3.0]])
    >>> loss, _ = quark_loss(lp, kl, ent, torch.tensor([[1, 0]]), kl_coef=0.2, entropy_coef=0.1, response_length=4)
    >>> round(loss.item(), 6)  # (1 + 0.2 * 0.5 - 0.1 * 1) / (1 * 4)
    0.25
    """
    if logprobs.shape[1] > response_length:
        raise ValueError(f"responses are {logprobs.shape[1]} tokens wide, more than response_length {response_length}")
    mask = response_mask.to(logprobs.dtype)  # [B, T]
    per_token = (-logprobs + kl_coef * kl - entropy_coef * entropy) * mask  # [B, T]
    loss = per_token.sum() / (logprobs.shape[0] * response_length)
    tokens = mask.sum().clamp(min=1)
    logprobs, kl, entropy = logprobs.detach(), kl.detach(), entropy.detach()
    metrics = {"nll": float(-(logprobs * mask).sum() / tokens), "kl_per_token": float((kl * mask).sum() / tokens),
               "kl_per_sequence": float((kl * mask).sum() / logprobs.shape[0]),
               "entropy": float((entropy * mask).sum() / tokens), "loss": loss.item()}
    return loss, metrics

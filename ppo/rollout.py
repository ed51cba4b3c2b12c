"""Sampling responses from the policy: the rollout phase of every RL step.

Implementation details that live here:

- **Pure sampling** (`temperature`, `top_k=0`, `top_p=1.0`): PPO's ratio and KL assume the
  tokens came from the policy's own distribution (at the sampling temperature). Top-k or
  nucleus truncation would sample from a different distribution than the one whose
  log-probs we train on (N+ implementation details; AlpacaFarm and TRL sample purely).
  The model's saved ``generation_config`` is never trusted: settings are always passed.
- **Stop-token truncation and the response mask**: everything after the first stop token
  is padding; `response_mask` is 1 for real response tokens *including* the stop token, so
  the policy learns to emit it.
- **Missing-EOS detection** (`Rollout.has_eos`): a response that used all
  `max_new_tokens` without a stop token is flagged; `ppo.rewards` decides what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .policy import encode_prompts, left_pad


@dataclass
class Rollout:
    """One batch of sampled responses. Shapes: B = batch, Q = query length, T = response length."""

    query_ids: torch.Tensor  # [B, Q] left-padded
    query_mask: torch.Tensor  # [B, Q] 1 on real query tokens
    response_ids: torch.Tensor  # [B, T] right-padded with the pad token
    response_mask: torch.Tensor  # [B, T] 1 up to and including the stop token
    has_eos: torch.Tensor  # [B] bool: the response ended with a stop token
    generation_logits: torch.Tensor | None = None  # [B, T, V] raw logits, if requested

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # [B]

    def __len__(self) -> int:
        return self.response_ids.shape[0]


def truncate_after_stop(
    response_ids: torch.Tensor, stop_token_ids: list[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad everything after the first stop token and build the response mask.

    Returns `(response_ids, response_mask, has_eos)`.

    >>> ids = torch.tensor([[5, 2, 7, 7], [5, 6, 7, 8]])  # stop token 2, pad 0
    >>> out, mask, eos = truncate_after_stop(ids, [2], 0)
    >>> out.tolist(), mask.tolist(), eos.tolist()
    ([[5, 2, 0, 0], [5, 6, 7, 8]], [[1, 1, 0, 0], [1, 1, 1, 1]], [True, False])
    """
    is_stop = torch.isin(response_ids, torch.tensor(stop_token_ids, device=response_ids.device))  # [B, T]
    # stops_before[t] = number of stop tokens strictly before position t
    stops_before = is_stop.long().cumsum(-1) - is_stop.long()
    response_mask = (stops_before == 0).long()  # [B, T]
    has_eos = is_stop.any(-1)  # [B]
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_token_id))
    return response_ids, response_mask, has_eos


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    return_logits: bool = False,
    stop_token_ids: list[int] | None = None,
) -> Rollout:
    """Sample one response per prompt (pure sampling at `temperature`, or greedy).

    `top_k=0` and `top_p=1.0` (the defaults) mean no truncation of the distribution.

    Uses the global torch RNG: seed it (`torch.manual_seed`) for reproducible rollouts.
    `return_logits` keeps the raw generation logits so old log-probs can be taken from
    them instead of a second forward pass (PPOConfig.logprobs_from_generation).
    """
    stop_token_ids = stop_token_ids or [tokenizer.eos_token_id]
    device = next(model.parameters()).device
    query_ids, query_mask = left_pad(encode_prompts(tokenizer, prompts), tokenizer.pad_token_id)
    query_ids, query_mask = query_ids.to(device), query_mask.to(device)
    sampling = dict(do_sample=False) if greedy else dict(
        do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p
    )
    was_training = model.training
    model.eval()
    output = model.generate(
        input_ids=query_ids,
        attention_mask=query_mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_token_ids,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
        output_logits=return_logits,
        **sampling,
    )
    model.train(was_training)
    raw_response = output.sequences[:, query_ids.shape[1]:]  # [B, T<=max_new_tokens]
    response_ids, response_mask, has_eos = truncate_after_stop(raw_response, stop_token_ids, tokenizer.pad_token_id)
    logits = torch.stack(output.logits, dim=1) if return_logits else None  # [B, T, V]
    return Rollout(query_ids, query_mask, response_ids, response_mask, has_eos, logits)


def decode_responses(tokenizer: PreTrainedTokenizerBase, rollout: Rollout) -> list[str]:
    """Response texts without special tokens (what a scorer sees)."""
    return tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

"""Token log-probs, entropies and values of responses by a teacher-forced forward pass.

Implementation details that live here:

- **Temperature-scaled log-probs** (`PPOConfig.scale_logits_by_temperature`): responses
  were sampled from softmax(logits / T), so their log-probs, the KL and the PPO ratio must
  use logits / T too. Scoring them with T = 1 logits trains on a different distribution
  than the one sampled (N+ implementation details; TRL and AlpacaFarm divide by T).
- **Left-padded queries, right-padded responses**: the query and response are concatenated
  and position ids come from the attention mask, so padding never shifts positions.
- **Which logits score which token**: the logits at position ``t`` predict token ``t+1``,
  so the response tokens are scored by the logits from the last query token up to the
  second-to-last response token. Values follow the same convention: the value of the
  state *before* emitting each response token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .policy import position_ids_from_mask


def concat_query_response(query_ids, query_mask, response_ids, response_mask):
    """`(input_ids, attention_mask, position_ids)` of the full sequences, ``[B, Q+T]``."""
    input_ids = torch.cat([query_ids, response_ids], dim=1)  # [B, Q+T]
    attention_mask = torch.cat([query_mask, response_mask.to(query_mask.dtype)], dim=1)  # [B, Q+T]
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False):
    """Log-prob of `tokens` under softmax(logits / temperature), and optionally the entropy.

    >>> logits = torch.tensor([[[0.0, 0.0]]])  # one position, two equally likely tokens
    >>> logprobs_from_logits(logits, torch.tensor([[1]])).exp().item()
    0.5
    """
    logits = logits.float() / temperature  # [B, T, V]
    log_probs = F.log_softmax(logits, dim=-1)  # [B, T, V]
    token_logprobs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, T]
    if not with_entropy:
        return token_logprobs
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, T]
    return token_logprobs, entropy


def response_logprobs(model, query_ids, query_mask, response_ids, response_mask,
                      temperature: float = 1.0, with_entropy: bool = False):
    """Per-token log-probs (and entropies) of the response under `model`, ``[B, T]``.

    Runs with or without autograd depending on the caller's context (wrap rollout-time
    calls in ``torch.no_grad()``).
    """
    input_ids, attention_mask, position_ids = concat_query_response(query_ids, query_mask, response_ids, response_mask)
    query_length = query_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits  # [B, Q+T, V]
    response_logits = logits[:, query_length - 1:-1]  # [B, T, V]: position t predicts token t+1
    return logprobs_from_logits(response_logits, response_ids, temperature, with_entropy)


def response_values(value_model, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
    """The critic's value of the state before each response token, ``[B, T]``."""
    input_ids, attention_mask, position_ids = concat_query_response(query_ids, query_mask, response_ids, response_mask)
    values = value_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)  # [B, Q+T]
    return values[:, query_ids.shape[1] - 1:-1].float()  # [B, T]

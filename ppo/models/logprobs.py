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
- **No padding columns** (exact): a batch is cut to its longest real sequence before the
  forward pass (query columns that are padding in every row, response columns after every
  row's stop token), and the outputs are padded back to ``[B, T]`` with zeros. A micro-batch
  of short responses then costs what its tokens cost, not what the longest response of the
  whole rollout batch costs.
- **The last column never runs** (exact): its output would predict a token after the
  response, and by causality no earlier output depends on it.
- **The critic on padding** (`PPOConfig.value_loss_over_padding`, `padded_response_values`):
  AlpacaFarm's critic runs over the whole padded width; that pass keeps its padding columns.
- **The lean forward** (`PPOConfig.lean_forward`, `ppo.speed.lean_forward`): GPT-2 and Llama
  models run through their own modules without the Hugging Face call plumbing; with
  `PPOConfig.share_prompt_prefix` each distinct prompt of a batch runs once, and with
  `PPOConfig.paired_critic_pass` the policy's and the critic's passes over a batch run as one
  (`response_logprobs_and_values`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppo.speed.lean_forward import paired_critic, paired_response_outputs, response_logits, response_scalars
from ppo.models.policy import position_ids_from_mask


def concat_query_response(query_ids, query_mask, response_ids, response_mask):
    """`(input_ids, attention_mask, position_ids)` of the full sequences, ``[B, Q+T]``."""
    input_ids = torch.cat([query_ids, response_ids], dim=1)  # [B, Q+T]
    attention_mask = torch.cat([query_mask, response_mask.to(query_mask.dtype)], dim=1)  # [B, Q+T]
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def trim_padding(query_ids, query_mask, response_ids, response_mask):
    """Drop the query columns that are padding in every row (queries are left-padded) and the
    response columns after every row's last real token; returns the four tensors cut."""
    real_query = query_mask.bool().any(0).nonzero()
    first = int(real_query[0]) if len(real_query) else query_ids.shape[1] - 1
    first = min(first, query_ids.shape[1] - 1)  # keep at least one query column
    real_response = response_mask.bool().any(0).nonzero()
    width = int(real_response[-1]) + 1 if len(real_response) else 1
    return (query_ids[:, first:], query_mask[:, first:], response_ids[:, :width], response_mask[:, :width])


def _unpadded_inputs(query_ids, query_mask, response_ids, response_mask):
    """`((input_ids, attention_mask, position_ids), query_length, response_ids)` of the batch
    cut to its real columns (`trim_padding`)."""
    query_ids, query_mask, response_ids, response_mask = trim_padding(query_ids, query_mask, response_ids, response_mask)
    return concat_query_response(query_ids, query_mask, response_ids, response_mask), query_ids.shape[1], response_ids


def _pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the last dimension of `x` ``[B, t]`` to ``[B, width]``."""
    return x if x.shape[1] == width else F.pad(x, (0, width - x.shape[1]))


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
    width = response_ids.shape[1]
    inputs, query_length, response_ids = _unpadded_inputs(query_ids, query_mask, response_ids, response_mask)
    logits = response_logits(model, *inputs, query_length)  # [B, t, V]: position t predicts token t+1
    out = logprobs_from_logits(logits, response_ids, temperature, with_entropy)
    if not with_entropy:
        return _pad_columns(out, width)
    return _pad_columns(out[0], width), _pad_columns(out[1], width)


def response_values(value_model, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
    """The critic's value of the state before each response token, ``[B, T]``."""
    width = response_ids.shape[1]
    inputs, query_length, _ = _unpadded_inputs(query_ids, query_mask, response_ids, response_mask)
    values = response_scalars(value_model, *inputs, query_length)  # [B, t]
    return _pad_columns(values.float(), width)  # [B, T]


def padded_response_values(value_model, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
    """The critic's values at every response column ``[B, T]``, padding included, as
    AlpacaFarm's critic computes them (`PPOConfig.value_loss_over_padding`; rl_models.py
    `AutoregressiveValue.forward`): the whole padded batch through the module call, padding
    masked out as keys and given position 1, as transformers' `prepare_inputs_for_generation`
    gives it there. A padding column's value is the critic's output at that column. The lean
    path declines this pass: it runs real tokens only."""
    input_ids, attention_mask, position_ids = concat_query_response(query_ids, query_mask, response_ids, response_mask)
    position_ids = position_ids.masked_fill(attention_mask == 0, 1)
    values = value_model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                         position_ids=position_ids[:, :-1])  # [B, Q+T-1]: the last column predicts nothing
    return values[:, query_ids.shape[1] - 1:].float()  # [B, T]


def response_logprobs_and_values(policy, value_model, query_ids, query_mask, response_ids, response_mask,
                                 temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """`response_logprobs` with entropies and `response_values` of the same batch, ``[B, T]``
    each, as ``{"logprobs", "entropy", "values"}``: one stacked pass when
    `ppo.speed.lean_forward.pair` paired the two models (PPOConfig.paired_critic_pass), else a pass each."""
    if not paired_critic(policy, value_model):
        logprobs, entropy = response_logprobs(policy, query_ids, query_mask, response_ids, response_mask,
                                              temperature=temperature, with_entropy=True)
        values = response_values(value_model, query_ids, query_mask, response_ids, response_mask)
        return {"logprobs": logprobs, "entropy": entropy, "values": values}
    width = response_ids.shape[1]
    inputs, query_length, response_ids = _unpadded_inputs(query_ids, query_mask, response_ids, response_mask)
    logits, values = paired_response_outputs(policy, value_model, *inputs, query_length)  # [B, t, V], [B, t]
    logprobs, entropy = logprobs_from_logits(logits, response_ids, temperature, with_entropy=True)
    return {"logprobs": _pad_columns(logprobs, width), "entropy": _pad_columns(entropy, width),
            "values": _pad_columns(values.float(), width)}

"""Sampling responses from the policy: the rollout phase of every RL step.

Implementation details that live here:

- **Pure sampling** (`temperature`, `top_k=0`, `top_p=1.0`): PPO's ratio and KL assume the
  tokens came from the policy's own distribution (at the sampling temperature). Top-k or
  nucleus truncation would sample from a different distribution than the one whose
  log-probs we train on (N+ implementation details; AlpacaFarm and TRL sample purely).
- **A generation config built from `PPOConfig` only** (`sampling_config`): a checkpoint's
  saved ``generation_config`` may carry ``repetition_penalty``, ``no_repeat_ngram_size``,
  ``top_k=50``, ... and transformers fills every setting we leave unset from it. Any of
  them reshapes the sampling distribution, so the rollouts would be off-policy for the
  log-probs the loss uses. `generate` swaps in a complete config of its own for the call.
- **Stop tokens** (`PPOConfig.stop_token_ids`): by default every EOS id the checkpoint
  declares (`ppo.models.policy.declared_stop_token_ids`), not only the tokenizer's; an empty list
  means none, as in TRL's default: every response runs to `max_new_tokens`.
- **Prompt length** (`PPOConfig.max_prompt_length`, `PPOConfig.prompt_truncation`): a
  prompt longer than the limit is cut (left or right, keeping BOS) or refused with an
  error naming the field, before it can reach the model's position table.
- **Stop-token truncation and the response mask**: everything after the first stop token
  is padding; `response_mask` is 1 for real response tokens *including* the stop token, so
  the policy learns to emit it.
- **Fixed-width padding** (`PPOConfig.pad_to_response_length`, `pad_to_width`): every
  batch right-padded to `response_length`, as AlpacaFarm does, for the toggles that take
  statistics over padding.
- **Missing-EOS detection** (`Rollout.has_eos`): a response that used all
  `max_new_tokens` without a stop token is flagged; `ppo.algorithm.rewards` decides what that costs.
  With no stop token, a response is flagged when it holds no EOS id anywhere (TRL's
  `contain_eos_token`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ppo.speed import lean_forward, lean_sampling
from ppo.models.policy import (context_length, declared_stop_token_ids, encode_prompts, left_pad, scoring_mode,
                     truncate_prompt)

PROMPT_TRUNCATION_MODES = ("left", "right", "error")


class PromptTooLongError(ValueError):
    """A prompt does not fit `max_prompt_length` and truncation is 'error'."""


@dataclass
class Rollout:
    """One batch of sampled responses. Shapes: B = batch, Q = query length, T = response length."""

    query_ids: torch.Tensor  # [B, Q] left-padded
    query_mask: torch.Tensor  # [B, Q] 1 on real query tokens
    response_ids: torch.Tensor  # [B, T] right-padded with the pad token
    response_mask: torch.Tensor  # [B, T] 1 up to and including the stop token
    has_eos: torch.Tensor  # [B] bool: the response ended with a stop token
    generation_logits: torch.Tensor | None = None  # [B, T, V] raw logits, if requested
    prompt_truncated: torch.Tensor | None = None  # [B] bool: the prompt was cut to max_prompt_length
    sampler_logprobs: torch.Tensor | None = None  # [B, T] the sampler's own log-probs (vLLM), 0 on padding

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # [B]

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def to(self, device) -> "Rollout":
        """The batch's id, mask and stop tensors moved to `device` (in place; returns self)."""
        for name in ("query_ids", "query_mask", "response_ids", "response_mask", "has_eos", "sampler_logprobs"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        return self


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
    stops = torch.tensor(stop_token_ids, dtype=response_ids.dtype, device=response_ids.device)
    is_stop = torch.isin(response_ids, stops)  # [B, T]
    # stops_before[t] = number of stop tokens strictly before position t
    stops_before = is_stop.long().cumsum(-1) - is_stop.long()
    response_mask = (stops_before == 0).long()  # [B, T]
    has_eos = is_stop.any(-1)  # [B]
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_token_id))
    return response_ids, response_mask, has_eos


def responses_and_masks(raw_response: torch.Tensor, stop_token_ids: list[int], model, tokenizer):
    """`truncate_after_stop` of sampled tokens. With no stop token every response runs to the
    length limit, so "missing EOS" means no EOS id of the checkpoint anywhere in it, as TRL's
    ``contain_eos_token`` has it."""
    response_ids, response_mask, has_eos = truncate_after_stop(raw_response, stop_token_ids, tokenizer.pad_token_id)
    if not stop_token_ids:
        eos = torch.tensor(declared_stop_token_ids(model, tokenizer), dtype=raw_response.dtype,
                           device=raw_response.device)
        has_eos = torch.isin(raw_response, eos).any(-1)  # [B]
    return response_ids, response_mask, has_eos


def sampling_config(max_new_tokens: int, stop_token_ids: list[int], pad_token_id: int, temperature: float = 1.0,
                    greedy: bool = False, top_k: int = 0, top_p: float = 1.0) -> GenerationConfig:
    """The complete generation config of a rollout: every logits processor transformers
    would otherwise take from the checkpoint is set to its neutral value here."""
    neutral = dict(
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0, min_length=0, typical_p=1.0, min_p=None,
        epsilon_cutoff=0.0, eta_cutoff=0.0, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
        forced_bos_token_id=None, forced_eos_token_id=None, sequence_bias=None, renormalize_logits=False,
        exponential_decay_length_penalty=None, num_beams=1, num_beam_groups=1, penalty_alpha=None,
        guidance_scale=None, watermarking_config=None, diversity_penalty=0.0, length_penalty=1.0,
        num_return_sequences=1, use_cache=True,
    )
    sampling = dict(do_sample=False) if greedy else dict(
        do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=list(stop_token_ids) or None,
                              pad_token_id=pad_token_id, **neutral, **sampling)
    return config


@contextlib.contextmanager
def _only_generation_config(model, generation_config: GenerationConfig):
    """Make `generation_config` the model's own for the call, so no saved setting can be
    merged into it (transformers fills unset fields from ``model.generation_config``)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the HF model
    saved = inner.generation_config
    inner.generation_config = generation_config
    try:
        yield
    finally:
        inner.generation_config = saved


def encode_queries(tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_prompt_length: int | None,
                   truncation: str = "left") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded `(query_ids, query_mask, truncated)`; prompts over `max_prompt_length`
    tokens are cut on `truncation`'s side, or refused when it is 'error'."""
    if truncation not in PROMPT_TRUNCATION_MODES:
        raise ValueError(f"prompt_truncation: expected one of {PROMPT_TRUNCATION_MODES}, got {truncation!r}")
    encoded, truncated = [], []
    for index, ids in enumerate(encode_prompts(tokenizer, prompts)):
        too_long = max_prompt_length is not None and len(ids) > max_prompt_length
        if too_long and truncation == "error":
            raise PromptTooLongError(
                f"prompts[{index}] has {len(ids)} tokens, more than PPOConfig.max_prompt_length={max_prompt_length} "
                "(set prompt_truncation='left' or 'right' to cut it, or raise max_prompt_length within the "
                "model's context)")
        if too_long:
            ids = truncate_prompt(ids, max_prompt_length, truncation, tokenizer.bos_token_id)
        encoded.append(ids)
        truncated.append(too_long)
    query_ids, query_mask = left_pad(encoded, tokenizer.pad_token_id)
    return query_ids, query_mask, torch.tensor(truncated, dtype=torch.bool)


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
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
) -> Rollout:
    """Sample one response per prompt (pure sampling at `temperature`, or greedy).

    `top_k=0` and `top_p=1.0` (the defaults) mean no truncation of the distribution; no
    other setting of the checkpoint's generation config is used (`sampling_config`).
    `stop_token_ids` defaults to every EOS id the checkpoint declares; ``[]`` means none
    (`responses_and_masks` says what missing EOS then means).
    `max_prompt_length` defaults to the model's context minus `max_new_tokens`, so an
    over-long prompt is an error naming the limit, never an IndexError in the model.

    Uses the global torch RNG: seed it (`torch.manual_seed`) for reproducible rollouts.
    `return_logits` keeps the raw generation logits so old log-probs can be taken from
    them instead of a second forward pass (PPOConfig.logprobs_from_generation).
    """
    stop_token_ids = list(declared_stop_token_ids(model, tokenizer) if stop_token_ids is None else stop_token_ids)
    if max_prompt_length is None and context_length(model) is not None:
        max_prompt_length = context_length(model) - max_new_tokens
        if max_prompt_length < 1:
            raise ValueError(f"response length {max_new_tokens} leaves no room for a prompt in the model's "
                             f"context of {context_length(model)} positions")
    device = next(model.parameters()).device
    query_ids, query_mask, truncated = encode_queries(tokenizer, prompts, max_prompt_length, prompt_truncation)
    query_ids, query_mask = query_ids.to(device), query_mask.to(device)
    if lean_forward.lean_backbone(model) is not None and top_k == 0 and top_p == 1.0:
        # The same sampling rule through the lean KV-cached loop (ppo/speed/lean_sampling.py).
        raw_response, logits = lean_sampling.sample(model, query_ids, query_mask, max_new_tokens, stop_token_ids,
                                                   tokenizer.pad_token_id, temperature, greedy, return_logits)
        response_ids, response_mask, has_eos = responses_and_masks(raw_response, stop_token_ids, model, tokenizer)
        return Rollout(query_ids, query_mask, response_ids, response_mask, has_eos, logits, truncated.to(device))
    generation_config = sampling_config(max_new_tokens, stop_token_ids, tokenizer.pad_token_id, temperature,
                                        greedy, top_k, top_p)
    generation_config.return_dict_in_generate = True
    generation_config.output_logits = return_logits
    with scoring_mode(model), _only_generation_config(model, generation_config):
        output = model.generate(
            input_ids=query_ids,
            attention_mask=query_mask,
            generation_config=generation_config,
        )
    raw_response = output.sequences[:, query_ids.shape[1]:]  # [B, T<=max_new_tokens]
    response_ids, response_mask, has_eos = responses_and_masks(raw_response, stop_token_ids, model, tokenizer)
    logits = torch.stack(output.logits, dim=1) if return_logits else None  # [B, T, V]
    return Rollout(query_ids, query_mask, response_ids, response_mask, has_eos, logits, truncated.to(device))


def pad_to_width(rollout: Rollout, width: int, pad_token_id: int) -> Rollout:
    """The rollout right-padded to `width` response columns (AlpacaFarm pads every batch to
    `response_len`, `PPOConfig.pad_to_response_length`), so statistics taken over padding
    see a fixed width rather than the batch's longest response. The new columns are
    padding: outside `response_mask`, pad tokens, zero generation logits.

    >>> r = Rollout(torch.ones(1, 2), torch.ones(1, 2), torch.tensor([[5, 2]]), torch.tensor([[1, 1]]),
    ...             torch.tensor([True]))
    >>> pad_to_width(r, 4, 0).response_ids.tolist(), pad_to_width(r, 4, 0).response_mask.tolist()
    ([[5, 2, 0, 0]], [[1, 1, 0, 0]])
    """
    missing = width - rollout.response_ids.shape[1]
    if missing < 0:
        raise ValueError(f"rollout is {rollout.response_ids.shape[1]} tokens wide, more than the width {width}")
    if missing == 0:
        return rollout
    pad = torch.nn.functional.pad
    logits, sampler_logprobs = rollout.generation_logits, rollout.sampler_logprobs
    return dataclasses.replace(
        rollout,
        sampler_logprobs=None if sampler_logprobs is None else pad(sampler_logprobs, (0, missing)),  # [B, width]
        response_ids=pad(rollout.response_ids, (0, missing), value=pad_token_id),  # [B, width]
        response_mask=pad(rollout.response_mask, (0, missing), value=0),  # [B, width]
        generation_logits=None if logits is None else pad(logits, (0, 0, 0, missing)))  # [B, width, V]


def decode_responses(tokenizer: PreTrainedTokenizerBase, rollout: Rollout) -> list[str]:
    """Response texts without special tokens (what a scorer sees)."""
    return tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

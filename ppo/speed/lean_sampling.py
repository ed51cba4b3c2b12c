"""KV-cached sampling for GPT-2 and Llama models on the lean forward (PPOConfig.lean_forward).

`generate` adds per-token logits processors, stopping criteria and cache objects around
every step; for the small models of the testbed that costs as much as the arithmetic. Here
`sample` runs the model's layers through ppo/speed/lean_forward.py with a key/value buffer per layer
(compiled, every step has the same shapes and the unfilled positions are masked; eager, a step
reads only the filled part), prefills each distinct prompt once, drops rows that have finished
once they are a quarter of the cache, and draws each token from softmax(logits / T) for every
row as ``torch.multinomial`` draws it (`_draw`): `generate`'s rule, so a seed gives the same
samples (tests/test_lean_forward.py).
"""

from __future__ import annotations

import torch

from ppo.speed import lean_forward
from ppo.speed.batch_layouts import distinct_prompts


def _prefill(backbone, query_ids, query_mask, positions, cache: lean_forward.KVCache) -> torch.Tensor:
    """Run the prompts into the cache; each distinct prompt once (a GRPO batch repeats every
    prompt G times), its keys, values and last hidden state copied to its rows. Rows of a
    batch do not interact, so this is the same arithmetic as the full batch."""
    found = distinct_prompts(query_ids, query_mask)
    last = query_ids.shape[1] - 1  # only the last position's output is read (the first token's logits)
    if found is None:
        return lean_forward.hidden_states(backbone, query_ids, positions, query_mask, cache, keep_from=last)
    first, inverse = found
    width = query_ids.shape[1]
    distinct = lean_forward.KVCache(keys=[k.new_zeros(len(first), k.shape[1], width, k.shape[3]) for k in cache.keys],
                       values=[v.new_zeros(len(first), v.shape[1], width, v.shape[3]) for v in cache.values])
    hidden = lean_forward.hidden_states(backbone, query_ids[first], positions[first], query_mask[first], distinct,
                                        keep_from=last)
    for layer in range(len(cache.keys)):
        cache.keys[layer][:, :, :width] = distinct.keys[layer][inverse]
        cache.values[layer][:, :, :width] = distinct.values[layer][inverse]
    cache.length = width
    return hidden[inverse]


def sample(model, query_ids: torch.Tensor, query_mask: torch.Tensor, max_new_tokens: int,
           stop_token_ids: list[int], pad_token_id: int, temperature: float = 1.0, greedy: bool = False,
           return_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample up to `max_new_tokens` per row with a KV cache; returns the new tokens
    ``[B, T]`` (pad after a row's stop token; T stops growing once every row has stopped)
    and, if asked, the raw logits of each step ``[B, T, V]`` (zeros for a row once it has
    finished and left the cache: `_drop_finished_rows`).

    The rule is `generate`'s with pure sampling: logits in float32 divided by the
    temperature, softmax, one ``torch.multinomial`` draw per row per step (`_draw`; finished
    rows draw too and are overwritten by pad), or argmax when greedy. Non-finite logits are an
    error, as they are for ``torch.multinomial``.
    """
    # Inference mode skips autograd's version counters and view tracking; its tensors are
    # copied on the way out, so the rollout's ids and logits are ordinary tensors the update
    # may use under autograd.
    with torch.inference_mode():
        response, logits = _sample_loop(model, query_ids, query_mask, max_new_tokens, stop_token_ids,
                                        pad_token_id, temperature, greedy, return_logits)
    return response.clone(), (logits.clone() if logits is not None else None)


def _sample_loop(model, query_ids, query_mask, max_new_tokens, stop_token_ids, pad_token_id, temperature, greedy,
                 return_logits):
    backbone = lean_forward.lean_backbone(model)
    batch, prompt_length = query_ids.shape
    config = backbone.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    weight = backbone.get_input_embeddings().weight
    capacity = prompt_length + max_new_tokens
    layers = config.num_hidden_layers
    # zeros: masked slots must not hold NaN
    cache = lean_forward.KVCache(keys=[weight.new_zeros(batch, heads, capacity, head_dim) for _ in range(layers)],
                                 values=[weight.new_zeros(batch, heads, capacity, head_dim) for _ in range(layers)])
    key_mask = torch.zeros(batch, capacity, dtype=torch.long, device=query_ids.device)
    key_mask[:, :prompt_length] = query_mask
    # positions as `generate` gives them: counted over real tokens, padding gets 1
    positions = query_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(query_mask == 0, 1)
    next_position = positions[:, -1:] + 1  # [B, 1]
    stops = torch.tensor(stop_token_ids, dtype=torch.long, device=query_ids.device)  # may be empty: no stop token
    slots = torch.arange(capacity, device=query_ids.device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=query_ids.device)
    finite = torch.ones((), dtype=torch.bool, device=query_ids.device)
    tokens, step_logits = [], []
    inputs = query_ids
    rows = torch.arange(batch, device=query_ids.device)  # the batch rows the cache holds, in order
    compiled = backbone.__dict__.get(lean_forward.COMPILE_ATTRIBUTE)
    for step in range(max_new_tokens):
        width = cache.length + inputs.shape[1]
        if step == 0:
            hidden = _prefill(backbone, query_ids, query_mask, positions, cache)
        else:  # one token into the static cache, attending over its filled part (compiled: all of it)
            cache.slot = slots[width - 1:width]
            cache.filled = None if compiled else width
            hidden = lean_forward.hidden_states(backbone, inputs, positions, key_mask[:, :cache.filled], cache)
        logits = model.lm_head(hidden[:, -1:]).squeeze(1).float()  # [b, V]: the rows still in the cache
        if len(rows) < batch:  # dropped rows (finished) get zero logits: they draw, and become pad
            logits = logits.new_zeros(batch, logits.shape[1]).index_copy_(0, rows, logits)  # [B, V]
        if return_logits:
            step_logits.append(logits)
        finite &= torch.isfinite(logits).all()
        new = logits.argmax(-1) if greedy else _draw(logits if temperature == 1.0 else logits / temperature)
        new = torch.where(unfinished, new, pad_token_id)
        tokens.append(new)
        unfinished = unfinished & ~torch.isin(new, stops)
        running = int(unfinished.sum())  # the unfinished rows are all in the cache
        if not running or step == max_new_tokens - 1:
            break
        key_mask[:, width] = 1
        rows, key_mask = _drop_finished_rows(cache, rows, unfinished, running, key_mask)
        inputs, positions = new[rows, None], next_position[rows]
        next_position = next_position + 1
    if not finite:
        raise ValueError("sampling: the logits hold inf or NaN (non-finite weights or activations); "
                         "no token can be drawn from them")
    response = torch.stack(tokens, dim=1)  # [B, T]
    return response, (torch.stack(step_logits, dim=1) if return_logits else None)


def _draw(logits: torch.Tensor) -> torch.Tensor:
    """One token per row from softmax(`logits`): what ``torch.multinomial(probs, 1)`` computes
    on the CPU (argmax of probs / q for q ~ Exp(1), drawn from the global generator), the same
    samples for a seed, without the call's per-step input checks (two reductions and two reads
    back each step; the loop checks its logits once, at the end)."""
    probs = torch.softmax(logits, dim=-1)
    if probs.device.type != "cpu":  # another device's kernel draws differently: use it
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)


COMPACT_BELOW = 0.75  # drop finished rows once the running ones are at most this share of the cache


def _drop_finished_rows(cache: lean_forward.KVCache, rows: torch.Tensor, unfinished: torch.Tensor, running: int,
                        key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the cache rows of finished responses once they are a quarter of it; returns the
    batch rows the cache holds now and their key mask (`running` rows are unfinished). Rows do
    not interact, so the running rows compute what they would have (a sampling step's cost
    falls with its rows), and the cache is copied only a few times per batch."""
    if running > COMPACT_BELOW * len(rows):
        return rows, key_mask
    keep = unfinished[rows].nonzero().squeeze(1)
    cache.keys = [k[keep] for k in cache.keys]
    cache.values = [v[keep] for v in cache.values]
    return rows[keep], key_mask[keep]

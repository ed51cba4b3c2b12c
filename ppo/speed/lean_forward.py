"""A lean forward pass for GPT-2 and Llama models (its KV-cached sampler: ppo/speed/lean_sampling.py).

`PPOConfig.lean_forward` (on by default). Every forward pass of an RL step (generation,
old / reference log-probs, values, the update) goes through a Hugging Face model's
``forward``, which on every call builds a 4-D mask, dispatches the attention kernel, wraps
caches and outputs in objects and checks its arguments. For the small models of the
testbed that plumbing costs as much as the arithmetic; `generate` adds per-token logits
processors and stopping criteria on top.

Here the model's own weights go through the same operations called directly: one
precomputed additive mask, matmul attention (the 'eager' kernel; SDPA for a single new
token), and torch's fused kernels where the model spells a formula out op by op (GPT-2's
tanh-GELU, Llama's RMSNorm). It is the same math: log-probs agree with the module call to
float rounding (tests/test_lean_forward.py), and gradients reach the same parameters, so
optimizers and checkpoints are unchanged. `hidden_states` also runs the sampler's steps
(ppo/speed/lean_sampling.py) over a `KVCache`. `PPOConfig.compile_forward` hands the fixed-shape calls to torch.compile. Teacher-forced
passes (`response_logits`, `response_scalars`) never run a sequence's last column (no
output they return depends on it), run the last layer's queries and MLP only on the
columns whose outputs are read (`_last_rows`: the response positions; the prompt's last
position when prefilling the sampler) and, with `PPOConfig.share_prompt_prefix`, run each
distinct prompt of the batch once (`SharedPrompts`; on small batches in one pass over each
prompt group, `PromptGroups`): a GRPO batch repeats every prompt G times. With
`PPOConfig.padding_free` they carry only the real tokens between the attention calls
(`Packing`): the products, norms and activations never see a padding position. These
layouts of a batch's tokens live in ppo/speed/batch_layouts.py. With `PPOConfig.paired_critic_pass`
PPO's update pass runs the policy and its critic as one pass over both models' stacked
weights (`paired_response_outputs`; the pair: ppo/speed/model_pairs.py).

Used only where it is the same computation: a plain `GPT2LMHeadModel` / `LlamaForCausalLM`
(or their backbones inside a `ScalarHeadModel`) in eval mode or with every dropout at 0,
without gradient checkpointing, not wrapped by DDP or peft, GPT-2 without the
``reorder_and_upcast_attn`` variant. Anything else falls back to the module call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ppo.speed import batch_layouts
from ppo.speed.batch_layouts import Packing, SharedPrompts, distinct_prompts
from ppo.speed.model_pairs import Stacked, same_architecture, side_by_side

LEAN_ATTRIBUTE = "_lean_forward_backbone"
COMPILE_ATTRIBUTE = "_lean_forward_compiled"
SHARE_ATTRIBUTE = "_lean_forward_share_prompts"
PACK_ATTRIBUTE = "_lean_forward_padding_free"
PAIR_ATTRIBUTE = "_lean_forward_paired_critic"


def _class_name(module) -> str:
    """The class name of `module`, or of the first model of a `Stacked` pair."""
    return type(module._first if isinstance(module, Stacked) else module).__name__


def _backbone_kind(backbone: nn.Module) -> str | None:
    name = _class_name(backbone)
    if name == "GPT2Model" and not getattr(backbone.config, "reorder_and_upcast_attn", False):
        return "gpt2"
    if name == "LlamaModel":
        return "llama"
    return None


def dropout_active(model: nn.Module) -> bool:
    """Whether any dropout of `model` would change its outputs in train mode: an
    `nn.Dropout` or a float ``*drop*`` attribute a module reads at run time (attention
    dropout), above 0 (`ppo.models.policy.disable_dropout` sets them all to 0)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        if any(isinstance(v, float) and "drop" in k.lower() and v > 0 for k, v in vars(module).items()):
            return True
    return False


def supported_backbone(model: nn.Module) -> nn.Module | None:
    """The HF backbone (GPT2Model / LlamaModel) of `model` if the lean path computes exactly
    what its forward computes, else None."""
    if type(model).__name__ in ("GPT2LMHeadModel", "LlamaForCausalLM"):
        backbone = model.base_model
    elif hasattr(model, "backbone") and hasattr(model, "head"):  # value_model.ScalarHeadModel
        backbone = model.backbone
    else:
        return None
    if _backbone_kind(backbone) is None or getattr(backbone, "gradient_checkpointing", False):
        return None
    if dropout_active(backbone):
        return None
    return backbone


_COMPILED: dict = {}


def _compiled(run):
    """`run` compiled once per process by torch.compile (inductor, dynamic shapes, so a new
    response length or cache length does not recompile)."""
    if run not in _COMPILED:
        _COMPILED[run] = torch.compile(run, dynamic=True)
    return _COMPILED[run]


def enable(*models: nn.Module | None, compile: bool = False, share_prompts: bool = True,
           padding_free: bool = True) -> list[str]:
    """Mark each supported model for the lean path (and, with `compile`, for its compiled
    form: PPOConfig.compile_forward; with `share_prompts`, for one pass per distinct prompt
    in scoring passes: PPOConfig.share_prompt_prefix; with `padding_free`, for teacher-forced
    passes over real tokens only: PPOConfig.padding_free); returns the class names that were
    not supported (they keep their module call)."""
    skipped = []
    for model in models:
        if model is None:
            continue
        backbone = supported_backbone(model)
        if backbone is None:
            skipped.append(type(model).__name__)
        else:
            # A plain attribute, not a registered submodule: state_dict and save_pretrained
            # must not see the backbone twice.
            object.__setattr__(model, LEAN_ATTRIBUTE, backbone)
            object.__setattr__(backbone, COMPILE_ATTRIBUTE, compile)
            object.__setattr__(backbone, SHARE_ATTRIBUTE, share_prompts)
            object.__setattr__(backbone, PACK_ATTRIBUTE, padding_free)
    return skipped


def lean_backbone(model: nn.Module) -> nn.Module | None:
    return model.__dict__.get(LEAN_ATTRIBUTE)


# ---- the policy and its critic as one pass (the pair itself: ppo/speed/model_pairs.py) ---------------
def pair(policy: nn.Module, value_model: nn.Module | None) -> bool:
    """Mark `policy` to run its update passes together with `value_model`'s as one stacked
    pass (PPOConfig.paired_critic_pass, `paired_response_outputs`) when both are on the lean
    path with the same architecture, shapes and layout switches, not compiled; returns
    whether they were paired. The mark is a plain attribute: state_dict never sees it. Paired
    backbones keep their parameters in the two rows of one tensor (`side_by_side`), so a pass
    reads their stacked weights without copying them."""
    first = lean_backbone(policy)
    second = lean_backbone(value_model) if value_model is not None else None
    if first is None or second is None or first.__dict__.get(COMPILE_ATTRIBUTE):
        return False
    if not same_architecture(first, second) or any(first.__dict__.get(k) != second.__dict__.get(k)
                                                   for k in (SHARE_ATTRIBUTE, PACK_ATTRIBUTE)):
        return False
    object.__setattr__(policy, PAIR_ATTRIBUTE, value_model)
    side_by_side(first, second)  # each pass then reads the stacked weights without copying them
    return True


def paired_critic(policy: nn.Module, value_model: nn.Module | None) -> bool:
    """Whether `pair` paired `policy` with this `value_model`."""
    return value_model is not None and policy.__dict__.get(PAIR_ATTRIBUTE) is value_model


# ---- masks ------------------------------------------------------------------------------------
def additive_mask(key_mask: torch.Tensor, query_length: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, Lq, Lk]``: 0 where query i may attend key j (j <= its position, key real),
    the dtype's most negative number elsewhere (finite, so an all-padding row stays finite
    and contributes nothing)."""
    key_length = key_mask.shape[1]
    offset = key_length - query_length  # queries are the last Lq positions
    causal = torch.ones(query_length, key_length, dtype=torch.bool, device=key_mask.device).tril(offset)
    allowed = causal[None] & key_mask.bool()[:, None, :]  # [B, Lq, Lk]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=key_mask.device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


# ---- the blocks -------------------------------------------------------------------------------
@dataclass
class KVCache:
    """Keys and values of every layer, ``[B, heads, capacity, head_dim]``, filled up to `length`."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0
    # Sampling steps write one token at `slot` (a 1-element tensor). Compiled, they attend
    # over the whole buffer, unfilled positions masked: every step has the same shapes (a
    # static cache), so a compiled step is compiled once. Eager, they attend over the first
    # `filled` positions only: the unfilled ones would get exactly zero weight, and reading
    # them is most of a one-token attention call's time (it scales with the keys read).
    slot: torch.Tensor | None = None
    filled: int | None = None


def _split_heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``[..., n * d]`` -> ``[..., n, d]`` (a view)."""
    return t.view(*t.shape[:-1], -1, head_dim)


def _heads(t: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    """``[B, L, n, d]`` (or packed ``[N, n, d]``) -> ``[B, n, L, d]``, the grid attention runs on."""
    if packing is not None:
        t = packing.unpack(t)
    return t.transpose(1, 2)


def _merge_heads(out: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    """Attention output ``[B, L, n, d]`` -> ``[B, L, n * d]`` (or packed ``[N, n * d]``)."""
    out = out.reshape(*out.shape[:-2], -1)
    return out if packing is None else packing.pack(out)


def _attend(query, key, value, bias, scaling):
    if query.shape[2] == 1:  # one new token (sampling): the fused kernel is faster here
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias.to(query.dtype), scale=scaling)
        return out.transpose(1, 2)  # [B, 1, h, d]
    weights = torch.matmul(query, key.transpose(-1, -2)) * scaling + bias  # [B, h, Lq, Lk]
    weights = torch.softmax(weights, dim=-1).type(value.dtype)
    return torch.matmul(weights, value).transpose(1, 2)  # [B, Lq, h, d]


def _store(cache: KVCache | SharedPrompts | None, layer: int, key, value):
    """Append this call's keys/values to the cache; return everything cached so far."""
    if cache is None:
        return key, value
    if isinstance(cache, SharedPrompts):
        if cache.recording:  # the distinct prompts' pass
            cache.keys.append(key)
            cache.values.append(value)
            return key, value
        return (torch.cat([cache.keys[layer][cache.rows], key], dim=2),
                torch.cat([cache.values[layer][cache.rows], value], dim=2))
    if cache.slot is not None:
        cache.keys[layer].index_copy_(2, cache.slot, key)
        cache.values[layer].index_copy_(2, cache.slot, value)
        return cache.keys[layer][:, :, :cache.filled], cache.values[layer][:, :, :cache.filled]
    start, stop = cache.length, cache.length + key.shape[2]
    cache.keys[layer][:, :, start:stop] = key
    cache.values[layer][:, :, start:stop] = value
    return cache.keys[layer][:, :, :stop], cache.values[layer][:, :, :stop]


def _halves(x: torch.Tensor) -> torch.Tensor:
    """A paired pass's ``[2n, ..., H]`` stream as ``[2, n * ..., H]``: its first half is the
    first model's tokens, its second half the second's (`Stacked`)."""
    return x.reshape(2, -1, x.shape[-1])


def _embed(table, ids: torch.Tensor) -> torch.Tensor:
    """`table`'s rows for `ids` (with its ``padding_idx``, as the module call); for a pair,
    each half of the doubled `ids` from its own model's table."""
    if isinstance(table, Stacked):
        half = len(ids) // 2
        return torch.cat([_embed(table._first, ids[:half]), _embed(table._second, ids[half:])])
    return F.embedding(ids, table.weight, getattr(table, "padding_idx", None))


def _conv1d(layer, x):
    """GPT-2's `Conv1D` (x @ W + b) as the module computes it, without the module call; a
    pair's stacked weights (``[2, in, out]``) as one batched product over the two halves."""
    weight = layer.weight
    if weight.dim() == 3:
        return torch.baddbmm(layer.bias.unsqueeze(1), _halves(x), weight).view(*x.shape[:-1], layer.nf)
    return torch.addmm(layer.bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], layer.nf)


def _layer_norm(norm, x):
    weight = norm.weight
    if weight.dim() == 2:  # a pair: normalise, then each half's own scale and shift
        out = _halves(F.layer_norm(x, norm.normalized_shape, None, None, norm.eps))
        return torch.addcmul(norm.bias.unsqueeze(1), out, weight.unsqueeze(1)).view(x.shape)
    return F.layer_norm(x, norm.normalized_shape, weight, norm.bias, norm.eps)


_TANH_GELUS = ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "GELUPytorchTanh")


def _activation(act, x):
    """The model's activation; the tanh-approximated GELU (GPT-2's ``gelu_new``) as torch's
    fused kernel: the same formula in one pass instead of eight (and one backward pass),
    equal to float rounding (2.4e-7)."""
    if type(act).__name__ in _TANH_GELUS:
        return F.gelu(x, approximate="tanh")
    return act(x)


def _rms_norm(norm, x):
    """Llama's RMSNorm (in float32, then the weight) as torch's fused kernel."""
    out = F.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon).to(x.dtype)
    weight = norm.weight
    if weight.dim() == 2:  # a pair: each half its own weight
        return (_halves(out) * weight.unsqueeze(1)).view(out.shape)
    return weight * out


def _norm(norm, x):
    if _class_name(norm) == "LlamaRMSNorm":
        return _rms_norm(norm, x)
    return norm(x)


def _linear(layer, x):
    weight = layer.weight
    if weight.dim() == 3:  # a pair (``[2, out, in]``): one batched product over the two halves
        bias = layer.bias
        product = (torch.bmm(_halves(x), weight.transpose(1, 2)) if bias is None
                   else torch.baddbmm(bias.unsqueeze(1), _halves(x), weight.transpose(1, 2)))
        return product.view(*x.shape[:-1], weight.shape[1])
    return F.linear(x, weight, layer.bias)


def _last_rows(query, x, bias, keep_from: int, packing: Packing | None = None):
    """The last layer needs its queries, residual stream and mask rows only from column
    `keep_from` on (the outputs the caller reads); keys and values of every column were
    already computed and stored. Rows do not interact outside attention, so the kept rows
    compute exactly what they would in the full layer. Returns the packing of the kept
    columns too (None when unpacked)."""
    if packing is None:
        return query[:, :, keep_from:], x[:, keep_from:], bias[:, :, keep_from:], None
    packing, kept = packing.columns_from(keep_from)
    return query[:, :, keep_from:], x[kept], bias[:, :, keep_from:], packing


def _gpt2_hidden(backbone, input_ids, position_ids, bias, cache, keep_from=0, packing=None):
    """GPT-2's blocks; with `packing`, `input_ids` / `position_ids` are the real tokens ``[N]``
    and the residual stream stays ``[N, H]`` until the final norm is unpacked to the grid."""
    x = _embed(backbone.wte, input_ids) + _embed(backbone.wpe, position_ids)
    last = len(backbone.h) - 1
    for index, block in enumerate(backbone.h):
        attn, mlp = block.attn, block.mlp
        qkv = _conv1d(attn.c_attn, _layer_norm(block.ln_1, x))
        query, key, value = _heads(_split_heads(qkv, attn.head_dim), packing).split(attn.num_heads, dim=1)
        key, value = _store(cache, index, key, value)
        if index == last and keep_from:
            query, x, bias, packing = _last_rows(query, x, bias, keep_from, packing)
        out = _attend(query, key, value, bias, attn.scaling)
        x = x + _conv1d(attn.c_proj, _merge_heads(out, packing))
        x = x + _conv1d(mlp.c_proj, _activation(mlp.act, _conv1d(mlp.c_fc, _layer_norm(block.ln_2, x))))
    x = _layer_norm(backbone.ln_f, x)
    return x if packing is None else packing.unpack(x)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _llama_hidden(backbone, input_ids, position_ids, bias, cache, keep_from=0, packing=None):
    """Llama's layers, with `packing` as in `_gpt2_hidden`."""
    x = _embed(backbone.embed_tokens, input_ids)
    # [..., d] per token. Older transformers (5.17, in the declared range) take [B, T]
    # positions only (newer ones any shape): one row of all positions, then back.
    cos, sin = backbone.rotary_emb(x, position_ids.reshape(1, -1))
    cos, sin = (t.reshape(*position_ids.shape, t.shape[-1]) for t in (cos, sin))
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over the heads
    last = len(backbone.layers) - 1
    for index, layer in enumerate(backbone.layers):
        attn = layer.self_attn
        h = _norm(layer.input_layernorm, x)
        query, key, value = (_split_heads(_linear(proj, h), attn.head_dim)
                             for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # [..., n, d]
        query = query * cos + _rotate_half(query) * sin  # RoPE per token, before attention's grid
        key = key * cos + _rotate_half(key) * sin
        query, key, value = (_heads(t, packing) for t in (query, key, value))
        key, value = _store(cache, index, key, value)
        if index == last and keep_from:
            query, x, bias, packing = _last_rows(query, x, bias, keep_from, packing)
        if attn.num_key_value_groups > 1:
            key = key.repeat_interleave(attn.num_key_value_groups, dim=1)
            value = value.repeat_interleave(attn.num_key_value_groups, dim=1)
        out = _attend(query, key, value, bias, attn.scaling)
        x = x + _linear(attn.o_proj, _merge_heads(out, packing))
        h = _norm(layer.post_attention_layernorm, x)
        mlp = layer.mlp
        x = x + _linear(mlp.down_proj, _activation(mlp.act_fn, _linear(mlp.gate_proj, h)) * _linear(mlp.up_proj, h))
    x = _norm(backbone.norm, x)
    return x if packing is None else packing.unpack(x)


def _bias_dtype(backbone, input_ids) -> torch.dtype:
    """The attention mask's dtype: the weights' (or autocast's) float type."""
    if torch.is_autocast_enabled(input_ids.device.type):
        return torch.get_autocast_dtype(input_ids.device.type)
    return backbone.get_input_embeddings().weight.dtype


def hidden_states(backbone, input_ids, position_ids, key_mask, cache: KVCache | SharedPrompts | None = None,
                  keep_from: int = 0) -> torch.Tensor:
    """Final hidden states ``[B, L - keep_from, H]`` of `input_ids`, columns `keep_from`
    onwards (attending to `key_mask`'s real keys, which covers the cached positions plus
    these). The last layer runs only those columns' rows (`_last_rows`). Without a sampling
    cache and with PPOConfig.padding_free, only the real tokens run (`Packing`) and the
    padding positions of the result are zeros."""
    bias = additive_mask(key_mask, input_ids.shape[1], _bias_dtype(backbone, input_ids))
    run = _gpt2_hidden if _backbone_kind(backbone) == "gpt2" else _llama_hidden
    # Compiled for whole sequences and static-cache sampling steps (fixed shapes); the
    # prompt's prefill into the cache runs eagerly.
    if (cache is None or getattr(cache, "slot", None) is not None) and backbone.__dict__.get(COMPILE_ATTRIBUTE):
        # one graph for every call: the whole sequence runs and the columns are cut after
        out = _compiled(run)(backbone, input_ids, position_ids, bias, cache)[:, keep_from:]
    else:
        # Teacher-forced passes skip their padding (PPOConfig.padding_free); the sampler's
        # cache is written on the grid, so its prefill runs padded.
        packed = backbone.__dict__.get(PACK_ATTRIBUTE) and not isinstance(cache, KVCache)
        packing = Packing.of(key_mask[:, -input_ids.shape[1]:]) if packed else None
        ids, positions = ((input_ids, position_ids) if packing is None else  # the real tokens only, [N]
                          (packing.pack(input_ids), packing.pack(position_ids)))
        out = run(backbone, ids, positions, bias, cache, keep_from, packing)
    if cache is not None:
        cache.length += input_ids.shape[1]
    return out


def _shared_prompt_hidden(backbone, input_ids, attention_mask, position_ids, query_length: int):
    """`response_hidden` with one pass per distinct prompt, or None when no prompt repeats.

    A GRPO batch holds each prompt G times; rows do not interact, so the prompt positions'
    keys, values and last hidden state are computed once per distinct prompt and indexed to
    its rows, and only the response positions run per row (attending to their prompt's
    keys through the index). The same arithmetic; gradients of a shared prompt are summed
    over its rows by the index's backward, as the per-row passes sum them in the weights."""
    distinct = distinct_prompts(input_ids[:, :query_length], attention_mask[:, :query_length])
    if distinct is None:
        return None
    first, rows = distinct
    if backbone.__dict__.get(PACK_ATTRIBUTE):  # a small batch: one pass over its prompt groups
        groups = batch_layouts.prompt_groups(attention_mask, query_length, first, rows,
                                             _bias_dtype(backbone, input_ids), batch_layouts.ONE_PASS_MAX_SCORES)
        if groups is not None:
            run = _gpt2_hidden if _backbone_kind(backbone) == "gpt2" else _llama_hidden
            return groups.hidden(run, backbone, input_ids, position_ids, query_length)
    shared = SharedPrompts(rows=rows)
    prompt_hidden = hidden_states(backbone, input_ids[first, :query_length], position_ids[first, :query_length],
                                  attention_mask[first, :query_length], shared, keep_from=query_length - 1)  # [U, 1, H]
    last_prompt = prompt_hidden[rows]  # [B, 1, H]: predicts the first response token
    if input_ids.shape[1] == query_length:
        return last_prompt
    shared.recording = False
    responses = hidden_states(backbone, input_ids[:, query_length:], position_ids[:, query_length:],
                              attention_mask, shared)  # [B, L-Q, H]
    return torch.cat([last_prompt, responses], dim=1)


def response_hidden(backbone, input_ids, attention_mask, position_ids, query_length: int) -> torch.Tensor:
    """Final hidden states ``[B, L-Q]`` at positions ``Q-1 .. L-2`` of ``[B, L]`` sequences
    whose first `query_length` columns are the prompt: the positions whose outputs predict
    the response tokens. The last column is never run (by causality no earlier output
    depends on it), and with PPOConfig.share_prompt_prefix each distinct prompt runs once."""
    input_ids, attention_mask, position_ids = input_ids[:, :-1], attention_mask[:, :-1], position_ids[:, :-1]
    if backbone.__dict__.get(SHARE_ATTRIBUTE) and not backbone.__dict__.get(COMPILE_ATTRIBUTE):
        hidden = _shared_prompt_hidden(backbone, input_ids, attention_mask, position_ids, query_length)
        if hidden is not None:
            return hidden
    return hidden_states(backbone, input_ids, position_ids, attention_mask, keep_from=query_length - 1)


def paired_response_outputs(policy, value_model, input_ids, attention_mask, position_ids,
                            query_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_logits` of `policy` and `response_scalars` of `value_model` from one pass of
    the pair (`pair`): the batch runs twice over, its first copy through the policy's layers
    and its second through the critic's, every product a batched one over the two. Rows do
    not interact and each half meets its own model's weights, so it is the same arithmetic as
    the two passes (tests/test_lean_forward.py). A batch made of repeated prompts (at most one
    distinct prompt per two rows: PPO with several samples per prompt) takes the two passes,
    each sharing its prompts (PPOConfig.share_prompt_prefix); a prompt drawn twice by chance
    does not."""
    backbone = lean_backbone(policy)
    ids, mask, positions = input_ids[:, :-1], attention_mask[:, :-1], position_ids[:, :-1]
    distinct = (distinct_prompts(ids[:, :query_length], mask[:, :query_length])
                if backbone.__dict__.get(SHARE_ATTRIBUTE) else None)
    if distinct is not None and 2 * len(distinct[0]) <= len(ids):
        return (response_logits(policy, input_ids, attention_mask, position_ids, query_length),
                response_scalars(value_model, input_ids, attention_mask, position_ids, query_length))
    both = Stacked(backbone, lean_backbone(value_model), markers=(COMPILE_ATTRIBUTE, PACK_ATTRIBUTE))
    hidden = hidden_states(both, *(torch.cat([t, t]) for t in (ids, positions, mask)), keep_from=query_length - 1)
    policy_hidden, critic_hidden = hidden.chunk(2)  # [B, L-Q, H] each
    return policy.lm_head(policy_hidden), value_model.head(critic_hidden).squeeze(-1)


def response_logits(model, input_ids, attention_mask, position_ids, query_length: int) -> torch.Tensor:
    """Logits ``[B, L-Q, V]`` at the positions that predict the response tokens (see
    `response_hidden`): the lean path when `model` is marked for it, else ``model(...)``
    on the sequences without their last column."""
    backbone = lean_backbone(model)
    if backbone is None:
        return model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                     position_ids=position_ids[:, :-1]).logits[:, query_length - 1:]
    return model.lm_head(response_hidden(backbone, input_ids, attention_mask, position_ids, query_length))


def response_scalars(model, input_ids, attention_mask, position_ids, query_length: int) -> torch.Tensor:
    """A `ScalarHeadModel`'s outputs ``[B, L-Q]`` at the same positions, lean when marked."""
    backbone = lean_backbone(model)
    if backbone is None:
        return model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                     position_ids=position_ids[:, :-1])[:, query_length - 1:]
    return model.head(response_hidden(backbone, input_ids, attention_mask, position_ids, query_length)).squeeze(-1)

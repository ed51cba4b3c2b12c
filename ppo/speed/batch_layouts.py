"""How the lean forward lays a batch's tokens out (ppo/speed/lean_forward.py).

A teacher-forced pass over a ``[B, L]`` batch, left-padded prompts then right-padded
responses, need not run that grid as it is:

- `Packing` (PPOConfig.padding_free): only the real tokens, ``[N, width]``, between attention
  calls; attention alone scatters onto the grid and gathers back.
- `SharedPrompts` (PPOConfig.share_prompt_prefix): each distinct prompt in a first pass, then
  the responses attending to its keys through an index.
- `PromptGroups` (both toggles, small batches): one attention row per prompt group, its prompt
  once and then its rows' response tokens, in one pass.

`distinct_prompts` finds the groups. A step's sampler, reference pass and update pass see the
same prompts, so it and the one-pass layout are memoised on the last batch (`_LastBatch`).
Each layout is the same arithmetic as the per-row pass (tests/test_lean_forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SharedPrompts:
    """Keys and values of each *distinct* prompt, per layer (``[U, heads, Q, head_dim]``),
    and the prompt of each row (`rows`, ``[B]``): a pass over the prompts records them, a
    pass over the responses attends to ``cat(keys[rows], its own keys)``."""

    rows: torch.Tensor
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    recording: bool = True
    length: int = 0


class Packing:
    """The real tokens of a padded ``[B, L]`` batch, in row-major order (PPOConfig.padding_free).

    A teacher-forced pass over a batch padded to its longest row spends a third of its
    products on padding on the testbed presets. Between attention calls nothing mixes
    positions, so the residual stream can hold only the real tokens, ``[N, H]``: attention
    alone needs the grid, so its queries, keys and values are scattered into a zero
    ``[B, L]`` grid (`unpack`; padding keys are masked out, padding queries never read) and
    its output gathered back (`pack`). Each real token meets the same numbers as in the
    padded pass."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask.bool()  # [B, L]: real tokens
        self.index = self.mask.reshape(-1).nonzero().squeeze(1)  # [N]: their places in the flat grid

    @classmethod
    def of(cls, mask: torch.Tensor) -> Packing | None:
        """The packing of `mask` ``[B, L]``, or None when it has no padding to skip."""
        packing = cls(mask)
        return None if len(packing.index) == mask.numel() else packing

    def pack(self, grid: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` -> ``[N, ...]``: the real tokens."""
        return grid.reshape(-1, *grid.shape[2:]).index_select(0, self.index)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` -> ``[B, L, ...]``, zeros at padding."""
        batch, length = self.mask.shape
        grid = tokens.new_zeros(batch * length, *tokens.shape[1:]).index_copy(0, self.index, tokens)
        return grid.view(batch, length, *tokens.shape[1:])

    def columns_from(self, start: int) -> tuple[Packing, torch.Tensor]:
        """The packing of columns `start` on, and where its tokens sit among this one's
        (row-major order keeps them in the same order)."""
        kept = (self.index % self.mask.shape[1] >= start).nonzero().squeeze(1)  # [N']
        return Packing(self.mask[:, start:]), kept



class _LastBatch:
    """A one-entry memo for a function of a batch's tensors: the result of the last call,
    returned again while every argument is equal. A step's sampler, reference pass and
    update pass see the same prompts (the last two the same batch), so its prompt layout is
    worked out once. Results are made
    outside inference mode, so a pass with autograd may save them for its backward."""

    def __init__(self, function):
        self.function, self.arguments, self.result = function, None, None

    def __call__(self, *arguments):
        if self.arguments is None or not all(map(_equal, arguments, self.arguments)):
            with torch.inference_mode(False):
                self.arguments = tuple(a.clone() if torch.is_tensor(a) else a for a in arguments)
                self.result = self.function(*self.arguments)
        return self.result


def _equal(a, b) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    return type(a) is type(b) and a == b


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """``(first, rows)`` for a batch that repeats prompts: `first` ``[U]`` is one row of each
    distinct prompt (ids and mask equal; any copy, they are identical), `rows` ``[B]`` the
    distinct prompt of each row. None when every prompt is distinct."""
    return _distinct_prompts(prompt_ids, prompt_mask)


def _find_distinct_prompts(prompt_ids, prompt_mask):
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    unique, rows = torch.unique(keys, dim=0, return_inverse=True)
    if len(unique) == len(keys):
        return None
    first = torch.empty(len(unique), dtype=torch.long, device=rows.device).scatter_(
        0, rows, torch.arange(len(rows), device=rows.device))
    return first, rows


_distinct_prompts = _LastBatch(_find_distinct_prompts)



# One pass per prompt group when its attention grid stays this small (scores per head and layer).
ONE_PASS_MAX_SCORES = 1 << 16


@dataclass
class PromptGroups:
    """A batch that repeats prompts, laid out one *prompt group* per attention row (with
    PPOConfig.share_prompt_prefix and padding_free): the row holds the group's prompt once, at
    its own columns, then the real response tokens of each of its rows, one after another.
    Each response token attends to its prompt and to its own row's earlier tokens (`bias`),
    so every token meets the keys it meets in the per-row pass, in one pass instead of the
    two (prompts, then responses) of `SharedPrompts`. Its grid has ``U x W^2`` scores against
    the per-row ``B x R x (Q + R)``: worth it only while they are few (`ONE_PASS_MAX_SCORES`),
    where a pass's per-call costs outweigh its arithmetic. For the same reason it runs on its
    ``[U, W]`` grid as it is: its only padding is a prompt's left padding and the tail of a
    group with fewer response tokens, and packing would cost two index calls per layer."""

    source: torch.Tensor  # [U * W]: each grid slot's place in the flat ``[B, L]`` batch (empty slots: any token)
    bias: torch.Tensor  # [U, 1, W, W]: additive attention mask (empty slots are never attended to)
    out_index: torch.Tensor  # [B * (R + 1)]: each output's place in the kept grid ``[U * (W - Q + 1)]`` (past it: a zero row)

    @classmethod
    def of(cls, mask: torch.Tensor, query_length: int, first: torch.Tensor, rows: torch.Tensor,
           dtype: torch.dtype, max_scores: int = ONE_PASS_MAX_SCORES) -> PromptGroups | None:
        """The layout of ``[B, L]`` sequences whose first `query_length` columns are a
        left-padded prompt, grouped by `distinct_prompts`' ``(first, rows)``; None when its
        grid would hold more than `max_scores` scores per head or a prompt does not end at
        its last column."""
        batch, length = mask.shape
        groups, device = len(first), mask.device
        mask = mask.bool()
        if not bool(mask[:, query_length - 1].all()):
            return None
        row, column = mask[:, query_length:].nonzero(as_tuple=True)  # the response tokens, row-major
        group = rows[row]
        order = torch.argsort(group, stable=True)  # by group, keeping row-major order inside each
        row, column, group = row[order], column[order] + query_length, group[order]
        counts = torch.bincount(group, minlength=groups)
        rank = torch.arange(len(group), device=device) - (counts.cumsum(0) - counts)[group]
        width = query_length + int(counts.max()) if len(group) else query_length
        if groups * width * width > max_scores:
            return None
        slot = group * width + query_length + rank  # the response tokens' places in the flat grid
        owner = torch.full((groups, width), -2, dtype=torch.long, device=device)  # -2 empty, -1 prompt, else row
        owner[:, :query_length] = torch.where(mask[first, :query_length], -1, -2)
        owner.view(-1)[slot] = row
        columns = torch.arange(width, device=device).repeat(groups, 1)  # the token's column in its sequence
        columns.view(-1)[slot] = column
        # the prompt's columns, then (until overwritten by the responses) its last token again
        source = (first[:, None] * length + torch.arange(width, device=device).clamp(max=query_length - 1)).view(-1)
        source[slot] = row * length + column
        valid = owner > -2
        allowed = (valid[:, None, :] & ((owner[:, None, :] == -1) | (owner[:, None, :] == owner[:, :, None]))
                   & (columns[:, None, :] <= columns[:, :, None]))  # [U, W (queries), W (keys)]
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        # outputs: the prompt's last position, then each response column (zero where padding)
        kept, out_width = width - query_length + 1, length - query_length + 1
        out_index = torch.full((batch, out_width), groups * kept, dtype=torch.long, device=device)
        out_index[:, 0] = rows * kept
        out_index[row, column - query_length + 1] = group * kept + 1 + rank
        return cls(source=source, bias=bias[:, None], out_index=out_index.view(-1))

    def hidden(self, run, backbone, input_ids, position_ids, query_length: int) -> torch.Tensor:
        """`lean_forward.response_hidden`'s ``[B, R + 1, H]`` in one pass over the groups;
        `run` is the model's layers (`lean_forward._gpt2_hidden` or `_llama_hidden`)."""
        groups, width = self.bias.shape[0], self.bias.shape[-1]
        ids = input_ids.reshape(-1)[self.source].view(groups, width)
        positions = position_ids.reshape(-1)[self.source].view(groups, width)
        grid = run(backbone, ids, positions, self.bias, None, query_length - 1)  # [U, W - Q + 1, H]
        flat = torch.cat([grid.reshape(-1, grid.shape[-1]), grid.new_zeros(1, grid.shape[-1])])
        return flat[self.out_index].view(input_ids.shape[0], -1, grid.shape[-1])


prompt_groups = _LastBatch(PromptGroups.of)  # the layout of the last batch, memoised

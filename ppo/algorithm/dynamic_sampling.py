"""Building the rollout batch: one round of sampling, or DAPO's dynamic sampling.

A group whose G samples all pass (or all fail) has zero group-relative advantage: it costs
a rollout and carries no policy-gradient signal. Masking such groups out of the loss
(`difficulty_filter_mode="mask"`) leaves a smaller effective batch, and under a per-sequence
mean the filtered rows still count in the denominator, so the filter then changes only the
gradient's scale. Kimi k1.5 (offline) and DAPO (online, "dynamic sampling") instead hand
the update a batch *made of* informative groups. Implementation details that live here:

- **Dynamic sampling** (`sample_batch` with ``max_rounds > 1``; `PPOConfig.difficulty_filter_mode
  = "resample"`): draw and score rounds of ``n_groups`` prompts, keep the groups whose pass
  rate lies strictly inside the band, and stop as soon as ``n_groups`` are kept (DAPO,
  Yu et al. 2025, sec. 3.2; verl's ``max_num_gen_batches`` caps the rounds). If the cap is
  reached first, the most recent filtered groups fill the batch; the loss then leaves them
  out (they fail the band again in the trainer). The cost is logged: rounds and responses
  generated per step.
- **Concatenating rounds** (`concat_scored`): queries are left-padded and responses
  right-padded, so rounds with different lengths are padded to a common width on the
  correct side.
- **Everything seen can be retired** (`ScoredBatch.seen_problems`): with `retire_mastered`,
  prompts mastered in a discarded round are retired too.

Rounds are per process: each rank fills its own share of whole groups, and no collective
runs inside the loop, so ranks may take different numbers of rounds.

Example (G = 2, n_groups = 2, band (0, 1)): round 1 gives pass rates [1.0, 0.5] -> keeps
one group; round 2 gives [0.0, 0.5] -> keeps one more; the batch is the two 0.5 groups and
the step generated 8 responses for 4 trained on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
from einops import rearrange

from ppo.algorithm.filtering import group_pass_rates, keep_groups
from ppo.models.rollout import Rollout


@dataclass
class ScoredBatch:
    """Sampled and scored responses; `B = groups x G`, each group's G samples contiguous."""

    problems: list  # [B] Problem objects
    rollout: Rollout
    texts: list[str]  # [B] decoded responses
    task_scores: torch.Tensor  # [B] the task's own reward (the gold in RLHF)
    raw_scores: torch.Tensor  # [B] the reward trained on (the task's, or the reward model's)
    correct: torch.Tensor  # [B] bool, the task's verdict
    well_formed: torch.Tensor | None = None  # [B] bool, the task's format verdict (format reward)
    reward_components: torch.Tensor | None = None  # [B, 3] correctness, format, length (set in phase 5)
    reward_weights: torch.Tensor | None = None  # [3] their weights in the summed score
    # Every group generated for this batch (kept or not): for retire_mastered and the cost.
    seen_problems: list = field(default_factory=list)  # [groups seen] one Problem per group
    seen_pass_rates: torch.Tensor | None = None  # [groups seen]
    rounds: int = 1
    responses_generated: int = 0

    def __len__(self) -> int:
        return len(self.problems)


def _pad_cat(tensors: list[torch.Tensor], pad_value, left: bool) -> torch.Tensor:
    """Concatenate along dim 0, padding dim 1 to the widest (on the left for queries)."""
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        missing = width - t.shape[1]
        if missing:
            shape = (t.shape[0], missing, *t.shape[2:])
            filler = torch.full(shape, pad_value, dtype=t.dtype, device=t.device)
            t = torch.cat([filler, t] if left else [t, filler], dim=1)
        padded.append(t)
    return torch.cat(padded)


def concat_rollouts(rollouts: list[Rollout], pad_token_id: int) -> Rollout:
    """One `Rollout` from several, padding queries on the left and responses on the right.

    >>> a = Rollout(torch.tensor([[7]]), torch.tensor([[1]]), torch.tensor([[3, 2]]), torch.tensor([[1, 1]]), torch.tensor([True]))
    >>> b = Rollout(torch.tensor([[6, 7]]), torch.tensor([[1, 1]]), torch.tensor([[2]]), torch.tensor([[1]]), torch.tensor([True]))
    >>> c = concat_rollouts([a, b], pad_token_id=0)
    >>> c.query_ids.tolist(), c.response_ids.tolist(), c.response_mask.tolist()
    ([[0, 7], [6, 7]], [[3, 2], [2, 0]], [[1, 1], [1, 0]])
    """
    if len(rollouts) == 1:
        return rollouts[0]
    values = {}
    for f in dataclasses.fields(Rollout):
        parts = [getattr(r, f.name) for r in rollouts]
        if any(p is None for p in parts):
            values[f.name] = None
        elif parts[0].dim() == 1:
            values[f.name] = torch.cat(parts)
        elif f.name.startswith("query"):
            values[f.name] = _pad_cat(parts, pad_token_id if f.name == "query_ids" else 0, left=True)
        else:
            values[f.name] = _pad_cat(parts, pad_token_id if f.name == "response_ids" else 0, left=False)
    return Rollout(**values)


def select_rollout(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rows `rows` of every per-sample tensor of `rollout`."""
    values = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(Rollout)}
    return Rollout(**{name: None if v is None else v[rows.to(v.device)] for name, v in values.items()})


def concat_scored(parts: list[ScoredBatch], pad_token_id: int) -> ScoredBatch:
    """Concatenate scored batches (rounds of dynamic sampling) into one."""
    return ScoredBatch(
        problems=[p for part in parts for p in part.problems],
        rollout=concat_rollouts([part.rollout for part in parts], pad_token_id),
        texts=[t for part in parts for t in part.texts],
        task_scores=torch.cat([part.task_scores for part in parts]),
        raw_scores=torch.cat([part.raw_scores for part in parts]),
        correct=torch.cat([part.correct for part in parts]),
        well_formed=None if any(part.well_formed is None for part in parts)
        else torch.cat([part.well_formed for part in parts]),
    )


def select_groups(batch: ScoredBatch, groups: torch.Tensor, group_size: int) -> ScoredBatch:
    """The groups with indices `groups` (each G contiguous rows) of `batch`."""
    rows = rearrange(groups[:, None] * group_size + torch.arange(group_size), "b g -> (b g)")  # [b*G]
    row_list = rows.tolist()
    return ScoredBatch(
        problems=[batch.problems[i] for i in row_list],
        rollout=select_rollout(batch.rollout, rows),
        texts=[batch.texts[i] for i in row_list],
        task_scores=batch.task_scores[rows.to(batch.task_scores.device)],
        raw_scores=batch.raw_scores[rows.to(batch.raw_scores.device)],
        correct=batch.correct[rows.to(batch.correct.device)],
        well_formed=None if batch.well_formed is None else batch.well_formed[rows.to(batch.well_formed.device)],
    )


def sample_batch(draw: Callable[[int], ScoredBatch], n_groups: int, group_size: int,
                 band: tuple[float, float] | None = None, max_rounds: int = 1,
                 pad_token_id: int = 0) -> ScoredBatch:
    """A batch of `n_groups` groups: one round of `draw(n_groups)`, or dynamic sampling.

    Args:
        draw: samples and scores `n` prompts x G responses (`ScoredBatch`).
        n_groups: groups the batch must hold (this process's share).
        band: ``(min_pass_rate, max_pass_rate)``; groups strictly inside are kept. None, or
            ``max_rounds == 1``: a single round, nothing dropped here.
        max_rounds: cap on rounds (dynamic sampling when > 1).

    Returns:
        the batch, with `rounds`, `responses_generated` and every group seen
        (`seen_problems`, `seen_pass_rates`) filled in.
    """
    kept_parts: list[ScoredBatch] = []
    rejected_parts: list[ScoredBatch] = []
    seen_problems, seen_rates = [], []
    n_kept = generated = rounds = 0
    while rounds < max(1, max_rounds):
        part = draw(n_groups)
        rounds += 1
        generated += len(part)
        rates = group_pass_rates(part.correct, group_size)  # [n_groups]
        seen_problems += part.problems[::group_size]
        seen_rates.append(rates.cpu())
        if band is None or max_rounds <= 1:
            kept_parts, n_kept = [part], n_groups
            break
        kept = keep_groups(rates, *band).cpu()  # [n_groups]
        take = torch.nonzero(kept).flatten()[: n_groups - n_kept]
        if len(take):
            kept_parts.append(select_groups(part, take, group_size))
            n_kept += len(take)
        rejected_parts.insert(0, select_groups(part, torch.nonzero(~kept).flatten(), group_size))
        if n_kept == n_groups:
            break
    if n_kept < n_groups:
        # The cap was reached: fill with the latest filtered groups (the loss leaves them out).
        fill: list[ScoredBatch] = []
        missing = n_groups - n_kept
        for part in rejected_parts:
            if missing == 0:
                break
            groups = min(missing, len(part) // group_size)
            if groups:
                fill.append(select_groups(part, torch.arange(groups), group_size))
                missing -= groups
        kept_parts += fill
    batch = concat_scored(kept_parts, pad_token_id)
    batch.seen_problems = seen_problems
    batch.seen_pass_rates = torch.cat(seen_rates)
    batch.rounds, batch.responses_generated = rounds, generated
    return batch

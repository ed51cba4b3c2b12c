"""Guards where values enter the loop: rewards, losses, gradients and weights must be finite.

One NaN reward makes the group mean, the whitening statistics and then every advantage
NaN; one optimizer step later every weight is NaN, and the next checkpoint saves them. So
the values are checked where they enter, before they can reach an update or a save:

- `reward_values`: what a user's ``reward_fn`` returned must be one real number per
  response (not None, a string, a scalar or a 2-D tensor). Errors name the prompt index,
  the response and the reward function. An integer too large for a float (``10**400``) is
  an infinite reward, left to `check_scores`.
- `RewardFunctionError`: an exception raised inside the reward function, re-raised with the
  batch (how many responses, the first prompt) and, by the run loop, the step.
- `check_prompts`: a prompt must be text the tokenizer can encode (a lone surrogate cannot).
- `check_scores`: every sequence score (reward function or reward model) is finite, or the
  run stops before the update. With ``nonfinite_rewards="drop"`` the bad samples are kept
  out of the loss instead and counted in the metrics (`drop_nonfinite_scores`).
- `check_update`: the losses and gradient norms of one optimizer step are finite, checked
  *before* ``optimizer.step()``, so the weights and the newest checkpoint stay the last good
  ones.
- `check_parameters`: the weights after a step are finite (a learning rate that is finite
  but huge overflows them without any NaN in the gradients).

With several processes each decision goes through `distributed.any_rank`, so every rank
stops on the same step (a rank that stopped alone would leave the others waiting in a
collective forever).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import torch
from torch.distributed.tensor import DTensor

from ppo.parallel import distributed

FLOAT32_MAX = torch.finfo(torch.float32).max  # scores are trained in float32


class NonFiniteError(RuntimeError):
    """A NaN or infinite reward, loss, gradient or weight; the run stops before any save."""


class RewardTypeError(TypeError):
    """A reward function returned something other than one real number per response."""


class RewardFunctionError(RuntimeError):
    """The reward function (or the task's scorer) raised; the message names the batch, and the
    run loop adds the step. The original exception is its ``__cause__``."""


def reward_function_error(error: Exception, source: str, prompts: Sequence[str]) -> RewardFunctionError:
    first = f" (first prompt {_short(prompts[0])})" if prompts else ""
    return RewardFunctionError(f"{source} raised {type(error).__name__}: {error} while scoring a batch of "
                               f"{len(prompts)} responses to {len(set(prompts))} prompts{first}")


def check_prompts(prompts: Sequence[str], where: str = "prompts") -> None:
    """Refuse a prompt that is not valid Unicode text (a lone surrogate such as ``'\\ud800'``
    cannot be encoded, and tokenizers fail on it without naming the prompt)."""
    for index, prompt in enumerate(prompts):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"{where}[{index}] {_short(prompt)}: not valid text ({error.reason} at character "
                             f"{error.start}); fix or drop this prompt") from None


def _name(reward_fn: Callable | None) -> str:
    if reward_fn is None:
        return "the reward"
    return getattr(reward_fn, "__qualname__", None) or type(reward_fn).__name__


def _short(text: str, limit: int = 80) -> str:
    """A prompt or response, quoted and cut to `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _brief(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def reward_values(rewards: Any, prompts: Sequence[str], responses: Sequence[str],
                  reward_fn: Callable | None = None) -> list[float]:
    """``reward_fn``'s return value as a list of floats, one per response (NaN passes through).

    Non-finite values are left for `check_scores`, which decides on every rank together.

    >>> reward_values([1, 0.5], ["a", "b"], ["x", "y"])
    [1.0, 0.5]
    """
    name, count = _name(reward_fn), len(responses)
    expected = f"expected a list of {count} numbers (one per response)"
    if isinstance(rewards, (str, bytes)):  # "1010" would otherwise be read as four rewards
        raise RewardTypeError(f"reward_fn {name} returned a string {_short(str(rewards))}; {expected}")
    if isinstance(rewards, torch.Tensor) or hasattr(rewards, "ndim"):  # tensors and numpy arrays
        if rewards.ndim != 1:
            raise RewardTypeError(f"reward_fn {name} returned an array of shape {tuple(rewards.shape)}; {expected}")
        rewards = rewards.tolist()
    if rewards is None or isinstance(rewards, numbers.Number) or not isinstance(rewards, (list, tuple)):
        raise RewardTypeError(f"reward_fn {name} returned {type(rewards).__name__} {_brief(rewards)}; {expected}")
    if len(rewards) != count:
        raise RewardTypeError(f"reward_fn {name} returned {len(rewards)} rewards for {count} responses")
    values = []
    for index, reward in enumerate(rewards):
        if hasattr(reward, "ndim") and reward.ndim == 0:  # a 0-d tensor or numpy scalar
            reward = reward.item()
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise RewardTypeError(f"reward_fn {name} returned {type(reward).__name__} {_brief(reward)} as the "
                                  f"reward of prompt {index} {_short(prompts[index])} response "
                                  f"{_short(responses[index])}; rewards must be real numbers")
        try:
            values.append(float(reward))
        except OverflowError:  # an int beyond float range: infinite, so check_scores names it
            values.append(math.inf if reward > 0 else -math.inf)
    return values


def check_scores(scores: torch.Tensor, prompts: Sequence[str], responses: Sequence[str], source: str,
                 drop: bool = False) -> torch.Tensor:
    """`scores` ``[B]`` if all finite; else stop on every rank (or, with `drop`, return the mask
    ``[B]`` of the finite ones). Returns the keep mask (all True when nothing is wrong)."""
    # A finite score past float32's largest value would be inf from the next operation on.
    finite = torch.isfinite(scores) & (scores.abs() <= FLOAT32_MAX)  # [B]
    if not distributed.any_rank(not bool(finite.all())):
        return finite
    if drop:
        return finite
    bad = (~finite).nonzero().flatten().tolist()
    if bad:
        index = bad[0]
        where = "" if distributed.world_size() == 1 else f" on process {distributed.rank()}"
        value = float(scores[index])
        beyond = f" (beyond float32's range, +-{FLOAT32_MAX:.3g}, in which scores are trained)" if math.isfinite(value) else ""
        raise NonFiniteError(
            f"{source} gave {value:g}{beyond} for prompt {index}{where} {_short(prompts[index])} response "
            f"{_short(responses[index])} ({len(bad)} of {len(bad) + int(finite.sum())} scores are not finite); "
            "stopped before the update, so the weights and the newest checkpoint are the last good ones. "
            "Fix the reward, or set nonfinite_rewards='drop' to leave such samples out of the loss")
    raise NonFiniteError(f"{source} gave a non-finite score on another process; stopped before the update")


def drop_nonfinite_scores(scores: torch.Tensor, finite: torch.Tensor, group_size: int) -> torch.Tensor:
    """Scores ``[B]`` with each non-finite one replaced by the mean of its group's finite scores
    (0 when none is), so a dropped sample shifts no group baseline; the caller keeps it out
    of the loss.

    >>> drop_nonfinite_scores(torch.tensor([1.0, float("nan"), 3.0, 0.0]), torch.tensor([1, 0, 1, 1]).bool(), 2)
    tensor([1., 1., 3., 0.])
    """
    grouped = torch.where(finite, scores, torch.zeros_like(scores)).view(-1, group_size)  # [prompts, G]
    counts = finite.view(-1, group_size).sum(-1, keepdim=True)  # [prompts, 1]
    means = (grouped.sum(-1, keepdim=True) / counts.clamp(min=1)).expand_as(grouped).reshape(-1)  # [B]
    kept = torch.where(finite, scores, means)  # [B]
    return kept.float() if kept.dtype == torch.float64 else kept  # task scores arrive as float64 (check_scores)


def check_update(values: dict[str, float], step: int) -> None:
    """Stop on every rank, before ``optimizer.step()``, when a loss or gradient norm is not finite."""
    bad = {name: value for name, value in values.items() if not math.isfinite(value)}
    if distributed.any_rank(bool(bad)):
        detail = ", ".join(f"{name}={value}" for name, value in bad.items()) or "on another process"
        raise NonFiniteError(f"step {step}: non-finite {detail}; stopped before the optimizer step, so the weights "
                             "and the newest checkpoint are the last good ones")


def contiguous_blocks(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`tensors` as flat views of the storage runs they tile back to back, plus the ones that
    tile none: ``(blocks, rest)``, together exactly the elements of `tensors` (tied tensors
    counted once). A paired policy and critic live in one ``[2, N]`` tensor
    (ppo/speed/model_pairs.py `side_by_side`), so a pass over their 104 weights becomes one
    reduction over one block instead of one kernel per tensor (torch's CPU ``_foreach_norm``).

    >>> rows = torch.arange(6.0)
    >>> blocks, rest = contiguous_blocks([rows[3:], rows[:3], torch.ones(2)])
    >>> [b.tolist() for b in blocks], [r.tolist() for r in rest]
    ([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], [[1.0, 1.0]])
    """
    runs: dict[tuple, list[torch.Tensor]] = {}
    seen, rest = set(), []
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_contiguous() and t.numel():  # keyed by where its storage starts (data_ptr less the offset)
            runs.setdefault((t.data_ptr() - t.storage_offset() * t.element_size(), t.dtype, t.device), []).append(t)
        else:
            rest.append(t)
    blocks = []
    for group in runs.values():
        group.sort(key=lambda t: t.storage_offset())
        start = end = group[0].storage_offset()
        for t in group:
            if t.storage_offset() != end:  # a gap or an overlap: not one block
                break
            end += t.numel()
        else:
            if len(group) > 1:
                blocks.append(torch.empty(0, dtype=group[0].dtype, device=group[0].device)
                              .set_(group[0].untyped_storage(), start, (end - start,)))
                continue
        rest.extend(group)
    return blocks, rest


def check_parameters(parameters: Sequence[torch.nn.Parameter], step: int) -> None:
    """Stop on every rank when an optimizer step left a non-finite weight."""
    # One norm per block of weights stored back to back, one fused norm per other weight: a NaN
    # or inf weight makes its norm non-finite. Only if a norm is non-finite (which finite but
    # huge weights can also give) check element-wise. 16-bit blocks are summed in float32.
    parameters = [p.to_local() if isinstance(p, DTensor) else p for p in parameters]  # FSDP: this rank's shards
    blocks, rest = contiguous_blocks(parameters)
    norms = ([torch.linalg.vector_norm(b, dtype=torch.float32 if b.element_size() < 4 else None) for b in blocks]
             + (list(torch._foreach_norm(rest)) if rest else []))
    finite = not norms or bool(torch.isfinite(torch.stack(norms)).all())
    if not finite:
        finite = all(bool(torch.isfinite(p).all()) for p in parameters)
    if distributed.any_rank(not finite):
        raise NonFiniteError(f"step {step}: the optimizer step made weights non-finite (learning rate too large?); "
                             "stopped before any checkpoint of them")


def score_source(task, reward_model_path: str | None = None) -> str:
    """What produced the sequence scores, for error messages: the reward model, the user's
    reward_fn, or the task."""
    if reward_model_path is not None:
        return f"the reward model {reward_model_path}"
    reward_fn = getattr(task, "reward_fn", None)
    if reward_fn is not None:
        return f"reward_fn {getattr(reward_fn, '__qualname__', type(reward_fn).__name__)}"
    return f"task {getattr(task, 'name', type(task).__name__)}"

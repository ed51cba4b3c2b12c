"""Held-out evaluation: greedy and sampled accuracy, and response length by correctness.

Two accuracies, because they answer different questions. Greedy accuracy is what the
model "knows"; sampled accuracy at temperature 1 is what the policy actually does when it
explores, and it is the one RL optimises directly (a sharper policy raises it even when
greedy accuracy stays put). Lengths are split into correct and incorrect responses because
several ablations (GRPO's length normalisation, Kimi's length reward) move them apart.

Evaluation is guarded as training is: the same prompt truncation (`max_prompt_length`,
`prompt_truncation`), and the same rule for a NaN or infinite reward (ppo/guards.py
`check_scores`: stop, or with ``nonfinite_rewards='drop'`` leave the sample out and count it
in ``*_dropped_nonfinite``); a reward function that raises is re-raised naming the batch.

Evaluation reseeds sampling (so two evaluations of the same policy agree) and must then
put every random generator back as it found it: `preserve_rng_state` saves and restores
Python's, torch's CPU generator and the accelerator's per-device generators (CUDA, MPS,
XPU, ...). Restoring only the CPU generator is not enough on a GPU: ``torch.manual_seed``
also reseeds every CUDA generator, so each mid-run evaluation would reset the training
run's GPU sampling stream and a resumed run would no longer match a straight one.
"""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from typing import Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .guards import NonFiniteError, RewardTypeError, check_scores, reward_function_error
from .rollout import decode_responses, generate
from .tasks.base import Problem, Score, Task


def score_source(task: Task) -> str:
    """What scores `task`'s responses, for error messages."""
    reward_fn = getattr(task, "reward_fn", None)
    if reward_fn is not None:
        return f"reward_fn {getattr(reward_fn, '__qualname__', type(reward_fn).__name__)}"
    return f"task {getattr(task, 'name', type(task).__name__)}"


def score_batch(task: Task, problems: Sequence[Problem], texts: list[str], has_eos: list[bool]) -> list[Score]:
    """Score a batch, in one call when the task can (custom reward functions), else one by one.

    An exception inside the scorer comes back as `RewardFunctionError` naming the batch (its
    cause is the original); the guards' own errors pass through as they are.
    """
    try:
        if hasattr(task, "score_batch"):
            return task.score_batch(problems, texts, has_eos)
        return [task.score(problem, text, eos) for problem, text, eos in zip(problems, texts, has_eos)]
    except (RewardTypeError, NonFiniteError):
        raise
    except Exception as error:
        raise reward_function_error(error, score_source(task), [p.prompt for p in problems]) from error


def accelerator_rng_devices() -> tuple[str, list[int]] | None:
    """The accelerator whose generators a reseed touches: ``(device_type, device indices)``.

    None when torch has no usable accelerator, or when its runtime was never initialised in
    this process (nothing has been sampled there, and reading its generators would create a
    device context, hundreds of MB of GPU memory, for a CPU-only run; torch only queues a
    reseed of an uninitialised device, and the trainer initialises its device before the
    first evaluation). All indices, not just
    the current device: ``torch.manual_seed`` reseeds every device's generator. Reading a
    generator's state is a host-side copy and needs no context on that device.
    """
    if not torch.accelerator.is_available():
        return None
    device_type = torch.accelerator.current_accelerator().type
    module = torch.get_device_module(device_type)
    is_initialized = getattr(module, "is_initialized", None)
    if is_initialized is not None and not is_initialized():
        return None
    return device_type, list(range(module.device_count()))


@contextlib.contextmanager
def preserve_rng_state() -> Iterator[None]:
    """Restore Python's, torch's CPU and the accelerator's device RNG states on exit.

    Evaluation reseeds and samples inside this block; training afterwards draws exactly
    the numbers it would have drawn without the evaluation (on CPU and on GPU), so a run
    with mid-run evaluations resumes exactly. ``torch.random.fork_rng`` does the torch
    part (CPU plus the listed devices of one device type)::

        >>> state = torch.get_rng_state()
        >>> with preserve_rng_state():
        ...     _ = torch.manual_seed(123); _ = torch.rand(5)
        >>> torch.equal(torch.get_rng_state(), state)
        True
    """
    python_state = random.getstate()
    accelerator = accelerator_rng_devices()
    if accelerator is None:
        fork = torch.random.fork_rng(devices=[])  # CPU generator only
    else:
        device_type, devices = accelerator
        fork = torch.random.fork_rng(devices=devices, device_type=device_type)
    try:
        with fork:
            yield
    finally:
        random.setstate(python_state)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


@torch.no_grad()
def score_generations(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    max_new_tokens: int,
    greedy: bool,
    temperature: float = 1.0,
    batch_size: int = 128,
    gather: Callable[[list], list] | None = None,
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
    nonfinite_rewards: str = "stop",
    source: str | None = None,
) -> dict:
    """Generate for every problem and summarise: accuracy, format rates, lengths.

    In a data-parallel run each process passes its own shard of `problems` and
    ``gather=ppo.distributed.gather_objects``: the summary then covers every process's
    problems (and is the same on every process). Prompts over `max_prompt_length` are cut
    as `prompt_truncation` says; a non-finite reward stops the run, or with
    ``nonfinite_rewards='drop'`` its sample is left out and counted (``dropped_nonfinite``).
    """
    correct, lengths, has_eos, has_answer, levels = [], [], [], [], []
    rewards, prompts, responses = [], [], []
    for start in range(0, len(problems), batch_size):
        chunk = list(problems[start:start + batch_size])
        rollout = generate(model, tokenizer, [p.prompt for p in chunk], max_new_tokens,
                           temperature=temperature, greedy=greedy, max_prompt_length=max_prompt_length,
                           prompt_truncation=prompt_truncation)
        texts = decode_responses(tokenizer, rollout)
        eos_flags = rollout.has_eos.tolist()
        scores = score_batch(task, chunk, texts, eos_flags)
        for problem, score, eos, length in zip(chunk, scores, eos_flags, rollout.response_lengths.tolist()):
            correct.append(score.correct)
            has_answer.append(score.has_answer)
            has_eos.append(eos)
            lengths.append(length)
            levels.append(problem.level)
            rewards.append(score.reward)
        prompts += [p.prompt for p in chunk]
        responses += texts
    # Training's non-finite rule, decided once per evaluation on every rank together (a
    # shard's number of chunks differs between ranks; the collective must not).
    finite = check_scores(torch.tensor(rewards, dtype=torch.float64), prompts, responses,
                          f"{source or score_source(task)} (held-out evaluation)",
                          drop=nonfinite_rewards == "drop").tolist()
    # In a data-parallel run each process scored its shard of the held-out set: summarise all.
    records = [record for record, keep in zip(zip(correct, has_answer, has_eos, lengths, levels), finite) if keep]
    dropped = len(finite) - len(records)
    records = gather(records) if gather is not None else records
    dropped = sum(gather([dropped]) if gather is not None else [dropped])
    correct, has_answer, has_eos, lengths, levels = (list(column) for column in zip(*records)) if records else ([],) * 5
    by_level = defaultdict(list)
    for level, ok in zip(levels, correct):
        if level is not None:
            by_level[level].append(float(ok))
    return {
        "accuracy": _mean([float(c) for c in correct]),
        "eos_rate": _mean([float(e) for e in has_eos]),
        "answer_rate": _mean([float(a) for a in has_answer]),
        "length": _mean([float(n) for n in lengths]),
        "length_correct": _mean([float(n) for n, c in zip(lengths, correct) if c]),
        "length_incorrect": _mean([float(n) for n, c in zip(lengths, correct) if not c]),
        "accuracy_by_level": {int(k): _mean(v) for k, v in sorted(by_level.items())},
        **({"dropped_nonfinite": float(dropped)} if nonfinite_rewards == "drop" else {}),
    }


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 128,
    problems: Sequence[Problem] | None = None,
    gather: Callable[[list], list] | None = None,
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
    nonfinite_rewards: str = "stop",
    source: str | None = None,
) -> dict:
    """Greedy and sampled (at `temperature`) metrics on the task's held-out set.

    `problems` may be this process's shard, with `gather` merging every process's results
    (see `score_generations`, which also applies training's guards: `max_prompt_length`,
    `prompt_truncation`, `nonfinite_rewards`; `source` names the scorer in its errors).

    Sampling is seeded with `seed` and every global RNG state (Python, torch CPU, accelerator
    devices) is restored afterwards (`preserve_rng_state`), so an evaluation in the middle
    of training does not change the training run's randomness.
    Returns a flat dict: ``greedy_accuracy``, ``sampled_accuracy``,
    ``sampled_length_correct``, ... and per-level accuracies.
    """
    problems = list(task.eval_problems() if problems is None else problems)
    guards = dict(max_prompt_length=max_prompt_length, prompt_truncation=prompt_truncation,
                  nonfinite_rewards=nonfinite_rewards, source=source)
    with preserve_rng_state():
        torch.manual_seed(seed)
        greedy = score_generations(model, tokenizer, task, problems, max_new_tokens, greedy=True,
                                   batch_size=batch_size, gather=gather, **guards)
        sampled = score_generations(model, tokenizer, task, problems, max_new_tokens, greedy=False,
                                    temperature=temperature, batch_size=batch_size, gather=gather, **guards)
    flat = {}
    for prefix, result in (("greedy", greedy), ("sampled", sampled)):
        for key, value in result.items():
            if key == "accuracy_by_level":
                for level, accuracy in value.items():
                    flat[f"{prefix}_accuracy_level{level}"] = accuracy
            else:
                flat[f"{prefix}_{key}"] = value
    return flat


def format_eval(metrics: dict) -> str:
    """A short human-readable table of `evaluate`'s output."""
    lines = [f"{'':10s} {'accuracy':>9s} {'len(correct)':>13s} {'len(wrong)':>11s} {'eos rate':>9s}"]
    for prefix in ("greedy", "sampled"):
        lines.append(
            f"{prefix:10s} {metrics[f'{prefix}_accuracy']:9.3f} {metrics[f'{prefix}_length_correct']:13.1f} "
            f"{metrics[f'{prefix}_length_incorrect']:11.1f} {metrics[f'{prefix}_eos_rate']:9.3f}"
        )
    levels = sorted(int(k.rsplit("level", 1)[1]) for k in metrics if k.startswith("sampled_accuracy_level"))
    if levels:
        per_level = "  ".join(
            f"L{lv}: {metrics[f'greedy_accuracy_level{lv}']:.2f}/{metrics[f'sampled_accuracy_level{lv}']:.2f}"
            for lv in levels
        )
        lines.append(f"by level (greedy/sampled): {per_level}")
    return "\n".join(lines)

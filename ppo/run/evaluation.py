"""Held-out evaluation: greedy and sampled accuracy, and response length by correctness.

Two accuracies, because they answer different questions. Greedy accuracy is what the
model "knows"; sampled accuracy at temperature 1 is what the policy actually does when it
explores, and it is the one RL optimises directly (a sharper policy raises it even when
greedy accuracy stays put). Lengths are split into correct and incorrect responses because
several ablations (GRPO's length normalisation, Kimi's length reward) move them apart.

Precise enough to compare runs. One sampled response per held-out problem makes the sampled
accuracy a single draw of N coin flips: on the 256-problem testbed set its draw-to-draw
spread is as large as the seed-to-seed spread of trained runs. So each problem is sampled
several times (``PPOConfig.eval_samples_per_prompt``) and the accuracy is the mean per-problem
pass rate, whose evaluation noise shrinks as 1/sqrt(draws); `pass_at_k` sits beside it. Draws
are seeded per chunk from the run's seed (`chunk_seed`), so the two arms of a seed pair see the
same sampling noise (common random numbers) and a paired difference keeps little of it.

Evaluation is guarded as training is: the same prompt truncation (`max_prompt_length`,
`prompt_truncation`), and the same rule for a NaN or infinite reward (ppo/run/guards.py
`check_scores`: stop, or with ``nonfinite_rewards='drop'`` leave the sample out and count it
in ``*_dropped_nonfinite``); a reward function that raises is re-raised naming the batch.

A thinking budget (Qwen3, arXiv 2505.09388, sec. 4.3: thinking-mode fusion's early exit) caps the
part of a response before the task's answer marker: `finish_after_thinking_budget` generates
at most `thinking_budget` tokens, and a response that has neither stopped nor written the
marker by then gets the marker appended, as Qwen3 appends its early-exit string and
``</think>``, and is continued for at most `answer_tokens` more tokens, its answer then
scored as any other (`score_generations`, ``python -m ppo.run.thinking_budget``).

Evaluation reseeds sampling (so two evaluations of the same policy agree) and must then
put every random generator back as it found it: `preserve_rng_state` saves and restores
Python's, torch's CPU generator and the accelerator's per-device generators (CUDA, MPS,
XPU, ...). Restoring only the CPU generator is not enough on a GPU: ``torch.manual_seed``
also reseeds every CUDA generator, so each mid-run evaluation would reset the training
run's GPU sampling stream and a resumed run would no longer match a straight one.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import defaultdict
from typing import Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ppo.run.guards import NonFiniteError, RewardTypeError, check_scores, reward_function_error
from ppo.models.rollout import Rollout, decode_responses, generate
from ppo.tasks.base import Problem, Score, Task


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


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """The unbiased pass@k of one prompt from `samples` draws of which `correct` were right:
    ``1 - C(n - c, k) / C(n, k)``, the chance that k draws without replacement hold at least
    one right answer (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1).

    Worked example: 4 draws, 1 right: pass@1 = 1 - C(3,1)/C(4,1) = 0.25, pass@2 = 1 - 3/6 = 0.5,
    pass@4 = 1.0. NaN when k > samples (the estimate needs k draws).
    """
    if k > samples:
        return float("nan")
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of one evaluation chunk: the run's evaluation seed and the chunk's index.

    Reseeding each chunk (rather than drawing every chunk from one stream) keeps the random
    numbers of a given problem and draw the same whatever the model generated before it: a
    chunk that stops early (every response finished) would otherwise shift every later chunk's
    draws. Two arms of a seed pair therefore sample their held-out responses from the same
    noise (common random numbers), and their difference carries less evaluation noise.
    """
    return (seed * 1_000_003 + chunk) % (2 ** 63)


def sampled_chunks(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    max_new_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
    batch_size: int = 128,
    samples_per_prompt: int = 1,
    seed: int | None = None,
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
) -> Iterator[tuple[list[tuple[int, Problem]], "Rollout"]]:
    """Generate for every problem, `samples_per_prompt` times (contiguous; greedy: once), in
    chunks of `batch_size` responses; yields ``(chunk, rollout)`` where `chunk` lists each row's
    (problem index, problem). With `seed`, chunk c samples after
    ``torch.manual_seed(chunk_seed(seed, c))`` (common random numbers, see `chunk_seed`)."""
    draws = 1 if greedy else samples_per_prompt
    expanded = [(index, problem) for index, problem in enumerate(problems) for _ in range(draws)]
    for chunk_index, start in enumerate(range(0, len(expanded), batch_size)):
        chunk = expanded[start:start + batch_size]
        if seed is not None and not greedy:
            torch.manual_seed(chunk_seed(seed, chunk_index))
        yield chunk, generate(model, tokenizer, [p.prompt for _, p in chunk], max_new_tokens, temperature=temperature,
                              greedy=greedy, max_prompt_length=max_prompt_length, prompt_truncation=prompt_truncation)


def finish_after_thinking_budget(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    rollout: Rollout,
    answer_marker: str,
    answer_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
) -> tuple[list[str], list[bool], list[int]]:
    """Responses whose thinking was cut at the rollout's width (the budget), finished.

    `rollout` holds at most N = budget tokens per response. A response that stopped is
    final, answered or not. One that did not stop but wrote `answer_marker` has finished
    thinking and is continued (its answer is not part of the budget). One that wrote neither
    gets the marker appended right after its N thinking tokens, Qwen3's early exit, and is
    continued. A continuation samples at most `answer_tokens` tokens from prompt + text so
    far, under the same rule (greedy or `temperature`), from the global RNG.

    Returns ``(texts, has_eos, lengths)``, one per response; a length counts every token of
    the response, the forced marker's included (N + marker + answer).
    """
    texts = decode_responses(tokenizer, rollout)  # [B] strings
    has_eos = rollout.has_eos.tolist()
    lengths = rollout.response_lengths.tolist()
    marker_ids = tokenizer(answer_marker, add_special_tokens=False)["input_ids"]
    forced = [not eos and answer_marker not in text for text, eos in zip(texts, has_eos)]
    unfinished = [i for i, eos in enumerate(has_eos) if not eos]
    if not unfinished:
        return texts, has_eos, lengths
    for i in unfinished:
        if forced[i]:
            texts[i] += answer_marker
            lengths[i] += len(marker_ids)
    tail = generate(model, tokenizer, [prompts[i] + texts[i] for i in unfinished], answer_tokens,
                    temperature=temperature, greedy=greedy, max_prompt_length=max_prompt_length,
                    prompt_truncation=prompt_truncation)
    for i, text, eos, length in zip(unfinished, decode_responses(tokenizer, tail), tail.has_eos.tolist(),
                                    tail.response_lengths.tolist()):
        texts[i], has_eos[i], lengths[i] = texts[i] + text, eos, lengths[i] + length
    return texts, has_eos, lengths


def summarise_problems(records: Sequence[dict], draws: int) -> dict:
    """The evaluation summary from per-problem records (each: ``level`` and the lists
    ``correct``, ``answer``, ``eos``, ``length`` over that problem's kept draws).

    ``accuracy`` is the mean over problems of their pass rates; with `draws` > 1 the summary
    adds ``accuracy_se`` = ``sqrt(sum_i p_i (1 - p_i) / (n_i - 1)) / N`` (the standard error of
    that mean over the evaluation's own draws) and ``pass_at_<draws>`` (`pass_at_k`).

    Worked example, 4 draws: problem A right 3 times, B never: accuracy (0.75 + 0) / 2 =
    0.375, accuracy_se sqrt(0.75 * 0.25 / 3) / 2 = 0.125, pass_at_4 (1 + 0) / 2 = 0.5.
    """
    pass_rates = [_mean([float(c) for c in entry["correct"]]) for entry in records]

    def every(key: str) -> list:
        return [value for entry in records for value in entry[key]]

    pairs = list(zip(every("length"), every("correct")))
    by_level = defaultdict(list)
    for entry, rate in zip(records, pass_rates):
        if entry["level"] is not None:
            by_level[entry["level"]].append(rate)
    summary = {
        "accuracy": _mean(pass_rates),
        "eos_rate": _mean([float(e) for e in every("eos")]),
        "answer_rate": _mean([float(a) for a in every("answer")]),
        "length": _mean([float(n) for n in every("length")]),
        "length_correct": _mean([float(n) for n, c in pairs if c]),
        "length_incorrect": _mean([float(n) for n, c in pairs if not c]),
        "accuracy_by_level": {int(k): _mean(v) for k, v in sorted(by_level.items())},
    }
    if draws > 1:
        counts = [(len(entry["correct"]), sum(bool(c) for c in entry["correct"])) for entry in records]
        within = [p * (1 - p) / (n - 1) for p, (n, _) in zip(pass_rates, counts) if n > 1]
        summary["accuracy_se"] = math.sqrt(sum(within)) / len(records) if records else float("nan")
        summary[f"pass_at_{draws}"] = _mean([pass_at_k(n, c, draws) for n, c in counts if n >= draws])
    return summary


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
    samples_per_prompt: int = 1,
    seed: int | None = None,
    thinking_budget: int | None = None,
    answer_tokens: int = 16,
) -> dict:
    """Generate for every problem (`sampled_chunks`) and summarise (`summarise_problems`):
    accuracy, format rates, lengths.

    With `thinking_budget` N, each response thinks at most N tokens before the task's
    ``answer_marker`` is forced, then answers in at most `answer_tokens`
    (`finish_after_thinking_budget`).

    In a data-parallel run each process passes its own shard of `problems` and
    ``gather=ppo.parallel.distributed.gather_objects``: the summary then covers every process's
    problems (and is the same on every process). Prompts over `max_prompt_length` are cut
    as `prompt_truncation` says; a non-finite reward stops the run, or with
    ``nonfinite_rewards='drop'`` its sample is left out and counted (``dropped_nonfinite``).
    """
    samples = []  # one (problem index, problem, score, has_eos, length) per response
    texts_all = []
    if thinking_budget is not None:
        if thinking_budget < 1 or getattr(task, "answer_marker", None) is None:
            raise ValueError(f"thinking_budget={thinking_budget}: needs a budget >= 1 and a task with an "
                             f"answer_marker (task {getattr(task, 'name', type(task).__name__)!r})")
        max_new_tokens = min(max_new_tokens, thinking_budget)
    for chunk, rollout in sampled_chunks(model, tokenizer, problems, max_new_tokens, greedy, temperature, batch_size,
                                         samples_per_prompt, seed, max_prompt_length, prompt_truncation):
        if thinking_budget is None:
            texts, eos_flags, lengths = (decode_responses(tokenizer, rollout), rollout.has_eos.tolist(),
                                         rollout.response_lengths.tolist())
        else:  # Qwen3's early exit: the marker forced after the budget, then the answer
            texts, eos_flags, lengths = finish_after_thinking_budget(
                model, tokenizer, [p.prompt for _, p in chunk], rollout, task.answer_marker, answer_tokens, greedy,
                temperature, max_prompt_length, prompt_truncation)
        scores = score_batch(task, [p for _, p in chunk], texts, eos_flags)
        samples += [(index, problem, score, eos, length) for (index, problem), score, eos, length
                    in zip(chunk, scores, eos_flags, lengths)]
        texts_all += texts
    # Training's non-finite rule, decided once per evaluation on every rank together (a
    # shard's number of chunks differs between ranks; the collective must not).
    finite = check_scores(torch.tensor([sample[2].reward for sample in samples], dtype=torch.float64),
                          [sample[1].prompt for sample in samples], texts_all,
                          f"{source or score_source(task)} (held-out evaluation)",
                          drop=nonfinite_rewards == "drop").tolist()
    # Per problem: its kept draws. A problem's draws all live on one process, so each
    # problem's record is complete before the gather.
    per_problem: dict[int, dict] = {}
    for keep, (index, problem, score, eos, length) in zip(finite, samples):
        entry = per_problem.setdefault(index, {"level": problem.level, "correct": [], "answer": [], "eos": [],
                                               "length": []})
        if keep:
            for key, value in (("correct", score.correct), ("answer", score.has_answer), ("eos", eos),
                               ("length", length)):
                entry[key].append(value)
    records = [entry for entry in per_problem.values() if entry["correct"]]
    dropped = len(finite) - sum(len(entry["correct"]) for entry in records)
    records = gather(records) if gather is not None else records
    dropped = sum(gather([dropped]) if gather is not None else [dropped])
    summary = summarise_problems(records, 1 if greedy else samples_per_prompt)
    if nonfinite_rewards == "drop":
        summary["dropped_nonfinite"] = float(dropped)
    return summary


@torch.no_grad()
def heldout_kl(
    policy: PreTrainedModel,
    reference: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    max_new_tokens: int,
    seed: int,
    samples_per_prompt: int = 1,
    batch_size: int = 128,
    max_prompt_length: int | None = None,
    prompt_truncation: str = "error",
) -> float:
    """The true KL(policy || reference) on held-out prompts, in nats per response.

    Samples what the sampled evaluation with this `seed` samples (`sampled_chunks`) and
    averages the sequence-level k1 estimate ``sum_t log pi(y_t) - log pi_ref(y_t)`` over the
    responses: an unbiased estimate of the KL, unlike the clipped or per-token estimators
    training may use, and on prompts no training step saw.
    """
    from ppo.models.logprobs import response_logprobs

    totals = []
    with preserve_rng_state():
        for _, rollout in sampled_chunks(policy, tokenizer, problems, max_new_tokens, batch_size=batch_size,
                                         samples_per_prompt=samples_per_prompt, seed=seed,
                                         max_prompt_length=max_prompt_length, prompt_truncation=prompt_truncation):
            inputs = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
            logprobs = response_logprobs(policy, *inputs)  # [B, T]
            ref_logprobs = response_logprobs(reference, *inputs)  # [B, T]
            totals += ((logprobs - ref_logprobs) * rollout.response_mask).sum(1).tolist()  # [B] nats each
    return _mean(totals)


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
    samples_per_prompt: int = 1,
    thinking_budget: int | None = None,
) -> dict:
    """Greedy and sampled (at `temperature`) metrics on the task's held-out set.

    `problems` may be this process's shard, with `gather` merging every process's results
    (see `score_generations`, which also applies training's guards: `max_prompt_length`,
    `prompt_truncation`, `nonfinite_rewards`; `source` names the scorer in its errors).
    Each problem is sampled `samples_per_prompt` times: ``sampled_accuracy`` is then the mean
    per-problem pass rate, with ``sampled_accuracy_se`` and ``sampled_pass_at_<n>`` beside it.

    Sampling is seeded with `seed`, chunk by chunk (`chunk_seed`), and every global RNG state
    (Python, torch CPU, accelerator devices) is restored afterwards (`preserve_rng_state`), so
    an evaluation in the middle of training does not change the training run's randomness.
    Returns a flat dict: ``greedy_accuracy``, ``sampled_accuracy``,
    ``sampled_length_correct``, ... and per-level accuracies. With `thinking_budget` both
    are measured with the answer marker forced after that many tokens (`score_generations`).
    """
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    problems = list(task.eval_problems() if problems is None else problems)
    guards = dict(max_prompt_length=max_prompt_length, prompt_truncation=prompt_truncation,
                  nonfinite_rewards=nonfinite_rewards, source=source, thinking_budget=thinking_budget)
    with preserve_rng_state():
        torch.manual_seed(seed)
        greedy = score_generations(model, tokenizer, task, problems, max_new_tokens, greedy=True,
                                   batch_size=batch_size, gather=gather, **guards)
        sampled = score_generations(model, tokenizer, task, problems, max_new_tokens, greedy=False,
                                    temperature=temperature, batch_size=batch_size, gather=gather,
                                    samples_per_prompt=samples_per_prompt, seed=seed, **guards)
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

"""The default testbed task: scratchpad addition with a verifiable reward.

A prompt is a sum, e.g. ``"27+5+8="``. A demonstration works it out left to right on a
scratchpad, optionally re-checks the total a variable number of times, and then writes the
final answer after the ``#`` marker::

    27+5=32;32+8=40;chk40;#40<eos>

Why it looks like this (each property is something a later ablation measures):

- **Difficulty levels.** Level ``k`` has a fixed number of operands and digits (see
  `LEVELS`), so a partially trained model solves level 0 nearly always and the top level
  rarely. Group-relative advantages (GRPO's std division, difficulty filtering) act very
  differently on these groups.
- **Variable length for the same answer.** Demonstrations carry 0..`max_checks` optional
  ``chk<total>;`` steps, so one problem has short and long correct responses and RL can
  move response length either way; length normalisation and Kimi's length reward have a
  visible effect.
- **A verifiable scorer with format signals.** `score` parses the text after the last
  ``#`` marker; a response without it, or without EOS, is flagged.
- **A fixed, seeded held-out set** with equal counts per level and no repeated prompt. It
  depends only on the levels, its size and its seed (never on the demonstrator's
  `slip_rate`), so the SFT report and every RL evaluation score the same problems, and
  every training problem (SFT's and RL's) is redrawn when its text is a held-out prompt.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from ppo.tasks.base import Problem, Score

ANSWER_MARKER = "#"
STEP_SEPARATOR = ";"
CHECK_PREFIX = "chk"

# (number of operands, digits per operand) for each difficulty level.
LEVELS: tuple[tuple[int, int], ...] = ((2, 1), (3, 1), (4, 1), (3, 2))

_ANSWER_RE = re.compile(r"#(-?\d+)\s*$")


def solve_with_scratchpad(operands: Sequence[int], num_checks: int, slips: Sequence[int] = ()) -> str:
    """The demonstration response for a sum: running totals, re-checks, answer.

    `slips[i]` (default 0) is added to the result of step i: a demonstrator's arithmetic
    slip, carried through the remaining steps so the final answer is wrong.

    >>> solve_with_scratchpad([27, 5, 8], num_checks=1)
    '27+5=32;32+8=40;chk40;#40'
    >>> solve_with_scratchpad([27, 5, 8], num_checks=0, slips=[0, -1])
    '27+5=32;32+8=39;#39'
    """
    steps = []
    total = operands[0]
    for i, operand in enumerate(operands[1:]):
        result = max(0, total + operand + (slips[i] if i < len(slips) else 0))
        steps.append(f"{total}+{operand}={result}")
        total = result
    steps += [f"{CHECK_PREFIX}{total}"] * num_checks
    return STEP_SEPARATOR.join(steps) + f"{STEP_SEPARATOR}{ANSWER_MARKER}{total}"


def parse_answer(response: str) -> str | None:
    """The integer after the final answer marker, or None when it is missing or garbled.

    The marker must end the response (trailing whitespace allowed): text after the answer
    means the model kept going and the answer is not final.

    >>> parse_answer("3+4=7;#7"), parse_answer("3+4=7;#7;chk7"), parse_answer("3+4=7")
    ('7', None, None)
    """
    match = _ANSWER_RE.search(response)
    return match.group(1) if match else None


@dataclass
class ArithmeticTask:
    """Scratchpad addition over difficulty `levels`.

    Args:
        levels: (operands, digits) per level; training problems draw a level uniformly.
        max_checks: demonstrations use 0..max_checks optional ``chk`` steps, uniformly.
        slip_rate: probability that a demonstration step's result is off by 1-3 (a noisy
            demonstrator). A policy imitating such demonstrations slips at about this rate
            per step when it samples, but its most likely token is the right one, so RL with
            the verifiable reward has a real, learnable gap to close: greedy accuracy is
            well above sampled accuracy. Held-out problems are always scored against the
            true sum.
        eval_size: held-out problems (split equally across levels, distinct prompts).
        eval_seed: seed of the held-out set; training problems whose prompt is a held-out
            prompt are redrawn, so the held-out accuracy measures generalisation.
    """

    levels: tuple[tuple[int, int], ...] = LEVELS
    max_checks: int = 3
    slip_rate: float = 0.0
    eval_size: int = 256
    eval_seed: int = 1234
    name: str = "arithmetic"
    # What ends the thinking: the evaluation's thinking budget forces it (ppo/run/evaluation.py).
    answer_marker = ANSWER_MARKER

    def __post_init__(self):
        self.levels = tuple(tuple(level) for level in self.levels)
        for i, (operands, digits) in enumerate(self.levels):
            if operands < 2 or not 1 <= digits <= 4:
                raise ValueError(
                    f"levels[{i}]: need at least 2 operands and 1-4 digits, got {(operands, digits)}"
                )
        if not 0.0 <= self.slip_rate < 1.0:
            raise ValueError(f"slip_rate: must be in [0, 1), got {self.slip_rate}")
        if self.max_checks < 0:
            raise ValueError(f"max_checks: must be >= 0, got {self.max_checks}")
        if self.eval_size < len(self.levels):
            raise ValueError(f"eval_size: must be at least the number of levels ({len(self.levels)})")
        self._eval = self._make_held_out_set()
        self._eval_prompts = {p.prompt for p in self._eval}

    # -- problems ---------------------------------------------------------------------
    def _draw_operands(self, level: int, rng: random.Random) -> list[int]:
        operands_count, digits = self.levels[level]
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return [rng.randint(low, 10**digits - 1) for _ in range(operands_count)]

    def make_problem(self, level: int, rng: random.Random) -> Problem:
        operands_count = self.levels[level][0]
        operands = self._draw_operands(level, rng)
        prompt = "+".join(map(str, operands)) + "="
        num_checks = rng.randint(0, self.max_checks)
        slips = [rng.choice((-3, -2, -1, 1, 2, 3)) if rng.random() < self.slip_rate else 0
                 for _ in range(operands_count - 1)]
        return Problem(
            prompt=prompt,
            answer=str(sum(operands)),
            level=level,
            demonstration=solve_with_scratchpad(operands, num_checks, slips),
            meta={"operands": operands},
        )

    def _make_held_out_set(self) -> list[Problem]:
        """`eval_size` distinct problems, levels in turn (0, 1, ..., 0, 1, ...), so any prefix
        is balanced. Drawn from operands alone with their own generator: the set does not
        depend on `slip_rate` or `max_checks`, which only shape demonstrations."""
        rng = random.Random(self.eval_seed)
        counts = [len(range(level, self.eval_size, len(self.levels))) for level in range(len(self.levels))]
        for level, count in enumerate(counts):
            operands_count, digits = self.levels[level]
            distinct = (10**digits - (0 if digits == 1 else 10 ** (digits - 1))) ** operands_count
            if count > 0.8 * distinct:  # at least a fifth of every level is left to train on
                raise ValueError(f"eval_size {self.eval_size}: level {level} {self.levels[level]} has only {distinct} "
                                 f"distinct problems; holding out {count} would leave too few to train on")
        per_level: list[list[Problem]] = [[] for _ in self.levels]
        seen: set[str] = set()
        for level, count in enumerate(counts):
            while len(per_level[level]) < count:
                operands = self._draw_operands(level, rng)
                prompt = "+".join(map(str, operands)) + "="
                if prompt not in seen:
                    seen.add(prompt)
                    per_level[level].append(Problem(prompt=prompt, answer=str(sum(operands)), level=level,
                                                    demonstration=solve_with_scratchpad(operands, 0),
                                                    meta={"operands": operands}))
        return [per_level[i % len(self.levels)][i // len(self.levels)] for i in range(self.eval_size)]

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        problems = []
        while len(problems) < n:
            problem = self.make_problem(rng.randrange(len(self.levels)), rng)
            if problem.prompt not in self._eval_prompts:
                problems.append(problem)
        return problems

    def eval_problems(self) -> Sequence[Problem]:
        return self._eval

    # -- scoring ----------------------------------------------------------------------
    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        answer = parse_answer(response)
        return Score(correct=answer is not None and int(answer) == int(problem.answer),
                     has_answer=answer is not None, has_eos=has_eos)

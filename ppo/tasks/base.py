"""What a task is: problems, demonstrations for SFT, and a verifiable scorer.

A task hands the trainer `Problem`s (a prompt plus what the scorer needs to check an
answer) and scores decoded responses. The score has two parts on purpose:

- `correct`: the verifiable reward (RLVR), 1 if the final answer is right.
- `has_answer` / `has_eos`: format signals. A response that never wrote the answer marker,
  or that ran out of tokens before its end-of-sequence token, is detectable on its own so
  that the missing-EOS tricks of PPO (penalise it, replace its score) have something to act
  on and so that "format reward" experiments (DeepSeek R1) are possible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer.

    `level` is the difficulty level (None when the task has none); ablations break
    accuracy and gradient weight down by it.
    """

    prompt: str
    answer: str
    level: int | None = None
    demonstration: str | None = None  # an SFT target response, when the task has one
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Score:
    """The verdict on one response."""

    correct: bool
    has_answer: bool  # an answer could be read by the task's rule (e.g. the number after an answer marker)
    has_eos: bool  # the response ended with the end-of-sequence token
    value: float | None = None  # a real-valued reward (custom reward functions); None: use `correct`

    @property
    def reward(self) -> float:
        """The reward: `value` when set, else the verifiable 1.0 / 0.0 for correctness."""
        if self.value is not None:
            return self.value
        return 1.0 if self.correct else 0.0

    @property
    def well_formed(self) -> bool:
        return self.has_answer and self.has_eos


class Task(Protocol):
    """The interface the trainer, SFT and evaluation use."""

    name: str

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        """`n` training problems drawn with `rng`."""

    def eval_problems(self) -> Sequence[Problem]:
        """The fixed held-out evaluation set."""

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        """Check a decoded response (special tokens removed) against `problem`."""

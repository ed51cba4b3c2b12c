r"""A MATH-style task whose answers are checked by math-verify (``task='math'``).

Each row of `PPOConfig.dataset` holds a prompt (`prompt_column`) and a gold answer
(`answer_column`), in any format `ppo.tasks.data_files` reads::

    {"prompt": "What is 1/2 + 1/4? Put the answer in \\boxed{}.", "answer": "\\frac{3}{4}"}

Answers are parsed and compared by Hugging Face's math-verify (the optional ``math``
extra, ``pip install -e '.[math-verify]'``), which turns LaTeX and plain expressions into SymPy
objects and compares them as mathematics, not as strings:

- **the gold answer** is LaTeX without delimiters (``\frac{3}{4}``, ``(1, 3]``,
  ``2\sqrt{2}``), read as if boxed; a gold text that already holds ``\boxed{}`` or ``$``
  (a full solution, as MATH's ``solution`` field) is read as it is. A gold answer
  math-verify cannot parse stops the task at load, naming its row.
- **the response's answer** is what math-verify extracts from the whole response: the
  last ``\boxed{}`` first, then LaTeX in ``$...$``, then a plain expression. A response it
  extracts nothing from has no answer (`Score.has_answer` False).
- **equal** means equal as numbers (``0.5`` = ``\frac12``, ``1,000`` = ``1000``, ``10\%`` = ``10``),
  as expressions (``(x+1)^2`` = ``x^2+2x+1``, ``\sqrt8`` = ``2\sqrt2``), as sets in any order
  (``\{2, 1\}`` = ``\{1, 2\}``), as intervals with their open and closed ends (``[1,3]`` is
  not ``(1,3]``), and an equation's right side (``x=2`` = ``2``). tests/test_math_verify_task.py
  holds the tricky cases.
- **a timeout** (`PPOConfig.math_verify_timeout`, whole seconds) bounds each parse and each
  comparison: SymPy can take very long on adversarial output, and a check that times out
  counts as wrong. math-verify times out with ``signal.alarm``, which works only in a
  process's main thread; elsewhere the checks run without a timeout.

The GSM8K scorer (`ppo.tasks.gsm8k`) is unchanged: numbers only, by its own rules.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Sequence

from ppo.tasks.base import Problem, Score
from ppo.tasks.gsm8k import TaskDataError


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise ImportError("task='math' checks answers with math-verify, which is not installed: "
                          "pip install -e '.[math-verify]' (or pip install math-verify)") from None
    return math_verify


def _timeout(seconds: int) -> int | None:
    """`seconds`, or None (no timeout) outside the main thread, where signal.alarm cannot run."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def parse_gold(answer: str, timeout: int = 5) -> list:
    r"""The gold `answer` as math-verify objects; bare LaTeX is read as if boxed.

    >>> parse_gold(r"\frac{3}{4}")[0]
    3/4
    """
    math_verify = _math_verify()
    text = answer if ("\\boxed" in answer or "$" in answer) else "\\boxed{" + answer + "}"
    return math_verify.parse(text, parsing_timeout=_timeout(timeout))


def parse_response(response: str, timeout: int = 5) -> list:
    """What math-verify extracts from a response: empty when it finds no answer."""
    return _math_verify().parse(response, parsing_timeout=_timeout(timeout))


def answers_match(gold: list, predicted: list, timeout: int = 5) -> bool:
    r"""Whether math-verify finds `predicted` equal to `gold` (both from the parsers above).

    >>> answers_match(parse_gold("(1, 3]"), parse_response(r"so $\boxed{(1,3]}$"))
    True
    """
    if not gold or not predicted:
        return False
    return bool(_math_verify().verify(gold, predicted, timeout_seconds=_timeout(timeout)))


def math_problems(rows: list[dict], where: str, prompt_column: str, answer_column: str,
                  timeout: int = 5) -> list[Problem]:
    """`Problem`s from dataset rows; every gold answer is parsed here, once, so a bad one
    stops the run at load with its row named."""
    from ppo.tasks.data_files import column

    prompts = column(rows, prompt_column, where, "prompt_column")
    answers = column(rows, answer_column, where, "answer_column", numbers=True)
    problems = []
    for index, (prompt, answer) in enumerate(zip(prompts, answers), start=1):
        if not parse_gold(answer, timeout):
            raise TaskDataError(f"{where}: row {index}: math-verify cannot parse the gold answer {answer!r} "
                                f"(column {answer_column!r})")
        problems.append(Problem(prompt=prompt, answer=answer, meta={"row": index}))
    return problems


@dataclass
class MathTask:
    """Problems from a dataset, responses checked against the gold answers by math-verify.

    Args:
        train: training problems (`math_problems`).
        held_out: held-out problems; None evaluates on the training problems.
        timeout: seconds per parse or comparison (`PPOConfig.math_verify_timeout`).
    """

    train: list[Problem]
    held_out: list[Problem] | None = None
    timeout: int = 5
    name: str = "math"
    _gold: dict = field(init=False, repr=False, default_factory=dict)

    @classmethod
    def from_config(cls, config) -> "MathTask":
        from ppo.tasks.data_files import train_and_eval_rows

        _math_verify()  # a missing extra is named before any file is read
        (rows, where), held_out = train_and_eval_rows(config)
        read = dict(prompt_column=config.prompt_column, answer_column=config.answer_column,
                    timeout=config.math_verify_timeout)
        return cls(math_problems(rows, where, **read),
                   math_problems(*held_out, **read) if held_out is not None else None,
                   timeout=config.math_verify_timeout)

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self.train) for _ in range(n)]

    def eval_problems(self) -> Sequence[Problem]:
        return self.held_out if self.held_out is not None else self.train

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        if problem.answer not in self._gold:  # parsed once per distinct answer
            self._gold[problem.answer] = parse_gold(problem.answer, self.timeout)
        predicted = parse_response(response, self.timeout)
        correct = answers_match(self._gold[problem.answer], predicted, self.timeout)
        return Score(correct=correct, has_answer=bool(predicted), has_eos=has_eos)

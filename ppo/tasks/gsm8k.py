"""A JSONL math task in the GSM8K layout, for real models.

Each line is a JSON object with a ``question`` and an ``answer`` whose last line is
``#### <number>`` (GSM8K's layout: the worked solution, then the final number)::

    {"question": "Tom has 3 apples ...", "answer": "3 + 4 = 7\\n#### 7"}

The reward is numeric answer checking: the number after the response's last ``####``
(or, if the model never wrote the marker, nothing: `has_answer` is False), compared with
the gold number after removing thousands separators, as a float with a tiny tolerance so
``"7"``, ``"7.0"`` and ``"7.00"`` all match.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .base import Problem, Score

GSM8K_MARKER = "####"
_NUMBER_RE = re.compile(r"-?\$?\s*(-?[\d,]*\.?\d+)")
_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


class TaskDataError(ValueError):
    """A data file that cannot be used; the message names the file, line and field."""


def parse_number(text: str) -> float | None:
    """The first number in `text` as a float (commas and a leading $ allowed), else None.

    >>> parse_number(" 1,234.5 dollars"), parse_number("$-3"), parse_number("none")
    (1234.5, -3.0, None)
    """
    match = _NUMBER_RE.search(text)
    if not match:
        return None
    raw = match.group(0).replace("$", "").replace(",", "").replace(" ", "")
    try:
        return float(raw)
    except ValueError:
        return None


def extract_final_answer(text: str) -> float | None:
    """The number after the last ``####`` marker in `text`, or None."""
    if GSM8K_MARKER not in text:
        return None
    return parse_number(text.rsplit(GSM8K_MARKER, 1)[1])


def load_gsm8k_jsonl(path: str | Path) -> list[Problem]:
    """Read a GSM8K-layout JSONL file into `Problem`s, validating every row up front.

    Raises `TaskDataError` naming the path and line for: an unreadable file, invalid
    JSON, a missing or non-string ``question``/``answer``, an empty question, an answer
    without ``#### <number>``, or a non-numeric gold answer. Blank lines are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"{path}: no such JSONL file")
    problems = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise TaskDataError(f"{where}: invalid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise TaskDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in ("question", "answer"):
                if key not in row:
                    raise TaskDataError(f"{where}: missing field {key!r}")
                if not isinstance(row[key], str):
                    raise TaskDataError(f"{where}: field {key!r} must be a string")
            question, answer = row["question"].strip(), row["answer"]
            if not question:
                raise TaskDataError(f"{where}: field 'question' is empty (an empty prompt)")
            if GSM8K_MARKER not in answer:
                raise TaskDataError(f"{where}: field 'answer' has no '{GSM8K_MARKER} <number>' line")
            gold_text = answer.rsplit(GSM8K_MARKER, 1)[1].strip()
            gold = parse_number(gold_text)
            if gold is None or not re.fullmatch(r"-?\$?[\d,]*\.?\d+", gold_text.replace(" ", "")):
                raise TaskDataError(
                    f"{where}: field 'answer' has a non-numeric gold answer {gold_text!r}"
                )
            problems.append(
                Problem(
                    prompt=_PROMPT_TEMPLATE.format(question=question),
                    answer=repr(gold),
                    level=row.get("level") if isinstance(row.get("level"), int) else None,
                    demonstration=" " + answer.strip(),
                    meta={"line": line_number},
                )
            )
    if not problems:
        raise TaskDataError(f"{path}: the file has no rows")
    return problems


@dataclass
class GSM8KTask:
    """Math word problems from JSONL files with numeric answer checking.

    Args:
        train_path: JSONL of training problems.
        eval_path: JSONL of held-out problems (defaults to the training file).
        eval_size: cap on the number of held-out problems (first rows), None for all.
    """

    train_path: str
    eval_path: str | None = None
    eval_size: int | None = None
    name: str = "gsm8k"
    _train: list[Problem] = field(init=False, repr=False)
    _eval: list[Problem] = field(init=False, repr=False)

    def __post_init__(self):
        self._train = load_gsm8k_jsonl(self.train_path)
        self._eval = load_gsm8k_jsonl(self.eval_path) if self.eval_path else list(self._train)
        if self.eval_size is not None:
            self._eval = self._eval[: self.eval_size]

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_problems(self) -> Sequence[Problem]:
        return self._eval

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        predicted = extract_final_answer(response)
        gold = float(problem.answer)
        correct = predicted is not None and math.isclose(predicted, gold, rel_tol=1e-6, abs_tol=1e-6)
        return Score(correct=correct, has_answer=predicted is not None, has_eos=has_eos)

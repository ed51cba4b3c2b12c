r"""A JSONL math task in the GSM8K layout, for real models.

Each line is a JSON object with a ``question`` and an ``answer`` whose last line is
``#### <number>`` (GSM8K's layout: the worked solution, then the final number)::

    {"question": "Tom has 3 apples ...", "answer": "3 + 4 = 7\n#### 7"}

The reward is numeric answer checking: one number is read from the response and compared
with the gold number as a float with a tiny tolerance, so ``"7"``, ``"7.0"`` and ``"7.00"``
all match. Which number is read is `GSM8KTask.answer_mode` (``PPOConfig.gsm8k_answer_mode``),
the two modes of the common GSM8K evaluators (lm-evaluation-harness's gsm8k task reports
both, as ``strict-match`` and ``flexible-extract``):

- ``"strict"``: the number right after the *first* ``####``. No marker, or no number right
  after it (``#### seven``, ``#### The answer is 7``), is no answer.
- ``"flexible"`` (the default): the number in the last ``\boxed{...}`` that holds one;
  otherwise the *last* number anywhere in the response. ``####`` gets no special
  treatment (the number after it is usually the last one anyway).

Both modes first cut the response at an invented next question (`cut_at_next_question`):
a base model prompted with ``Question: ...\nAnswer:`` often runs on into
``Question: <a new problem>``, and its numbers must not be scored. The cut is at the first
``Question:`` anywhere (the stop sequence lm-evaluation-harness uses for GSM8K) or a line
that starts with ``Q:``. Numbers (`NUMBER_RE`) may carry comma thousands separators
(``1,234``), a ``$`` before or after the sign, and an ASCII or Unicode minus (U+2212);
a sentence's trailing ``.`` is not a decimal point. A minus counts only when it touches the
digits (or the ``$``) and does not follow a word or digit, so the ``-`` of ``5-3`` or
``10 - 3`` is subtraction, not a sign.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ppo.config import GSM8K_ANSWER_MODES
from ppo.tasks.base import Problem, Score

GSM8K_MARKER = "####"
_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"

# One number. The look-behind keeps "x2" and the "3" of "1.2.3" from counting as numbers,
# and keeps the "-" of "5-3" from being a sign.
NUMBER_RE = re.compile(
    r"(?<![\w.])"
    r"(?P<minus>[-\u2212])?(?:\$\s*)?(?P<minus_after_dollar>[-\u2212])?"
    r"(?P<number>(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
)
# The invented next question: "Question:" anywhere, or "Q:" opening a line.
_NEXT_QUESTION_RE = re.compile(r"\bQuestion:|^[ \t]*Q:", re.MULTILINE)
_BOXED = "\\boxed{"
_LATEX_FRACTION_RE = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_PLAIN_FRACTION_RE = re.compile(r"\s*([-\u2212]?[0-9.]+)\s*/\s*([0-9.]+)\s*")


class TaskDataError(ValueError):
    """A data file that cannot be used; the message names the file, line and field."""


def _value(match: re.Match) -> float:
    value = float(match["number"].replace(",", ""))
    return -value if match["minus"] or match["minus_after_dollar"] else value


def parse_number(text: str) -> float | None:
    """The first number in `text` as a float (see `NUMBER_RE`), else None.

    >>> parse_number(" 1,234.5 dollars"), parse_number("$-3"), parse_number("\u22127."), parse_number("none")
    (1234.5, -3.0, -7.0, None)
    """
    match = NUMBER_RE.search(text)
    return _value(match) if match else None


def last_number(text: str) -> float | None:
    """The last number in `text`, else None: ``last_number("3 + 4 = 7.") == 7.0``."""
    matches = list(NUMBER_RE.finditer(text))
    return _value(matches[-1]) if matches else None


def cut_at_next_question(response: str) -> str:
    """`response` up to an invented next question (see the module docstring).

    >>> cut_at_next_question("3+4=7. The answer is 7.\\n\\nQuestion: Sam has 5 pens ...")
    '3+4=7. The answer is 7.\\n\\n'
    """
    match = _NEXT_QUESTION_RE.search(response)
    return response[: match.start()] if match else response


def boxed_contents(text: str) -> list[str]:
    r"""The contents of every ``\boxed{...}`` in `text`, braces balanced; an unclosed box
    (a response cut at the token limit) runs to the end of the text.

    >>> boxed_contents(r"so \boxed{\frac{1}{2}} and \boxed{18")
    ['\\frac{1}{2}', '18']
    """
    contents = []
    start = text.find(_BOXED)
    while start >= 0:
        position, depth = start + len(_BOXED), 1
        while position < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            position += 1
        contents.append(text[start + len(_BOXED): position - 1 if depth == 0 else position])
        start = text.find(_BOXED, position)
    return contents


def _boxed_value(content: str) -> float | None:
    """The number a ``\\boxed{}`` holds: LaTeX spacing and ``{,}`` undone, a fraction
    (``\\frac{3}{4}``, ``3/4``) divided out, else the last number inside."""
    content = content.replace("{,}", ",").replace("\\!", "").replace("\\,", "").replace("\\$", "$")
    fraction = _LATEX_FRACTION_RE.fullmatch(content.strip()) or _PLAIN_FRACTION_RE.fullmatch(content)
    if fraction:
        numerator, denominator = parse_number(fraction[1]), parse_number(fraction[2])
        if numerator is not None and denominator:
            return numerator / denominator
    return last_number(content)


def extract_answer(response: str, mode: str = "flexible") -> float | None:
    """The number `response` answers with under `mode` (``"strict"`` or ``"flexible"``), or None.

    >>> extract_answer("3+4=7\\n#### 7\\nQuestion: 2+2? #### 4", "strict")
    7.0
    >>> extract_answer(r"So she has \\boxed{18} eggs; 18 - 2 = 16", "flexible")
    18.0
    >>> extract_answer("The answer is 42.", "strict"), extract_answer("The answer is 42.", "flexible")
    (None, 42.0)
    """
    if mode not in GSM8K_ANSWER_MODES:
        raise ValueError(f"answer_mode must be one of {GSM8K_ANSWER_MODES}, got {mode!r}")
    text = cut_at_next_question(response)
    if mode == "strict":
        marker = text.find(GSM8K_MARKER)
        if marker < 0:
            return None
        match = NUMBER_RE.match(text[marker + len(GSM8K_MARKER):].lstrip())
        return _value(match) if match else None
    for content in reversed(boxed_contents(text)):
        value = _boxed_value(content)
        if value is not None:
            return value
    return last_number(text)


def load_gsm8k_jsonl(path: str | Path) -> list[Problem]:
    """Read a GSM8K-layout JSONL file into `Problem`s, validating every row up front.

    Raises `TaskDataError` naming the path and line for: an unreadable file, bytes that
    are not UTF-8, invalid JSON, a missing or non-string ``question``/``answer``, an empty question, an answer
    without ``#### <number>``, or a non-numeric gold answer. Blank lines are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"{path}: no such JSONL file")
    problems = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise TaskDataError(f"{where}: not UTF-8 text (byte {error.start} of the line)") from None
            if not line.strip():
                continue
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
            if gold is None or not NUMBER_RE.fullmatch(gold_text):
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
        answer_mode: which number of a response is its answer: ``"flexible"`` (last
            ``\\boxed{}``, else the last number) or ``"strict"`` (right after the first
            ``####``); see the module docstring and ``PPOConfig.gsm8k_answer_mode``.
    """

    train_path: str
    eval_path: str | None = None
    eval_size: int | None = None
    answer_mode: str = "flexible"
    name: str = "gsm8k"
    answer_marker = "####"  # what the evaluation's thinking budget forces (ppo/run/evaluation.py)
    _train: list[Problem] = field(init=False, repr=False)
    _eval: list[Problem] = field(init=False, repr=False)

    def __post_init__(self):
        if self.answer_mode not in GSM8K_ANSWER_MODES:
            raise ValueError(f"GSM8KTask.answer_mode must be one of {GSM8K_ANSWER_MODES}, got {self.answer_mode!r}")
        self._train = load_gsm8k_jsonl(self.train_path)
        self._eval = load_gsm8k_jsonl(self.eval_path) if self.eval_path else list(self._train)
        if self.eval_size is not None:
            self._eval = self._eval[: self.eval_size]

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_problems(self) -> Sequence[Problem]:
        return self._eval

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        predicted = extract_answer(response, self.answer_mode)
        gold = float(problem.answer)
        correct = predicted is not None and math.isclose(predicted, gold, rel_tol=1e-6, abs_tol=1e-6)
        return Score(correct=correct, has_answer=predicted is not None, has_eos=has_eos)

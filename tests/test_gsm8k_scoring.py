r"""GSM8K answer extraction in both modes, on hand-written responses.

Each row gives a response, its gold answer, and for each mode the number we expect to be
read (None: no answer) and the reward (1 correct, 0 not), worked out by hand from the
rules in ppo/tasks/gsm8k.py:

- strict: the number right after the FIRST ``####``;
- flexible: the number in the last ``\boxed{}`` that holds one, else the LAST number;
- both: the response is first cut at ``Question:`` (anywhere) or a line opening ``Q:``.
"""

import json

import pytest

from ppo.config import PPOConfig
from ppo.tasks import GSM8KTask
from ppo.tasks.base import Problem
from ppo.tasks.gsm8k import boxed_contents, cut_at_next_question, extract_answer, load_gsm8k_jsonl
from ppo.trainer import build_task

MINUS = "\u2212"  # the Unicode minus sign

# (id, response, gold, (strict number, strict reward), (flexible number, flexible reward))
CASES = [
    ("marker", "3 + 4 = 7\n#### 7", 7, (7, 1), (7, 1)),
    ("plain-sentence", "The answer is 42.", 42, (None, 0), (42, 1)),
    ("boxed-only", r"So the total is \boxed{18}.", 18, (None, 0), (18, 1)),
    ("runs-on-into-next-question", "#### 7\n\nQuestion: Sam has 2 pens and buys 3. How many?\nAnswer: 2 + 3 = 5\n#### 5",
     7, (7, 1), (7, 1)),
    ("next-question-holds-the-only-marker",
     "5 * 3 = 15 dollars. The answer is 15.\nQuestion: A train goes 60 miles in 2 hours. Speed?\nAnswer: #### 30",
     15, (None, 0), (15, 1)),
    ("next-question-mid-line", "The answer is 7. Question: How many legs do 3 dogs have? 12", 7, (None, 0), (7, 1)),
    ("next-question-as-Q-line", "3 + 4 = 7. The answer is 7.\nQ: Tom has 9 cards. How many?\nA: 9", 7, (None, 0), (7, 1)),
    ("starts-with-invented-question", "Q: What is 2+2?\nA: 4", 4, (None, 0), (None, 0)),
    ("unicode-minus-after-marker", f"It drops to {MINUS}5 degrees.\n#### {MINUS}5", -5, (-5, 1), (-5, 1)),
    ("unicode-minus-no-marker", f"The change is {MINUS}12.", -12, (None, 0), (-12, 1)),
    ("ascii-minus", "#### -7", -7, (-7, 1), (-7, 1)),
    ("minus-before-dollar", "The balance is -$3.", -3, (None, 0), (-3, 1)),
    ("dollar-before-minus", "#### $-3", -3, (-3, 1), (-3, 1)),
    ("thousands", "#### 1,234", 1234, (1234, 1), (1234, 1)),
    ("dollars-and-millions", "They earn $1,200,000 in total.\n#### $1,200,000", 1200000, (1200000, 1), (1200000, 1)),
    ("thousands-and-decimals", "#### 1,000,000.5", 1000000.5, (1000000.5, 1), (1000000.5, 1)),
    ("trailing-zeros", "#### 7.00", 7, (7, 1), (7, 1)),
    ("trailing-period", "#### 7.", 7, (7, 1), (7, 1)),
    ("no-space-after-marker", "Half of 5 is 2.5\n####2.5", 2.5, (2.5, 1), (2.5, 1)),
    ("wrong-number", "#### 8", 7, (8, 0), (8, 0)),
    ("marker-then-word", "#### seven", 7, (None, 0), (None, 0)),
    ("marker-then-sentence", "#### The answer is 7", 7, (None, 0), (7, 1)),
    ("first-marker-wins-strict", "3 + 4 = 7\n#### 7\n#### 9", 7, (7, 1), (9, 0)),
    ("reasoning-after-marker", "#### 7 apples, since she had 3 and bought 4", 7, (7, 1), (4, 0)),
    ("box-beats-later-numbers", r"I think \boxed{18}. Check: 18 - 2 = 16", 18, (None, 0), (18, 1)),
    ("last-box-wins", r"First guess \boxed{10}, corrected: \boxed{12}", 12, (None, 0), (12, 1)),
    ("boxed-fraction", r"\boxed{\frac{3}{4}}", 0.75, (None, 0), (0.75, 1)),
    ("boxed-latex-thousands", r"The answer is \boxed{1{,}000} dollars", 1000, (None, 0), (1000, 1)),
    ("boxed-escaped-dollar", r"\boxed{\$18}", 18, (None, 0), (18, 1)),
    ("empty-box-falls-back", r"She has 18 eggs left. \boxed{}", 18, (None, 0), (18, 1)),
    ("unclosed-box", r"so the answer is \boxed{18", 18, (None, 0), (18, 1)),
    ("subtraction-is-not-a-sign", "Subtract: 10 - 3", 3, (None, 0), (3, 1)),
    ("hyphen-is-not-a-sign", "She keeps 10-3", 3, (None, 0), (3, 1)),
    ("percent", "The answer is 50%.", 50, (None, 0), (50, 1)),
    ("last-of-two-units", "The answer is 0.5 hours, i.e. 30 minutes.", 30, (None, 0), (30, 1)),
    ("empty", "", 7, (None, 0), (None, 0)),
]


@pytest.fixture(scope="session")
def tasks(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm8k") / "train.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "#### 1"}) + "\n")
    return {mode: GSM8KTask(str(path), answer_mode=mode) for mode in ("strict", "flexible")}


def _check(tasks, mode, response, gold, expected_number, expected_reward):
    number = extract_answer(response, mode)
    if expected_number is None:
        assert number is None
    else:
        assert number == pytest.approx(expected_number)
    score = tasks[mode].score(Problem(prompt="q?", answer=repr(float(gold))), response, has_eos=True)
    assert score.reward == expected_reward
    assert score.has_answer == (expected_number is not None)


@pytest.mark.parametrize("case_id, response, gold, strict, flexible", CASES, ids=[c[0] for c in CASES])
def test_strict_mode(tasks, case_id, response, gold, strict, flexible):
    _check(tasks, "strict", response, gold, *strict)


@pytest.mark.parametrize("case_id, response, gold, strict, flexible", CASES, ids=[c[0] for c in CASES])
def test_flexible_mode(tasks, case_id, response, gold, strict, flexible):
    _check(tasks, "flexible", response, gold, *flexible)


def test_table_is_big_enough_and_the_modes_disagree():
    assert len(CASES) >= 25
    assert sum(strict != flexible for _, _, _, strict, flexible in CASES) >= 10


def test_cut_at_next_question():
    assert cut_at_next_question("#### 7\nQuestion: next") == "#### 7\n"
    assert cut_at_next_question("#### 7\n  Q: next") == "#### 7\n"
    assert cut_at_next_question("The FAQ: 3 + 4 = 7") == "The FAQ: 3 + 4 = 7"  # "Q:" inside a word
    assert cut_at_next_question("the question: 7") == "the question: 7"  # lower case is prose


def test_boxed_contents_balances_braces():
    assert boxed_contents(r"a \boxed{\frac{1}{2}} b \boxed{3}") == [r"\frac{1}{2}", "3"]
    assert boxed_contents("no box") == []


def test_unknown_mode_is_rejected(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match="answer_mode"):
        GSM8KTask(str(path), answer_mode="loose")
    with pytest.raises(ValueError, match="answer_mode"):
        extract_answer("#### 1", "loose")


def test_build_task_threads_the_mode(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "#### 1"}) + "\n")
    assert build_task(PPOConfig(task="gsm8k", task_path=str(path))).answer_mode == "flexible"
    strict = build_task(PPOConfig(task="gsm8k", task_path=str(path), gsm8k_answer_mode="strict"))
    assert strict.answer_mode == "strict"
    problem = strict.eval_problems()[0]
    assert not strict.score(problem, "The answer is 1.", True).correct


def test_gold_with_unicode_minus_and_bad_separators(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": f"#### {MINUS}5"}) + "\n")
    assert float(load_gsm8k_jsonl(path)[0].answer) == -5.0
    path.write_text(json.dumps({"question": "q?", "answer": "#### 1,23"}) + "\n")
    with pytest.raises(ValueError, match="non-numeric gold answer '1,23'"):
        load_gsm8k_jsonl(path)

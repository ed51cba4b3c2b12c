"""task='math': gold and predicted answers parsed and compared by math-verify."""

import json

import pytest

pytest.importorskip("math_verify")
pytest.importorskip("datasets")

from ppo.config import PPOConfig  # noqa: E402
from ppo.tasks import build_task  # noqa: E402
from ppo.tasks.base import Problem  # noqa: E402
from ppo.tasks.gsm8k import TaskDataError  # noqa: E402
from ppo.tasks.math_answers import MathTask  # noqa: E402

# (gold answer as a MATH row holds it, response, correct?)
TRICKY = [
    (r"\frac{1}{2}", r"The answer is $\boxed{0.5}$.", True),  # a fraction as a decimal
    (r"\frac{1}{2}", r"so \boxed{\dfrac12}", True),  # \dfrac, braces left out
    (r"-\frac{3}{4}", r"\boxed{-0.75}", True),  # a negative fraction
    ("1000", r"\boxed{1,000}", True),  # a thousands separator
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}", True),  # the same surd, simplified differently
    ("x^2+2x+1", r"\boxed{(x+1)^2}", True),  # the same polynomial, factored
    ("(1, 3]", r"$\boxed{(1,3]}$", True),  # an interval, open and closed ends
    ("(1, 3]", r"$\boxed{[1,3]}$", False),  # the wrong closed end
    (r"\{1,2\}", r"\boxed{\{2, 1\}}", True),  # a set in another order
    ("x=2", r"\boxed{2}", True),  # the right side of an equation
    ("3", r"3 apples? No: 4 + 1 = 5, so \boxed{5}", False),  # the boxed answer wins over earlier numbers
    (r"\frac{\pi}{3}", r"$\boxed{60^\circ}$", False),  # degrees are not radians
    ("5", "I cannot tell.", False),  # no answer at all
]


@pytest.mark.parametrize("gold, response, correct", TRICKY)
def test_math_verify_tricky_answers(gold, response, correct):
    task = MathTask([Problem(prompt="q", answer=gold)])
    score = task.score(task.train[0], response, has_eos=True)
    assert score.correct is correct
    assert score.has_answer is (response != "I cannot tell.")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math_verify_task_from_a_jsonl_dataset(tmp_path):
    train = write_jsonl(tmp_path / "math.jsonl", [{"problem": "1/2 + 1/4?", "solution": r"\frac{3}{4}"},
                                                  {"problem": "2 + 2?", "solution": 4}])
    config = PPOConfig(task="math", dataset=str(train), prompt_column="problem", answer_column="solution",
                       math_verify_timeout=2)
    task = build_task(config)
    assert [p.answer for p in task.eval_problems()] == [r"\frac{3}{4}", "4"] and task.timeout == 2
    assert task.score(task.train[0], r"$\boxed{0.75}$", True).correct
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "p", "solution": "1"}, {"problem": "q", "solution": "}{"}])
    with pytest.raises(TaskDataError, match=r"row 2: math-verify cannot parse the gold answer '\}\{'"):
        build_task(config.replace(dataset=str(bad)))
    with pytest.raises(TaskDataError, match=r"no column 'answer' \(PPOConfig.answer_column\)"):
        build_task(config.replace(answer_column="answer"))


def test_math_verify_settings_are_checked():
    with pytest.raises(ValueError, match="PPOConfig.dataset: is required for task='math'"):
        PPOConfig(task="math")
    with pytest.raises(ValueError, match="PPOConfig.math_verify_timeout: must be a whole number of seconds >= 1"):
        PPOConfig(task="math", dataset="x.jsonl", math_verify_timeout=0)
    from ppo.settings.config_checks import inert_settings

    assert [n for n, _ in inert_settings(PPOConfig(math_verify_timeout=9))] == ["math_verify_timeout"]


def test_gsm8k_scorer_is_unchanged_by_math_verify():
    from ppo.tasks.gsm8k import extract_answer

    assert extract_answer(r"so \boxed{\frac{1}{2}}") == 0.5 and extract_answer("x = 1,234.") == 1234.0

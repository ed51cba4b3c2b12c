import random

import pytest

from ppo.tasks.arithmetic import ArithmeticTask, parse_answer, solve_with_scratchpad
from ppo.tasks.base import Problem


@pytest.fixture(scope="session")
def task():
    return ArithmeticTask()


PROBLEM = Problem(prompt="27+5+8=", answer="40", level=1)


def test_demonstration_format():
    assert solve_with_scratchpad([27, 5, 8], 0) == "27+5=32;32+8=40;#40"
    assert solve_with_scratchpad([27, 5, 8], 2) == "27+5=32;32+8=40;chk40;chk40;#40"


@pytest.mark.parametrize(
    "response, has_eos, correct, has_answer",
    [
        ("27+5=32;32+8=40;#40", True, True, True),  # correct
        ("27+5=32;32+8=40;chk40;chk40;#40", True, True, True),  # correct, long form
        ("27+5=32;32+8=41;#41", True, False, True),  # wrong answer
        ("27+5=32;32+8=40;40", True, False, False),  # malformed: no marker
        ("27+5=32;32+8=40;#4x", True, False, False),  # malformed: garbled answer
        ("27+5=32;32+8=40;#40;chk40", True, False, False),  # answer not final
        ("27+5=32;32+8=40;#40", False, True, True),  # right answer but EOS-less
        ("27+5=32;32+8=40;chk4", False, False, False),  # truncated mid-way
        ("", True, False, False),  # empty
    ],
)
def test_scorer(task, response, has_eos, correct, has_answer):
    score = task.score(PROBLEM, response, has_eos)
    assert score.correct is correct
    assert score.has_answer is has_answer
    assert score.has_eos is has_eos
    assert score.reward == (1.0 if correct else 0.0)
    assert score.well_formed == (has_answer and has_eos)


def test_parse_answer():
    assert parse_answer("1+2=3;#3") == "3"
    assert parse_answer("#-12 ") == "-12"
    assert parse_answer("#") is None


def test_every_demonstration_scores_correct(task):
    for problem in task.sample_problems(200, random.Random(0)):
        assert task.score(problem, problem.demonstration, True).correct


def test_levels_and_variable_length(task):
    problems = task.sample_problems(400, random.Random(1))
    assert {p.level for p in problems} == set(range(len(task.levels)))
    for p in problems:
        operands, digits = task.levels[p.level]
        assert len(p.meta["operands"]) == operands
    lengths = {len(p.demonstration) for p in problems if p.level == 0}
    assert len(lengths) >= 4  # optional re-checks make lengths vary for one level


def test_eval_set_is_fixed_balanced_and_held_out(task):
    again = ArithmeticTask()
    assert [p.prompt for p in task.eval_problems()] == [p.prompt for p in again.eval_problems()]
    levels = [p.level for p in task.eval_problems()]
    assert all(levels.count(lv) == len(levels) // len(task.levels) for lv in set(levels))
    train_prompts = {p.prompt for p in task.sample_problems(2000, random.Random(2))}
    assert not train_prompts & {p.prompt for p in task.eval_problems()}


def test_bad_task_settings():
    with pytest.raises(ValueError, match="levels"):
        ArithmeticTask(levels=((1, 1),))
    with pytest.raises(ValueError, match="max_checks"):
        ArithmeticTask(max_checks=-1)

"""A task made of a user's prompts and reward function, TRL-style.

``reward_fn(prompts, responses) -> list[float]`` scores a batch of decoded responses. In
evaluation, "accuracy" is the share of responses with a reward above `success_threshold`
(0 by default), since a free-form reward has no notion of a correct answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ppo.run.guards import check_prompts, reward_values
from ppo.tasks.base import Problem, Score

RewardFunction = Callable[[list[str], list[str]], list[float]]


@dataclass
class CustomTask:
    prompts: list[str]
    reward_fn: RewardFunction
    eval_prompts: list[str] | None = None
    success_threshold: float = 0.0
    name: str = "custom"
    _train: list[Problem] = field(init=False, repr=False)
    _eval: list[Problem] = field(init=False, repr=False)

    def __post_init__(self):
        self.prompts = prompt_list(self.prompts, "prompts")
        if self.eval_prompts is not None:
            self.eval_prompts = prompt_list(self.eval_prompts, "eval_prompts")
            if not self.eval_prompts:
                raise ValueError("CustomTask.eval_prompts: [] holds no held-out prompt; give at least one, or None "
                                 "to evaluate on the training prompts")
        if not self.prompts:
            raise ValueError("CustomTask.prompts: need at least one prompt")
        for index, prompt in enumerate(list(self.prompts) + list(self.eval_prompts or [])):
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"CustomTask: prompt {index} is empty or not a string")
        check_prompts(list(self.prompts) + list(self.eval_prompts or []), where="CustomTask prompts")
        if not callable(self.reward_fn):
            raise ValueError("CustomTask.reward_fn: must be callable(prompts, responses) -> list[float]")
        self._train = [Problem(prompt=p, answer="") for p in self.prompts]
        self._eval = [Problem(prompt=p, answer="") for p in (self.eval_prompts or self.prompts)]

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_problems(self) -> Sequence[Problem]:
        return self._eval

    def score_batch(self, problems: Sequence[Problem], responses: list[str], has_eos: list[bool]) -> list[Score]:
        prompts = [p.prompt for p in problems]
        # One real number per response, checked here with the prompt and response named;
        # NaN / inf pass on to the trainer, which stops every process together.
        rewards = reward_values(self.reward_fn(prompts, list(responses)), prompts, responses, self.reward_fn)
        return [Score(correct=float(r) > self.success_threshold, has_answer=True, has_eos=bool(e), value=float(r))
                for r, e in zip(rewards, has_eos)]

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        return self.score_batch([problem], [response], [has_eos])[0]


def prompt_list(prompts, name: str) -> list[str]:
    """`prompts` as a list, if it is a list or tuple; any other collection is refused, naming
    `name`, because each would train on something else than the user's prompts: a string
    on its characters, a set in an order that changes with PYTHONHASHSEED, a dict on its keys."""
    where = f"CustomTask.{name}"
    if isinstance(prompts, (str, bytes)):
        raise ValueError(f"{where}: a single string {prompts[:40]!r} would be read as one prompt per character; "
                         "pass a list, [text] for one prompt")
    if isinstance(prompts, (set, frozenset)):
        raise ValueError(f"{where}: a set has no order (it changes with PYTHONHASHSEED, and with it the prompts "
                         "each seed draws); pass a list, e.g. sorted(prompts)")
    if isinstance(prompts, dict):
        raise ValueError(f"{where}: a dict would train on its keys; pass a list: list(prompts) for the keys, "
                         "list(prompts.values()) for the values")
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"{where}: expected a list or tuple of strings, got {type(prompts).__name__}")
    return list(prompts)

"""Tasks: problems, demonstrations and verifiable scorers (see `base.Task`)."""

from __future__ import annotations

from .arithmetic import ArithmeticTask
from .base import Problem, Score, Task
from .custom import CustomTask
from .gsm8k import GSM8KTask, TaskDataError, load_gsm8k_jsonl

__all__ = ["ArithmeticTask", "CustomTask", "GSM8KTask", "Problem", "Score", "Task", "TaskDataError", "build_task",
           "load_gsm8k_jsonl"]


def build_task(config, prompts: list[str] | None = None, reward_fn=None) -> Task:
    """The task named by `config.task` (a custom task needs `prompts` and `reward_fn`)."""
    if config.task == "custom" or reward_fn is not None:
        if prompts is None or reward_fn is None:
            raise ValueError("PPOConfig.task='custom' needs both prompts and reward_fn")
        return CustomTask(prompts=list(prompts), reward_fn=reward_fn)
    if config.task == "gsm8k":
        return GSM8KTask(config.task_path, eval_path=config.eval_path, answer_mode=config.gsm8k_answer_mode)
    if config.task == "preference":
        from .preferences import PreferenceTask

        return PreferenceTask(reward_model_path=config.reward_model_path)
    return ArithmeticTask()

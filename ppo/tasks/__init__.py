"""Tasks: problems, demonstrations and verifiable scorers (see `base.Task`)."""

from .arithmetic import ArithmeticTask
from .base import Problem, Score, Task
from .gsm8k import GSM8KTask, TaskDataError, load_gsm8k_jsonl

__all__ = ["ArithmeticTask", "GSM8KTask", "Problem", "Score", "Task", "TaskDataError", "load_gsm8k_jsonl"]

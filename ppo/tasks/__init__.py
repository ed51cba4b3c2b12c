"""Tasks: problems, demonstrations and verifiable scorers (see `base.Task`)."""

from .arithmetic import ArithmeticTask
from .base import Problem, Score, Task
from .custom import CustomTask
from .gsm8k import GSM8KTask, TaskDataError, load_gsm8k_jsonl

__all__ = ["ArithmeticTask", "CustomTask", "GSM8KTask", "Problem", "Score", "Task", "TaskDataError", "load_gsm8k_jsonl"]

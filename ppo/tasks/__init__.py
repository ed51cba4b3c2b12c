"""Tasks: problems, demonstrations and verifiable scorers (see `base.Task`)."""

from __future__ import annotations

from ppo.tasks.arithmetic import ArithmeticTask
from ppo.tasks.base import Problem, Score, Task
from ppo.tasks.custom import CustomTask
from ppo.tasks.gsm8k import GSM8KTask, TaskDataError, load_gsm8k_jsonl

__all__ = ["ArithmeticTask", "CustomTask", "GSM8KTask", "Problem", "Score", "Task", "TaskDataError", "build_task",
           "load_gsm8k_jsonl"]


def build_task(config, prompts: list[str] | None = None, reward_fn=None) -> Task:
    """The task named by `config.task`; `prompts` and `reward_fn` make the custom task, which
    `config.task` must then be ('custom', or 'arithmetic' as the caller's default: see
    `custom_task_config`). A built-in task with its own data refuses them rather than
    ignoring one side or the other."""
    given = [name for name, value in (("prompts", prompts), ("reward_fn", reward_fn)) if value is not None]
    if given and config.task not in ("custom", "arithmetic"):
        raise ValueError(f"PPOConfig.task={config.task!r} brings its own prompts and scorer, so the {' and '.join(given)} "
                         "passed in would be ignored; set task='custom' to train on them")
    if config.task == "custom" or given:
        return _custom_task(config, prompts, reward_fn)
    if config.task == "math":
        from ppo.tasks.math_answers import MathTask

        return MathTask.from_config(config)
    if config.task == "gsm8k":
        return GSM8KTask(config.task_path, eval_path=config.eval_path, answer_mode=config.gsm8k_answer_mode)
    if config.task == "preference":
        from ppo.tasks.preferences import PreferenceTask

        return PreferenceTask(reward_model_path=config.reward_model_path)
    return ArithmeticTask()


def _custom_task(config, prompts, reward_fn) -> CustomTask:
    """The custom task from prompts and reward_fn passed in, or from `config.dataset` and
    `config.reward_fn` (the command line's way); each side from one source only."""
    for passed, given, field, value in (("prompts", prompts, "dataset", config.dataset),
                                        ("reward_fn", reward_fn, "reward_fn", config.reward_fn)):
        if value and given is not None:
            raise ValueError(f"PPOConfig.{field} and the {passed} passed to RLTrainer both give the custom task's "
                             f"{passed}; pass one")
    eval_prompts = None
    if prompts is None and config.dataset:
        from ppo.tasks.data_files import load_prompts

        prompts, eval_prompts = load_prompts(config)
    if reward_fn is None and config.reward_fn:
        from ppo.tasks.reward_functions import WeightedRewards

        reward_fn = WeightedRewards(config.reward_fn, config.reward_fn_weights)
    if prompts is None or reward_fn is None:
        missing, give = (("reward_fn", "a callable, or PPOConfig.reward_fn 'module:function'") if reward_fn is None
                         else ("prompts", "a list, or PPOConfig.dataset"))
        raise ValueError(f"PPOConfig.task='custom' needs both prompts and reward_fn; {missing} is missing ({give})")
    return CustomTask(prompts=prompts, reward_fn=reward_fn, eval_prompts=eval_prompts)


def custom_task_config(config, prompts=None, reward_fn=None):
    """`config` with ``task='custom'`` when prompts or a reward_fn are passed in with the
    default task 'arithmetic', so config.yaml says which task trained; otherwise as it is."""
    if config.task == "arithmetic" and (prompts is not None or reward_fn is not None):
        return config.replace(task="custom")
    return config

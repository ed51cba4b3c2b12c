"""Reward functions named by import path (`PPOConfig.reward_fn`), several summed with weights.

``ppo-train --task custom --reward-fn my_rewards:brevity`` imports ``brevity`` from
``my_rewards`` (a module on the path, or the current directory, as ``python -m`` finds
it) and ``--reward-fn path/to/file.py:brevity`` loads it from a file (verl's
``custom_reward_function.path`` and ``name``). Each function has the signature of the Python
API's ``reward_fn``: ``f(prompts, responses) -> list[float]``, one number per response. With
several (TRL's ``reward_funcs`` and ``reward_weights``) the reward is
``sum_i weight_i * f_i(prompts, responses)``, weights 1 by default (`reward_fn_weights`).

A path that cannot be imported is refused when the task is built, naming the path. A
function that raises or returns something else than one number per response is named in
the error, which the run loop completes with the batch and the step.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

from ppo.run.guards import reward_values


class RewardFunctionFailed(RuntimeError):
    """One of several reward functions raised; the message names it (the cause is the original)."""


def load_reward_function(spec: str) -> Callable:
    """The callable named by ``'module:function'`` or ``'path/to/file.py:function'``
    (``function`` may be dotted: ``'module:Class.method'``)."""
    module_name, _, attribute = spec.rpartition(":")
    where = f"PPOConfig.reward_fn {spec!r}"
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"{where}: no such file {path}")
        module_spec = importlib.util.spec_from_file_location(f"ppo_reward_fn_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            raise ValueError(f"{where}: importing {path} raised {type(error).__name__}: {error}") from error
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would find it
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise ValueError(f"{where}: cannot import module {module_name!r} ({error}); put it on PYTHONPATH, run from "
                             "its folder, or name its file ('path/to/file.py:function')") from error
        except Exception as error:
            raise ValueError(f"{where}: importing {module_name!r} raised {type(error).__name__}: {error}") from error
    function = module
    for part in attribute.split("."):
        if not hasattr(function, part):
            raise ValueError(f"{where}: {module_name} has no attribute {attribute!r}")
        function = getattr(function, part)
    if not callable(function):
        raise ValueError(f"{where}: {attribute} is {type(function).__name__}, not a function "
                         "f(prompts, responses) -> list[float]")
    return function


class WeightedRewards:
    """``sum_i weights[i] * f_i(prompts, responses)`` over the functions at `specs`.

    >>> rewards = WeightedRewards(["operator:countOf"], [2.0])  # a stand-in for a function of yours
    >>> rewards.__qualname__
    '2.0*operator:countOf'
    """

    def __init__(self, specs: Sequence[str], weights: Sequence[float] | None = None):
        if not specs:
            raise ValueError("PPOConfig.reward_fn: name at least one reward function")
        weights = [1.0] * len(specs) if weights is None else [float(w) for w in weights]
        if len(weights) != len(specs):
            raise ValueError(f"PPOConfig.reward_fn_weights: {len(weights)} weights for {len(specs)} reward functions")
        self.specs, self.weights = list(specs), weights
        self.functions = [load_reward_function(spec) for spec in self.specs]
        # What error messages and the run's score source call it.
        self.__qualname__ = " + ".join(spec if weight == 1.0 else f"{weight}*{spec}"
                                       for spec, weight in zip(self.specs, self.weights))

    def __call__(self, prompts: list[str], responses: list[str]) -> list[float]:
        total = [0.0] * len(responses)
        for spec, weight, function in zip(self.specs, self.weights, self.functions):
            if len(self.functions) == 1:
                returned = function(prompts, responses)  # its own exception, named by the caller
            else:
                try:
                    returned = function(prompts, responses)
                except Exception as error:
                    raise RewardFunctionFailed(f"{spec} raised {type(error).__name__}: {error}") from error
            values = reward_values(returned, prompts, responses, SimpleNamespace(__qualname__=spec))
            total = [t + weight * v for t, v in zip(total, values)]
        return total

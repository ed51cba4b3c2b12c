"""The trainer composes its collaborators; nothing outside it takes the trainer.

The models and optimizers (`ppo.models.setup.Models`), where a run stands
(`ppo.run.checkpoints.TrainingState`), the forward passes and the run loop are objects the
trainer builds and hands to the functions that need them. A function that takes the whole
trainer instead makes its reader learn every attribute the trainer has; this test finds
any, by reading the source (no import): a parameter named ``trainer``, or one annotated
with ``RLTrainer`` (a name, an attribute, a string annotation, inside ``Optional[...]`` or a
union alike), anywhere in the project's packages except ppo/trainer.py itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ppo", "ablations", "value_model", "gae")
EXEMPT = {ROOT / "ppo" / "trainer.py"}  # the trainer's own methods take `self`
TRAINER_PARAMETER = "trainer"
TRAINER_CLASS = "RLTrainer"


def names_the_trainer(annotation: ast.expr | None) -> bool:
    """Whether an annotation mentions `RLTrainer` (a name, ``module.RLTrainer``, or a string)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == TRAINER_CLASS:
            return True
        if isinstance(node, ast.Attribute) and node.attr == TRAINER_CLASS:
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(rf"\b{TRAINER_CLASS}\b", node.value):
                return True
    return False


def functions_taking_the_trainer(source: str, filename: str = "<source>") -> list[str]:
    """``'file:line name(parameter)'`` for every function or lambda in `source` with a
    parameter named ``trainer`` or annotated with `RLTrainer`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        arguments = node.args
        parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                      *(a for a in (arguments.vararg, arguments.kwarg) if a is not None)]
        for parameter in parameters:
            if parameter.arg == TRAINER_PARAMETER or names_the_trainer(parameter.annotation):
                name = getattr(node, "name", "<lambda>")
                found.append(f"{filename}:{node.lineno} {name}({parameter.arg})")
    return found


def project_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if path not in EXEMPT)


def test_the_checker_finds_a_planted_trainer_parameter():
    """Each form is caught (a name, an annotation in its forms, a lambda, keyword-only and
    positional-only parameters); the same function taking collaborators is not."""
    planted = '''
from __future__ import annotations
import ppo.trainer
from typing import Optional

def by_name(trainer, batch): ...
def by_annotation(owner: RLTrainer): ...
def by_string(owner: "RLTrainer | None" = None): ...
def by_attribute(*, owner: Optional[ppo.trainer.RLTrainer]): ...
async def positional(trainer, /): ...
class Logger:
    def log(self, trainer): ...
callback = lambda trainer: trainer.step
def fine(config, models, state, trainers: list, not_a_trainer: "RLTrainerLike"): ...
'''
    found = functions_taking_the_trainer(planted, "planted.py")
    assert [entry.split(" ")[1] for entry in found] == [
        "by_name(trainer)", "by_annotation(owner)", "by_string(owner)", "by_attribute(owner)",
        "positional(trainer)", "log(trainer)", "<lambda>(trainer)"]
    assert found[0] == "planted.py:6 by_name(trainer)"


def test_no_function_takes_the_trainer_bag():
    files = project_files()
    assert len(files) > 100  # the walk found the project
    found = [entry for path in files
             for entry in functions_taking_the_trainer(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, ("functions outside ppo/trainer.py that take the trainer; hand them the collaborators they "
                       "read instead (Models, TrainingState, ForwardPasses, the config, a callable):\n"
                       + "\n".join(found))

"""Evaluation reseeds sampling and must leave every random generator as it found it.

On CPU the check is direct. The accelerator part is checked twice: against a stand-in
accelerator (two fake devices whose generator states live in a dict), which runs
everywhere, and against real CUDA generators when a GPU is present.
"""

import random
import types

import pytest
import torch

from ppo.config import PPOConfig
from ppo.run.evaluation import accelerator_rng_devices, evaluate, preserve_rng_state
from ppo.models.policy import load_policy
from ppo.tasks import ArithmeticTask
from ppo.trainer import RLTrainer


def global_states():
    return torch.get_rng_state(), random.getstate()


def assert_same_states(before, after):
    assert torch.equal(before[0], after[0]), "torch CPU generator changed"
    assert before[1] == after[1], "Python random state changed"


def test_preserve_rng_state_restores_cpu_and_python():
    torch.manual_seed(7)
    random.seed(7)
    before = global_states()
    expected_next = (torch.rand(3), random.random())
    torch.set_rng_state(before[0])
    random.setstate(before[1])
    with preserve_rng_state():
        torch.manual_seed(123)
        random.seed(123)
        torch.rand(100)
        random.random()
    assert_same_states(before, global_states())
    assert torch.equal(torch.rand(3), expected_next[0]) and random.random() == expected_next[1]


def test_preserve_rng_state_restores_on_error():
    torch.manual_seed(3)
    before = global_states()
    with pytest.raises(RuntimeError, match="boom"):
        with preserve_rng_state():
            torch.manual_seed(99)
            raise RuntimeError("boom")
    assert_same_states(before, global_states())


def test_evaluate_leaves_global_rng_unchanged(tiny_model_dir):
    """`evaluate` seeds with seed=0 and samples; the caller's stream continues untouched."""
    model, tokenizer = load_policy(tiny_model_dir)
    problems = ArithmeticTask().eval_problems()[:4]
    torch.manual_seed(11)
    random.seed(11)
    torch.rand(5)  # move away from the seeded state, so a reseed to 11 would also be caught
    before = global_states()
    evaluate(model, tokenizer, ArithmeticTask(), max_new_tokens=4, seed=0, problems=problems)
    assert_same_states(before, global_states())


class ReseedingTask(ArithmeticTask):
    """A task whose `extra_eval` reseeds and draws, as `PreferenceTask.extra_eval` does."""

    def extra_eval(self, policy, tokenizer, problems, max_new_tokens, seed):
        torch.manual_seed(seed + 1)
        random.seed(seed + 1)
        return {"extra_draw": torch.rand(1).item()}


def test_trainer_evaluate_with_extra_eval_leaves_rng_unchanged(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), rollout_batch_size=8,
                       response_length=4, eval_size=2, total_steps=1, progress=False)
    trainer = RLTrainer(config, task=ReseedingTask())
    torch.rand(5)
    random.random()
    before = global_states()
    metrics = trainer.evaluate()
    assert "extra_draw" in metrics
    assert_same_states(before, global_states())


class FakeDeviceModule(types.SimpleNamespace):
    """Two accelerator devices whose generator states are plain integers."""

    def __init__(self):
        super().__init__(states={0: 10, 1: 20})

    def is_initialized(self):
        return True

    def device_count(self):
        return 2

    def get_rng_state(self, device):
        return self.states[device]

    def set_rng_state(self, state, device):
        self.states[device] = state


def test_preserve_rng_state_restores_every_accelerator_device(monkeypatch):
    """With an accelerator present, each device's generator is saved and restored too."""
    fake = FakeDeviceModule()
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    real_get_device_module = torch.get_device_module
    monkeypatch.setattr(torch, "get_device_module",
                        lambda device_type=None: fake if device_type == "cuda" else real_get_device_module(device_type))
    assert accelerator_rng_devices() == ("cuda", [0, 1])
    with preserve_rng_state():
        fake.states.update({0: 99, 1: 99})  # what a reseed of every device does
    assert fake.states == {0: 10, 1: 20}


def test_uninitialised_accelerator_is_left_alone(monkeypatch):
    """No device context is created for a process that never used the accelerator."""
    fake = FakeDeviceModule()
    fake.is_initialized = lambda: False
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch, "get_device_module", lambda device_type=None: fake)
    assert accelerator_rng_devices() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (checks the real CUDA generators)")
def test_preserve_rng_state_covers_cuda():
    torch.cuda.init()
    assert accelerator_rng_devices() == ("cuda", list(range(torch.cuda.device_count())))
    torch.manual_seed(5)
    torch.rand(4, device="cuda")
    before_cuda = torch.cuda.get_rng_state_all()
    expected_next = torch.rand(4, device="cuda")
    torch.cuda.set_rng_state_all(before_cuda)
    with preserve_rng_state():
        torch.manual_seed(123)
        torch.rand(100, device="cuda")
    for before, after in zip(before_cuda, torch.cuda.get_rng_state_all()):
        assert torch.equal(before, after)
    assert torch.equal(torch.rand(4, device="cuda"), expected_next)

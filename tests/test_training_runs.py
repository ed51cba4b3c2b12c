"""Short real training runs from the SFT warm start: each must move held-out accuracy.

These use the testbed exactly as users do (the cached SFT warm start, the CPU presets),
only with fewer steps. The first test in a fresh clone builds the warm start (~2.5 min).
The full-length acceptance runs are marked slow (``make test-all``).
"""

import pytest

from ppo.config import preset
from ppo.trainer import RLTrainer


def run(tmp_path, name, **overrides):
    config = preset(name, testbed=True, output_dir=str(tmp_path / name), progress=False, **overrides)
    return RLTrainer(config).train()


def test_short_ppo_run_raises_sampled_accuracy(tmp_path):
    summary = run(tmp_path, "alpacafarm", total_steps=30, eval_every=0, eval_size=128, seed=0)
    before, after = summary["initial_eval"]["sampled_accuracy"], summary["final_eval"]["sampled_accuracy"]
    assert after >= before + 0.08, (before, after)


def test_short_grpo_run_raises_sampled_accuracy(tmp_path):
    summary = run(tmp_path, "grpo", total_steps=40, eval_every=0, eval_size=128, seed=0)
    before, after = summary["initial_eval"]["sampled_accuracy"], summary["final_eval"]["sampled_accuracy"]
    assert after >= before + 0.08, (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alpacafarm", "grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_full_testbed_run_gains_15_points(tmp_path, name, seed):
    summary = run(tmp_path, name, seed=seed)
    assert summary["sampled_accuracy_gain"] >= 0.15, summary["sampled_accuracy_gain"]


@pytest.mark.slow
def test_short_grpo_lora_run_raises_sampled_accuracy(tmp_path):
    """LoRA (rank 8, the usual 10x learning rate) learns on the testbed too. The reference is
    the adapter-disabled base; ablations.memory measures what that saves. Measured: 0.359 ->
    0.414 held-out sampled accuracy (full fine-tuning at lr 1e-4 in the same 40 steps: see
    docs/results.md)."""
    pytest.importorskip("peft")
    summary = run(tmp_path, "grpo", total_steps=40, eval_every=0, eval_size=128, seed=0, threads=1, lora_r=8,
                  lora_alpha=16.0, lr=1e-3)
    before, after = summary["initial_eval"]["sampled_accuracy"], summary["final_eval"]["sampled_accuracy"]
    assert after >= before + 0.04, (before, after)

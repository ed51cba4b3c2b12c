"""Precision: fp32 master weights, one autocast for every model, fp16 loss scaling with two optimizers."""

from __future__ import annotations

import math

import pytest
import torch

import ppo.models.optimization as optimization_module
import ppo.trainer as trainer_module
from ppo.cli import build_parser, config_from_args
from ppo.config import PPOConfig, preset
from ppo.trainer import RLTrainer

TINY = dict(task="custom", rollout_batch_size=8, response_length=8, ppo_epochs=1, num_minibatches=1, total_steps=2,
            save_every=0, eval_every=0, progress=False, log_samples=1, threads=1)
PROMPTS = ["1+1=", "2+3=", "9+9=", "11+1="]


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one process-wide state; a test with another mixed precision resets it."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def run(tmp_path, model_dir, name=None, **overrides):
    values = dict(TINY, model_path=str(model_dir), output_dir=str(tmp_path), **overrides)
    config = preset(name, **values) if name else PPOConfig(**values)
    return RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)


@pytest.mark.parametrize("name", [None, "grpo"])
def test_bf16_reference_runs_under_the_policys_autocast(tmp_path, tiny_model_dir, fresh_accelerate_state, name):
    """Policy and untouched reference share weights and precision: step-1 KL is exactly 0."""
    trainer = run(tmp_path / "bf16", tiny_model_dir, name, mixed_precision="bf16", kl_clip_at_zero=True,
                  **({"group_size": 4} if name else {}))
    assert trainer.accelerator.mixed_precision == "bf16"
    assert next(trainer.policy.parameters()).dtype == torch.float32  # master weights stay fp32
    metrics = trainer.train_step()
    assert metrics["kl_k1"] == 0.0 and metrics["kl"] == 0.0
    # the forward passes really ran in bf16: outputs differ from an fp32 forward
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        autocast_logits = trainer.ref_policy(ids).logits
        fp32_logits = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits
    assert not torch.equal(autocast_logits, fp32_logits)


def _simulated_fp16(monkeypatch, init_scale=2.0**12):
    """accelerate accepts fp16 on CPU but silently turns it off (no scaler, no autocast).
    Turn both on, as on a GPU: CPU fp16 autocast and a real `GradScaler`."""
    import accelerate

    real = accelerate.Accelerator

    class FP16OnCPU(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.native_amp = True
            self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)

    monkeypatch.setattr(accelerate, "Accelerator", FP16OnCPU)


def test_fp16_with_separate_value_optimizer_matches_fp32(tmp_path, tiny_model_dir, fresh_accelerate_state,
                                                          monkeypatch):
    """One loss scaler, unscaled once for both optimizers: the update completes and points
    where the fp32 update points (same rollout, gradients compared after unscaling)."""
    captured = {}
    real_generate, real_step = trainer_module.generate, optimization_module.step_optimizers

    def capture_step(accelerator, optimizers):
        captured[tag] = [torch.cat([p.grad.flatten().float() for p in group["params"] if p.grad is not None])
                         for optimizer in optimizers for group in optimizer.param_groups]
        real_step(accelerator, optimizers)

    def replay_generate(*args, **kwargs):
        if "rollout" not in captured:
            captured["rollout"] = real_generate(*args, **kwargs)
        return captured["rollout"]

    monkeypatch.setattr(trainer_module, "generate", replay_generate)
    monkeypatch.setattr(optimization_module, "step_optimizers", capture_step)
    tag = "fp32"
    fp32 = run(tmp_path / "fp32", tiny_model_dir, separate_value_optimizer=True, lr=1e-3)
    fp32.train_step()

    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    _simulated_fp16(monkeypatch)
    tag = "fp16"
    fp16 = run(tmp_path / "fp16", tiny_model_dir, separate_value_optimizer=True, lr=1e-3, mixed_precision="fp16")
    assert fp16.accelerator.scaler is not None and fp16.value_optimizer is not None
    before = [p.detach().clone() for p in fp16.value_model.parameters()]
    fp16.train_step()
    assert fp16.accelerator.scaler.get_scale() == 2.0**12  # no overflow, no skipped step
    assert any(not torch.equal(a, b) for a, b in zip(before, fp16.value_model.parameters()))
    assert len(captured["fp16"]) == 2  # policy and critic, each unscaled exactly once
    for fp16_grad, fp32_grad in zip(captured["fp16"], captured["fp32"]):
        cosine = torch.nn.functional.cosine_similarity(fp16_grad, fp32_grad, dim=0)
        assert cosine > 0.99, float(cosine)
        # unscaled once: same magnitude as fp32 (twice would be 4096x smaller)
        assert fp16_grad.norm() == pytest.approx(float(fp32_grad.norm()), rel=0.05)


def test_fp16_overflow_skips_the_step_and_the_run_goes_on(tmp_path, tiny_model_dir, fresh_accelerate_state,
                                                           monkeypatch):
    """With fp16 loss scaling a non-finite gradient is an overflow the scaler handles: it
    skips the optimizer step and lowers its scale. The non-finite guard must not stop the
    run there (a non-finite loss still does: tests/test_reliability.py)."""
    _simulated_fp16(monkeypatch, init_scale=2.0**40)  # far too large: fp16 gradients overflow
    trainer = run(tmp_path, tiny_model_dir, lr=1e-3, mixed_precision="fp16", lr_schedule="constant", total_steps=60)
    optimizer = trainer.policy_optimizer
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.train_step()
    assert not math.isfinite(metrics["policy_grad_norm"])
    assert trainer.accelerator.scaler.get_scale() < 2.0**40  # the scaler saw the overflow
    # the step was skipped: AdamW counted no step and its moments are still zero
    assert all(float(state["step"]) == 0 and not state["exp_avg"].any() for state in optimizer.state.values())
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))

    def moved():
        return any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))

    for _ in range(40):  # the scale halves on every overflow until the gradients fit
        trainer.train_step()
        if moved():
            break
    assert moved() and trainer.accelerator.scaler.get_scale() > 1.0


def test_bf16_checkpoint_trains_with_fp32_master_weights(tmp_path, tiny_model_dir):
    """A bf16 checkpoint is upcast: it trains exactly like its fp32 copy at the same lr."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    model.to(torch.float32).save_pretrained(tmp_path / "fp32")  # the same values, stored in fp32
    tokenizer.save_pretrained(tmp_path / "fp32")

    def changed_fraction_after_two_steps(model_dir, **overrides):
        torch.manual_seed(0)
        trainer = run(tmp_path / f"run_{model_dir.name}_{len(overrides)}", model_dir, lr=1e-6, **overrides)
        start = [p.detach().clone() for p in trainer.policy.parameters()]
        trainer.train_step()
        trainer.train_step()
        end = list(trainer.policy.parameters())
        changed = sum(int((a != b).sum()) for a, b in zip(start, end))
        return changed / sum(p.numel() for p in end), end

    master, master_params = changed_fraction_after_two_steps(tmp_path / "bf16")
    reference, reference_params = changed_fraction_after_two_steps(tmp_path / "fp32")
    assert all(p.dtype == torch.float32 for p in master_params)
    assert master == reference > 0.5
    assert all(torch.equal(a, b) for a, b in zip(master_params, reference_params))
    # As saved ("auto"), bf16 weights round most lr-1e-6 updates away.
    as_saved, as_saved_params = changed_fraction_after_two_steps(tmp_path / "bf16", model_dtype="auto")
    assert as_saved_params[0].dtype == torch.bfloat16
    assert as_saved < 0.2 * master


def test_mixed_precision_no_from_the_command_line(tmp_path):
    parser = build_parser()
    assert config_from_args(parser.parse_args(["--mixed-precision", "no"])).mixed_precision == "no"
    assert config_from_args(parser.parse_args(["--set", "mixed_precision=no"])).mixed_precision == "no"
    (tmp_path / "c.yaml").write_text("mixed_precision: no\nmodel_dtype: bfloat16\n")
    config = config_from_args(parser.parse_args(["--config", str(tmp_path / "c.yaml")]))
    assert (config.mixed_precision, config.model_dtype) == ("no", "bfloat16")
    with pytest.raises(ValueError, match="PPOConfig.mixed_precision"):
        PPOConfig(mixed_precision=True)  # YAML `yes` is not a precision
    with pytest.raises(ValueError, match="PPOConfig.model_dtype"):
        PPOConfig(model_dtype="fp32")

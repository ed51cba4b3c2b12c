"""The critic's details: critic warm-up (with a real resume inside it), value pretraining,
the critic diagnostics, and the new critic-free estimators running in the loop."""

from __future__ import annotations

import json

import pytest
import torch

from ppo.config import PPOConfig
from ppo.run.metrics import critic_diagnostics
from ppo.trainer import RLTrainer
from ppo.models.value_pretrain import PretrainSettings, pretrain_critic, pretrained_critic_path

# A random tiny model never solves a problem; scoring its unfinished responses -1 gives the
# critic returns to fit from the first step.
TINY = dict(rollout_batch_size=8, response_length=12, eval_size=8, eval_every=0, save_every=0, progress=False,
            log_samples=0, lr=1e-3, threads=1, missing_eos="replace", missing_eos_value=-1.0)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def metric_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("separate_value_optimizer", [True, False])
def test_critic_warmup_freezes_the_policy_bit_for_bit_and_resumes_inside_it(tmp_path, tiny_model_dir,
                                                                           separate_value_optimizer):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), total_steps=3,
                       critic_warmup_steps=2, num_minibatches=2, ppo_epochs=2,
                       separate_value_optimizer=separate_value_optimizer, **TINY)
    first = RLTrainer(config)
    policy0, critic0 = weights(first.policy_module), weights(first.value_model)
    first.train(stop_after=1)  # step 1 of the warm-up, then a checkpoint
    assert first.step == 1
    assert same(weights(first.policy_module), policy0)
    assert not same(weights(first.value_model), critic0)

    second = RLTrainer(config)  # a new process's trainer: resumes from the step-1 checkpoint
    second.train(resume=True, stop_after=2)
    assert second.step == 2
    assert same(weights(second.policy_module), policy0)  # step 2 is still inside the warm-up
    critic2 = weights(second.value_model)
    assert not same(critic2, critic0)

    third = RLTrainer(config)
    third.train(resume=True)
    assert third.step == 3
    assert not same(weights(third.policy_module), policy0)  # the policy trains from step 3 on
    rows = [r for r in metric_rows(tmp_path / "run") if r["step"] >= 1]
    assert [r["policy_grad_norm"] for r in rows[:2]] == [0.0, 0.0] and rows[2]["policy_grad_norm"] > 0
    assert all(r["value_grad_norm"] > 0 for r in rows)


def test_critic_warmup_needs_a_critic():
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        PPOConfig(advantage_estimator="grpo", group_size=2, critic_warmup_steps=1)


def test_critic_diagnostics_worked_example():
    advantages = torch.tensor([[0.25, 0.5, 0.0]])
    rewards, values = torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    stats = critic_diagnostics(advantages, rewards, values, mask, mask, gamma=1.0)
    assert stats == pytest.approx({"value_error_mc": 0.25, "advantage_bias_first_tokens": -0.125})
    # only the first tokens count: with first_tokens=1 the bias is A_0 - (G_0 - V_0) = 0.25 - 0.5
    assert critic_diagnostics(advantages, rewards, values, mask, mask, 1.0, first_tokens=1)[
        "advantage_bias_first_tokens"] == pytest.approx(-0.25)


def test_value_pretraining_is_cached_and_loaded_by_value_init(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), total_steps=1, **TINY)
    settings = PretrainSettings(rounds=2, epochs=2)
    path = pretrain_critic(config, settings, cache_dir=tmp_path / "cache")
    assert path == pretrained_critic_path(config, settings, tmp_path / "cache")
    info = json.loads((path / "critic_info.json").read_text())
    history = info["epochs"]
    assert [row["epoch"] for row in history] == [0, 1, 2]
    assert history[-1]["value_error"] < history[0]["value_error"]  # the fit moved toward the returns
    stamp = (path / "critic_info.json").stat().st_mtime_ns
    assert pretrain_critic(config, settings, cache_dir=tmp_path / "cache") == path  # cached: not refitted
    assert (path / "critic_info.json").stat().st_mtime_ns == stamp
    assert pretrained_critic_path(config.replace(seed=5, total_steps=7), settings, tmp_path / "cache") == path
    assert pretrained_critic_path(config.replace(gamma=0.9), settings, tmp_path / "cache") != path

    from value_model import ScalarHeadModel

    saved = weights(ScalarHeadModel.from_pretrained(path))
    trainer = RLTrainer(config.replace(value_init="pretrained", value_init_path=str(path)))
    assert same(weights(trainer.value_model), saved)
    assert saved["head.weight"].abs().sum() > 0  # the trained head is kept, not zeroed


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"])
def test_new_estimators_run_in_the_loop(tmp_path, tiny_model_dir, estimator):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / estimator), total_steps=1,
                       advantage_estimator=estimator, group_size=2, whiten_advantages=False, **TINY)
    trainer = RLTrainer(config)
    policy0 = weights(trainer.policy_module)
    trainer.train()
    assert trainer.value_model is None and not same(weights(trainer.policy_module), policy0)


def test_decoupled_lambda_run_logs_the_critic_diagnostics(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), total_steps=1,
                       lam=0.95, lam_critic=1.0, lam_length_alpha=0.5, **TINY)
    RLTrainer(config).train()
    row = metric_rows(tmp_path / "run")[-1]
    for key in ("value_error", "value_error_mc", "advantage_bias_first_tokens", "explained_variance"):
        assert key in row, key

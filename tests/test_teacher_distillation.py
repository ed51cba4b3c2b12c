"""On-policy distillation in the loop: the teacher slot (ppo/models/setup.py, ppo/models/teacher.py),
its loss in the update (`RLTrainer._update`, `ForwardPasses.distillation_loss`) and its config
fields (`teacher_model_path`, `distill_coef`, `distill_only`). The math alone is in
tests/test_distillation.py; the sharded teacher in tests/test_sharding.py."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from ppo.config import PPOConfig
from ppo.models import teacher as teacher_module
from ppo.models.policy import load_policy
from ppo.models.tiny_model import TinyModelConfig, build_tiny_model
from ppo.settings.config_checks import InertSettingWarning, config_warnings
from ppo.trainer import RLTrainer

PROMPTS = ["1+1=", "2+3=", "9+9=", "4+4="]
TINY = dict(task="custom", rollout_batch_size=8, group_size=2, advantage_estimator="grpo", kl_placement="loss",
            whiten_advantages=False, response_length=8, ppo_epochs=1, eval_size=2, eval_every=0, total_steps=1, save_every=0,
            progress=False, log_samples=0, lr=1e-3, threads=1, device="cpu", report_to=[])


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory, char_tokenizer):
    """A different tiny model (other initial weights) with the policy's tokenizer, saved like a checkpoint."""
    torch.manual_seed(123)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             char_tokenizer)
    path = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


def make_trainer(tmp_path, model_dir, **overrides) -> RLTrainer:
    config = PPOConfig(model_path=str(model_dir), output_dir=str(tmp_path / "run"), **{**TINY, **overrides})
    return RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)


def dense_reverse_kl_by_hand(student, teacher, rollout) -> float:
    """KL(student || teacher) summed over the vocabulary at every real response token, each row
    run alone and unpadded through both plain Hugging Face forwards in float64, then the mean
    over those tokens (the token mean)."""
    total, count = 0.0, 0
    for row in range(len(rollout)):
        query = rollout.query_ids[row][rollout.query_mask[row].bool()]
        response = rollout.response_ids[row][rollout.response_mask[row].bool()]
        ids = torch.cat([query, response])[None]  # [1, L]
        with torch.no_grad():
            p = torch.log_softmax(student(input_ids=ids).logits[0].double(), -1)  # [L, V]
            q = torch.log_softmax(teacher(input_ids=ids).logits[0].double(), -1)
        for t in range(len(response)):  # position Q - 1 + t predicts response token t
            position = len(query) - 1 + t
            total += float((p[position].exp() * (p[position] - q[position])).sum())
            count += 1
    return total / count


def test_distill_only_training_loss_equals_the_dense_reverse_kl_by_hand(tmp_path, tiny_model_dir, teacher_dir):
    """With distill_only (one epoch, one minibatch, one micro-batch, token mean) the loss the
    update backpropagates is exactly the mean over the batch's response tokens of the reverse
    KL from the policy to the teacher, whatever the rewards were."""
    trainer = make_trainer(tmp_path, tiny_model_dir, teacher_model_path=str(teacher_dir), distill_only=True,
                           kl_coef=0.0, kl_placement="reward", loss_agg="token_mean")
    seen = {}
    old_logprobs, backward = trainer.passes.old_logprobs, trainer.accelerator.backward
    trainer.passes.old_logprobs = lambda rollout: (seen.setdefault("rollout", rollout), old_logprobs(rollout))[1]
    trainer.accelerator.backward = lambda loss: (seen.setdefault("loss", float(loss.detach())), backward(loss))[1]
    metrics = trainer.train_step()
    student, _ = load_policy(tiny_model_dir)  # the weights the backward ran on (one optimizer step, after it)
    teacher, _ = load_policy(teacher_dir)
    expected = dense_reverse_kl_by_hand(student.eval(), teacher.eval(), seen["rollout"])
    assert expected > 0.01  # two different random models: far from each other
    assert seen["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert metrics["distill_kl"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # Plus the policy-gradient loss instead (distill_coef): the teacher's term is added, not alone.
    mixed = make_trainer(tmp_path / "mixed", tiny_model_dir, teacher_model_path=str(teacher_dir), distill_coef=0.5,
                         kl_coef=0.0, kl_placement="reward", loss_agg="token_mean")
    captured = {}
    backward = mixed.accelerator.backward
    mixed.accelerator.backward = lambda loss: (captured.setdefault("loss", float(loss.detach())), backward(loss))[1]
    mixed_metrics = mixed.train_step()
    assert captured["loss"] == pytest.approx(mixed_metrics["pg_loss"] + 0.5 * mixed_metrics["distill_kl"], abs=1e-5)


def test_teacher_is_frozen_unchanged_and_gets_no_gradient(tmp_path, tiny_model_dir, teacher_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, teacher_model_path=str(teacher_dir), distill_coef=1.0,
                           total_steps=2)
    teacher = trainer.teacher
    assert teacher is not None and not teacher.training
    assert all(not p.requires_grad for p in teacher.parameters())
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    policy_before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.train_step()
    assert metrics["distill_kl"] > 0 and metrics["time_teacher_forward"] > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not teacher.training
    assert any(not torch.equal(a, b.detach()) for a, b in zip(policy_before, trainer.policy.parameters()))
    # Distillation off: no teacher is loaded at all, and none is measured.
    plain = make_trainer(tmp_path / "plain", tiny_model_dir)
    assert plain.teacher is None and "distill_kl" not in plain.train_step()


def test_distill_kl_decreases_in_a_short_distillation_run(tmp_path, tiny_model_dir, teacher_dir):
    """A few steps of distill_only (no reward) from one random model toward another: the
    student's reverse KL to the teacher, on its own samples, falls."""
    trainer = make_trainer(tmp_path, tiny_model_dir, teacher_model_path=str(teacher_dir), distill_only=True,
                           kl_coef=0.0, kl_placement="reward", lr=3e-3, total_steps=8, response_length=6)
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [row["distill_kl"] for row in rows if "distill_kl" in row]
    assert len(kl) == 8 and summary["steps"] == 8
    assert sum(kl[-2:]) / 2 < 0.8 * sum(kl[:2]) / 2, kl


def test_distill_settings_without_a_teacher_are_refused():
    with pytest.raises(ValueError, match=r"PPOConfig.distill_coef: distils from a teacher: set teacher_model_path"):
        PPOConfig(**{**TINY, "distill_coef": 0.1})
    with pytest.raises(ValueError, match=r"PPOConfig.distill_only: distils from a teacher: set teacher_model_path"):
        PPOConfig(**{**TINY, "distill_only": True})
    with pytest.raises(ValueError, match=r"PPOConfig.distill_coef: must be >= 0"):
        PPOConfig(**{**TINY, "distill_coef": -1.0, "teacher_model_path": "testbed"})
    with pytest.raises(ValueError, match=r"PPOConfig.distill_only: .*advantage_estimator='gae'"):
        PPOConfig(distill_only=True, teacher_model_path="testbed")  # the default PPO trains a critic


def test_teacher_path_that_does_not_exist_is_refused_naming_it(tmp_path, tiny_model_dir):
    missing = tmp_path / "no_such_teacher"
    with pytest.raises(ValueError, match=rf"PPOConfig.teacher_model_path: '{missing}' does not exist"):
        make_trainer(tmp_path, tiny_model_dir, teacher_model_path=str(missing), distill_coef=0.1)


def test_teacher_with_another_vocabulary_is_refused_naming_both_sizes(tmp_path, tiny_model_dir, char_tokenizer):
    torch.manual_seed(5)
    other = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             char_tokenizer)
    policy_size = other.get_output_embeddings().weight.shape[0]
    other.resize_token_embeddings(policy_size + 7)
    other.save_pretrained(tmp_path / "wide")
    char_tokenizer.save_pretrained(tmp_path / "wide")
    with pytest.raises(ValueError, match=rf"PPOConfig.teacher_model_path: the teacher at .* has a vocabulary of "
                                         rf"{policy_size + 7} token ids and the policy {policy_size}"):
        make_trainer(tmp_path, tiny_model_dir, teacher_model_path=str(tmp_path / "wide"), distill_coef=0.1)


def test_teacher_and_distill_settings_that_cannot_act_are_warned(teacher_dir):
    base = PPOConfig(**TINY)
    unread = config_warnings(base.replace(teacher_model_path=str(teacher_dir)))
    assert any(m.startswith("PPOConfig.teacher_model_path:") and "distill_coef=0" in m for m in unread)
    only = base.replace(teacher_model_path=str(teacher_dir), distill_only=True, distill_coef=0.5, entropy_coef=0.01,
                        kl_coef=0.04)
    names = [m.split(":")[0] for m in config_warnings(only)]
    assert "PPOConfig.distill_coef" in names and "PPOConfig.entropy_coef" in names and "PPOConfig.kl_coef" in names
    assert config_warnings(base.replace(teacher_model_path=str(teacher_dir), distill_coef=0.5)) == []
    assert issubclass(InertSettingWarning, UserWarning)


def test_testbed_teacher_is_built_once_then_reused(tmp_path, monkeypatch):
    """teacher_model_path='testbed' resolves to the cached testbed teacher, building it only
    when it is missing (the build itself is `python -m ppo.models.teacher build`)."""
    builds = []

    def fake_build(output_dir, progress=True):
        builds.append(output_dir)
        output_dir.mkdir(parents=True)
        (output_dir / teacher_module.INFO_FILE).write_text("{}")
        return output_dir

    monkeypatch.setattr(teacher_module, "build_testbed_teacher", fake_build)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = teacher_module.resolve_teacher_path("testbed", progress=False, cache_dir=tmp_path)
        second = teacher_module.resolve_teacher_path("testbed", progress=False, cache_dir=tmp_path)
    assert first == second == teacher_module.testbed_teacher_dir(tmp_path) and builds == [first]
    assert first.parent == tmp_path / "teacher"

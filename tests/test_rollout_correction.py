"""The sampler-trainer mismatch: TIS / MIS weights worked by hand, and a real mismatch from
sampling under bf16 autocast while the trainer scores in fp32."""

import math

import pytest
import torch

from ppo.algorithm.rollout_correction import correction_weights, mismatch_metrics, sampling_autocast

# One sequence of two tokens with trainer / sampler ratios 3 and 0.25, and a padding column.
OLD = torch.log(torch.tensor([[3.0, 0.25, 1.0]]))
SAMPLER = torch.zeros(1, 3)
MASK = torch.tensor([[1.0, 1.0, 0.0]])


@pytest.mark.parametrize("mode, weights, mask", [
    ("none", [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]),
    ("token_tis", [2.0, 0.25, 1.0], [1.0, 1.0, 0.0]),      # 3 capped at 2
    ("sequence_tis", [0.75, 0.75, 0.75], [1.0, 1.0, 0.0]),  # 3 * 0.25, under the cap
    ("token_mis", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),        # 3 > 2 and 0.25 < 0.5: both out
    ("sequence_mis", [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]),     # 0.75 inside [0.5, 2]
])
def test_weights_and_masks_by_hand(mode, weights, mask):
    got_weights, got_mask = correction_weights(OLD, SAMPLER, MASK, mode, cap=2.0, floor=0.5)
    assert torch.allclose(got_weights, torch.tensor([weights]), atol=1e-6)
    assert torch.equal(got_mask, torch.tensor([mask]))


def test_sequence_weights_are_capped():
    old = torch.log(torch.tensor([[3.0, 3.0]]))
    weights, _ = correction_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "sequence_tis", cap=4.0)
    assert torch.allclose(weights, torch.full((1, 2), 4.0))  # 9 capped at 4
    _, mask = correction_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "sequence_mis", cap=4.0)
    assert mask.sum() == 0


def test_mismatch_metrics_by_hand():
    metrics = mismatch_metrics(OLD, SAMPLER, MASK, "token_tis", cap=2.0)
    k3 = ((3.0 - 1 - math.log(3.0)) + (0.25 - 1 - math.log(0.25))) / 2
    assert metrics["rollout_mismatch_kl"] == pytest.approx(k3, rel=1e-6)
    assert metrics["rollout_ratio_min"] == pytest.approx(0.25) and metrics["rollout_ratio_max"] == pytest.approx(3.0)
    assert metrics["rollout_corrected_frac"] == 0.5
    assert mismatch_metrics(OLD, OLD, MASK)["rollout_mismatch_kl"] == 0.0


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="rollout_correction"):
        correction_weights(OLD, SAMPLER, MASK, "tis")
    with pytest.raises(ValueError, match="sampling precision"):
        sampling_autocast("fp16", "cpu")


def test_bf16_sampling_refuses_the_lean_sampler(tmp_path, tiny_model_dir):
    """Refused when the config is made, naming the field, before any model is loaded."""
    from ppo.config import preset

    with pytest.raises(ValueError, match="sampling_precision.*lean_forward=False"):
        preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
               **{**TINY, "lean_forward": True, "sampling_precision": "bf16"})


# ---- in the loop --------------------------------------------------------------------------
TINY = dict(rollout_batch_size=8, response_length=12, eval_size=8, eval_every=0, total_steps=2, save_every=0,
            progress=False, log_samples=0, lr=1e-2, group_size=4, lean_forward=False)


def run_steps(config, steps=2, spy=None):
    from ppo.trainer import RLTrainer

    trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "9+9="], reward_fn=lambda p, r: [float(x.count("1")) for x in r])
    if spy is not None:
        spy(trainer)
    return [trainer.train_step() for _ in range(steps)]


def test_bf16_sampling_shows_a_mismatch_and_fp32_none(tmp_path, tiny_model_dir):
    from ppo.config import preset

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    log_rollout_mismatch=True, **TINY)
    exact = run_steps(config)
    bf16 = run_steps(config.replace(sampling_precision="bf16", output_dir=str(tmp_path / "b")))
    # fp32 sampling differs from the fp32 pass by round-off only; bf16 autocast by orders more
    assert all(row["rollout_mismatch_kl"] < 1e-11 for row in exact)
    assert all(row["rollout_mismatch_kl"] > 1e-9 for row in bf16)
    assert all(row["rollout_ratio_max"] > 1.0002 and row["rollout_ratio_min"] < 0.9998 for row in bf16)


def test_without_the_toggles_nothing_is_logged_or_kept(tmp_path, tiny_model_dir):
    from ppo.config import preset

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"), **TINY)
    rows = run_steps(config, steps=1)
    assert not any(key.startswith("rollout_") for key in rows[0])


@pytest.mark.parametrize("mode", ["token_tis", "sequence_tis", "token_mis", "sequence_mis"])
def test_corrections_cap_the_per_token_weights_in_the_loop(tmp_path, tiny_model_dir, mode, monkeypatch):
    """Under bf16 sampling the advantages the update sees are the estimator's times weights
    that never pass the cap (TIS), or tokens outside the band leave the loss mask (MIS)."""
    from ppo.config import preset
    from ppo.algorithm import rollout_correction

    seen = {}
    original = rollout_correction.correct

    def spy(config, rollout, old_logprobs, advantages, loss_mask, *args, **kwargs):
        out = original(config, rollout, old_logprobs, advantages, loss_mask, *args, **kwargs)
        seen.update(advantages=advantages, loss_mask=loss_mask, out=out)
        return out

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / mode),
                    sampling_precision="bf16", rollout_correction=mode, rollout_correction_cap=1.001,
                    rollout_correction_floor=0.999, **TINY)
    monkeypatch.setattr(rollout_correction, "correct", spy)
    row = run_steps(config, steps=1)[0]
    advantages, loss_mask = seen["advantages"], seen["loss_mask"]
    new_advantages, new_mask, _ = seen["out"]
    real = loss_mask.bool() & (advantages.abs() > 1e-6)
    assert real.any()
    weights = new_advantages[real] / advantages[real]
    if mode.endswith("tis"):
        assert weights.max() <= 1.001 + 1e-5 and torch.equal(new_mask, loss_mask)
        assert (weights < 1.0).any() or (weights > 1.0).any()  # bf16 moved some ratio off 1
    else:
        assert torch.allclose(weights, torch.ones_like(weights))
        assert new_mask.sum() < loss_mask.sum()  # a band of 0.1% drops some tokens
    assert row["rollout_corrected_frac"] > 0


@pytest.mark.parametrize("mode, limits", [
    ("geo_tis", dict(rollout_correction_cap=1.0005)),
    ("geo_mis", dict(rollout_correction_cap=1.0001, rollout_correction_floor=0.9999)),
    ("token_icepop", dict(rollout_correction_cap=1.001, rollout_correction_floor=0.999)),
    ("sequence_icepop", dict(rollout_correction_cap=1.001, rollout_correction_floor=0.999)),
    ("decoupled", dict(rollout_correction_cap=1.0005)),
    ("token_k3", dict(rollout_correction_kl_threshold=1e-8)),
    ("seq_max_k2", dict(rollout_correction_kl_threshold=3e-7)),
])
def test_the_loop_applies_each_correction_as_computed(tmp_path, tiny_model_dir, mode, limits, monkeypatch):
    """Under bf16 sampling the update sees the estimator's advantages times `correction_weights`
    and the mask it leaves, computed from the old pass and the sampler's own log-probs."""
    from ppo.config import preset
    from ppo.algorithm import rollout_correction

    seen = {}
    original = rollout_correction.correct

    def spy(config, rollout, old_logprobs, advantages, loss_mask, temperature, *args, **kwargs):
        out = original(config, rollout, old_logprobs, advantages, loss_mask, temperature, *args, **kwargs)
        sampler = rollout_correction.sampler_token_logprobs(rollout, temperature)
        seen.update(expected=rollout_correction.correction_weights(
            old_logprobs, sampler, loss_mask, config.rollout_correction, config.rollout_correction_cap,
            config.rollout_correction_floor, config.rollout_correction_kl_threshold), advantages=advantages, out=out)
        return out

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / mode),
                    sampling_precision="bf16", rollout_correction=mode, **limits, **TINY)
    monkeypatch.setattr(rollout_correction, "correct", spy)
    row = run_steps(config, steps=1)[0]
    weights, mask = seen["expected"]
    new_advantages, new_mask, _ = seen["out"]
    assert torch.equal(new_advantages, seen["advantages"] * weights) and torch.equal(new_mask, mask)
    assert 0 < row["rollout_corrected_frac"] < 1  # a band this narrow acts on a bf16 mismatch, not on everything


def test_batch_normalised_weights_average_one_in_the_loop(tmp_path, tiny_model_dir, monkeypatch):
    from ppo.config import preset
    from ppo.algorithm import rollout_correction

    seen = {}
    original = rollout_correction.correct

    def spy(config, rollout, old_logprobs, advantages, loss_mask, temperature, *args, **kwargs):
        seen["out"] = original(config, rollout, old_logprobs, advantages, loss_mask, temperature, *args, **kwargs)
        sampler = rollout_correction.sampler_token_logprobs(rollout, temperature)
        truncated, _ = rollout_correction.correction_weights(old_logprobs, sampler, loss_mask, "token_tis", cap=1.0002)
        seen.update(truncated=truncated, advantages=advantages, mask=loss_mask)
        return seen["out"]

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    sampling_precision="bf16", rollout_correction="token_tis", rollout_correction_cap=1.0002,
                    rollout_correction_batch_normalize=True, **TINY)
    monkeypatch.setattr(rollout_correction, "correct", spy)
    row = run_steps(config, steps=1)[0]
    truncated, mask = seen["truncated"], seen["mask"]
    mean = float((truncated * mask).sum() / mask.sum())
    assert row["rollout_weight_batch_mean"] == pytest.approx(mean, rel=1e-6) and mean != 1.0
    assert torch.equal(seen["out"][0], seen["advantages"] * (truncated / mean))


def test_off_policy_sequence_mask_acts_in_the_update(tmp_path, tiny_model_dir):
    """DeepSeek-V3.2's mask needs the current policy: it acts in the update, after the first
    optimizer step has moved the policy away from the sampler, and is logged there."""
    from ppo.config import preset

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    off_policy_mask_threshold=0.0, **{**TINY, "ppo_epochs": 2})
    masked = run_steps(config, steps=1)[0]
    assert masked["off_policy_masked_frac"] > 0
    plain = run_steps(config.replace(off_policy_mask_threshold=None, output_dir=str(tmp_path / "b")), steps=1)[0]
    assert "off_policy_masked_frac" not in plain and plain["pg_loss"] != masked["pg_loss"]

import pytest

from ppo.cli import build_parser, config_from_args
from ppo.config import PRESETS, TESTBED_ADJUSTMENTS, TESTBED_SCALE, PPOConfig, field_help, parse_override, preset


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(gamma=1.5), "gamma"),
        (dict(lam=-0.1), "lam"),
        (dict(rollout_batch_size=64, num_minibatches=3), "rollout_batch_size"),
        (dict(rollout_batch_size=64, group_size=5), "rollout_batch_size"),
        (dict(rollout_batch_size=64, num_minibatches=2, gradient_accumulation_steps=3), "gradient_accumulation_steps"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(advantage_estimator="vtrace"), "advantage_estimator"),
        (dict(loss_agg="sum"), "loss_agg"),
        (dict(missing_eos="drop"), "missing_eos"),
        (dict(cliprange=0.0), "cliprange"),
        (dict(dual_clip=0.5), "dual_clip"),
        (dict(top_p=0.0), "top_p"),
        (dict(advantage_estimator="grpo", group_size=1), "group_size"),
        (dict(task="gsm8k"), "task_path"),
        (dict(gsm8k_answer_mode="loose"), "gsm8k_answer_mode"),
        (dict(kl_coef=-1.0), "kl_coef"),
        (dict(total_steps=0), "total_steps"),
    ],
)
def test_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}"):
        PPOConfig(**overrides)


def test_reward_model_init_needs_a_reward_model():
    with pytest.raises(ValueError, match=r"PPOConfig\.value_init"):
        PPOConfig(value_init="reward_model").validate_for_run()


def test_every_field_has_help():
    assert all(len(text) > 10 for text in field_help().values())


def test_cli_help_prints_every_field_verbatim():
    """`ppo.cli --help` formats every field's help; a '%' in it (retain_freed_memory quotes
    percentages) must come out as written, not break argparse's formatting."""
    text = "".join(build_parser().format_help().split())  # argparse re-wraps lines (and at hyphens)
    for name, help_text in field_help().items():
        assert "--" + name.replace("_", "-") in text
        assert "".join(help_text.split())[:60] in text, name
    assert "0-6%" in text


def test_alpacafarm_preset_values():
    config = preset("alpacafarm")
    expected = dict(kl_coef=0.0067, adaptive_kl=False, kl_estimator="k1", kl_clip_at_zero=True, kl_placement="reward",
                    whiten_rewards=True, whiten_advantages=True, gamma=1.0, lam=1.0, cliprange=0.2,
                    cliprange_value=0.2, vf_coef=0.1, ppo_epochs=2, rollout_batch_size=512, minibatch_size=256,
                    lr=1e-5, separate_value_optimizer=False, adam_eps=1e-5, warmup_steps=5, lr_schedule="linear",
                    max_grad_norm=1.0, temperature=1.0, entropy_coef=0.0, missing_eos="none", disable_dropout=True,
                    value_init="reward_model", logprobs_from_generation=False)
    for name, value in expected.items():
        assert getattr(config, name) == value, name


def test_trl_preset_values():
    config = preset("trl_ppo")
    expected = dict(kl_coef=0.05, kl_estimator="k1", gamma=1.0, lam=0.95, whiten_rewards=False, cliprange=0.2,
                    cliprange_value=0.2, vf_coef=0.1, ppo_epochs=4, num_minibatches=1, temperature=0.7, lr=3e-6)
    for name, value in expected.items():
        assert getattr(config, name) == value, name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_testbed_scaling_keeps_algorithmic_settings(name):
    full, small = preset(name), preset(name, testbed=True)
    changed = {k for k in full.to_dict() if full.to_dict()[k] != small.to_dict()[k]}
    assert changed <= set(TESTBED_SCALE) | set(TESTBED_ADJUSTMENTS.get(name, {}))
    assert small.num_minibatches == full.num_minibatches


def test_yaml_round_trip_and_unknown_field(tmp_path):
    config = preset("alpacafarm", testbed=True, seed=3)
    config.to_yaml(tmp_path / "c.yaml")
    assert PPOConfig.from_yaml(tmp_path / "c.yaml") == config
    with pytest.raises(ValueError, match="unknown field"):
        PPOConfig.from_dict({"kl_coeff": 0.1})


def test_overrides_and_cli_precedence(tmp_path):
    assert parse_override("kl_coef=0.1") == ("kl_coef", 0.1)
    assert parse_override("cliprange-high=null") == ("cliprange_high", None)
    with pytest.raises(ValueError, match="unknown field"):
        parse_override("nope=1")
    (tmp_path / "c.yaml").write_text("kl_coef: 0.2\nseed: 5\n")
    args = build_parser().parse_args(["--preset", "alpacafarm", "--testbed", "--config", str(tmp_path / "c.yaml"),
                                      "--seed", "7", "--set", "lam=0.9"])
    config = config_from_args(args)
    assert (config.kl_coef, config.seed, config.lam, config.rollout_batch_size) == (0.2, 7, 0.9, 64)
    assert config.kl_clip_at_zero is True  # from the preset

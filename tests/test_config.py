import re
import warnings

import pytest
import yaml

import ppo.cli
from ppo.cli import build_parser, config_from_args
from ppo.config import PRESETS, TESTBED_ADJUSTMENTS, TESTBED_SCALE, PPOConfig, field_help, parse_override, preset
from ppo.run.run_dir import resume_changes


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
    text = "".join(build_parser().format_help().split())  # argparse re-wraps lines (and at hyphens)
    for name, help_text in field_help().items():
        assert "--" + name.replace("_", "-") in text
        assert "".join(help_text.split())[:60] in text, name


def test_cli_help_prints_a_percent_sign_as_written(monkeypatch):
    """argparse formats help strings with %: a '%' in a field's help must not break it."""
    helps = {name: f"{text} Up to 5% of it." for name, text in field_help().items()}
    monkeypatch.setattr(ppo.cli, "field_help", lambda: helps)
    assert "Upto5%ofit." in "".join(build_parser().format_help().split())


# A sentence ends at . ! or ? followed by a space and a capital letter (so "e.g. 'q_proj'"
# and "Ziegler et al. 2019" do not end one).
_SENTENCE_END = re.compile(r"[.!?]\s+(?=[A-Z])")
# A timing or a measured ratio: "2 minutes", "80 ms", "0-6%", "0.85x".
_MEASUREMENT = re.compile(r"\d\s*(%|ms\b|seconds?\b|minutes?\b)|\d\.\d+x\b")


@pytest.mark.parametrize("name", list(field_help()))
def test_help_is_at_most_two_sentences_without_measurements(name):
    """The long story of a field is its row in docs/implementation-details.md."""
    text = field_help()[name]
    assert len(_SENTENCE_END.findall(text)) <= 1, f"{name}: more than two sentences: {text}"
    assert not _MEASUREMENT.search(text), f"{name}: a measurement belongs in the catalogue row: {text}"


def test_fields_follow_the_algorithm_with_speed_toggles_last():
    names = list(field_help())
    firsts = ["model_path", "rollout_batch_size", "missing_eos", "kl_coef", "advantage_estimator", "ppo_epochs",
              "lr", "eval_every", "mixed_precision", "lean_forward"]
    assert [names.index(name) for name in firsts] == sorted(names.index(name) for name in firsts)
    speed = {"lean_forward", "compile_forward", "share_prompt_prefix", "padding_free", "paired_critic_pass",
             "reuse_update_forward", "retain_freed_memory"}
    assert set(names[-len(speed):]) == speed


def test_critic_on_padding_needs_the_fixed_width():
    """value_loss_over_padding trains the critic on the padding of a fixed-width batch."""
    with pytest.raises(ValueError, match=r"PPOConfig\.value_loss_over_padding.*pad_to_response_length"):
        PPOConfig(value_loss_over_padding=True)
    assert PPOConfig(value_loss_over_padding=True, pad_to_response_length=True).value_loss_over_padding
    with pytest.raises(ValueError, match=r"PPOConfig\.value_loss_over_padding"):
        preset("alpacafarm", pad_to_response_length=False)


def test_score_position_and_no_stop_token_settings():
    with pytest.raises(ValueError, match=r"PPOConfig\.score_position"):
        PPOConfig(score_position="first_token")
    with pytest.raises(ValueError, match=r"PPOConfig\.score_position.*gae"):
        preset("grpo", score_position="after_last_token")
    assert PPOConfig(stop_token_ids=[]).stop_token_ids == []  # no stop token
    for bad in ([-1], [True], "2"):
        with pytest.raises(ValueError, match=r"PPOConfig\.stop_token_ids"):
            PPOConfig(stop_token_ids=bad)
    full, testbed = preset("trl_ppo"), preset("trl_ppo", testbed=True)
    assert full.stop_token_ids == [] and testbed.stop_token_ids is None  # TESTBED_ADJUSTMENTS keeps the EOS
    assert full.score_position == testbed.score_position == "after_last_token"


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


# ---------------------------------------------------------------- renamed fields
OLD, NEW = "whiten_rewards_over_padding", "reward_whitening_mode"


def test_renamed_field_loads_from_a_dict_and_a_yaml_file(tmp_path):
    with pytest.warns(FutureWarning, match=NEW):
        assert PPOConfig.from_dict({OLD: "alpacafarm"}).reward_whitening_mode == "alpacafarm"
    (tmp_path / "c.yaml").write_text(f"{OLD}: stats\n")
    with pytest.warns(FutureWarning, match=NEW):
        assert PPOConfig.from_yaml(tmp_path / "c.yaml").reward_whitening_mode == "stats"
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=rf"PPOConfig\.{NEW}: given twice"):
        PPOConfig.from_dict({NEW: "masked", OLD: "stats"})


def test_renamed_field_as_a_keyword_and_in_replace_and_preset():
    with pytest.warns(FutureWarning, match=NEW):
        assert PPOConfig(**{OLD: True}).reward_whitening_mode == "stats"  # true/false of the oldest configs
    with pytest.warns(FutureWarning, match=NEW):
        assert PPOConfig().replace(**{OLD: "stats"}).reward_whitening_mode == "stats"
    with pytest.warns(FutureWarning, match=NEW):  # the old name overrides the preset's new one
        assert preset("alpacafarm", **{OLD: "masked"}).reward_whitening_mode == "masked"


def test_renamed_field_reads_under_its_old_name():
    config = preset("alpacafarm")
    with pytest.warns(DeprecationWarning, match=NEW):
        assert getattr(config, OLD) == "alpacafarm"
    with pytest.raises(AttributeError):
        setattr(config, OLD, "masked")
    assert OLD not in config.to_dict() and config.to_dict()[NEW] == "alpacafarm"


def test_renamed_field_in_overrides_and_cli_flags(tmp_path):
    with pytest.warns(FutureWarning, match=NEW):
        assert parse_override(f"{OLD.replace('_', '-')}=stats") == (NEW, "stats")
    with pytest.warns(FutureWarning, match=NEW):
        args = build_parser().parse_args(["--preset", "grpo", "--set", f"{OLD}=alpacafarm"])
        assert config_from_args(args).reward_whitening_mode == "alpacafarm"
    with pytest.warns(FutureWarning, match=NEW):
        args = build_parser().parse_args(["--preset", "grpo", "--" + OLD.replace("_", "-"), "stats"])
        assert config_from_args(args).reward_whitening_mode == "stats"
    (tmp_path / "c.yaml").write_text(f"{NEW}: stats\n")
    with pytest.warns(FutureWarning, match=NEW):  # a flag overrides the file even under the old name
        args = build_parser().parse_args(["--config", str(tmp_path / "c.yaml"), "--" + OLD.replace("_", "-"),
                                          "alpacafarm"])
        assert config_from_args(args).reward_whitening_mode == "alpacafarm"


def test_a_run_whose_config_yaml_has_the_old_name_resumes(tmp_path):
    config = preset("alpacafarm", testbed=True, output_dir=str(tmp_path))
    stored = {(OLD if name == NEW else name): value for name, value in config.to_dict().items()}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    with pytest.warns(FutureWarning, match=NEW):
        assert resume_changes(tmp_path, config) == {}
    with pytest.warns(FutureWarning, match=NEW):
        args = build_parser().parse_args(["--output-dir", str(tmp_path), "--resume", "--total-steps", "7"])
        resumed = config_from_args(args)
    assert resumed == config.replace(total_steps=7)


def test_current_names_load_without_warnings(tmp_path):
    config = preset("alpacafarm", testbed=True)
    config.to_yaml(tmp_path / "c.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PPOConfig.from_yaml(tmp_path / "c.yaml") == config
        assert parse_override(f"{NEW}=stats") == (NEW, "stats")

"""No toggle silently does nothing: the liveness table, the inert-setting rules, and each
case that was once accepted and ignored (ppo/settings/liveness.py, ppo/settings/config_checks.py)."""

import dataclasses
import json
import warnings

import pytest

from ppo.config import PRESETS, PPOConfig, field_help, preset
from ppo.settings.config_checks import InertSettingWarning, config_warnings, inert_settings, run_warnings
from ppo.settings.liveness import (DOC, NO_EFFECT_BY_NATURE, PROBES, check_live, differs, observe, probe_config, render,
                          undecided_fields, verdicts)


def count_odd(prompts, responses):
    return [sum(c in "13579" for c in r) / max(1, len(r)) for r in responses]


# ------------------------------------------------------------------------------ the table
def test_every_field_has_a_verdict():
    assert undecided_fields() == []
    assert not set(PROBES) & set(NO_EFFECT_BY_NATURE), "a field is both probed and declared inert by nature"
    assert set(PROBES) | set(NO_EFFECT_BY_NATURE) == set(field_help()), "a probe names a field PPOConfig lacks"


def test_a_field_added_without_a_verdict_is_caught():
    grown = dataclasses.make_dataclass("Grown", [("brand_new_toggle", bool, dataclasses.field(default=False))],
                                       bases=(PPOConfig,))
    assert undecided_fields(grown) == ["brand_new_toggle"]


def test_the_committed_table_is_current():
    assert DOC.read_text() == render(), "docs/liveness.md is stale: run python -m ppo.settings.liveness"


def test_refused_and_warned_cells_name_their_field_and_every_preset_is_decided():
    table = verdicts()
    assert list(table) == list(field_help())
    for name, row in table.items():
        assert set(row) == set(PRESETS)
        for preset_name, cell in row.items():
            assert cell.kind in ("live", "refused", "warned", "n/a")
            if cell.kind in ("refused", "warned"):
                assert name in cell.reason, (name, preset_name, cell.reason)


def test_known_cells():
    table = verdicts()
    assert table["vf_coef"]["grpo"].kind == "warned" and table["vf_coef"]["alpacafarm"].kind == "live"
    assert table["lam_critic"]["grpo"].kind == "refused"
    assert table["ref_update_alpha"]["alpacafarm"].kind == "refused"
    assert table["ref_update_every"]["dr_grpo"].kind == "refused"  # beta = 0: no reference to refresh
    assert table["cliprange"]["grpo"].kind == "warned"  # one on-policy step: every ratio is exactly 1
    assert table["cliprange"]["alpacafarm"].kind == "live"
    assert table["output_dir"]["grpo"].kind == "n/a"


def test_stock_presets_carry_no_inert_setting():
    for name in PRESETS:
        for testbed in (False, True):
            assert config_warnings(preset(name, testbed=testbed)) == [], (name, testbed)


def test_one_step_probe_sees_a_live_cell_and_not_a_warned_one(tmp_path):
    from ppo.settings.liveness import tiny_model

    model = tiny_model(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InertSettingWarning)
        base = observe(probe_config("grpo", model))
        assert differs(base, observe(probe_config("grpo", model, kl_coef=0.2)))
        assert not differs(base, observe(probe_config("grpo", model, vf_coef=0.5)))  # no critic to weigh
        assert not differs(base, observe(probe_config("grpo", model)))  # the probe itself is deterministic


@pytest.mark.slow
def test_every_probed_cell_agrees_with_the_probe(tmp_path):
    """Each 'live' cell decided by the probe changes the run; each 'warned' one leaves its
    trained weights as they were (a few minutes on 2 cores)."""
    from ppo.settings.liveness import tiny_model

    assert check_live(tiny_model(tmp_path)) == []


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("settings, field", [
    (dict(critic_warmup_steps=5, total_steps=5), "critic_warmup_steps"),  # the policy would never train
    (dict(ref_update_every=10, kl_coef=0.0), "ref_update_every"),
    (dict(ref_update_alpha=0.6), "ref_update_alpha"),
    (dict(value_init_path="critics/x"), "value_init_path"),
    (dict(advantage_estimator="grpo", group_size=2, lam_critic=1.0), "lam_critic"),
    (dict(advantage_estimator="grpo", group_size=2, lam_length_alpha=0.05), "lam_length_alpha"),
    (dict(advantage_estimator="grpo", group_size=2, lora_r=8, lora_critic=True), "lora_critic"),
    (dict(advantage_estimator="grpo", group_size=2, value_init="pretrained", value_init_path="c"), "value_init"),
    (dict(ref_update_every=10, lora_r=8), "ref_update_every"),  # once failed after the initial evaluation
    (dict(lam=0.95, lam_critic=0.95), "lam_critic"),
    (dict(rollout_correction_floor=-0.5), "rollout_correction_floor"),
    (dict(rollout_correction_cap=0.5), "rollout_correction_cap"),
])
def test_inert_mistakes_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=rf"^PPOConfig\.{field}: "):
        PPOConfig(**settings)


def test_the_refusal_says_what_makes_the_setting_inert():
    with pytest.raises(ValueError, match=r"kl_coef=0 .* skips the reference model; set kl_coef > 0"):
        PPOConfig(ref_update_every=10, kl_coef=0.0)
    with pytest.raises(ValueError, match=r"beyond total_steps \(5\): the policy would never train"):
        PPOConfig(critic_warmup_steps=6, total_steps=5)
    with pytest.raises(ValueError, match=r"value_init='policy' does not read it; set value_init='pretrained'"):
        PPOConfig(value_init_path="critics/x")


# ------------------------------------------------------------------------------ warnings
def test_inert_settings_are_warned_naming_field_and_cause():
    messages = config_warnings(preset("grpo", vf_coef=0.5, value_init="random", missing_eos_value=-3.0))
    assert [m.split(":")[0] for m in messages] == ["PPOConfig.value_init", "PPOConfig.missing_eos_value",
                                                   "PPOConfig.vf_coef"]
    assert "advantage_estimator='grpo' trains no critic" in messages[0]
    assert "missing_eos='none'" in messages[1] and "set missing_eos='replace'" in messages[1]


def test_default_values_never_warn():
    assert inert_settings(PPOConfig()) == []
    assert inert_settings(preset("grpo")) == []


def test_warmup_longer_than_the_run_is_warned():
    messages = config_warnings(PPOConfig(warmup_steps=10, total_steps=5))
    assert any(m.startswith("PPOConfig.warmup_steps: 10 is longer than total_steps (5)") for m in messages)
    assert config_warnings(PPOConfig(warmup_steps=5, total_steps=5)) == []


def test_fsdp_in_one_process_is_warned():
    config = PPOConfig(sharding="fsdp")
    assert any(m.startswith("PPOConfig.sharding: 'fsdp' has no effect in one process") for m in run_warnings(config, 1))
    assert run_warnings(config, 2) == []


def test_whitening_scope_process_in_one_process_is_warned_and_without_whitening_inert():
    """whitening_scope='process' changes nothing in one process (its share is the whole batch):
    the run warns; in two it acts (tests/test_data_parallel.py). With nothing whitened it is
    inert in any number of processes."""
    config = preset("alpacafarm").replace(whitening_scope="process")
    assert any(m.startswith("PPOConfig.whitening_scope: 'process' has no effect in one process")
               for m in run_warnings(config, 1))
    assert run_warnings(config, 2) == []
    assert run_warnings(preset("alpacafarm"), 1) == []  # "global", the default, never warns
    plain = dict(inert_settings(preset("grpo").replace(whitening_scope="process")))
    assert "whiten_rewards=False and whiten_advantages=False" in plain["whitening_scope"]
    assert "whitening_scope" not in dict(inert_settings(config))


def test_keep_checkpoints_help_says_zero_keeps_all():
    assert "0 keeps every one" in field_help()["keep_checkpoints"]


def test_report_to_none_as_a_list_means_no_tracker():
    assert PPOConfig(report_to=["none"]).report_to == []
    assert PPOConfig(report_to="none").report_to == []
    with pytest.raises(ValueError, match=r"PPOConfig.report_to: 'none' means no tracker and cannot be listed"):
        PPOConfig(report_to=["none", "tensorboard"])


def test_a_warned_run_records_its_warnings(tmp_path, tiny_model_dir):
    from ppo.run.model_card import render as render_card
    from ppo.trainer import RLTrainer

    config = preset("grpo", testbed=True, model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"),
                    rollout_batch_size=4, group_size=2, response_length=6, total_steps=1, eval_size=2,
                    report_to=[], progress=False, vf_coef=0.5)
    with pytest.warns(InertSettingWarning, match=r"PPOConfig.vf_coef: 0.5 has no effect"):
        trainer = RLTrainer(config)
    summary = trainer.train()
    assert summary["warnings"] == config_warnings(config) != []
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == summary["warnings"]
    card = render_card(config, 1, "m", None, {})
    differ, inert = card.split("## Settings with no effect in this run")
    assert "`vf_coef`" not in differ and "`vf_coef` | `0.5` |" in inert


# ------------------------------------------------------------------------------ the Python API
@pytest.mark.parametrize("prompts, message", [
    ("hello world", r"a single string 'hello world' would be read as one prompt per character"),
    ({"1+1=", "2+2="}, r"a set has no order"),
    ({"1+1=": 2}, r"a dict would train on its keys"),
    (iter(["1+1="]), r"expected a list or tuple of strings, got list_iterator"),
])
def test_prompt_collections_other_than_lists_are_refused(prompts, message):
    from ppo.tasks.custom import CustomTask

    with pytest.raises(ValueError, match=rf"CustomTask.prompts: {message}"):
        CustomTask(prompts=prompts, reward_fn=count_odd)


def test_a_tuple_of_prompts_keeps_its_order():
    from ppo.tasks.custom import CustomTask

    task = CustomTask(prompts=("b", "a"), reward_fn=count_odd)
    assert [p.prompt for p in task.eval_problems()] == ["b", "a"]


def test_empty_eval_prompts_are_refused():
    from ppo.tasks.custom import CustomTask

    with pytest.raises(ValueError, match=r"CustomTask.eval_prompts: \[\] holds no held-out prompt"):
        CustomTask(prompts=["a"], reward_fn=count_odd, eval_prompts=[])
    assert [p.prompt for p in CustomTask(prompts=["a"], reward_fn=count_odd).eval_problems()] == ["a"]


def test_a_reward_fn_is_used_or_refused_never_ignored(tiny_model_dir, tmp_path):
    from ppo.tasks import CustomTask, build_task
    from ppo.trainer import RLTrainer

    common = dict(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "r"), rollout_batch_size=4,
                  response_length=6, progress=False, report_to=[])
    trainer = RLTrainer(PPOConfig(task="arithmetic", **common), prompts=["1+1="], reward_fn=count_odd)
    assert isinstance(trainer.task, CustomTask) and trainer.config.task == "custom"  # config.yaml says so
    with pytest.raises(ValueError, match=r"PPOConfig.task='gsm8k' brings its own prompts and scorer, so the "
                                         r"reward_fn passed in would be ignored"):
        build_task(PPOConfig(task="gsm8k", task_path="x.jsonl"), reward_fn=count_odd)
    with pytest.raises(ValueError, match=r"needs both prompts and reward_fn; prompts is missing"):
        build_task(PPOConfig(), reward_fn=count_odd)
    with pytest.raises(ValueError, match=r"pass a task, or prompts and reward_fn, not both"):
        RLTrainer(PPOConfig(**common), task=CustomTask(prompts=["a"], reward_fn=count_odd), prompts=["b"])


def test_stop_ids_outside_the_vocabulary_are_refused(tiny_model_dir, tmp_path):
    from ppo.trainer import RLTrainer

    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "r"), stop_token_ids=[2, 10**6],
                       rollout_batch_size=4, progress=False)
    with pytest.raises(ValueError, match=r"PPOConfig.stop_token_ids: \[1000000\] lie outside the model's vocabulary"):
        RLTrainer(config)


# ------------------------------------------------------------------------------ messages
def test_a_reward_beyond_float32_is_named_with_its_value():
    import torch

    from ppo.run.guards import NonFiniteError, check_scores, drop_nonfinite_scores

    scores = torch.tensor([1.0, 1e300], dtype=torch.float64)
    with pytest.raises(NonFiniteError, match=r"reward_fn f gave 1e\+300 \(beyond float32's range, \+-3.4e\+38"):
        check_scores(scores, ["a", "b"], ["x", "y"], "reward_fn f")
    kept = check_scores(scores, ["a", "b"], ["x", "y"], "reward_fn f", drop=True)
    assert kept.tolist() == [True, False]
    dropped = drop_nonfinite_scores(scores, kept, 2)
    assert dropped.dtype == torch.float32 and dropped.tolist() == [1.0, 1.0]


def test_ablations_timeout_must_be_positive(capsys):
    from ablations.__main__ import build_parser

    for bad in ("-1", "0", "nan"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "quick", "--timeout", bad])
        assert "--timeout: must be a number of seconds > 0" in capsys.readouterr().err
    assert build_parser().parse_args(["run", "quick", "--timeout", "90"]).timeout == 90.0


def test_run_sweep_refuses_a_non_positive_timeout(tmp_path):
    from ablations.runner import run_sweep

    with pytest.raises(ValueError, match=r"timeout must be a number of seconds > 0"):
        run_sweep(["quick"], tmp_path / "sweep", timeout=-1, progress=False)
    assert not (tmp_path / "sweep").exists()


# ------------------------------------------------------------------------------ identical arms
def test_a_sweep_of_arms_differing_only_in_an_inert_field_is_refused_naming_both(tmp_path):
    from ablations.registry import Ablation, Variant
    from ablations.runner import run_sweep

    same = Ablation("same_arms", "Does the critic's weight matter without a critic?",
                    (Variant("base", "grpo"), Variant("heavy_critic", "grpo", {"vf_coef": 0.5})), "accuracy")
    with pytest.raises(ValueError, match=r"same_arms: variants 'base' and 'heavy_critic' resolve to the same effective "
                                         r"configuration; they differ only in \['vf_coef'\] \(PPOConfig.vf_coef"):
        run_sweep([same], tmp_path / "sweep", seeds=1, progress=False)
    assert not (tmp_path / "sweep").exists()  # refused before anything was written


def test_identical_arms_check_passes_every_registered_ablation_and_real_differences():
    from ablations.registry import ABLATIONS, Ablation, Variant
    from ablations.sweep_plan import plan_runs, refuse_identical_arms

    for ablation in ABLATIONS.values():
        refuse_identical_arms(plan_runs(ablation, 2, None, "/nonexistent/sweep"))
    speed = Ablation("speed_only", "q", (Variant("a", "grpo"), Variant("b", "grpo", {"padding_free": False})), "x")
    refuse_identical_arms(plan_runs(speed, 1, None, "/nonexistent/sweep"))  # exact speed paths are compared on time
    logging_only = Ablation("log", "q", (Variant("a", "grpo"), Variant("b", "grpo", {"eval_every": 3})), "x")
    with pytest.raises(ValueError, match=r"eval_every sets when the held-out evaluation runs"):
        refuse_identical_arms(plan_runs(logging_only, 1, None, "/nonexistent/sweep"))

import pytest

from ablations.registry import ABLATIONS, get_ablation
from ppo.config import PPOConfig

REQUIRED = ["ppo_vs_grpo", "kl_clip_at_zero", "gamma_lambda", "whitening", "value_clip", "kl_estimator",
            "kl_placement", "value_init", "value_optimizer", "temperature_logprobs", "missing_eos", "ppo_epochs",
            "grpo_std_norm", "length_norm", "kimi_length_reward", "difficulty_filter", "quick"]


def test_required_ablations_are_registered():
    assert set(REQUIRED) <= set(ABLATIONS)


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_every_variant_resolves_to_a_valid_config(name, tmp_path):
    ablation = get_ablation(name)
    assert ablation.question and len(ablation.variants) >= 2
    configs = []
    for variant in ablation.variants:
        config = ablation.config(variant, seed=1, output_dir=str(tmp_path / variant.name))
        assert isinstance(config, PPOConfig)
        config.validate_for_run()
        for key, value in variant.overrides.items():
            assert getattr(config, key) == value
        configs.append(config.to_dict())
    # variants differ in at least one field (besides the output directory)
    stripped = [{k: v for k, v in c.items() if k != "output_dir"} for c in configs]
    assert all(stripped[i] != stripped[j] for i in range(len(stripped)) for j in range(i + 1, len(stripped)))


def test_unknown_ablation():
    with pytest.raises(ValueError, match="known: "):
        get_ablation("nope")


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "a/b", "..", ".hidden", "a\\b", " pad", ""])
def test_names_are_not_paths(name, tmp_path):
    """A variant or ablation name becomes one folder of the sweep directory: a separator, '..',
    an absolute or hidden name is refused where it is registered and where a plan reads it,
    so a run can never land outside the sweep (and its preparation never clears what is there)."""
    from ablations.registry import ABLATIONS, Ablation, Variant, register
    from ablations.sweep_plan import plan_runs

    with pytest.raises(ValueError, match=r"variant name .*(never a path|non-empty)"):
        Variant(name, "grpo")
    with pytest.raises(ValueError, match=r"ablation name .*(never a path|non-empty)"):
        register(name, "q?", [Variant("a", "grpo"), Variant("b", "grpo")], "accuracy")
    assert name not in ABLATIONS
    # An object built around the dataclass checks (a duplicate of an Ablation) is refused by the plan.
    import types

    sneaky = types.SimpleNamespace(name="ok", variants=[types.SimpleNamespace(name=name, preset="grpo")])
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    with pytest.raises(ValueError, match="variant name"):
        plan_runs(sneaky, seeds=1, steps=1, sweep_dir=tmp_path / "sweep")
    assert precious.read_text() == "keep"
    Ablation("fine-name_1", "q?", (Variant("a", "grpo"), Variant("b-2", "grpo")), "accuracy")
    with pytest.raises(ValueError, match="report's plots/ folder"):
        Ablation("plots", "q?", (Variant("a", "grpo"),), "accuracy")


def test_data_parallel_only_toggles_name_a_field_and_an_existing_test():
    """Fields that act only across processes have no sweep (each run is one process, where
    their arms would be identical); each names the multi-process test that shows its effect."""
    import re
    from dataclasses import fields
    from pathlib import Path

    from ablations.registry import DATA_PARALLEL_ONLY
    from ppo.settings.config_checks import run_warnings

    root = Path(__file__).resolve().parent.parent
    names = {f.name for f in fields(PPOConfig)}
    for field, where in DATA_PARALLEL_ONLY.items():
        assert field in names, field
        path, _, test = where.split(" ", 1)[0].partition("::")
        assert (root / path).is_file(), where
        if test:
            assert re.search(rf"^def {test}\(", (root / path).read_text(), re.M), where
        assert not any(field in v.overrides for a in ABLATIONS.values() for v in a.variants), field
    # In one process each warns that it cannot act (whitening is on in the default config).
    for field, value in (("whitening_scope", "process"), ("sharding", "fsdp")):
        assert any(m.startswith(f"PPOConfig.{field}:") for m in run_warnings(PPOConfig(**{field: value}), 1))


def test_the_families_compare_at_equal_samples_on_the_finer_batch(tmp_path):
    """Every ppo_vs_grpo arm trains on FAMILY_BATCH's 128 responses per step (the resolution
    docs/testbed.md measured), so its comparisons stay at equal samples, and so does the demo's
    `quick`; the other ablations keep the testbed's 64. Each claim pair still differs in the
    advantage estimator alone."""
    from dataclasses import asdict

    from ablations.registry import FAMILY_BATCH

    ablation = get_ablation("ppo_vs_grpo")
    configs = {v.name: asdict(ablation.config(v, 1, str(tmp_path))) for v in ablation.variants}
    assert {c["rollout_batch_size"] for c in configs.values()} == {FAMILY_BATCH["rollout_batch_size"]} == {128}
    quick = get_ablation("quick")  # the demo compares the families too
    assert {quick.config(v, 1, str(tmp_path)).rollout_batch_size for v in quick.variants} == {128}
    assert get_ablation("kl_clip_at_zero").config(get_ablation("kl_clip_at_zero").base, 1,
                                                  str(tmp_path)).rollout_batch_size == 64  # the testbed's own
    for arm, partner in (("grpo_critic", "grpo"), ("dr_grpo_rloo", "dr_grpo")):
        differ = {k for k in configs[arm] if configs[arm][k] != configs[partner][k]}
        assert differ == {"advantage_estimator"}, (arm, differ)

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

"""The sweep-time projection (`ablations.estimate`): its counts are what `train` does, identical
runs count once, and a timed run's projection is its formula."""

import pytest

from ablations import estimate
from ablations.registry import Ablation, Variant
from ppo.config import PPOConfig
from ppo.trainer import RLTrainer

TINY = dict(rollout_batch_size=8, response_length=8, eval_size=8, progress=False, log_samples=0, lr=1e-3)


@pytest.mark.parametrize("total_steps,eval_every,save_every", [(4, 2, 0), (5, 2, 3)])
def test_evaluation_and_checkpoint_counts_are_what_train_does(tmp_path, tiny_model_dir, monkeypatch,
                                                              total_steps, eval_every, save_every):
    calls = {"evaluate": 0, "save_checkpoint": 0}
    for name in calls:
        original = getattr(RLTrainer, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(RLTrainer, name, spy)
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), total_steps=total_steps,
                       eval_every=eval_every, save_every=save_every, **TINY)
    RLTrainer(config).train()
    assert calls["evaluate"] == estimate.evaluations(total_steps, eval_every)
    assert calls["save_checkpoint"] == estimate.checkpoints(total_steps, save_every)


def test_identical_runs_across_ablations_count_once():
    base = Variant("base", "grpo")
    first = Ablation("first", "?", (base, Variant("more_kl", "grpo", {"kl_coef": 0.2})), metric="kl")
    second = Ablation("second", "?", (Variant("same_as_base", "grpo"), Variant("no_kl", "grpo", {"kl_coef": 0.0})),
                      metric="kl")
    runs = estimate.distinct_runs([first, second], seeds=3, steps=None, threads=1)
    assert [(ablation, variant) for ablation, variant, _, _ in runs] == [
        ("first", "base"), ("first", "more_kl"), ("second", "no_kl")]
    assert all(count == 3 and config.threads == 1 and config.seed == 1 for _, _, config, count in runs)
    assert not any(config.compile_forward for _, _, config, _ in runs)
    compiled = estimate.distinct_runs([first, second], seeds=3, steps=None, threads=1, compile_forward=True)
    assert all(config.compile_forward for _, _, config, _ in compiled)


def test_a_timed_run_projects_its_own_formula(tiny_model_dir, tmp_path):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "unused"), total_steps=30,
                       eval_every=10, save_every=0, **TINY)
    result = estimate.time_run("a", "v", config, runs=2, timed_steps=2, startup=1.5)
    assert result.step > 0 and result.setup > 0 and result.eval > 0 and result.save > 0
    assert (result.evals, result.saves) == (4, 1)
    assert result.first_step >= 0
    assert result.run_seconds == pytest.approx(1.5 + result.setup + result.first_step + 30 * result.step
                                               + 4 * result.eval + result.save)
    assert result.seconds == pytest.approx(2 * result.run_seconds)
    assert not (tmp_path / "unused").exists()  # timed in a scratch directory
    table = estimate.format_table([result])
    assert "| a | v | 30 |" in table and "2 runs (1 distinct configs x seeds)" in table


def test_unknown_ablation_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        estimate.main(["no_such_ablation"])
    assert exit_info.value.code == 2
    assert "no_such_ablation" in capsys.readouterr().err


def test_the_ablations_command_hands_estimate_over(capsys):
    from ablations.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", "--help"])
    assert exit_info.value.code == 0
    assert "--timed-steps" in capsys.readouterr().out


def test_the_command_times_every_distinct_run_and_writes_json(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import json

    from ablations import registry

    small = dict(model_path=str(tiny_model_dir), rollout_batch_size=8, group_size=4, response_length=8,
                 eval_size=8, eval_every=2)
    tiny = Ablation("tiny_estimate", "?", (Variant("base", "grpo", small),
                                           Variant("same", "grpo", small),  # identical: counted once
                                           Variant("beta", "grpo", {**small, "kl_coef": 0.2})), metric="kl")
    monkeypatch.setitem(registry.ABLATIONS, tiny.name, tiny)
    out = tmp_path / "estimate.jsonl"
    assert estimate.main([tiny.name, "--seeds", "2", "--steps", "3", "--timed-steps", "1", "--json", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["variant"] for line in lines] == ["base", "beta"]
    assert all(line["runs"] == 2 and line["total_steps"] == 3 and line["evals"] == 3 for line in lines)
    text = capsys.readouterr().out
    assert "[2/2] tiny_estimate/beta" in text and "4 runs (2 distinct configs x seeds)" in text


def test_an_ablation_file_is_estimated_with_its_own_seeds(tmp_path, tiny_model_dir, restored_registry, capsys):
    """`estimate` reads an ablation file as `run` does; without --seeds it projects the file's."""
    import json

    path = tmp_path / "mine.yaml"
    path.write_text(f"name: mine_estimate\nquestion: Which is faster?\npreset: grpo\nseeds: 4\nsteps: 2\nmetric: kl\n"
                    f"overrides: {{model_path: '{tiny_model_dir}', rollout_batch_size: 8, group_size: 4,"
                    f" response_length: 8, eval_size: 8}}\n"
                    f"variants:\n  base: {{}}\n  beta: {{kl_coef: 0.2}}\n")
    out = tmp_path / "estimate.jsonl"
    assert estimate.main([str(path), "--timed-steps", "1", "--json", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(line["ablation"], line["variant"], line["runs"]) for line in lines] == [
        ("mine_estimate", "base", 4), ("mine_estimate", "beta", 4)]
    assert "8 runs (2 distinct configs x seeds)" in capsys.readouterr().out


def test_a_bad_ablation_file_is_a_usage_error_naming_it(tmp_path, restored_registry, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken_estimate\nquestion: Which is faster?\npreset: grpo\nmetric: kl\nvariants:\n  a: {kl_coef: 0.1}\n  b: {kl_coef: 0.2}\n"
                    "base: c\n")
    with pytest.raises(SystemExit) as exit_info:
        estimate.main([str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "base" in err

"""The instrument: precise held-out evaluation, common random numbers, the noise budget, the
A/A check, the late-evaluation quantity and the demo's gain verdicts."""

import math
import random
import statistics

import pytest
import torch

from ablations.aa import aa_differences, false_positive_rate, jackknife_interval, separated_fraction, subsets
from ablations.noise import budget, draw_seed, seeds_needed, smallest_detectable, variance_split
from ablations.report_tables import gain_lines, gain_over_start
from ablations.run_results import late_mean
from ablations.stats import paired_difference
from ppo.run.evaluation import evaluate, heldout_kl, pass_at_k, sampled_chunks, summarise_problems
from ppo.models.policy import load_policy
from ppo.tasks import ArithmeticTask


# ------------------------------------------------------------------ evaluation
def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(16, 4, 2) == pytest.approx(1 - math.comb(12, 2) / math.comb(16, 2))
    assert math.isnan(pass_at_k(2, 1, 4))


def test_summarise_problems_worked_example():
    records = [{"level": 0, "correct": [True, True, False, True], "answer": [True] * 4, "eos": [True] * 4,
                "length": [3, 4, 5, 6]},
               {"level": 1, "correct": [False] * 4, "answer": [True] * 4, "eos": [True] * 4, "length": [1, 1, 1, 1]}]
    summary = summarise_problems(records, draws=4)
    assert summary["accuracy"] == pytest.approx(0.375)
    assert summary["accuracy_se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 3) / 2)
    assert summary["pass_at_4"] == pytest.approx(0.5)
    assert summary["accuracy_by_level"] == {0: 0.75, 1: 0.0}
    assert summary["length_correct"] == pytest.approx((3 + 4 + 6) / 3)
    assert summary["length_incorrect"] == pytest.approx((5 + 1 + 1 + 1 + 1) / 5)
    # One draw per problem: the plain mean, and no standard error or pass@n to report.
    one = summarise_problems([{**r, "correct": r["correct"][:1], "length": r["length"][:1]} for r in records], 1)
    assert one["accuracy"] == 0.5 and "accuracy_se" not in one


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    model, tokenizer = load_policy(str(tiny_model_dir))
    return model, tokenizer, ArithmeticTask()


def test_chunks_are_seeded_on_their_own_so_arms_share_their_draws(tiny):
    """Common random numbers: a chunk's draws do not depend on what the chunks before it
    generated, so two models (or two runs) that differ early still sample a later chunk
    from the same noise. Changing the first chunk's prompts (different lengths, so a
    different number of sampling steps) leaves the second chunk's responses unchanged."""
    model, tokenizer, task = tiny
    problems = task.eval_problems()
    first = [problems[0], problems[1], problems[2], problems[3]]
    second = [problems[200], problems[201], problems[2], problems[3]]
    runs = []
    for chosen in (first, second):
        torch.manual_seed(99)  # whatever the global state, each chunk reseeds
        chunks = list(sampled_chunks(model, tokenizer, chosen, 16, batch_size=2, seed=5))
        runs.append(chunks)
    assert torch.equal(runs[0][1][1].response_ids, runs[1][1][1].response_ids)
    unseeded = list(sampled_chunks(model, tokenizer, second, 16, batch_size=2, seed=6))
    assert not torch.equal(runs[0][1][1].response_ids, unseeded[1][1].response_ids)


def test_several_draws_per_problem_give_a_precise_accuracy(tiny):
    """sampled_accuracy with n draws is the mean pass rate; its reported standard error matches
    the spread of the estimate over evaluation seeds, and is about 1/sqrt(n) of one draw's."""
    model, tokenizer, task = tiny
    problems = task.eval_problems()[:32]
    one = [evaluate(model, tokenizer, task, 16, seed=s, problems=problems)["sampled_accuracy"] for s in range(4)]
    many = [evaluate(model, tokenizer, task, 16, seed=s, problems=problems, samples_per_prompt=8) for s in range(4)]
    for result in many:
        assert result["sampled_accuracy"] * 32 * 8 == pytest.approx(round(result["sampled_accuracy"] * 32 * 8))
        assert 0.0 <= result["sampled_accuracy"] <= result["sampled_pass_at_8"] <= 1.0
        assert result["sampled_accuracy_se"] >= 0.0
    assert "sampled_accuracy_se" not in evaluate(model, tokenizer, task, 16, seed=0, problems=problems)
    assert all(0.0 <= value <= 1.0 for value in one)
    with pytest.raises(ValueError, match="samples_per_prompt"):
        evaluate(model, tokenizer, task, 16, problems=problems, samples_per_prompt=0)


def test_heldout_kl_is_zero_against_itself_and_positive_against_another(tiny, tiny_model_dir):
    model, tokenizer, task = tiny
    problems = task.eval_problems()[:8]
    assert heldout_kl(model, model, tokenizer, problems, 12, seed=1) == pytest.approx(0.0, abs=1e-6)
    other = load_policy(str(tiny_model_dir))[0]
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    kl = heldout_kl(model, other, tokenizer, problems, 12, seed=1, samples_per_prompt=4)
    assert kl > 0.0


def test_trainer_evaluates_each_problem_as_often_as_configured(tmp_path, tiny_model_dir):
    from ppo.config import PPOConfig
    from ppo.trainer import RLTrainer

    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), eval_size=8,
                       response_length=8, eval_samples_per_prompt=4, eval_batch_size=16, progress=False)
    metrics = RLTrainer(config).evaluate()
    assert "sampled_pass_at_4" in metrics and "sampled_accuracy_se" in metrics
    with pytest.raises(ValueError, match="eval_samples_per_prompt"):
        PPOConfig(eval_samples_per_prompt=0)
    with pytest.raises(ValueError, match="eval_batch_size"):
        PPOConfig(eval_batch_size=0)


# ------------------------------------------------------------------ noise budget
def test_variance_split_worked_example():
    split = variance_split({("v", 1): [0.30, 0.32], ("v", 2): [0.40, 0.42]})
    assert split["eval_sd"] == pytest.approx(math.sqrt(0.0002))
    assert split["train_sd"] == pytest.approx(math.sqrt(0.005 - 0.0002 / 2))
    assert split["eval_share"] == pytest.approx(0.0002 / (0.0049 + 0.0002))


def test_variance_split_recovers_known_parts():
    rng = random.Random(0)
    values = {}
    for seed in range(400):
        run_effect = rng.gauss(0, 0.03)
        values[("v", seed)] = [0.4 + run_effect + rng.gauss(0, 0.01) for _ in range(4)]
    split = variance_split(values)
    assert split["eval_sd"] == pytest.approx(0.01, rel=0.1)
    assert split["train_sd"] == pytest.approx(0.03, rel=0.1)


def test_smallest_detectable_and_seeds_needed_worked_examples():
    assert smallest_detectable(0.02, 5) == pytest.approx((2.776 + 0.941) * 0.02 / math.sqrt(5))
    assert seeds_needed(0.02, 0.025) == 8
    assert smallest_detectable(0.02, 8) <= 0.025 < smallest_detectable(0.02, 7)
    assert seeds_needed(float("nan"), 0.025) is None
    assert math.isnan(smallest_detectable(0.02, 1))


def test_budget_uses_shared_draws_for_pairs():
    # Two arms whose draw 0 share the same evaluation noise (+e_s), draw 1 independent.
    values = {("a", 1): [0.40, 0.45], ("b", 1): [0.41, 0.36], ("a", 2): [0.30, 0.35], ("b", 2): [0.31, 0.26],
              ("a", 3): [0.50, 0.45], ("b", 3): [0.52, 0.56]}
    result = budget(values, "a", seeds=5, target=0.025)
    assert result["paired_sd"] == pytest.approx(statistics.stdev([0.01, 0.01, 0.02]))
    assert result["paired_sd_independent_draws"] == pytest.approx(statistics.stdev([-0.04, -0.04, 0.06]))
    assert result["pairs"] == 3


def test_draw_seeds_never_repeat_a_run_seed():
    assert draw_seed(3, 0) == 3
    seeds = {draw_seed(s, d) for s in range(1, 50) for d in range(1, 8)}
    assert not seeds & set(range(1, 50))


# ------------------------------------------------------------------ A/A
def test_aa_false_positive_rate_worked_example():
    assert false_positive_rate([0.0, 0.0, 0.0, 1.0], 3) == 0.0
    # every subset of [1, 1.1, 0.9, 1, 1.05] is clearly nonzero
    assert false_positive_rate([1.0, 1.1, 0.9, 1.0, 1.05], 3) == 1.0


def test_vectorised_verdict_equals_paired_difference():
    rng = random.Random(3)
    differences = [rng.gauss(0.2, 0.3) for _ in range(9)]
    chosen = subsets(9, 4)
    slow = sum(paired_difference({i: 0.5 for i in c}, {i: 0.5 + differences[i] for i in c})["separated"]
               for c in chosen) / len(chosen)
    assert separated_fraction(differences, chosen) == pytest.approx(slow)


def test_aa_rate_is_nominal_on_normal_noise():
    """The check itself is calibrated: on pure normal noise the 5-seed verdicts fire about 5%."""
    rng = random.Random(11)
    rates = [false_positive_rate([rng.gauss(0, 1) for _ in range(12)], 5) for _ in range(150)]
    assert statistics.mean(rates) == pytest.approx(0.05, abs=0.015)
    interval = jackknife_interval([rng.gauss(0, 1) for _ in range(12)], 5)
    assert interval["low"] <= interval["rate"] <= interval["high"] and interval["pairs"] == 12


def test_aa_differences_pair_by_sweep_seed():
    rows = [{"variant": "a", "seed": 1, "status": "ok", "q": 0.4}, {"variant": "b", "seed": 1, "status": "ok", "q": 0.5},
            {"variant": "a", "seed": 2, "status": "ok", "q": 0.3}, {"variant": "b", "seed": 2, "status": "failed", "q": 0.1}]
    assert aa_differences(rows, "q") == {1: pytest.approx(0.1)}


def test_aa_ablation_arms_differ_only_in_seed():
    from ablations.registry import ABLATIONS

    aa = ABLATIONS["aa_grpo"]
    a = aa.config(aa.variant("a"), 3, "x").to_dict()
    b = aa.config(aa.variant("b"), 3, "x").to_dict()
    assert {key for key in a if a[key] != b[key]} == {"seed"}
    assert b["seed"] == a["seed"] + 1000


# ------------------------------------------------------------------ quantities and the demo's verdict
def test_late_mean_worked_example():
    rows = [{"step": s, "eval_sampled_accuracy": v} for s, v in
            ((0, 0.3), (10, 0.35), (20, 0.38), (30, 0.40), (40, 0.42), (50, 0.44), (60, 0.46))]
    assert late_mean(rows, "eval_sampled_accuracy", 60) == pytest.approx(0.43)
    assert math.isnan(late_mean([{"step": 0, "eval_sampled_accuracy": 0.3}], "eval_sampled_accuracy", 60))


def test_gain_over_start_verdict_lines():
    rows = [{"ablation": "quick", "variant": v, "seed": s, "status": "ok", "initial_sampled_accuracy": 0.33 + 0.001 * s,
             "final_sampled_accuracy": 0.33 + 0.001 * s + gain + 0.004 * (s % 2)}
            for v, gain in (("ppo", 0.1), ("grpo", 0.0)) for s in (1, 2, 3)]
    gains = gain_over_start(rows)
    assert gains[("quick", "ppo")]["separated"] and gains[("quick", "ppo")]["mean"] == pytest.approx(0.1 + 0.008 / 3)
    assert not gains[("quick", "grpo")]["separated"]
    text = gain_lines(rows, "quick")
    assert "- ppo: +0.103" in text and "separated: gains over its start" in text
    assert "- grpo:" in text and "no difference detected" in text


def test_noise_command_end_to_end_on_a_small_sweep(tmp_path, tiny_model_dir, capsys):
    """`python -m ablations noise` re-evaluates each run's final policy and writes the budget;
    the claims updater then regenerates the same table from the saved JSON."""
    import json
    import shutil

    from ablations import doc_blocks
    from ablations.__main__ import main
    from ppo.config import PPOConfig

    sweep = tmp_path / "sweep"
    for variant in ("a", "b"):
        for seed in (1, 2, 3):
            run = sweep / "toy" / variant / f"seed{seed}"
            policy = run / "checkpoints" / "step_000001" / "policy"
            shutil.copytree(tiny_model_dir, policy)
            PPOConfig(model_path=str(tiny_model_dir), total_steps=1, seed=seed, eval_size=6, response_length=8,
                      eval_batch_size=64).to_yaml(run / "config.yaml")
            (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval_sampled_accuracy": 0.1}) + "\n")
            (run / "summary.json").write_text(json.dumps({"steps": 1, "initial_eval": {"sampled_accuracy": 0.1},
                                                          "final_eval": {"sampled_accuracy": 0.1}}))
    out = tmp_path / "noise_toy.json"
    assert main(["noise", str(sweep), "--draws", "2", "--samples-per-prompt", "1,4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [(e["quantity"], e["samples_per_prompt"]) for e in data["table"]] == [
        (q, k) for q in ("sampled_accuracy", "true_kl", "response_length") for k in (1, 4)]
    run = data["runs"][0]
    assert len(run["draws"]["4"]["sampled_accuracy"]) == 2 and len(run["draws"]["1"]["eval_seconds"]) == 2
    # the policy is the reference here: its true KL is zero on every draw
    assert all(abs(v) < 1e-6 for r in data["runs"] for v in r["draws"]["4"]["true_kl"])
    # arms with identical weights and shared draws differ by nothing in a pair
    accuracy = next(e for e in data["table"] if e["quantity"] == "sampled_accuracy" and e["samples_per_prompt"] == 4)
    assert accuracy["paired_sd"] == 0.0 and accuracy["runs"] == 6
    assert doc_blocks.instrument_table("noise", out) in printed
    assert main(["noise", str(sweep), "--draws", "1"]) == 2
    assert main(["noise", str(tmp_path / "nowhere")]) == 2

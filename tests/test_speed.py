"""The side-by-side speed benchmark: its task, its configs and its arithmetic."""

import json
import random
from pathlib import Path

import pytest

from ppo.benchmarks import speed


def test_addition_task_is_exact_match_with_eos():
    train, test = speed.addition_pairs()
    assert len(train) == 7600 and len(test) == 500 and not set(train) & set(test)
    assert speed.addition_pairs() == (train, test)  # deterministic split
    task = speed.AdditionTask()
    problem = task.eval_problems()[0]
    a, b = test[0]
    assert problem.prompt == f"{a}+{b}=" and problem.answer == str(a + b)
    assert task.score(problem, str(a + b), has_eos=True).correct
    assert not task.score(problem, str(a + b), has_eos=False).correct  # no EOS: not an exact match
    assert not task.score(problem, str(a + b) + "0", has_eos=True).correct
    drawn = task.sample_problems(5, random.Random(0))
    assert len(drawn) == 5 and all(p.prompt.endswith("=") for p in drawn)


@pytest.mark.parametrize("kind", speed.KINDS)
def test_configs_spell_out_the_identical_work(kind, tmp_path):
    config = speed.config_for(kind, "model", 42, 50, str(tmp_path))
    config.validate()
    assert (config.rollout_batch_size, config.response_length, config.kl_coef) == (32, 8, 0.04)
    assert (config.ppo_epochs, config.num_minibatches, config.lr, config.adam_eps) == (1, 1, 1e-4, 1e-8)
    if kind == "grpo":
        assert (config.group_size, config.kl_estimator, config.kl_placement, config.max_grad_norm) == (8, "k3", "loss", 1.0)
    else:
        assert (config.group_size, config.kl_estimator, config.kl_placement, config.max_grad_norm) == (1, "k1", "reward", None)
        assert not config.separate_value_optimizer and config.whiten_advantages
    with pytest.raises(ValueError, match="kind"):
        speed.config_for("dpo", "model", 0, 1, str(tmp_path))


def test_median_over_steps_five_on_and_the_summary():
    times = [9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 3.0]  # steps 1-4 are warm-up and ignored
    assert speed.median_step(times) == 2.0
    with pytest.raises(ValueError):
        speed.median_step([1.0, 2.0])
    trl = [{"system": "trl", "kind": "grpo", "seed": seed, "step_times_all": [0] * 4 + [t]}
           for seed, t in zip((42, 43, 44), (0.4, 0.2, 0.3))]
    mine = [{"system": "project", "kind": "grpo", "seed": seed, "step_times_all": [0] * 4 + [t],
             "after_test_greedy_acc": 0.5, "after_test_sample_t1_acc": 0.3}
            for seed, t in zip((42, 43, 44), (0.1, 0.15, 0.2))]
    # compare's order: each seed's two runs back to back, the system that goes first alternating
    runs = [trl[0], mine[0], mine[1], trl[1], trl[2], mine[2]]
    table = speed.summarize(runs)
    assert table["grpo"]["trl"]["median"] == 0.3 and table["grpo"]["project"]["median"] == 0.15
    assert table["grpo"]["ratio"] == pytest.approx(0.5)
    assert table["grpo"]["paired_ratios"] == pytest.approx([0.25, 0.75, 2 / 3])
    text = speed.format_summary(table)
    assert "| grpo | 0.3000 (0.2000-0.4000) | 0.1500 (0.1000-0.2000) | 0.50 | 0.25, 0.75, 0.67 | - / 0.500 |" in text


def test_paired_ratios_pair_each_seeds_adjacent_runs_only():
    def run(system, seed, t, kind="ppo"):
        return {"system": system, "kind": kind, "seed": seed, "step_times_all": [0] * 4 + [t]}
    # a seed run twice (two batches in one command) pairs twice, in order; other kinds and a
    # run without its partner are left out
    runs = [run("trl", 42, 0.2), run("project", 42, 0.1), run("trl", 42, 0.1, kind="grpo"),
            run("project", 42, 0.3), run("trl", 42, 0.4), run("trl", 43, 0.5)]
    assert speed.paired_ratios(runs, "ppo") == pytest.approx([0.5, 0.75])
    assert speed.paired_ratios(runs, "grpo") == []


def test_quality_after_training_is_differenced_by_seed_with_its_interval():
    """Greedy TRL 0.5, 0.6, 0.7 against project 0.3, 0.4, 0.8: differences -0.2, -0.2, +0.1,
    mean -0.1, sd sqrt(0.03) = 0.1732, half-width 4.303 * 0.1732 / sqrt(3) = 0.430, so the
    interval holds 0; the smallest gap 3 pairs at this spread detect is (4.303 + 1.061) * 0.1
    = 0.536. A pair without an evaluation on both sides is left out."""
    def run(system, seed, greedy=None, sampled=None):
        out = {"system": system, "kind": "ppo", "seed": seed, "step_times_all": [0.0] * 4 + [0.1]}
        if greedy is not None:
            out.update(after_test_greedy_acc=greedy, after_test_sample_t1_acc=sampled)
        return out
    runs = [run("trl", 42, 0.5, 0.30), run("project", 42, 0.3, 0.31),
            run("project", 43, 0.4, 0.35), run("trl", 43, 0.6, 0.30),
            run("trl", 44, 0.7, 0.40), run("project", 44, 0.8, 0.50),
            run("trl", 45), run("project", 45, 0.9, 0.9)]
    quality = speed.quality_of_pairs(speed.adjacent_pairs(runs, "ppo"))
    greedy, sampled = quality["greedy"], quality["sampled at T = 1"]
    assert greedy["n"] == 3 and greedy["mean"] == pytest.approx(-0.1)
    assert greedy["ci"] == pytest.approx(0.4303, abs=1e-3) and not greedy["separated"]
    assert greedy["detectable"] == pytest.approx(0.536, abs=1e-3)
    assert (greedy["trl_mean"], greedy["project_mean"]) == pytest.approx((0.6, 0.5))
    # sampled: +0.01, +0.05, +0.10 -> mean 0.0533, sd 0.04509, half-width 0.1120
    assert sampled["mean"] == pytest.approx(0.16 / 3) and sampled["ci"] == pytest.approx(0.1120, abs=1e-3)
    text = speed.format_summary(speed.summarize(runs))
    assert "| ppo | greedy | 0.600 / 0.500 | -0.100 (-0.530 to +0.330) | 3 | no | 0.536 |" in text
    assert speed.quality_of_pairs(speed.adjacent_pairs(runs, "grpo")) == {}
    # one pair has no interval and no detectable gap: its difference alone
    assert "| ppo | greedy | 0.500 / 0.300 | -0.200 | 1 | too few pairs | - |" in speed.format_summary(speed.summarize(runs[:2]))
    # pooled batches pair inside each batch: TRL's seed 45 at the end of one batch and the
    # project's at the start of the next are not a pair, and pool prints the same table
    first, second = runs[:6] + [run("trl", 45, 0.1, 0.1)], [run("project", 45, 0.9, 0.9)]
    pooled = speed.pool([first, second], "ppo")
    assert pooled["quality"]["greedy"]["n"] == 3 and pooled["quality"]["greedy"]["mean"] == pytest.approx(-0.1)
    assert "| ppo | greedy | 0.600 / 0.500 | -0.100 (-0.530 to +0.330) | 3 | no | 0.536 |" in speed.format_pooled(
        {"ppo": pooled})


def test_batches_pool_from_their_json_or_printed_lines(tmp_path):
    """`pool` takes each run's median from its step times (a compare --out JSON) or as printed,
    pools every run per system, and pairs seeds only inside a batch."""
    def run(system, seed, t):
        return {"system": system, "kind": "ppo", "seed": seed, "step_times_all": [9.0] * 4 + [t, t]}
    first = tmp_path / "first.json"  # its last run's partner never came (a batch cut short)
    first.write_text(json.dumps({"runs": [run("trl", 42, 0.2), run("project", 42, 0.1), run("project", 43, 0.12),
                                          run("trl", 43, 0.3), run("project", 44, 0.1)]}))
    second = tmp_path / "second.txt"  # what compare printed, with a line of other output
    second.write_text("trl      ppo seed 44: median 0.4000 s/step\n"
                      "Loading weights: 100%\n"
                      "project  ppo seed 42: median 0.1000 s/step\n"
                      "project  grpo seed 42: median 0.0500 s/step\n"
                      "| ppo | 0.4000 (0.4000-0.4000) | 0.1000 s/step |\n")
    batches = [speed.load_batch(first), speed.load_batch(second)]
    assert [(r["system"], r["seed"], r["median"]) for r in batches[1]] == [("trl", 44, 0.4), ("project", 42, 0.1),
                                                                         ("project", 42, 0.05)]
    pooled = speed.pool(batches, "ppo")
    assert {k: pooled["trl"][k] for k in ("per_run", "median", "min", "max")} == {
        "per_run": [0.2, 0.3, 0.4], "median": 0.3, "min": 0.2, "max": 0.4}
    assert {k: pooled["project"][k] for k in ("median", "min", "max")} == {"median": 0.1, "min": 0.1, "max": 0.12}
    assert pooled["ratio"] == pytest.approx(1 / 3)
    # seed 44's two runs are adjacent only across the two batches: not a pair
    assert pooled["paired_ratios"] == pytest.approx([0.5, 0.4]) and pooled["pairs_at_or_under_half"] == 2
    assert pooled["per_batch"] == pytest.approx([0.1 / 0.25, 0.1 / 0.4])
    # the batches' mean ratio, 0.325, with its 95% interval: sd sqrt(2) * 0.075 = 0.10607 over
    # 2 batches, half-width t(0.975, 1) * sd / sqrt(2) = 12.706 * 0.075 = 0.95295
    assert pooled["batch_ratio"]["mean"] == pytest.approx(0.325)
    assert pooled["batch_ratio"]["ci"] == pytest.approx(0.95295)
    assert speed.pool(batches, "grpo") is None  # no TRL run of it
    text = speed.format_pooled({"ppo": pooled, "grpo": None})
    assert ("| ppo | 3 / 4 | 0.3000 (0.2000-0.4000) | 0.1000 (0.1000-0.1200) | 0.333 | 2 of 2 | 0.40-0.50, 0.45 "
            "| 0.40, 0.25 | 0.325 (-0.628 to 1.278) |") in text
    # one batch has no interval: its ratio alone
    one = speed.format_pooled({"ppo": speed.pool(batches[:1], "ppo")}).splitlines()[-1]
    assert one.endswith("| 0.40 | 0.400 |")
    # the plot draws the same numbers: each batch's ratio, the mean, its interval, the goal
    figure = speed.pooled_figure([speed.batch_label(first), speed.batch_label(tmp_path / "batch07.txt")],
                                 {"ppo": pooled, "grpo": None})
    ax = figure.axes[0]
    ratios, mean, goal = ax.lines
    assert list(ratios.get_ydata()) == pytest.approx([0.4, 0.25]) and list(ratios.get_xdata()) == [0, 1]
    assert list(mean.get_ydata()) == pytest.approx([0.325, 0.325]) and list(goal.get_ydata()) == [0.5, 0.5]
    band = ax.patches[0]  # the interval: a rectangle across the axes, in data coordinates on y
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((0.325 - 0.95295, 0.325 + 0.95295))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["first", "7"]
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing ran\n")
    with pytest.raises(ValueError, match="empty.txt: no runs"):
        speed.load_batch(empty)


def test_the_pooled_batches_of_the_performance_page_are_kept():
    """docs/performance.md pools the batches kept in docs/results/data/speed/: each parses,
    and each holds both systems' runs of both kinds for three seeds."""
    kept = sorted((Path(__file__).parent.parent / "docs" / "results" / "data" / "speed").glob("batch*.txt"))
    assert len(kept) >= 24
    for path in kept:
        runs = speed.load_batch(path)
        assert sorted((r["system"], r["kind"]) for r in runs) == sorted(
            [(s, k) for s in ("trl", "project") for k in ("grpo", "ppo")] * 3), path
        full = path.with_suffix(".json")  # the same batch with every step's time: the same medians
        if full.exists():
            assert [round(speed.run_median(r), 4) for r in speed.load_batch(full)] == [r["median"] for r in runs]

"""The ablation report on hand-written fake sweeps whose numbers were worked out on paper.

The main fake sweep: ablation ``fake_ablation`` (unknown to the registry), variants alpha and
beta x seeds 0-2, 20 steps each (so "the last 10%" is steps 19 and 20), evaluations at steps
0, 5, 10, 15, 20, plus ``beta/seed3`` which crashed after its initial evaluation.

    final sampled accuracy   alpha 0.5 0.6 0.7 -> mean 0.600, sd 0.1,
                             half-width 4.303 * 0.1 / sqrt(3) = 0.2484
                             beta 0.3 0.4 0.8 -> mean 0.500, sd sqrt(0.07),
                             half-width 4.303 * sqrt(0.07) / sqrt(3) = 0.6573
    gain (initial 0.4)       alpha +0.200, beta +0.100
    reward                   10 on steps 1-18; alpha [1, 2] -> 1.5, beta [0.5, 1.5] -> 1.0
    kl                       alpha [0.01, 0.03] -> 0.02, beta [0.02, 0.04] -> 0.03
    length correct           alpha [20, 30] (seed 0: [20, NaN] -> 20) -> (20 + 25 + 25) / 3 = 23.3
    length incorrect         alpha [40, 50] -> 45; beta correct [10, 10] -> 10, incorrect [60, 80] -> 70
    advantage_abs_mean       alpha 1.0 1.2 1.4 (constant per seed) -> 1.2 +- 4.303 * 0.2 / sqrt(3) = 0.497
    wall seconds             alpha 100 110 120 -> 110
"""

import csv
import json
import math
import sys
import types

import numpy as np
import pytest

from ablations import report, stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 20
EVAL_STEPS = (0, 5, 10, 15, 20)
INITIAL = 0.4
FINAL = {"alpha": [0.5, 0.6, 0.7], "beta": [0.3, 0.4, 0.8]}
TAIL = {  # values at steps 19 and 20
    "alpha": {"reward": [1.0, 2.0], "kl": [0.01, 0.03], "kl_k1": [0.02, 0.04],
              "response_length_correct": [20.0, 30.0], "response_length_incorrect": [40.0, 50.0]},
    "beta": {"reward": [0.5, 1.5], "kl": [0.02, 0.04], "kl_k1": [0.03, 0.05],
             "response_length_correct": [10.0, 10.0], "response_length_incorrect": [60.0, 80.0]},
}


def write_run(run_dir, variant, seed, final, steps=STEPS, total_steps=STEPS, eval_steps=EVAL_STEPS,
              summary=True, error=None):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"total_steps: {total_steps}\nseed: {seed}\n")
    rows = []
    for step in range(steps + 1):
        row = {"step": step}
        if step > 0:
            tail = TAIL[variant]
            index = step - (STEPS - 1)  # 0 at step 19, 1 at step 20
            for key in ("reward", "kl", "kl_k1", "response_length_correct", "response_length_incorrect"):
                row[key] = tail[key][index] if index >= 0 else 10.0
            row.update(entropy=0.5, kl_coef=0.05, time_step=1.0, advantage_abs_mean=1.0 + 0.2 * seed)
            if variant == "alpha":
                row["vf_loss"] = 0.1 * step  # a PPO-only key: beta (GRPO-like) never logs it
            else:
                row["zero_advantage_group_frac"] = 0.25
            if variant == "alpha" and seed == 0 and step == 20:
                row["response_length_correct"] = float("nan")  # no correct response in this batch
        if step in eval_steps:
            accuracy = INITIAL + (final - INITIAL) * step / STEPS
            row.update(eval_sampled_accuracy=accuracy, eval_greedy_accuracy=accuracy + 0.05)
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (run_dir / "summary.json").write_text(json.dumps({
            "steps": steps, "samples": 16 * steps, "wall_seconds_this_session": 100.0 + 10 * seed,
            "initial_eval": {"sampled_accuracy": INITIAL, "greedy_accuracy": INITIAL + 0.05},
            "final_eval": {"sampled_accuracy": final, "greedy_accuracy": final + 0.05},
            "sampled_accuracy_gain": final - INITIAL,
        }))
    if error:
        (run_dir / "error.txt").write_text(error)


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for variant, finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(root / "fake_ablation" / variant / f"seed{seed}", variant, seed, final)
    write_run(root / "fake_ablation" / "beta" / "seed3", "beta", 3, 0.0, steps=0, summary=False,
              error="RuntimeError: boom at step 1\nTraceback (most recent call last):\n  ...\n")
    return root


def by_key(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def assert_png(path):
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000, path


def image_links(markdown):
    return [line.split("](", 1)[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![")]


# ---- pure pieces ------------------------------------------------------------------------
def test_mean_ci95_matches_hand_computation():
    ci = stats.mean_ci95([0.5, 0.6, 0.7])
    assert ci["n"] == 3
    assert ci["mean"] == pytest.approx(0.6)
    assert ci["sd"] == pytest.approx(0.1)
    assert ci["ci"] == pytest.approx(4.303 * 0.1 / math.sqrt(3)) and ci["ci"] == pytest.approx(0.2484, abs=1e-4)
    one = stats.mean_ci95([0.5, float("nan")])  # NaN seeds are dropped, not averaged in
    assert one["n"] == 1 and one["mean"] == 0.5 and math.isnan(one["ci"])
    assert stats.mean_ci95([])["n"] == 0


def test_t_quantiles_and_moving_average():
    assert stats.t_quantile_975(2) == 4.303
    assert stats.t_quantile_975(10) == pytest.approx(2.228, abs=1e-3)
    assert stats.t_quantile_975(30) == pytest.approx(2.042, abs=1e-3)
    np.testing.assert_allclose(report.moving_average(np.array([0, 0, 3, 0, 0.0]), window=3), [0, 1, 1, 1, 0])
    np.testing.assert_allclose(report.moving_average(np.array([1, np.nan, 3.0]), window=3), [1, 2, 3])


def test_tail_mean_uses_the_last_tenth_of_logged_steps():
    rows = [{"step": 0, "eval_x": 9.0}] + [{"step": s, "kl": 1.0 if s <= 18 else s - 18.0} for s in range(1, 21)]
    assert report.tail_mean(rows, "kl") == pytest.approx(1.5)  # steps 19, 20 -> (1 + 2) / 2
    assert math.isnan(report.tail_mean(rows, "eval_x"))  # only the pre-training eval: no "final" value
    assert math.isnan(report.tail_mean(rows, "vf_loss"))


# ---- the sweep --------------------------------------------------------------------------
def test_collect_runs_statuses_and_values(sweep):
    rows = report.collect_runs(sweep)
    assert len(rows) == 7
    assert [(r["variant"], r["seed"], r["status"]) for r in rows] == [
        ("alpha", 0, "ok"), ("alpha", 1, "ok"), ("alpha", 2, "ok"),
        ("beta", 0, "ok"), ("beta", 1, "ok"), ("beta", 2, "ok"), ("beta", 3, "failed")]
    failed = by_key(rows, variant="beta", seed=3)[0]
    assert failed["error"] == "RuntimeError: boom at step 1"
    alpha0 = by_key(rows, variant="alpha", seed=0)[0]
    assert alpha0["final_sampled_accuracy"] == 0.5 and alpha0["initial_sampled_accuracy"] == INITIAL
    assert alpha0["final_greedy_accuracy"] == pytest.approx(0.55)
    assert alpha0["reward"] == pytest.approx(1.5) and alpha0["kl"] == pytest.approx(0.02)
    assert alpha0["response_length_correct"] == pytest.approx(20.0)  # NaN at step 20 ignored
    assert alpha0["metric"] == "eval_sampled_accuracy" and alpha0["metric_value"] == pytest.approx(0.5)
    assert alpha0["wall_seconds"] == 100.0 and alpha0["samples"] == 320


def test_results_csv_and_summary(sweep):
    report.build_report(sweep)
    with open(sweep / "results.csv") as handle:
        csv_rows = list(csv.DictReader(handle))
    assert len(csv_rows) == 7
    assert [r["status"] for r in csv_rows].count("ok") == 6
    assert by_key(csv_rows, variant="beta", seed="3")[0]["status"] == "failed"
    assert set(report.RUN_COLUMNS) <= set(csv_rows[0])

    entries = {e["variant"]: e for e in report.summarise(report.collect_runs(sweep))}
    alpha, beta = entries["alpha"], entries["beta"]
    assert (alpha["n_ok"], alpha["n_failed"], beta["n_ok"], beta["n_failed"], beta["n_runs"]) == (3, 0, 3, 1, 4)
    assert alpha["final_sampled_accuracy_mean"] == pytest.approx(0.6)
    assert alpha["final_sampled_accuracy_ci"] == pytest.approx(0.2484, abs=1e-4)
    assert beta["final_sampled_accuracy_mean"] == pytest.approx(0.5)
    assert beta["final_sampled_accuracy_ci"] == pytest.approx(4.303 * math.sqrt(0.07) / math.sqrt(3))
    assert alpha["accuracy_gain_mean"] == pytest.approx(0.2)
    assert alpha["response_length_correct_mean"] == pytest.approx(70 / 3)
    assert beta["reward_mean"] == pytest.approx(1.0) and beta["kl_mean"] == pytest.approx(0.03)
    assert beta["failed"] == [(3, "RuntimeError: boom at step 1")]


def test_report_markdown_table_and_plots(sweep):
    path = report.build_report(sweep)
    assert path == sweep / "report.md"
    text = path.read_text()
    assert "## fake_ablation" in text
    # every cell is mean ± 95% half-width; length correct: seeds 20, 25, 25 -> 23.3 ± 4.303 * 2.887 / sqrt(3);
    # wall 100, 110, 120 -> 110 ± 4.303 * 10 / sqrt(3) = 24.8
    assert ("| alpha | 3/3 | 0.600 ± 0.248 | +0.200 ± 0.248 | 1.5 ± 0 | 0.02 ± 0 | 0.03 ± 0 | 23.3 ± 7.17 | 45 ± 0 | "
            "0.600 ± 0.248 | 110 ± 25 | 320 |") in text
    assert "| beta | 3/4 | 0.500 ± 0.657 | +0.100 ± 0.657 | 1 ± 0 | 0.03 ± 0 | 0.04 ± 0 | 10 ± 0 | 70 ± 0 |" in text
    assert "`beta/seed3` (RuntimeError: boom at step 1)" in text
    links = image_links(text)
    assert "plots/fake_ablation_learning_curves.png" in links
    for link in links:
        assert not link.startswith("/")
        assert_png(sweep / link)
    for line in report.format_table(sweep).splitlines():  # the terminal tables are the report's tables
        assert line in text


def test_registry_metric_extras_and_variant_order(sweep, monkeypatch):
    def get_ablation(name):
        if name != "fake_ablation":
            raise KeyError(name)
        return types.SimpleNamespace(
            name=name, question="Does the critic help?",
            variants=[types.SimpleNamespace(name="beta"), types.SimpleNamespace(name="alpha")],
            metric="advantage_abs_mean", extra_metrics=("vf_loss", "zero_advantage_group_frac"))

    # The stored-definition reader imports the real registry's types: load it before the fake
    # registry replaces the module (alone in a fresh process it would otherwise import the fake).
    import ablations.ablation_files  # noqa: F401

    monkeypatch.setitem(sys.modules, "ablations.registry", types.SimpleNamespace(get_ablation=get_ablation))
    text = report.build_report(sweep).read_text()
    assert "Does the critic help?" in text
    assert "| `advantage_abs_mean` (metric) | wall s |" in text
    table = [line for line in text.splitlines() if line.startswith(("| alpha | 3/", "| beta | 3/"))]  # the main table
    assert [line.split(" | ")[0] for line in table] == ["| beta", "| alpha"]  # registry order, not sorted
    assert "| 1.2 ± 0.497 |" in table[1]
    links = image_links(text)
    assert {"plots/fake_ablation_metric.png", "plots/fake_ablation_extras.png"} <= set(links)
    for link in links:
        assert_png(sweep / link)
    rows = report.collect_runs(sweep)
    beta0 = by_key(rows, variant="beta", seed=0)[0]
    assert math.isnan(beta0["vf_loss"]) and beta0["zero_advantage_group_frac"] == pytest.approx(0.25)
    assert by_key(rows, variant="alpha", seed=0)[0]["vf_loss"] == pytest.approx((1.9 + 2.0) / 2)
    # ... and over the whole run: vf_loss = 0.1 * step for steps 1..20, mean 0.1 * 10.5
    assert by_key(rows, variant="alpha", seed=0)[0]["vf_loss:all"] == pytest.approx(1.05)
    assert math.isnan(beta0["vf_loss:all"])


# ---- robustness -------------------------------------------------------------------------
def test_unfinished_runs_and_runs_without_evals(tmp_path):
    root = tmp_path / "sweep"
    # Still running: step 0 eval and three training steps, no later eval, no summary.
    write_run(root / "broken" / "a" / "seed0", "alpha", 0, 0.5, steps=3, eval_steps=(0,), summary=False)
    # Stopped early with stop_after: a summary for 3 of 20 steps is not a finished run.
    write_run(root / "broken" / "a" / "seed1", "alpha", 1, 0.5, steps=3, eval_steps=(0, 3))
    write_run(root / "broken" / "b" / "seed0", "beta", 0, 0.0, steps=0, summary=False, error="OOM\n")
    rows = report.collect_runs(root)
    assert [r["status"] for r in rows] == ["incomplete", "incomplete", "failed"]
    assert math.isnan(rows[0]["final_sampled_accuracy"]) and rows[0]["initial_sampled_accuracy"] == INITIAL
    text = report.build_report(root).read_text()
    assert "| a | 0/2 | n/a |" in text and "| b | 0/1 | n/a |" in text
    assert "Incomplete runs" in text and "`b/seed0` (OOM)" in text
    for link in image_links(text):  # curves fall back to the unfinished runs
        assert_png(root / link)
    assert "plots/broken_learning_curves.png" in image_links(text)


def test_sweep_with_only_failed_runs(tmp_path):
    root = tmp_path / "sweep"
    for seed in range(2):
        run_dir = root / "dead" / "v" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "error.txt").write_text(f"ValueError: bad config {seed}\n")
    text = report.build_report(root).read_text()
    assert "| v | 0/2 | n/a |" in text
    assert "**Failed runs (2):**" in text and "ValueError: bad config 1" in text
    assert image_links(text) == []
    assert "0/2" in report.format_table(root)


# ---- paired statistics ------------------------------------------------------------------
def test_paired_difference_matches_hand_computation():
    # module docstring: beta - alpha final accuracy per seed = [-0.2, -0.2, +0.1]
    pair = stats.paired_difference({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.3, 1: 0.4, 2: 0.8})
    assert pair["mean"] == pytest.approx(-0.1)
    assert pair["sd"] == pytest.approx(math.sqrt(0.03))
    assert pair["ci"] == pytest.approx(4.303 * math.sqrt(0.03) / math.sqrt(3))  # 0.4303
    assert not pair["separated"]
    assert pair["detectable"] == pytest.approx((4.303 + 1.061) * math.sqrt(0.03) / math.sqrt(3))  # 0.5364
    # seeds missing on one side or non-finite are left out of the pairing
    pair = stats.paired_difference({0: 1.0, 1: 2.0, 2: float("nan"), 5: 3.0}, {0: 1.5, 1: 2.5, 2: 9.0})
    assert pair["seeds"] == [0, 1] and pair["n"] == 2 and pair["mean"] == pytest.approx(0.5)
    assert pair["sd"] == 0 and pair["too_few"] and pair["zero_spread"] and not pair["separated"]
    assert stats.t_quantile_80(40) == pytest.approx(0.851, abs=2e-3)


def test_two_equal_difference_pairs_are_too_few_seeds_not_separated():
    """The 3-step sweep's case: +0.016 on both seeds gave a ± 0.000 interval and "separated".
    Differences 0.671 - 0.655 and 0.687 - 0.671 are equal up to rounding."""
    pair = stats.paired_difference({1: 0.655, 2: 0.671}, {1: 0.671, 2: 0.687})
    assert pair["mean"] == pytest.approx(0.016) and pair["ci"] == pytest.approx(0, abs=1e-12)
    assert pair["too_few"] and pair["zero_spread"] and not pair["separated"]
    assert math.isnan(pair["detectable"]) and math.isnan(pair["p"])
    assert report.verdict(pair, "acc") == "too few seeds (2 pairs; a verdict needs 3)"
    # two unequal pairs that would exclude 0: [+0.10, +0.11] -> mean 0.105, ci 12.706 * 0.00707 / sqrt(2)
    # = 0.0635 < 0.105, still too few
    pair = stats.paired_difference({1: 0.5, 2: 0.5}, {1: 0.6, 2: 0.61})
    assert pair["ci"] == pytest.approx(12.706 * 0.01 / math.sqrt(2) / math.sqrt(2), abs=1e-4)
    assert abs(pair["mean"]) > pair["ci"] and not pair["separated"]
    assert report.verdict(pair).startswith("too few seeds")


def test_zero_spread_gets_no_verdict_and_identical_pairs_say_so():
    pair = stats.paired_difference({1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.55, 2: 0.65, 3: 0.75})
    assert pair["zero_spread"] and not pair["too_few"] and not pair["separated"]
    assert report.verdict(pair, "acc") == "no verdict: zero spread (every pair differs by +0.050)"
    same = stats.paired_difference({1: 0.5, 2: 0.6}, {1: 0.5, 2: 0.6})
    assert report.verdict(same) == "identical in every pair"
    # three pairs with spread: a verdict, and its p-value is the t test's
    # differences [0.2, 0.2, 0.1]: mean 0.1667, se 0.05774 / sqrt(3) = 0.03333, t = 5.0, df 2:
    # p = 1 - t / sqrt(t^2 + 2) = 1 - 5 / sqrt(27) = 0.03775
    pair = stats.paired_difference({1: 0.5, 2: 0.6, 3: 0.8}, {1: 0.7, 2: 0.8, 3: 0.9})
    assert pair["separated"] and report.verdict(pair) == "separated"
    assert pair["p"] == pytest.approx(1 - 5 / math.sqrt(27), abs=1e-4)


@pytest.mark.parametrize("df", range(1, 10))
def test_t_p_value_closed_form_matches_the_quantile_table(df):
    assert stats.t_two_sided_p(stats.T_975[df], df) == pytest.approx(0.05, abs=1e-4)
    assert stats.t_two_sided_p(0.0, df) == pytest.approx(1.0)
    assert stats.t_two_sided_p(-stats.T_975[df], df) == stats.t_two_sided_p(stats.T_975[df], df)


def test_report_prints_paired_differences_and_verdicts(sweep):
    rows = report.collect_runs(sweep)
    pairs = {p["column"]: p for p in report.paired_differences(rows)}
    assert {p["variant"] for p in report.paired_differences(rows)} == {"beta"}  # alpha is the base
    accuracy = pairs["final_sampled_accuracy"]
    assert accuracy["base"] == "alpha" and accuracy["n"] == 3  # the crashed beta/seed3 has no pair
    assert accuracy["ci"] == pytest.approx(0.4303, abs=1e-4) and not accuracy["separated"]
    # true KL: alpha 0.03, beta 0.04 on every seed -> +0.01 with zero spread: no verdict
    assert pairs["kl_k1"]["mean"] == pytest.approx(0.01) and pairs["kl_k1"]["zero_spread"]
    assert not pairs["kl_k1"]["separated"]
    text = report.format_table(sweep)
    assert "| beta | final_sampled_accuracy | -0.100 ± 0.430 | 3 | no difference detected at n=3 (detectable about 0.536) |" in text
    assert "| beta | kl_k1 | 0.01 ± 0 | 3 | no verdict: zero spread (every pair differs by 0.01) |" in text
    # every table cell carries an interval, not only accuracy
    assert "0.03 ± " in text and "45 ± " in text
    report.build_report(sweep)
    paired_csv = list(csv.DictReader((sweep / "paired.csv").open()))
    assert {r["column"] for r in paired_csv} >= {"final_sampled_accuracy", "kl_k1", "wall_seconds"}
    assert "Paired by seed against `alpha`" in (sweep / "report.md").read_text()


def test_report_refuses_a_directory_that_is_not_a_sweep_and_writes_nothing(tmp_path, sweep):
    """An empty directory, a single run's directory or a folder of other files: refused before
    anything (results.csv, report.md, plots/) is written there."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(report.NotASweepError, match=r"empty: not a sweep directory \(it is empty"):
        report.build_report(empty)
    assert list(empty.iterdir()) == []
    run = sweep / "fake_ablation" / "alpha" / "seed0"
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(report.NotASweepError, match=r"seed0: a single run's directory \(it holds metrics.jsonl, "
                                                     r"config.yaml\).*\(.*sweep\?\)"):
        report.build_report(run)
    assert sorted(p.name for p in run.iterdir()) == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    with pytest.raises(report.NotASweepError, match="not a sweep directory \\(it holds todo.txt"):
        report.build_report(other)
    assert [p.name for p in other.iterdir()] == ["todo.txt"]
    from ablations.__main__ import main

    assert main(["report", str(empty)]) == 1 and list(empty.iterdir()) == []


def test_report_lists_planned_runs_that_have_no_directory(sweep, capsys):
    """sweep.json plans variants alpha, beta and gamma x seeds 1-4; the fake sweep holds
    alpha and beta seeds 0-2 (and beta/seed3): missing are alpha/seed3, alpha/seed4,
    beta/seed4 and gamma/seed1-4."""
    (sweep / "sweep.json").write_text(json.dumps({
        "ablations": ["fake_ablation"], "variants": {"fake_ablation": ["alpha", "beta", "gamma"]}, "seeds": 4}))
    rows = report.collect_runs(sweep)
    missing = report.missing_planned_runs(sweep, rows)
    assert missing == ["fake_ablation/alpha/seed3", "fake_ablation/alpha/seed4", "fake_ablation/beta/seed4",
                       *[f"fake_ablation/gamma/seed{k}" for k in range(1, 5)]]
    text = report.build_report(sweep).read_text()
    assert "**Planned runs not started (7;" in text and "`fake_ablation/gamma/seed4`" in text
    (sweep / "sweep.json").write_text(json.dumps({"ablations": ["../x"], "seeds": 1}))
    with pytest.raises(ValueError, match=r"sweep.json: ablation name '../x'.*never a path"):
        report.missing_planned_runs(sweep, rows)
    # A sweep of fresh seeds (run --first-seed 3 --seeds 2) plans seeds 3-4 only.
    (sweep / "sweep.json").write_text(json.dumps({
        "ablations": ["fake_ablation"], "variants": {"fake_ablation": ["alpha", "beta"]}, "seeds": 2, "first_seed": 3}))
    assert report.missing_planned_runs(sweep, rows) == ["fake_ablation/alpha/seed3", "fake_ablation/alpha/seed4",
                                                        "fake_ablation/beta/seed4"]

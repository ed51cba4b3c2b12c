"""The table of AlpacaFarm's method comparison (ppo/tasks/feedback_report.py): means and
intervals, the rank agreement with AlpacaFarm's published win rates, and the generated block
of docs/alpacafarm.md, from a small fixed CSV and from the committed results."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from ablations.doc_blocks import generated_block
from ppo.tasks import feedback_report as report
from ppo.tasks.feedback_methods import PROVENANCE_COLUMNS, RESULT_COLUMNS, main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "feedback_methods"


def fixed_rows():
    """Three seeds of four methods, win rates chosen so the means are round numbers."""
    win = {"sft": [0.48, 0.50, 0.52], "best_of_n": [0.7, 0.8, 0.9], "quark": [0.30, 0.40, 0.35],
           "feedme": [0.55, 0.60, 0.65]}
    rows = []
    for method, values in win.items():
        for seed, value in enumerate(values, start=1):
            rows.append({"method": method, "seed": str(seed), "status": "ok", "error": "",
                         "win_rate_vs_sft": str(value), "gold_reward": "0.3", "proxy_reward": str(seed),
                         "kl_to_sft": "1.8350887" if method == "best_of_n" else "0.5",
                         "kl_kind": "best_of_n_formula" if method == "best_of_n" else "sampled_k1",
                         "response_length": "20", "accuracy": "0.4", "eval_responses": "512",
                         "rm_queries_train": "0" if method in ("sft", "best_of_n", "feedme") else "2560",
                         "rm_queries_per_response": "16" if method == "best_of_n" else "0",
                         "optimizer_steps": {"sft": "0", "best_of_n": "0", "quark": "40", "feedme": "169"}[method],
                         "train_seconds": "1", "eval_seconds": "1", "prov_commit": "abcdef0123", "prov_dirty": "False",
                         "prov_warm_start": "ws", "prov_reward_model": "rm", "prov_threads": "1"})
    rows.append({**rows[-1], "seed": "4", "status": "failed", "win_rate_vs_sft": ""})  # a failed row is left out
    return rows


def test_quark_best_of_n_feedme_table_from_a_fixed_csv():
    text = report.markdown(fixed_rows())
    lines = text.splitlines()
    assert lines[0].startswith("| method | win rate vs SFT (gold) |")
    # best-of-n: mean 0.8, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.248
    assert ("| best-of-n | 0.800 ± 0.248 | 0.300 ± 0.000 | 2.00 ± 2.48 | 1.84 ± 0.00 (formula) | 20.0 ± 0.0 "
            "| 0 | 16 | 0 | 45.0 |") in lines
    assert "| Quark | 0.350 ± 0.124 |" in text and "| 2560 | 0 | 40 | 35.6 |" in text  # sd 0.05
    assert "| binary FeedME | 0.600 ± 0.124 |" in text and "| 0 | 0 | 169 | 36.6 |" in text
    assert [line.split(" |")[0] for line in lines[2:6]] == ["| SFT start", "| best-of-n", "| Quark", "| binary FeedME"]
    # ours: best-of-n 0.8 > FeedME 0.6 > SFT 0.5 > Quark 0.35; AlpacaFarm: 45.0 > 36.7 > 36.6 > 35.6.
    # One swapped pair (SFT, FeedME) of six: Spearman 1 - 6 * 2 / (4 * 15) = 0.8, Kendall (5 - 1) / 6.
    assert "over the 4 methods both have: Spearman 0.80, Kendall tau-b 0.67." in text
    assert "Commit abcdef0 (dirty: False), warm start ws, reward model rm, 1 thread(s)." in text


def test_best_of_n_rank_agreement_uses_the_best_quantile_quark_when_asked():
    rows = fixed_rows() + [dict(row, method="quark_best_quantile", win_rate_vs_sft="0.55")
                           for row in fixed_rows() if row["method"] == "quark" and row["status"] == "ok"]
    summary = report.summarize(rows)
    assert report.rank_agreement(summary)["spearman"] == pytest.approx(0.8)
    other = report.rank_agreement(summary, quark="quark_best_quantile")  # Quark 0.55 now above SFT too
    assert other["methods"] == ["best_of_n", "sft", "feedme", "quark"]
    assert other["spearman"] == pytest.approx(spearman_by_hand([0.8, 0.5, 0.6, 0.55], [45.0, 36.7, 36.6, 35.6]))
    assert "With the best-quantile Quark in Quark's place" in report.markdown(rows)


def spearman_by_hand(x, y):
    rank = lambda v: [sorted(v).index(e) + 1 for e in v]  # no ties here
    d = [a - b for a, b in zip(rank(x), rank(y))]
    return 1 - 6 * sum(e * e for e in d) / (len(x) * (len(x) ** 2 - 1))


def test_feedme_rank_statistics_by_hand():
    assert report.average_ranks([2.0, 1.0, 2.0]) == [2.5, 1.0, 2.5]
    assert report.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert report.kendall_tau_b([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    # tau-b with a tie in x: pairs (1,2) tie in x; (1,3) and (2,3) concordant -> 2 / sqrt(2 * 3)
    assert report.kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(report.spearman([1, 1, 1], [1, 2, 3]))


def test_reward_conditioning_table_cli_updates_only_its_block(tmp_path, capsys):
    directory = tmp_path / "results"
    directory.mkdir()
    columns = list(RESULT_COLUMNS) + list(PROVENANCE_COLUMNS)
    rows = [dict(row, method="reward_conditioning") if row["method"] == "quark" else row for row in fixed_rows()]
    with (directory / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- generated:feedback_methods -->\nold\n<!-- /generated:feedback_methods -->\nafter\n")
    assert main(["table", str(directory), "--update", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "\nold\n" not in text
    assert "| binary reward conditioning | 0.350 ± 0.124 |" in generated_block(text, "feedback_methods")
    assert main(["table", str(directory)]) == 0 and "| binary reward conditioning |" in capsys.readouterr().out


def test_best_of_n_expert_iteration_quark_reward_conditioning_feedme_in_the_committed_table():
    """docs/alpacafarm.md's block is the table of the committed results, every method named,
    each with at least three seeds, all from one clean commit."""
    rows = report.read_rows(RESULTS)
    block = generated_block((ROOT / "docs" / "alpacafarm.md").read_text(), report.BLOCK)
    assert block == report.markdown(rows).strip()
    for label in ("best-of-n", "expert iteration", "| Quark |", "binary reward conditioning", "binary FeedME",
                  "PPO", "GRPO", "RLOO", "SFT start"):
        assert label in block
    summary = report.summarize(rows)
    assert all(len(entry["seeds"]) >= 3 for entry in summary.values())
    assert {row["prov_dirty"] for row in rows} == {"False"} and len({row["prov_commit"] for row in rows}) == 1


def test_feedme_and_every_method_of_the_committed_table_were_scored_by_the_pinned_reward_model():
    """Every committed row names the weights of the shipped reward model (`ppo.tasks.rlhf`'s
    pinned directory), so the table's numbers are the pinned model's, on any machine."""
    from ppo.run.provenance import warm_start_id
    from ppo.tasks.rlhf import reward_model_dir

    pinned = warm_start_id(str(reward_model_dir(progress=False)))
    assert {row["prov_reward_model"] for row in report.read_rows(RESULTS)} == {pinned}


def ranking_rows(ppo_minus_sft):
    """Seeds 4-10 of the five ranked methods: the SFT start at 1/2, best-of-n at 0.70, expert
    iteration at 0.60, FeedME at 1/2 + 0.01 * (seed - 7) (mean difference 0, sd 0.0216), PPO at
    1/2 + the given differences."""
    rows = []
    for i, seed in enumerate(report.RANKING_SEEDS):
        wins = {"sft": 0.5, "best_of_n": 0.70, "expert_iteration": 0.60, "feedme": 0.5 + 0.01 * (seed - 7),
                "ppo": 0.5 + ppo_minus_sft[i]}
        rows += [{"method": method, "seed": str(seed), "status": "ok", "win_rate_vs_sft": str(value),
                  "gold_reward": "0.3", "proxy_reward": "0.5", "kl_to_sft": "1", "response_length": "20",
                  "prov_commit": "abcdef0123", "prov_dirty": "False", "prov_warm_start": "ws",
                  "prov_reward_model": "rm", "prov_threads": "1"} for method, value in wins.items()]
    return rows


def test_ranking_claims_verdicts_from_fixed_rows():
    """PPO at +0.15 +- 0.01 over the start: beats the start and expert iteration (+0.05 over
    0.60, sd 0.0082: t = 16), loses to best-of-n (-0.05: contradicted); best-of-n and expert
    iteration beat the start with zero spread (no verdict); FeedME's difference 0 +- 0.0216 is
    inside +-0.05 (TOST t = 0.05 / (0.0216 / sqrt 7) = 6.1)."""
    ppo = [0.14, 0.15, 0.16, 0.15, 0.14, 0.16, 0.15]
    text = report.claims_markdown(ranking_rows(ppo), fixed_rows())
    lines = {line.split(" (AlpacaFarm")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert "| reproduced |" in lines["| PPO beats the SFT start."]
    assert "| reproduced |" in lines["| PPO beats expert iteration."]
    assert "| contradicted |" in lines["| PPO beats best-of-n."]
    assert "no verdict: zero spread" in lines["| Best-of-n beats the SFT start."]
    assert "consistent: within the registered margin ±0.05" in lines[
        "| Binary FeedME, supervised learning on the preferred responses, does no better than the SFT start."]
    assert "4-10 (7 pairs)" in lines["| PPO beats the SFT start."]
    assert "+0.150 ± 0.0" in lines["| PPO beats the SFT start."]
    # the power table reads the pilot: best-of-n - SFT over seeds 1-3 is 0.22, 0.30, 0.38 (sd 0.08)
    assert "| `feedback_methods`: `best_of_n` - `sft` in `win_rate_vs_sft` | directed | 0.05 " in text
    assert "| 0.08 (3, own runs) |" in text


def test_ranking_claims_cli_and_bad_seed_arguments(tmp_path, capsys):
    directory = tmp_path / "ranking"
    directory.mkdir()
    rows = ranking_rows([0.1] * 7)
    with (directory / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- generated:feedback_claims -->\nold\n<!-- /generated:feedback_claims -->\nb\n")
    assert main(["claims", str(directory), "--pilot", str(RESULTS), "--update", str(page)]) == 0
    block = generated_block(page.read_text(), report.CLAIMS_BLOCK)
    assert "| PPO beats the SFT start." in block and "\nold\n" not in page.read_text()
    with pytest.raises(SystemExit):
        main(["run", "--out", str(tmp_path / "x"), "--first-seed", "0"])
    assert "--first-seed must be at least 1" in capsys.readouterr().err


def test_ranking_claims_block_is_generated_from_the_committed_fresh_seeds():
    """docs/alpacafarm.md's claims block is the verdicts on the committed seeds 4-10, each row
    from one clean commit, every registered seed of every ranked method present."""
    directory = ROOT / "docs" / "results" / "feedback_ranking"
    rows = report.read_rows(directory)
    block = generated_block((ROOT / "docs" / "alpacafarm.md").read_text(), report.CLAIMS_BLOCK)
    assert block == report.claims_markdown(rows, report.read_rows(RESULTS)).strip()
    ok = {(row["method"], int(row["seed"])) for row in rows if row["status"] == "ok"}
    for claim in report.RANKING_CLAIMS:
        for variant in (claim.first[0], claim.second[0]):
            assert {(variant, seed) for seed in claim.seeds} <= ok
    assert {row["prov_dirty"] for row in rows} == {"False"}

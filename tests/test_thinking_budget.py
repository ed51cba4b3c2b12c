"""Qwen3's thinking budget on the testbed (ppo/run/evaluation.py `finish_after_thinking_budget`,
the command ppo/run/thinking_budget.py, `PPOConfig.eval_thinking_budget`).

The forcing is pinned on hand-made first phases: a response that neither stopped nor wrote
the answer marker within N tokens gets the marker as its token N + 1, exactly; one that
stopped is left alone; one that wrote the marker is continued without a second one.
"""

from __future__ import annotations

import json

import pytest
import torch

from ppo.config import PPOConfig
from ppo.models.policy import load_policy
from ppo.models.rollout import Rollout, decode_responses, generate
from ppo.run.evaluation import finish_after_thinking_budget, score_generations
from ppo.tasks import ArithmeticTask


def _first_phase(tokenizer, texts: list[str], stopped: list[bool]) -> Rollout:
    """A hand-made rollout of the first phase: each text's characters (the testbed's tokenizer
    is one token per character), then EOS where it stopped, right-padded."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if stop else [])
            for text, stop in zip(texts, stopped)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # [B, T]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # [B, T]
    query = torch.ones(len(rows), 1, dtype=torch.long)
    return Rollout(query, query, ids, mask, torch.tensor(stopped))


def test_thinking_budget_forces_the_marker_at_exactly_n_tokens(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    budget = 6
    prompts = ["12+34=", "5+6=", "7+8="]
    texts = ["12+34=", "5+6=11", "7+8=15"]  # row 0: N tokens, no marker; row 1: stopped; row 2: no stop, no marker
    first = _first_phase(tokenizer, [texts[0], texts[1], texts[2][:budget]], [False, True, False])
    torch.manual_seed(0)
    finished, has_eos, lengths = finish_after_thinking_budget(model, tokenizer, prompts, first, "#", answer_tokens=5)
    for row in (0, 2):  # forced: N thinking tokens, then the marker, then at most 5 answer tokens
        assert finished[row][:budget] == texts[row][:budget]
        assert finished[row][budget] == "#" and "#" not in finished[row][:budget]
        assert budget + 1 <= lengths[row] <= budget + 1 + 5
    assert finished[1] == "5+6=11" and has_eos[1] and lengths[1] == 7  # stopped within the budget: untouched


def test_thinking_budget_continues_an_answer_already_begun_without_a_second_marker(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    first = _first_phase(tokenizer, ["3+4=7;#"], [False])  # thought for 6 tokens, wrote the marker, then the budget
    torch.manual_seed(0)
    finished, _, lengths = finish_after_thinking_budget(model, tokenizer, ["3+4="], first, "#", answer_tokens=4)
    # The continuation is exactly what sampling from prompt + "3+4=7;#" gives: nothing was inserted.
    torch.manual_seed(0)
    tail = generate(model, tokenizer, ["3+4=3+4=7;#"], 4)
    assert finished[0] == "3+4=7;#" + decode_responses(tokenizer, tail)[0]
    assert lengths[0] == 7 + int(tail.response_lengths[0])


def test_thinking_budget_with_a_model_that_cannot_finish_scores_forced_answers(tiny_model_dir):
    """End to end through `score_generations`: the random tiny model rarely stops or writes
    '#' in 3 tokens, so nearly every response is forced; every response then holds a marker
    or a stop, and no response is longer than budget + marker + answer tokens."""
    model, tokenizer = load_policy(tiny_model_dir)
    task = ArithmeticTask()
    problems = list(task.eval_problems())[:8]
    summary = score_generations(model, tokenizer, task, problems, 16, greedy=False, samples_per_prompt=2, seed=0,
                                thinking_budget=3, answer_tokens=4)
    assert summary["length"] <= 3 + 1 + 4
    unbudgeted = score_generations(model, tokenizer, task, problems, 16, greedy=False, samples_per_prompt=2, seed=0)
    assert unbudgeted["length"] > summary["length"]


def test_thinking_budget_command_writes_table_and_plot(tiny_model_dir, tmp_path, capsys):
    from ppo.run import thinking_budget

    assert thinking_budget.main([str(tiny_model_dir), "--labels", "random", "--budgets", "2", "4",
                                 "--eval-size", "4", "--samples-per-prompt", "1", "--response-length", "8",
                                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| checkpoint | 2 | 4 | full |" in printed and "| random |" in printed
    assert (tmp_path / "budget.png").stat().st_size > 0
    assert len((tmp_path / "budget.csv").read_text().splitlines()) == 1 + 3
    provenance = json.loads((tmp_path / "provenance.json").read_text())
    assert provenance["checkpoints"] == {"random": str(tiny_model_dir)} and provenance["budgets"] == [2, 4]
    assert {"commit", "dirty"} <= set(provenance)
    # the committed curve's table is regenerated from budget.csv alone, as results.md's block is
    table = thinking_budget.table(thinking_budget.read_csv(tmp_path / "budget.csv"))
    assert table == (tmp_path / "budget.md").read_text().strip() == printed.split("\nwrote ")[0].strip()


def test_eval_thinking_budget_field_is_checked_naming_it():
    assert PPOConfig(eval_thinking_budget=8).eval_thinking_budget == 8
    with pytest.raises(ValueError, match=r"PPOConfig\.eval_thinking_budget:"):
        PPOConfig(eval_thinking_budget=0)
    with pytest.raises(ValueError, match=r"PPOConfig\.eval_thinking_budget:.*answer marker"):
        PPOConfig(eval_thinking_budget=8, task="custom")


def _write_budget_dir(directory, accuracies_by_seed):
    """A committed-style budget directory: budget.csv (one checkpoint per seed) and provenance.json."""
    from ppo.run import thinking_budget

    directory.mkdir(parents=True)
    curves = {f"seed{seed}": {budget: {"accuracy": acc, "answer_rate": 1.0, "length": 20.0}
                              for budget, acc in zip((8, 16, 32, thinking_budget.FULL), accuracies)}
              for seed, accuracies in accuracies_by_seed.items()}
    thinking_budget.write_csv(curves, directory / "budget.csv")
    (directory / "provenance.json").write_text(json.dumps({"commit": "abcdef0123", "dirty": False,
                                                           "samples_per_prompt": 8, "seed": 0}))


def test_budget_claims_verdicts_and_pilot_power_from_fixed_curves(tmp_path, capsys):
    """Tested seeds 4-15: 16 over 8 by +0.10 +- 0.01 (reproduced), 32 over 16 by 0 +- 0.01 (not
    detected), full below 32 by 0.05 (contradicted). The pilot's 16 - 8 differences 0.08, 0.10,
    0.12 have sd 0.02: the power row reads it."""
    from ablations import budget_claims
    from ablations.__main__ import main as ablations_main

    tested = {seed: (0.2, 0.3 + 0.01 * (-1) ** seed, 0.3 + 0.01 * (-1) ** (seed // 2), 0.25 + 0.001 * seed)
              for seed in budget_claims.BUDGET_SEEDS}
    pilot = {1: (0.2, 0.28, 0.3, 0.4), 2: (0.2, 0.30, 0.3, 0.4), 3: (0.2, 0.32, 0.3, 0.4)}
    _write_budget_dir(tmp_path / "tested", tested)
    _write_budget_dir(tmp_path / "tested" / "pilot", pilot)
    text = budget_claims.claims_markdown(tmp_path / "tested")
    rows = [line for line in text.splitlines() if line.startswith("| Held-out accuracy rises")]
    verdicts = [row.split(" | ")[-2] for row in rows[:3]]
    assert verdicts[0] == "reproduced" and verdicts[1].startswith("not detected") and verdicts[2] == "contradicted"
    assert "| `thinking_budget`: `budget_16` - `budget_8` in `sampled_accuracy` | directed | 0.02 " in text
    assert "| 0.02 (3, own runs) |" in text
    assert "Tested: commit abcdef0 (dirty: False), 8 draws per problem, evaluation seed 0." in text
    with pytest.raises(ValueError, match="labelled seedN"):
        budget_claims.claim_rows({"warm start": {8: {"accuracy": 0.1}}})
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- generated:budget_claims:tested -->\nold\n<!-- /generated:budget_claims:tested -->\n")
    assert ablations_main(["budget-claims", str(tmp_path / "tested"), "--update", str(page)]) == 0
    assert "| Held-out accuracy rises" in page.read_text() and "\nold\n" not in page.read_text()
    assert (tmp_path / "tested" / "budget_mean.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        budget_claims.main([str(tmp_path / "missing")])
    assert "budget.csv" in capsys.readouterr().err


def test_budget_claims_block_of_results_md_is_generated_from_the_committed_curves():
    """results.md's block is the verdicts on the committed checkpoints (seeds 4-15, every
    registered seed present) with the committed pilot, both evaluated from clean commits."""
    from pathlib import Path

    from ablations import budget_claims
    from ablations.doc_blocks import generated_block
    from ppo.run.thinking_budget import read_csv

    root = Path(__file__).resolve().parents[1]
    directory = root / "docs" / "results" / "thinking_budget_claims"
    block = generated_block((root / "docs" / "results.md").read_text(), "budget_claims:thinking_budget_claims")
    assert block == budget_claims.claims_markdown(directory).strip()
    assert {f"seed{s}" for s in budget_claims.BUDGET_SEEDS} <= set(read_csv(directory / "budget.csv"))
    for where in (directory, directory / "pilot"):
        assert json.loads((where / "provenance.json").read_text())["dirty"] is False

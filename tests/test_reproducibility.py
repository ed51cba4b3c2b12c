"""Results anyone can reproduce: the pinned warm start, a held-out set that is held out, and
the provenance every run records."""

import random

import pytest
import torch

from ppo.run import provenance
from ppo.models import sft
from ppo.config import PPOConfig
from ppo.algorithm.filtering import PromptPool
from ppo.tasks import ArithmeticTask
from ppo.tasks.preferences import PreferenceTask

# The digests of the shipped warm starts (ppo/models/warm_start/): what a fresh clone starts RL from
# on every machine. A change here is a new warm start: every documented number moves with it.
PINNED_FULL = "40760af3dd166d9d83b9e16c582e8ee822b80dade1078f6b070cb013efb7a33a"
PINNED_STEP200 = "abcf5e7747d4a664f33a8dedc59875aef78e6d4edfce7fcba569484e93829d3d"


def test_a_fresh_clone_gets_the_pinned_warm_start():
    full, weak = sft.warm_start(progress=False), sft.warm_start(progress=False, stop_after=200)
    assert full.parent == sft.PINNED_DIR and weak.parent == sft.PINNED_DIR  # shipped, never built here
    assert sft.weights_sha256(full) == PINNED_FULL == sft.load_sft_info(full)["weights_sha256"]
    assert sft.weights_sha256(weak) == PINNED_STEP200 == sft.load_sft_info(weak)["weights_sha256"]
    assert sft.load_sft_info(full)["config"] == sft.load_sft_info(weak)["config"]  # one run, two checkpoints
    assert sft.load_sft_info(full)["steps_trained"] == sft.SFTConfig().steps
    # the trainer's default start is that directory
    from ppo.models.setup import warm_start_path

    assert warm_start_path(PPOConfig(progress=False)) == str(full)


def test_the_weights_digest_sees_one_changed_bit(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(tmp_path / "same")
    before = sft.weights_sha256(tiny_model_dir)
    assert sft.weights_sha256(tmp_path / "same") == before  # the weights, not the file's bytes or path
    state = sft.state_sha256(model.state_dict())
    weight = next(iter(model.parameters()))
    with torch.no_grad():
        flat = weight.view(-1).view(torch.int32)
        flat[0] ^= 1  # the lowest mantissa bit of one weight
    assert sft.state_sha256(model.state_dict()) != state
    model.save_pretrained(tmp_path / "flipped")
    assert sft.weights_sha256(tmp_path / "flipped") != before
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        sft.weights_sha256(tmp_path / "nowhere")


def _sft_training_prompts(config: sft.SFTConfig) -> set[str]:
    """Every problem SFT trains on, drawn as `train_sft` draws them."""
    task, rng = config.task(), random.Random(config.seed)
    return {p.prompt for _ in range(config.steps) for p in task.sample_problems(config.batch_size, rng)}


def test_the_held_out_set_is_one_set_disjoint_from_every_training_problem():
    config = sft.SFTConfig()
    held_out = [p.prompt for p in config.task().eval_problems()]
    assert len(held_out) == len(set(held_out)) == 256  # no repeated prompt
    # the SFT report, RL on the verifiable task and RL on the preference task score the same set
    rl_task = ArithmeticTask()
    assert [p.prompt for p in rl_task.eval_problems()] == held_out
    assert [p.prompt for p in PreferenceTask(base=ArithmeticTask()).eval_problems()] == held_out
    assert [p.level for p in rl_task.eval_problems()][:8] == [0, 1, 2, 3, 0, 1, 2, 3]  # balanced prefixes
    # disjoint by text from everything SFT trained on (44,800 draws) and from RL's prompt stream
    assert not _sft_training_prompts(config) & set(held_out)
    pool = PromptPool(rl_task, random.Random(0))
    assert not {p.prompt for _ in range(500) for p in pool.sample(64)} & set(held_out)
    # the demonstrator's noise shapes demonstrations, never which problems are held out
    assert [p.prompt for p in ArithmeticTask(slip_rate=0.5, max_checks=0).eval_problems()] == held_out
    assert [p.prompt for p in ArithmeticTask(eval_seed=7).eval_problems()] != held_out


def test_a_held_out_set_that_would_swallow_a_level_is_refused():
    with pytest.raises(ValueError, match="level 0 .* only 100 distinct problems"):
        ArithmeticTask(eval_size=400)


def test_provenance_names_code_warm_start_libraries_threads_and_machine(tiny_model_dir):
    record = provenance.collect(str(tiny_model_dir), threads=3, processes=2)
    assert set(record) == set(provenance.FIELDS)
    assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)  # the tests run in a checkout
    assert record["warm_start"] == sft.weights_sha256(tiny_model_dir)[:16]
    assert record["torch"] == torch.__version__ and record["threads"] == 3 and record["processes"] == 2
    assert record["cpu"] and record["cpu"] != "unknown"
    assert provenance.collect(None, threads=1)["warm_start"] == "in-memory"
    assert record["reward_model"] == ""  # no reward model scored this run


def test_provenance_names_the_reward_model_a_run_is_scored_by(tiny_model_dir):
    """A preference run's rows say which reward model's bits scored it (its weights digest,
    computed like the warm start's), so two sweeps scored by different builds cannot pass for one."""
    record = provenance.collect(str(tiny_model_dir), threads=1, reward_model_path=str(tiny_model_dir))
    assert record["reward_model"] == sft.weights_sha256(tiny_model_dir)[:16]


def _finished_run(run_dir, commit, warm_start, final, samples=None):
    """A run directory as a finished run leaves it, with the given provenance (and the samples
    it trained, when given)."""
    import json

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("total_steps: 1\nseed: 1\n")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_sampled_accuracy": 0.4}) + "\n"
                                          + json.dumps({"step": 1, "eval_sampled_accuracy": final}) + "\n")
    record = provenance.collect(None, threads=1)
    record.update(commit=commit, warm_start=warm_start, dirty=False)
    (run_dir / "summary.json").write_text(json.dumps({
        "steps": 1, "initial_eval": {"sampled_accuracy": 0.4}, "final_eval": {"sampled_accuracy": final},
        "provenance": record, **({"samples": samples} if samples is not None else {})}))


def test_the_report_refuses_to_pool_runs_of_different_code_or_warm_starts(tmp_path, capsys):
    from ablations.__main__ import main
    from ablations.report import MixedProvenanceError, build_report

    sweep = tmp_path / "sweep"
    for seed in (1, 2):
        _finished_run(sweep / "toy" / "a" / f"seed{seed}", "a" * 40, "w1", 0.5)
        _finished_run(sweep / "toy" / "b" / f"seed{seed}", "a" * 40, "w1", 0.6)
    report = build_report(sweep).read_text()  # one commit, one warm start: pooled, and said so
    assert "Pooled 4 ok runs: commit aaaaaaaaaaaa; warm start w1;" in report
    # one run from other code: refused, naming both combinations and a run of each
    import shutil

    shutil.rmtree(sweep / "toy" / "b" / "seed2")
    _finished_run(sweep / "toy" / "b" / "seed2", "b" * 40, "w1", 0.6)
    with pytest.raises(MixedProvenanceError, match=r"2 different \(commit, warm start\).*bbbbbbbbbbbb.*toy/b/seed2"):
        build_report(sweep)
    assert main(["report", str(sweep)]) == 1 and "--allow-mixed" in capsys.readouterr().err
    # a different warm start is refused the same way
    shutil.rmtree(sweep / "toy" / "b" / "seed2")
    _finished_run(sweep / "toy" / "b" / "seed2", "a" * 40, "w2", 0.6)
    with pytest.raises(MixedProvenanceError, match="warm start w2"):
        build_report(sweep)
    # told to, it pools them and the report and the terminal say so
    assert main(["report", str(sweep), "--allow-mixed"]) == 0
    assert "MIXED PROVENANCE (pooled with --allow-mixed)" in capsys.readouterr().out
    assert "MIXED PROVENANCE" in (sweep / "report.md").read_text()
    # another ablation may start elsewhere on purpose (a weak start): pooled, both starts named
    shutil.rmtree(sweep / "toy" / "b" / "seed2")
    _finished_run(sweep / "toy" / "b" / "seed2", "a" * 40, "w1", 0.6)
    for seed in (1, 2):
        _finished_run(sweep / "weak" / "a" / f"seed{seed}", "a" * 40, "w2", 0.3)
    assert "Pooled 6 ok runs: commit aaaaaaaaaaaa; warm start w1, w2;" in build_report(sweep).read_text()


def test_the_testbed_page_tables_are_the_recorded_sweeps():
    """docs/testbed.md's gain tables are generated from the sweeps committed under docs/results/:
    the same numbers, every run from the pinned warm start, one clean commit per sweep."""
    import csv
    from pathlib import Path

    from ablations import doc_blocks, doc_tables

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs/testbed.md").read_text()
    names = [name for name in doc_blocks.block_names(page) if name.startswith("gains:")]
    assert {"gains:testbed_presets", "gains:dr_grpo_testbed"} <= set(names)
    for name, content in doc_tables.generated_tables([], names).items():
        assert doc_blocks.generated_block(page, name) == content, name
        rows = list(csv.DictReader(open(root / "docs/results" / name.split(":")[1] / "results.csv")))
        assert {r["prov_warm_start"] for r in rows} == {PINNED_FULL[:16]}
        assert len({r["prov_commit"] for r in rows}) == 1 and {r["prov_dirty"] for r in rows} == {"False"}

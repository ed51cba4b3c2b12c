"""The simulated-preference RLHF pieces: gold reward, annotators, preference files, the
Bradley-Terry reward model, its normalisation, the preference task's evaluation, the
AlpacaFarm preset, the cached reward-model path, and the pinned preference data and reward model
(its digests, its documented numbers, a rebuild's comparison with it)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from ppo.config import preset
from ppo.models.policy import ModelLoadError, load_policy
from ppo.tasks.base import Problem
from ppo.tasks.preferences import (
    AnnotatorPool,
    MissingRewardModelError,
    PreferenceTask,
    SimulatedAnnotator,
    build_preference_dataset,
    gold_score,
    load_preferences,
    save_preferences,
)
from value_model import ScalarHeadModel
from value_model.reward_model import (
    bradley_terry_loss,
    last_token_scores,
    load_reward_model_info,
    normalize_reward_model,
    save_reward_model,
    score_texts,
    train_reward_model,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These tests run tiny models; on cores shared with other jobs one thread is much faster.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    return load_policy(tiny_model_dir)


def _row(**changes) -> dict:
    row = {"prompt": "1+2=", "response_a": "1+2=3;#3", "response_b": "1+2=4;#4", "preferred": "a",
           "gold_a": 1.0, "gold_b": 0.0, "annotator": "annotator_0"}
    row.update(changes)
    return row


# ---------------------------------------------------------------------------------- gold reward
def test_gold_score_correctness_brevity_and_format():
    problem = Problem("27+5+8=", "40")
    assert gold_score(problem, "27+5=32;32+8=40;#40", True) == 1.0
    assert gold_score(problem, "27+5=32;32+8=40;chk40;chk40;#40", True) == 0.9  # 2 re-checks
    assert gold_score(problem, "27+5=32;32+8=41;#41", True) == 0.0
    assert gold_score(problem, "27+5=32;32+8=40;#40", False) == 0.5  # right, but never stopped
    assert gold_score(problem, "27+5=32;32+8=40", True) == -0.5  # no answer marker


def test_pair_difference_names_what_separates_a_pair():
    from ppo.tasks.preferences import pair_difference

    base = {"prompt": "2+2=", "answer": "4", "response_a": "2+2=4;#4"}
    assert pair_difference({**base, "response_b": "2+2=5;#5"}) == "correctness"
    assert pair_difference({**base, "response_b": "2+2=4;#4", "eos_b": False}) == "format"
    assert pair_difference({**base, "response_b": "2+2=4;chk4;#4"}) == "brevity"
    assert pair_difference({**base, "response_b": "2+2=4; #4"}) == "none"


# ---------------------------------------------------------------------------------- annotators
def test_annotator_noise_rate_matches_its_setting():
    """noise 0.25: a coin replaces the label 25% of the time, so 12.5% of labels are wrong."""
    annotator = SimulatedAnnotator(noise=0.25, seed=0)
    n = 4000
    wrong = sum(annotator.prefer(1.0, 0.0) != "a" for _ in range(n)) / n
    sigma = math.sqrt(0.125 * 0.875 / n)  # ~0.0052
    assert abs(wrong - 0.125) < 3 * sigma
    assert all(SimulatedAnnotator(noise=0.0).prefer(0.0, 0.95) == "b" for _ in range(100))


def test_annotator_length_bias_overrides_a_small_gold_gap():
    problem = Problem("8+7=", "15")
    short, long = "8+7=15;#15", "8+7=15;chk15;chk15;#15"  # gold 1.0 vs 0.9, 12 characters longer
    assert SimulatedAnnotator(noise=0.0).compare(problem, short, long) == "a"
    assert SimulatedAnnotator(noise=0.0, bias=0.02).compare(problem, short, long) == "b"  # 0.24 > 0.1
    # ...but not a correctness gap of 1.
    assert SimulatedAnnotator(noise=0.0, bias=0.02).compare(problem, short, "8+7=16;chk16;chk16;#16") == "a"


def test_annotator_pool_uses_every_annotator_and_checks_biases():
    pool = AnnotatorPool(n=3, noise=0.0, seed=1)
    names = {pool.compare(Problem("1+1=", "2"), "1+1=2;#2", "1+1=3;#3")[1] for _ in range(60)}
    assert names == {"annotator_0", "annotator_1", "annotator_2"}
    with pytest.raises(ValueError, match="biases"):
        AnnotatorPool(n=2, biases=[0.1])


# ---------------------------------------------------------------------------------- preference files
def test_preference_file_round_trip(tmp_path):
    rows = [_row(), _row(prompt="2+2=", response_a="2+2=4;#4", response_b="2+2=4;chk4;#4", gold_b=0.95)]
    path = save_preferences(rows, tmp_path / "prefs.jsonl")
    assert load_preferences(path) == rows


@pytest.mark.parametrize("row, message", [
    ({k: v for k, v in _row().items() if k != "gold_b"}, r"missing field\(s\) \['gold_b'\]"),
    (_row(response_b="1+2=3;#3"), "identical"),
    (_row(preferred="c"), "'preferred' must be"),
    (_row(preferred=1), "'preferred' must be"),
    (_row(gold_a="high"), "'gold_a' must be a number"),
])
def test_preference_file_validation_names_path_and_line(tmp_path, row, message):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message) as error:
        load_preferences(path)
    assert f"{path}:2" in str(error.value)


def test_preference_file_empty_or_not_json(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty preference file") as error:
        load_preferences(empty)
    assert str(empty) in str(error.value)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(ValueError, match=f"{broken}:2: not valid JSON"):
        load_preferences(broken)
    with pytest.raises(ValueError, match="identical"):
        save_preferences([_row(response_b="1+2=3;#3")], tmp_path / "out.jsonl")


def test_build_preference_dataset_rows(tiny_policy):
    policy, tokenizer = tiny_policy
    task = PreferenceTask()
    rows = build_preference_dataset(policy, tokenizer, task, n_pairs=6, seed=0, max_new_tokens=6,
                                    prompts_per_batch=4, pool=AnnotatorPool(2, noise=0.25, seed=0))
    assert len(rows) == 6
    for row in rows:
        assert row["response_a"] != row["response_b"] and row["preferred"] in ("a", "b")
        problem = Problem(row["prompt"], row["answer"])
        assert row["gold_a"] == gold_score(problem, row["response_a"], row["eos_a"])
        assert row["gold_b"] == gold_score(problem, row["response_b"], row["eos_b"])


# ---------------------------------------------------------------------------------- reward model
def test_bradley_terry_loss_by_hand():
    loss = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])).item()  # r_chosen = 2, r_rejected = 0
    assert loss == pytest.approx(math.log1p(math.exp(-2)), abs=1e-6)
    assert loss == pytest.approx(0.1269, abs=1e-4)
    # a mean over pairs; only differences matter
    pairs = bradley_terry_loss(torch.tensor([2.0, 5.0]), torch.tensor([0.0, 5.0])).item()
    assert pairs == pytest.approx((0.126928 + math.log(2)) / 2, abs=1e-5)


def test_scores_are_read_where_the_trainer_reads_them(tiny_policy):
    """Scoring decoded text (reward-model training) = scoring the rollout tensors (RL)."""
    from ppo.models.rollout import decode_responses, generate

    policy, tokenizer = tiny_policy
    model = ScalarHeadModel.from_policy(policy, head_init="normal", kind="reward").eval()
    torch.manual_seed(0)
    prompts = ["1+2=", "33+4+5=", "7+7="]
    rollout = generate(policy, tokenizer, prompts, max_new_tokens=6)
    with torch.no_grad():
        from_rollout = last_token_scores(model, rollout.query_ids, rollout.query_mask, rollout.response_ids,
                                         rollout.response_mask)
    from_text = score_texts(model, tokenizer, prompts, decode_responses(tokenizer, rollout), rollout.has_eos.tolist())
    # Decoding drops special tokens; only an untrained model writes them inside a response.
    special = torch.tensor([tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id])
    body = rollout.response_mask.bool() & (rollout.response_ids != tokenizer.eos_token_id)
    clean = ~(torch.isin(rollout.response_ids, special) & body).any(-1)  # [B]
    assert clean.sum() >= 2 and rollout.has_eos[clean].any()
    assert torch.allclose(from_rollout[clean], from_text[clean], atol=1e-5)


def test_reward_normalisation_makes_the_mean_sft_score_zero(tiny_policy):
    policy, tokenizer = tiny_policy
    torch.manual_seed(0)
    model = ScalarHeadModel.from_policy(policy, head_init="normal", kind="reward").eval()
    with torch.no_grad():
        model.head.bias.fill_(3.0)
    prompts = ["1+2=", "3+4=", "5+6+7=", "11+22="]
    responses = ["1+2=3;#3", "3+4=8;chk8;#8", "5+6=11;11+7=18;#18", "11+22=33"]
    has_eos = [True, True, True, False]
    before = score_texts(model, tokenizer, prompts, responses, has_eos)
    offset = normalize_reward_model(model, tokenizer, prompts, responses, has_eos)
    after = score_texts(model, tokenizer, prompts, responses, has_eos)
    assert offset == pytest.approx(before.mean().item(), abs=1e-6)
    assert after.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert torch.allclose(after, before - offset, atol=1e-5)  # a shift: the ranking is untouched


def _synthetic_pairs(n: int) -> list[dict]:
    """Chosen: the answer straight away; rejected: the same after three re-checks."""
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        short, long = f"{a}+{b}={a + b};#{a + b}", f"{a}+{b}={a + b};chk{a + b};chk{a + b};chk{a + b};#{a + b}"
        short_first = rng.random() < 0.5
        rows.append({"prompt": f"{a}+{b}=", "response_a": short if short_first else long,
                     "response_b": long if short_first else short, "preferred": "a" if short_first else "b",
                     "gold_a": 1.0 if short_first else 0.85, "gold_b": 0.85 if short_first else 1.0,
                     "annotator": "annotator_0"})
    return rows


def test_train_reward_model_learns_an_easy_preference_and_saves(tiny_model_dir, tiny_policy, tmp_path):
    model, metrics = train_reward_model(tiny_model_dir, _synthetic_pairs(96), epochs=3, batch_size=16, lr=3e-3,
                                        heldout_fraction=0.25, progress=False)
    assert metrics["heldout_pairs"] == 24 and metrics["train_pairs"] == 72
    assert metrics["heldout_accuracy_noisy"] > 0.9 and metrics["heldout_accuracy_gold"] > 0.9
    assert model.kind == "reward"
    _, tokenizer = tiny_policy
    path = save_reward_model(model, tokenizer, tmp_path / "rm", info={"metrics": metrics})
    assert load_reward_model_info(path)["metrics"]["heldout_pairs"] == 24
    loaded = ScalarHeadModel.from_pretrained(path)
    prompts, responses = ["3+4="], ["3+4=7;#7"]
    assert torch.allclose(score_texts(loaded, tokenizer, prompts, responses),
                          score_texts(model, tokenizer, prompts, responses), atol=1e-5)


def test_a_plain_causal_lm_is_not_a_reward_model(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="not a scalar-head model"):
        ScalarHeadModel.from_pretrained(tiny_model_dir)
    for path in (tiny_model_dir, tmp_path / "missing"):
        with pytest.raises(MissingRewardModelError, match="python -m ppo.tasks.rlhf build"):
            PreferenceTask(reward_model_path=path)


# ---------------------------------------------------------------------------------- the task
def test_preference_task_scores_with_the_gold_reward():
    task = PreferenceTask()
    problem = task.eval_problems()[0]
    assert list(task.eval_problems()) == list(PreferenceTask().base.eval_problems())
    right = f"{problem.prompt}{problem.answer};chk{problem.answer};#{problem.answer}"
    score = task.score(problem, right, True)
    assert score.correct and score.has_answer and score.has_eos and score.reward == pytest.approx(0.95)


def test_extra_eval_win_rate_is_one_half_for_the_sft_policy_itself(tiny_policy):
    policy, tokenizer = tiny_policy
    task = PreferenceTask()
    problems = list(task.eval_problems()[:6])
    first = task.extra_eval(policy, tokenizer, problems, max_new_tokens=6, seed=3)  # caches the SFT reference
    second = task.extra_eval(policy, tokenizer, problems, max_new_tokens=6, seed=3)  # same samples: all ties
    assert first["win_rate_vs_sft"] == 0.5 and second["win_rate_vs_sft"] == 0.5
    assert second["gold_reward"] == first["gold_reward"]
    assert "proxy_reward" not in second
    with pytest.raises(ValueError, match="set_reference"):
        task.extra_eval(policy, tokenizer, problems, max_new_tokens=6, seed=4)


def test_extra_eval_win_rate_by_hand(monkeypatch):
    import ppo.tasks.preferences as preferences

    problems = [Problem("1+2=", "3"), Problem("2+5=", "7"), Problem("2+2=", "4")]
    samples = iter([
        ["1+2=3;#3", "2+5=8;#8", "2+2=4;chk4;#4"],  # SFT: gold 1.0, 0.0, 0.95
        ["1+2=3;chk3;#3", "2+5=7;#7", "2+2=4;#4"],  # policy: 0.95 (loses), 1.0 (wins), 1.0 (wins)
    ])
    monkeypatch.setattr(preferences, "sample_responses", lambda *args, **kwargs: (next(samples), [True] * 3, []))
    task = PreferenceTask()
    assert task.extra_eval(None, None, problems, 8, 0)["win_rate_vs_sft"] == 0.5
    metrics = task.extra_eval(None, None, problems, 8, 0)
    assert metrics["win_rate_vs_sft"] == pytest.approx(2 / 3)
    assert metrics["gold_reward"] == pytest.approx((0.95 + 1.0 + 1.0) / 3)
    assert metrics["checks"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------- preset, cache, ablation
def test_alpacafarm_preset_matches_alpacafarm():
    """examples/scripts/rlhf_ppo.sh and rl/ppo_utils.py of AlpacaFarm (docs/alpacafarm.md)."""
    config = preset("alpacafarm")
    assert config.kl_coef == 0.0067 and not config.adaptive_kl and config.kl_estimator == "k1"
    assert config.kl_clip_at_zero and config.kl_placement == "reward"
    assert config.whiten_rewards and config.reward_whitening_mode == "alpacafarm" and config.whiten_advantages
    assert config.gamma == 1.0 and config.lam == 1.0
    assert config.cliprange == 0.2 and config.cliprange_value == 0.2 and config.cliprange_high is None
    assert config.vf_coef == 0.1 and config.entropy_coef == 0.0
    assert config.ppo_epochs == 2
    assert config.rollout_batch_size == 512 and config.minibatch_size == 256
    assert config.lr == 1e-5 and config.adam_eps == 1e-5 and config.warmup_steps == 5
    assert config.lr_schedule == "linear" and config.max_grad_norm == 1.0
    assert config.temperature == 1.0 and config.top_k == 0 and config.top_p == 1.0
    assert config.value_init == "reward_model" and not config.separate_value_optimizer


def test_reward_model_cache_path_is_deterministic_and_builds_nothing(tmp_path):
    from ppo.tasks.rlhf import RLHFConfig, reward_model_cache_path

    path = reward_model_cache_path(cache_dir=tmp_path)
    assert path == reward_model_cache_path(RLHFConfig(), cache_dir=tmp_path)
    assert path.parent == tmp_path / "reward_model" and not path.exists()
    assert reward_model_cache_path(RLHFConfig(n_pairs=10), cache_dir=tmp_path) != path
    assert reward_model_cache_path(RLHFConfig(noise=0.5), cache_dir=tmp_path) != path
    with pytest.raises(ValueError, match="RLHFConfig.noise"):
        RLHFConfig(noise=1.5)


def test_overoptimization_ablation_points_at_the_pinned_reward_model():
    from ablations.registry import get_ablation
    from ppo.tasks.rlhf import PINNED_DIR, RLHFConfig, reward_model_path

    ablation = get_ablation("alpacafarm_overoptimization")
    assert [v.overrides["kl_coef"] for v in ablation.variants] == [0.0, 0.0067, 0.05, 0.2]
    config = ablation.config(ablation.variants[1], seed=1, output_dir="unused")
    assert config.task == "preference" and config.value_init == "reward_model" and config.kl_coef == 0.0067
    assert config.reward_model_path == str(reward_model_path()) == str(PINNED_DIR / RLHFConfig().cache_key())
    assert ablation.metric == "eval_gold_reward"


def test_rlhf_build_pipeline_is_cached_and_feeds_the_preference_task(tmp_path):
    """The whole ``python -m ppo.tasks.rlhf build`` pipeline at toy sizes."""
    from ppo.tasks.rlhf import RLHFConfig, reward_model_cache_path, reward_model_dir
    from ppo.models.sft import SFTConfig
    from ppo.models.tiny_model import TinyModelConfig

    sft = SFTConfig(steps=4, batch_size=8, max_new_tokens=8, threads=1,
                    model=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    config = RLHFConfig(n_pairs=12, epochs=1, batch_size=4, normalization_samples=8, prompts_per_batch=8, sft=sft)
    path = reward_model_dir(config, cache_dir=tmp_path, progress=False)
    assert path == reward_model_cache_path(config, cache_dir=tmp_path)
    info = load_reward_model_info(path)
    assert info["metrics"]["train_pairs"] + info["metrics"]["heldout_pairs"] == 12
    assert abs(info["normalization"]["mean_after"]) < 1e-4
    assert len(load_preferences(path / "preferences.jsonl")) == 12
    mtime = (path / "reward_model_info.json").stat().st_mtime_ns
    assert reward_model_dir(config, cache_dir=tmp_path, progress=False) == path  # cache hit
    assert (path / "reward_model_info.json").stat().st_mtime_ns == mtime
    assert not list(path.parent.glob("*.tmp*"))

    policy, tokenizer = load_policy(info["sft_dir"])
    task = PreferenceTask(reward_model_path=path)
    metrics = task.extra_eval(policy, tokenizer, list(task.eval_problems()[:4]), max_new_tokens=8, seed=0)
    assert metrics["win_rate_vs_sft"] == 0.5 and math.isfinite(metrics["proxy_reward"])


def test_build_out_refuses_a_directory_that_holds_no_reward_model(tmp_path):
    """`--out` replaces an earlier copy of a reward model, never a directory of anything else
    (checked before any building)."""
    from ppo.tasks.rlhf import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as stop:
        main(["build", "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert stop.value.code == 2
    assert (out / "notes.txt").read_text() == "keep me" and not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------------- the pinned reward model
# The digest of the shipped reward model's weights (backbone and head): a fresh clone must
# get exactly these bits (ppo/tasks/reward_model/README.md).
PINNED_WEIGHTS = "ecdcff8402c3616baa3ac1b979339b18baf968f339f6c28da978856795ba428f"
PINNED_PREFERENCES = "d53cffe8e09d7b2088bcf9278a8c6d718978492306ab23e93bf05a10832105ed"


def _pinned():
    from ppo.tasks.rlhf import pinned_path

    path = pinned_path()
    assert path is not None, "the default reward model is not shipped under ppo/tasks/reward_model/"
    return path


def test_the_pinned_reward_model_is_shipped_with_its_recorded_digests(tmp_path):
    """The default settings get the shipped directory, never a build (the cache stays empty),
    and its files are the bits their info records and this test names."""
    from value_model.reward_model import check_reward_model_digests, reward_model_digests

    from ppo.tasks.rlhf import PINNED_DIR, reward_model_dir, reward_model_path

    path = _pinned()
    assert reward_model_dir(cache_dir=tmp_path / "cache", progress=False) == path == reward_model_path()
    assert path.parent == PINNED_DIR and not (tmp_path / "cache").exists()
    info = load_reward_model_info(path)
    digests = reward_model_digests(path)
    assert digests["weights_sha256"] == info["weights_sha256"] == PINNED_WEIGHTS
    assert digests["files_sha256"] == info["files_sha256"]
    assert info["files_sha256"]["preferences.jsonl"] == PINNED_PREFERENCES
    check_reward_model_digests(path)
    assert info["sft_dir"] == "ppo/models/warm_start/b18a99ea2052960b"  # the pinned warm start, no machine path
    assert info["built_with"]["dirty"] is False


def test_the_pinned_files_give_the_documented_numbers():
    """Held-out accuracies recomputed from the shipped model and preference data equal those its
    info records, and docs/alpacafarm.md's generated block is exactly `reward_model_markdown`
    of the shipped files: no number about the reward model on that page comes from elsewhere."""
    from pathlib import Path

    from value_model.reward_model import pairwise_metrics, split_pairs

    from ppo.models.policy import load_tokenizer
    from ppo.tasks.preferences import pair_difference
    from ppo.tasks.rlhf import DOC_BLOCK, reward_model_markdown

    path = _pinned()
    info = load_reward_model_info(path)
    metrics, config = info["metrics"], info["config"]
    rows = load_preferences(path / "preferences.jsonl")
    assert len(rows) == config["n_pairs"] == metrics["train_pairs"] + metrics["heldout_pairs"]
    assert info["label_counts"] == {"a": sum(r["preferred"] == "a" for r in rows),
                                    "b": sum(r["preferred"] == "b" for r in rows)}
    _, heldout = split_pairs(rows, config["heldout_fraction"], config["seed"])
    model, tokenizer = ScalarHeadModel.from_pretrained(path).eval(), load_tokenizer(path)
    recomputed = pairwise_metrics(model, tokenizer, heldout)
    for name in ("accuracy_noisy", "accuracy_gold", "label_gold_agreement", "gold_pairs"):
        assert recomputed[name] == pytest.approx(metrics[f"heldout_{name}"], abs=1e-6), name
    for kind in ("correctness", "format", "brevity"):
        subset = [row for row in heldout if pair_difference(row) == kind]
        assert len(subset) == metrics[f"heldout_{kind}_pairs"]
        assert pairwise_metrics(model, tokenizer, subset)["accuracy_gold"] == pytest.approx(
            metrics[f"heldout_{kind}_accuracy_gold"], abs=1e-6), kind
    page = (Path(__file__).resolve().parents[1] / "docs" / "alpacafarm.md").read_text()
    block = page.split(f"<!-- generated:{DOC_BLOCK} -->\n", 1)[1].split(f"<!-- /generated:{DOC_BLOCK} -->", 1)[0]
    assert block == reward_model_markdown(path), "docs/alpacafarm.md is stale: python -m ppo.tasks.rlhf describe " \
                                                 "--update docs/alpacafarm.md"
    assert f"| held-out accuracy against gold ({metrics['heldout_gold_pairs']} pairs with a gold winner) | " \
           f"{metrics['heldout_accuracy_gold']:.3f} |" in block


def _corrupt_copy(tmp_path, name: str):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(_pinned(), copy)
    data = bytearray((copy / name).read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's bytes, or of the last row's text
    (copy / name).write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("name", ["model.safetensors", "scalar_head.safetensors", "preferences.jsonl"])
def test_a_corrupted_pinned_file_is_refused_naming_it(tmp_path, name):
    """One flipped bit in any recorded file: the digest check, the trainer's loader and the
    preference task all refuse the directory, naming the file and what to do."""
    from value_model.reward_model import RewardModelDigestError, check_reward_model_digests

    from ppo.models.setup import load_reward_model

    copy = _corrupt_copy(tmp_path, name)
    message = rf"{name}: sha256 [0-9a-f]{{16}}\.\.\. is not the [0-9a-f]{{16}}\.\.\. that reward_model_info.json " \
              r"records: the file is corrupted or was changed.*build --rebuild"
    with pytest.raises(RewardModelDigestError, match=message):
        check_reward_model_digests(copy)
    with pytest.raises(RewardModelDigestError, match=name):
        load_reward_model(preset("alpacafarm", testbed=True, task="preference", reward_model_path=str(copy)))
    with pytest.raises(RewardModelDigestError, match=name):
        PreferenceTask(reward_model_path=copy)
    (copy / name).unlink()
    with pytest.raises(RewardModelDigestError, match=f"{name}: missing"):
        check_reward_model_digests(copy)


@pytest.mark.slow  # rebuilds the reward model: about 40 s (make test-all)
def test_a_rebuild_is_compared_with_the_pin(tmp_path):
    """`compare_to_pinned` on the pin itself says the bits are identical; on a copy with one
    weight moved by 0.25 and one label flipped it reports that weight difference, the
    preference rows it shares (all) and their label agreement (all but one), and the held-out
    accuracies both ways (the pinned model on the pinned pairs: the recorded ones)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from ppo.tasks.rlhf import closeness, compare_to_pinned

    pinned = _pinned()
    assert compare_to_pinned(pinned, pinned).startswith("bits: identical to the pinned reward model")
    copy = tmp_path / "rebuilt"
    shutil.copytree(pinned, copy)
    head = load_file(str(copy / "scalar_head.safetensors"))
    head["bias"] = head["bias"] + 0.25  # every score moves together: rankings and accuracies stay
    save_file(head, str(copy / "scalar_head.safetensors"))
    rows = load_preferences(copy / "preferences.jsonl")
    rows[0]["preferred"] = "b" if rows[0]["preferred"] == "a" else "a"
    save_preferences(rows, copy / "preferences.jsonl")
    near = closeness(copy, pinned)
    assert not near["identical"] and not near["same_preferences"]
    assert near["max_weight_diff"] == pytest.approx(0.25, abs=1e-6)
    assert near["same_pairs"] == 1.0 and near["label_agreement"] == pytest.approx(1 - 1 / len(rows))
    assert near["ranking_agreement"] == 1.0
    recorded = load_reward_model_info(pinned)["metrics"]
    assert near["heldout"]["pinned_model/pinned_data"]["gold"] == pytest.approx(recorded["heldout_accuracy_gold"])
    assert near["heldout"]["rebuilt_model/pinned_data"] == near["heldout"]["pinned_model/pinned_data"]
    text = compare_to_pinned(copy, pinned)
    assert "DIFFERENT" in text and "largest weight difference 0.25" in text and "pinned model" in text

"""`--dataset` (local files and saved `datasets` directories) and `--reward-fn` (reward
functions by import path): reading, the errors that name what is wrong, and a GRPO run from
the command line whose training reward rises."""

import json

import pytest

from ppo.config import PPOConfig
from ppo.tasks import build_task
from ppo.tasks.data_files import load_prompts, read_rows
from ppo.tasks.gsm8k import TaskDataError

pytest.importorskip("datasets")

ROWS = [{"prompt": "1+1=", "answer": "2", "level": 1}, {"prompt": "2+3=", "answer": "5", "level": 2},
        {"prompt": "9+9=", "answer": "18", "level": 3}]

REWARDS = '''
def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]

def length(prompts, responses):
    return [float(len(r)) for r in responses]

def echo_prompt_length(prompts, responses):
    return [float(len(p)) for p in prompts]

def broken(prompts, responses):
    raise ZeroDivisionError("boom")

def wrong_count(prompts, responses):
    return [1.0]
'''


def write_rows(path, rows=ROWS):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        path.write_text("prompt,answer,level\n" + "".join(f"{r['prompt']},{r['answer']},{r['level']}\n" for r in rows))
    elif suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_dataset_file_formats_read_the_same_rows(tmp_path, suffix):
    rows = read_rows(write_rows(tmp_path / f"data{suffix}"))
    assert [r["prompt"] for r in rows] == ["1+1=", "2+3=", "9+9="]
    assert [str(r["answer"]) for r in rows] == ["2", "5", "18"]
    assert not list(tmp_path.glob("**/*.arrow"))  # no cache left beside the data


def test_dataset_saved_directory_with_splits(tmp_path):
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]),
                          "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(str(saved))
    config = PPOConfig(task="custom", dataset=str(saved), eval_split="test", reward_fn=["operator:countOf"])
    assert load_prompts(config) == (["1+1=", "2+3="], ["9+9="])
    with pytest.raises(TaskDataError, match=r"no split 'validation'; its splits are \['test', 'train'\]"):
        read_rows(saved, "validation")
    single = tmp_path / "single"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(single))
    assert len(read_rows(single)) == 3


def test_dataset_eval_file_and_bad_inputs_are_named(tmp_path):
    train, held_out = write_rows(tmp_path / "train.jsonl"), write_rows(tmp_path / "test.csv", ROWS[:1])
    config = PPOConfig(task="custom", dataset=str(train), eval_dataset=str(held_out), reward_fn=["operator:countOf"])
    assert load_prompts(config) == (["1+1=", "2+3=", "9+9="], ["1+1="])
    with pytest.raises(TaskDataError, match=r"no column 'question' \(PPOConfig.prompt_column\); its columns are "
                                            r"\['answer', 'level', 'prompt'\]"):
        load_prompts(config.replace(prompt_column="question"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TaskDataError, match="empty.jsonl: the file is empty"):
        read_rows(empty)
    with pytest.raises(TaskDataError, match="row 2: column 'prompt' is empty"):
        load_prompts(config.replace(dataset=str(write_rows(tmp_path / "blank.jsonl", [ROWS[0], {"prompt": " "}])),
                                    eval_dataset=None))
    with pytest.raises(TaskDataError, match="no such file or directory"):
        read_rows(tmp_path / "missing.jsonl")
    with pytest.raises(TaskDataError, match="unknown file type '.txt'"):
        (tmp_path / "data.txt").write_text("1+1=\n")
        read_rows(tmp_path / "data.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(TaskDataError, match="bad.jsonl: cannot be read as json"):
        read_rows(bad)
    with pytest.raises(TaskDataError, match="a file is one split, 'train'"):
        read_rows(train, "test")


def test_dataset_needs_a_task_that_reads_it():
    with pytest.raises(ValueError, match="PPOConfig.dataset: task='arithmetic' reads no dataset"):
        PPOConfig(dataset="data.jsonl")
    with pytest.raises(ValueError, match="PPOConfig.reward_fn: task='gsm8k' scores responses itself"):
        PPOConfig(task="gsm8k", task_path="x.jsonl", reward_fn=["m:f"])
    with pytest.raises(ValueError, match="PPOConfig.reward_fn_weights: has 1 weights for 2"):
        PPOConfig(task="custom", reward_fn="m:f,m:g", reward_fn_weights=0.5)
    from ppo.settings.config_checks import inert_settings

    assert [name for name, _ in inert_settings(PPOConfig(prompt_column="question"))] == ["prompt_column"]


def test_reward_fn_path_from_module_and_file_with_weights(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write_rows(tmp_path / "train.jsonl")
    config = PPOConfig(task="custom", dataset=str(data), reward_fn=["my_rewards:count_ones", "my_rewards.py:length"],
                       reward_fn_weights=[2.0, -0.5])
    task = build_task(config)
    assert task.reward_fn.__qualname__ == "2.0*my_rewards:count_ones + -0.5*my_rewards.py:length"
    assert task.reward_fn(["a", "b"], ["11x", ""]) == [2.0 * 2 - 0.5 * 3, 0.0]
    scores = task.score_batch(task.eval_problems()[:2], ["1", "22"], [True, True])
    assert [s.reward for s in scores] == [1.5, -1.0]
    for spec, message in (("my_rewards:missing", "has no attribute 'missing'"),
                          ("no_such_module:f", "cannot import module 'no_such_module'"),
                          ("nowhere/x.py:f", "no such file"), ("my_rewards:REWARDS_TYPO", "has no attribute")):
        with pytest.raises(ValueError, match=f"PPOConfig.reward_fn '{spec}': .*{message}"):
            build_task(config.replace(reward_fn=[spec], reward_fn_weights=None))
    with pytest.raises(ValueError, match="PPOConfig.dataset and the prompts passed to RLTrainer"):
        build_task(config, prompts=["x"])


def test_reward_fn_path_errors_name_the_function_the_batch_and_the_step(tmp_path, tiny_model_dir, monkeypatch):
    from ppo.run.guards import RewardFunctionError, RewardTypeError
    from ppo.trainer import RLTrainer

    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = PPOConfig(task="custom", dataset=str(write_rows(tmp_path / "train.jsonl")), model_path=str(tiny_model_dir),
                       reward_fn=["my_rewards:count_ones", "my_rewards:broken"], advantage_estimator="rloo",
                       group_size=2, rollout_batch_size=4, response_length=4, total_steps=1, eval_every=0,
                       eval_size=1, progress=False, save_every=0, report_to=[], threads=1, output_dir=str(tmp_path / "run"))
    with pytest.raises(RewardFunctionError, match=r"after step 0: reward_fn my_rewards:count_ones \+ "
                                                  r"my_rewards:broken raised RewardFunctionFailed: my_rewards:broken "
                                                  r"raised ZeroDivisionError: boom while scoring a batch of 1 "):
        RLTrainer(config).train()
    with pytest.raises(RewardTypeError, match="reward_fn my_rewards:wrong_count returned 1 rewards for 4 responses"):
        RLTrainer(config.replace(reward_fn=["my_rewards:wrong_count"], output_dir=str(tmp_path / "run2"))).train()


def test_grpo_on_a_jsonl_dataset_with_a_reward_fn_path_raises_training_reward(tmp_path, tiny_model_dir, monkeypatch):
    """One command: a JSONL file of prompts, a reward function by path, GRPO; the reward rises."""
    from ppo.cli import main

    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    data = write_rows(tmp_path / "prompts.jsonl", [{"prompt": p} for p in ("1+1=", "2+3=", "9+9=", "4+4=")])
    out = tmp_path / "run"
    assert main(["--preset", "grpo", "--model-path", str(tiny_model_dir), "--task", "custom", "--dataset", str(data),
                 "--reward-fn", "my_rewards:count_ones", "--total-steps", "30", "--rollout-batch-size", "32",
                 "--response-length", "8", "--lr", "1e-2", "--eval-every", "0", "--eval-size", "2", "--save-every", "0",
                 "--progress", "false", "--report-to", "none", "--threads", "1", "--output-dir", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"score"' in line]
    first, last = [sum(r["score"] for r in part) / len(part) for part in (rows[:3], rows[-3:])]
    assert last > first + 2.0, (first, last)  # 0 to 8 ones in 8 tokens
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all(s["score"] == float(s["response"].count("1")) for s in samples)

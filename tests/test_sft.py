import pytest
import torch

from ppo.models.sft import SFTConfig, demonstration_batch, train_sft, warm_start
from ppo.tasks.base import Problem
from ppo.models.tiny_model import TinyModelConfig

SMALL = dict(steps=4, batch_size=8, model=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def test_demonstration_batch_labels_only_the_response(char_tokenizer):
    problem = Problem(prompt="1+2=", answer="3", demonstration="1+2=3;#3")
    input_ids, mask, labels = demonstration_batch(char_tokenizer, [problem, Problem("10+20=", "30", demonstration="#30")])
    # row 0: bos + 4 prompt chars, then 8 response chars + eos
    assert labels[0].ne(-100).sum().item() == 9
    assert labels[0, -1].item() == char_tokenizer.eos_token_id
    response_ids = labels[0][labels[0] != -100][:-1].tolist()
    assert char_tokenizer.decode(response_ids) == "1+2=3;#3"
    assert mask.sum(-1).tolist() == [1 + 4 + 9, 1 + 6 + 4]
    # row 1: 3 padding columns, bos + 6 prompt chars, then its 3 response chars + eos as their own labels
    assert input_ids[1, :3].tolist() == [char_tokenizer.pad_token_id] * 3
    assert labels[1, :10].tolist() == [-100] * 10
    assert labels[1, 10:].tolist() == input_ids[1, 10:].tolist()
    assert char_tokenizer.decode(labels[1, 10:-1].tolist()) == "#30"



def test_a_problem_without_a_demonstration_is_named(char_tokenizer):
    problems = [Problem("1+2=", "3", demonstration="#3"), Problem("7+1=", "8")]
    with pytest.raises(ValueError, match=r"problem '7\+1=' has no demonstration"):
        demonstration_batch(char_tokenizer, problems)

def test_sft_is_deterministic_for_a_seed():
    model_a, _ = train_sft(SFTConfig(seed=3, **SMALL), progress=False)
    model_b, _ = train_sft(SFTConfig(seed=3, **SMALL), progress=False)
    model_c, _ = train_sft(SFTConfig(seed=4, **SMALL), progress=False)
    state_a, state_b, state_c = model_a.state_dict(), model_b.state_dict(), model_c.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not all(torch.equal(state_a[k], state_c[k]) for k in state_a)


def test_sft_lowers_the_loss():
    """35 steps bring the demonstration loss below 0.6 of the untrained model's (measured: 0.53;
    25 steps: 0.60)."""
    from ppo.models.sft import sft_loss
    import random

    config = SFTConfig(seed=0, steps=35, batch_size=16, lr=3e-3,
                       model=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128))
    task = config.task()
    tokenizer_batch = None
    model, tokenizer = train_sft(config, progress=False)
    from ppo.models.tiny_model import build_tiny_model

    torch.manual_seed(0)
    untrained = build_tiny_model(config.model, tokenizer)
    tokenizer_batch = demonstration_batch(tokenizer, task.sample_problems(64, random.Random(99)))
    with torch.no_grad():
        assert sft_loss(model, *tokenizer_batch) < 0.6 * sft_loss(untrained, *tokenizer_batch)


def test_warm_start_caches_by_settings(tmp_path):
    config = SFTConfig(seed=1, max_new_tokens=8, **SMALL)
    path = warm_start(config, cache_dir=tmp_path, progress=False)
    assert (path / "sft_info.json").is_file() and (path / "config.json").is_file()
    mtime = (path / "sft_info.json").stat().st_mtime_ns
    assert warm_start(config, cache_dir=tmp_path, progress=False) == path  # cache hit
    assert (path / "sft_info.json").stat().st_mtime_ns == mtime
    other = warm_start(SFTConfig(seed=2, max_new_tokens=8, **SMALL), cache_dir=tmp_path, progress=False)
    assert other != path
    assert not list(tmp_path.glob("sft/*.tmp*"))  # atomic write left nothing behind


def test_sft_config_validation():
    with pytest.raises(ValueError, match="SFTConfig.steps"):
        SFTConfig(steps=0)
    with pytest.raises(ValueError, match="SFTConfig.lr"):
        SFTConfig(lr=-1.0)


def test_stop_after_is_the_full_runs_intermediate_checkpoint(tmp_path):
    """`stop_after` keeps the full run's schedule: stopping at the last step is the full run,
    stopping earlier is a different (less trained) model."""
    full, _ = train_sft(SFTConfig(seed=3, **SMALL), progress=False)
    at_end, _ = train_sft(SFTConfig(seed=3, **SMALL), progress=False, stop_after=4)
    early, _ = train_sft(SFTConfig(seed=3, **SMALL), progress=False, stop_after=2)
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # noqa: E731
    assert same(full, at_end)
    assert not same(full, early)
    with pytest.raises(ValueError, match="stop_after"):
        train_sft(SFTConfig(seed=3, **SMALL), progress=False, stop_after=5)


def test_warm_start_caches_an_earlier_checkpoint_separately(tmp_path):
    from ppo.models.sft import load_sft_info

    config = SFTConfig(seed=1, max_new_tokens=8, **SMALL)
    full = warm_start(config, cache_dir=tmp_path, progress=False)
    weak = warm_start(config, cache_dir=tmp_path, progress=False, stop_after=2)
    assert weak != full and weak.name.endswith("-step2")
    assert load_sft_info(weak)["steps_trained"] == 2 and load_sft_info(full)["steps_trained"] == 4
    assert warm_start(config, cache_dir=tmp_path, progress=False, stop_after=4) == full

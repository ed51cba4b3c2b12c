import os

import pytest
import torch

# Two threads match the 2-core CI machine when one pytest process runs the suite. `make test`
# runs it in one process per core (pytest-xdist, `-n auto`) with PPO_TEST_THREADS=1; set it to 1
# too when other jobs share the cores: oversubscribed torch threads stall each other.
torch.set_num_threads(int(os.environ.get("PPO_TEST_THREADS", "2")))

# The longest files first (short training runs, 2-process runs, sweeps through Ray and
# submitit): under `pytest -n` they then run beside the many short tests instead of leaving
# one worker alone at the end of the suite. The sort is stable: every other test keeps its order.
LONG_FIRST = ("tests/test_training_runs.py", "tests/test_sharding.py", "tests/test_run_directory.py",
              "tests/test_ablation_backends.py", "tests/test_data_parallel.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: 0 if item.nodeid.split("::")[0] in LONG_FIRST else 1)


@pytest.fixture(scope="session")
def char_tokenizer():
    from ppo.models.tiny_model import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, char_tokenizer):
    """A freshly initialised tiny model saved like a hub checkpoint."""
    from ppo.models.tiny_model import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), char_tokenizer)
    path = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path

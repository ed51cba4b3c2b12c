import os

import pytest
import torch

# Two threads match the 2-core CI machine. Set PPO_TEST_THREADS=1 when other jobs share the
# cores: oversubscribed torch threads stall each other and slow everything down many times.
torch.set_num_threads(int(os.environ.get("PPO_TEST_THREADS", "2")))


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

import os

import pytest
import torch

# Two threads match the 2-core CI machine when one pytest process runs the suite. `make test`
# runs it in one process per core (pytest-xdist, `-n auto`) with PPO_TEST_THREADS=1; set it to 1
# too when other jobs share the cores: oversubscribed torch threads stall each other.
# When set, it also caps what the code under test asks for: a trainer sets its config's
# `threads` (default 2), and two such runs on two workers put 4 spinning threads on 2 cores,
# which slows each several times over. Runs launched as subprocesses set their own counts.
TEST_THREADS = os.environ.get("PPO_TEST_THREADS")
torch.set_num_threads(int(TEST_THREADS or 2))
if TEST_THREADS:
    _set_num_threads = torch.set_num_threads
    torch.set_num_threads = lambda n: _set_num_threads(min(int(n), int(TEST_THREADS)))

# Under `pytest -n` (make test: `--dist loadgroup`), the files whose tests launch two processes
# (gloo, accelerate, torchrun; Ray and submitit sweeps) run one after another on one worker: two
# such launches at once on 2 cores put 4 busy-polling processes on them (with these files all
# sorted to the front, the suite took 20 minutes on this machine instead of 12). The short training runs go
# first, so that neither ends up alone at the tail of the suite. The sort is stable.
# The expensive fixtures are session-scoped: under `--dist loadgroup` a worker may run another
# file's tests between two of one file's, and a module-scoped fixture is then built again (the
# 2-process launches of test_sharding and test_data_parallel were, each about a minute).
MULTIPROCESS_FILES = ("tests/test_data_parallel.py", "tests/test_sharding.py", "tests/test_run_directory.py",
                      "tests/test_split_invariance.py", "tests/test_trackers.py", "tests/test_ablation_backends.py")
FIRST_FILES = ("tests/test_training_runs.py",)


@pytest.hookimpl(tryfirst=True)  # before xdist names each grouped test "<id>@<group>" from its mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("::")[0] in MULTIPROCESS_FILES:
            item.add_marker(pytest.mark.xdist_group("multiprocess"))
    items.sort(key=lambda item: 0 if item.nodeid.split("::")[0] in FIRST_FILES else 1)


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


@pytest.fixture
def restored_registry():
    """The shared table of ablations as it was before the test: an ablation file a test loads
    registers itself (`ablations.ablation_files.load_ablation_file`)."""
    from ablations import registry

    before = dict(registry.ABLATIONS)
    yield
    registry.ABLATIONS.clear()
    registry.ABLATIONS.update(before)

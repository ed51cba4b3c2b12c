import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

# Two threads match the 2-core CI machine. Set PPO_TEST_THREADS=1 when other jobs share the
# cores: oversubscribed torch threads stall each other and slow everything down many times.
TEST_THREADS = int(os.environ.get("PPO_TEST_THREADS", "2"))
torch.set_num_threads(TEST_THREADS)

# The testbed's SFT warm start (about 4-5 minutes at 2 threads) is needed only by the tests
# marked `warm_start`. On a fresh clone it is built beside the other tests instead of before
# them: a process started with the session trains it on one thread while the rest of the
# suite runs on the other core, also at one thread; the marked tests (and the `all_threads`
# ones, which assert on torch's thread count) are moved to the end, and the first of them
# switches the build to two threads, waits for it and gives this process its threads back.
# The weights do not depend on the thread count (tests/test_sft.py), so the cache holds
# the same model either way. Measured on the 2-core machine: the other tests took 191 s at
# one thread beside the build (about 160 s alone at two), the build 433 s at one thread
# (245-294 s at two). Before, building side by side at two threads each oversubscribed the
# cores (741 s against 287 + 230-260 s in sequence). PPO_TEST_BACKGROUND_WARM_START=0 turns
# this off: then the first marked test builds the warm start alone.
LATE_MARKERS = ("warm_start", "all_threads")
_builder: dict = {}


def _runs_late(item) -> bool:
    return any(item.get_closest_marker(name) for name in LATE_MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    items[:] = [item for item in items if not _runs_late(item)] + [item for item in items if _runs_late(item)]


def pytest_collection_finish(session):
    if (os.environ.get("PPO_TEST_BACKGROUND_WARM_START", "1") == "0" or "PYTEST_XDIST_WORKER" in os.environ
            or session.config.option.collectonly):
        return
    if not any(item.get_closest_marker("warm_start") for item in session.items):
        return
    from ppo.sft import DEFAULT_CACHE_DIR, SFTConfig

    if (DEFAULT_CACHE_DIR / "sft" / SFTConfig().cache_key() / "sft_info.json").is_file():
        return
    log = tempfile.NamedTemporaryFile("w+", prefix="warm_start_build_", suffix=".log", delete=False)
    builder = Path(__file__).with_name("warm_start_builder.py")
    _builder.update(process=subprocess.Popen([sys.executable, str(builder)], stdout=log, stderr=subprocess.STDOUT,
                                              cwd=builder.parent.parent),
                    log=Path(log.name), set_num_threads=torch.set_num_threads)
    # This process keeps to one core while the build has the other (the trainer sets its
    # config's thread count, so the setter itself is held at one until the build is done).
    torch.set_num_threads = lambda n: _builder["set_num_threads"](1)
    torch.set_num_threads(1)


def _finish_background_build(wait: bool) -> None:
    process = _builder.pop("process", None)
    if process is None:
        return
    torch.set_num_threads = _builder["set_num_threads"]
    torch.set_num_threads(TEST_THREADS)
    if not wait:
        process.terminate()
        process.wait()
        return
    process.send_signal(signal.SIGUSR1)
    if process.wait() != 0:
        tail = _builder["log"].read_text()[-2000:]
        warnings.warn(f"the background warm-start build failed (exit {process.returncode}); the test builds it "
                      f"itself. Its log ({_builder['log']}):\n{tail}")


@pytest.fixture(autouse=True)
def _background_warm_start_done(request):
    """Before a test that needs the warm start or all threads: the background build is finished."""
    if _runs_late(request.node):
        _finish_background_build(wait=True)
    yield


def pytest_sessionfinish(session, exitstatus):
    _finish_background_build(wait=False)  # interrupted before the marked tests: stop the build


@pytest.fixture(scope="session")
def char_tokenizer():
    from ppo.tiny_model import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, char_tokenizer):
    """A freshly initialised tiny model saved like a hub checkpoint."""
    from ppo.tiny_model import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), char_tokenizer)
    path = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path

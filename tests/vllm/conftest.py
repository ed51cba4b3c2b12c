"""The vLLM backend's tests (generation_backend='vllm', ppo/parallel/vllm_sampler.py).

They need vLLM, whose CPU build pins a transformers older than the main environment's, so
`make test` runs them in a second environment, ``.venv-vllm``, as
``pytest -m vllm tests/vllm``; the main run deselects them (setup.cfg addopts). One engine
serves a whole module: vLLM takes seconds to start.
"""

import os

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.vllm)

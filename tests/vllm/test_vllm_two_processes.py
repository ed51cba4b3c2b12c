"""Data parallel with vLLM: two processes, one engine each, each sampling its own prompts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("two_process_worker.py")
TOL = 1e-4  # as in test_vllm_sampler.py


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_each_sample_their_own_prompts_on_their_own_engine(tmp_path):
    pytest.importorskip("vllm")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(WORKER), str(tmp_path)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    first, second = result["ranks"]
    assert (first["rank"], second["rank"], first["world"]) == (0, 1, 2)
    assert first["prompts"] != second["prompts"]  # each rank draws from its own seed
    assert all(len(batch) == 8 for rank in (first, second) for batch in rank["prompts"])  # half the batch each
    assert first["responses"] != second["responses"]
    # Old log-probs are the engines' (logprobs_from_generation): step 1's ratio, the trainer's
    # first pass over them, is 1 up to the sampler-trainer mismatch, and so is step 2's after
    # the engines took the update.
    for step in result["steps"]:
        assert abs(step["ratio_mean"] - 1) < TOL and 0 < step["ratio_max"] - 1 < TOL

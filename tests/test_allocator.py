"""PPOConfig.retain_freed_memory (ppo/speed/allocator.py): glibc keeps freed memory for reuse.

mallopt settings last for the rest of a process and this test process has long since
built trainers, so each check runs in a fresh interpreter."""
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ppo.config import RESUMABLE_FIELDS, PPOConfig

ROOT = Path(__file__).resolve().parents[1]

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")


def _python(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


FAULTS = """
import resource, torch
from ppo.speed import allocator

def faults_per_step():
    def step():  # a step's activations: 1-5 MiB each and one of 40 MiB, then all freed
        kept = [torch.empty((1 + i % 5) << 18).fill_(1.0) for i in range(20)] + [torch.empty(10 << 20).fill_(1.0)]
        del kept
    for _ in range(3):
        step()
    counts = []  # the median step: a one-off growth of the retained pool (1,280 faults once) is not a step's cost
    for _ in range(10):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sorted(counts)[len(counts) // 2]

default = faults_per_step()
took = allocator.retain_freed_memory()
print(default, took, faults_per_step(), allocator.retain_freed_memory())
"""


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


@pytest.mark.slow  # counts page faults over runs: about 17 s (make test-all)
@glibc_only
@pytest.mark.skipif(_huge_pages_always(), reason="with transparent huge pages always on, one fault maps 2 MiB")
def test_retained_memory_is_reused_instead_of_faulted_in_again():
    # 40 MiB is above glibc's largest dynamic mmap threshold (32 MiB): by default it is a
    # fresh mapping every step, each of its 10,240 pages faulting when first written.
    default, took, retained, again = _python(FAULTS).split()
    assert float(default) > 5000
    assert took == "True" and again == "True"
    assert float(retained) < 100


RUN = """
import json, sys
from ppo.speed import allocator
from ppo.config import preset
from ppo.trainer import RLTrainer

def run(retain, out):
    config = preset("alpacafarm", model_path=sys.argv[1], output_dir=out, task="custom", rollout_batch_size=8,
                    response_length=8, total_steps=3, eval_every=0, save_every=0, progress=False, log_samples=0,
                    lr=3e-3, value_init="policy", retain_freed_memory=retain)
    trainer = RLTrainer(config, prompts=["1+1=", "12+3=", "7+70=", "5+5="],
                        reward_fn=lambda prompts, responses: [float(r.count("1")) for r in responses])
    rows = [trainer.train_step() for _ in range(3)]
    weights = sum(float(p.double().sum()) for p in trainer.policy.parameters())
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows], weights, allocator._retaining

# glibc's own settings first: once retained, a process cannot go back
print(json.dumps([run(False, sys.argv[2] + "/a"), run(True, sys.argv[2] + "/b")]))
"""


@pytest.mark.slow  # two runs in fresh processes: about 18 s (make test-all)
@glibc_only
def test_a_run_is_the_same_with_and_without_retained_memory(tmp_path, tiny_model_dir):
    """Exact: the same kernels on the same values, only the addresses of the buffers differ."""
    (plain, plain_weights, plain_retained), (kept, kept_weights, kept_retained) = json.loads(
        _python(RUN, str(tiny_model_dir), str(tmp_path)))
    assert not plain_retained and kept_retained
    for row_plain, row_kept in zip(plain, kept, strict=True):
        assert row_plain.keys() == row_kept.keys()
        for key, value in row_plain.items():
            assert row_kept[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key
    assert kept_weights == pytest.approx(plain_weights, rel=1e-6)


def test_retaining_is_the_default_and_may_change_on_resume():
    assert PPOConfig().retain_freed_memory
    assert "retain_freed_memory" in RESUMABLE_FIELDS

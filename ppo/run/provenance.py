"""Where a run's numbers come from: code, warm start, libraries, threads and machine.

Every `summary.json` carries this record under ``"provenance"`` and every row of a sweep's
`results.csv` repeats it in ``prov_*`` columns, so a table can say which code and which
warm start produced it, and the report refuses to pool rows that disagree on either
(``python -m ablations report --allow-mixed`` pools them anyway, and says so).

Fields: ``commit`` (the git commit of this source tree, or "unknown" outside a checkout),
``dirty`` (uncommitted changes to tracked files), ``warm_start`` (the digest of the starting
policy's weights, `ppo.models.sft.weights_sha256`, first 16 hex digits), ``torch``,
``transformers``, ``python``, ``threads`` (torch intra-op threads of the run), ``cpu``
(the processor's model name), ``processes`` and ``reward_model`` (the digest of the reward
model's weights, the same way as the warm start's, for a run scored by one; "" otherwise).
"""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[2]
# A checkpoint larger than this is identified by its file names and sizes, not hashed.
MAX_HASHED_BYTES = 2 * 1024**3
FIELDS = ("commit", "dirty", "warm_start", "torch", "transformers", "python", "threads", "cpu", "processes",
          "reward_model")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def source_version() -> tuple[str, bool]:
    """(commit, dirty) of the source tree this package runs from; ("unknown", False) outside git."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown", False
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, bool(status)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The processor's model name (Linux /proc/cpuinfo, else `platform.processor()`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.lru_cache(maxsize=16)
def warm_start_id(model_path: str | None) -> str:
    """First 16 hex digits of the weights digest of the checkpoint at `model_path`.

    The digest is `ppo.models.sft.weights_sha256` (tensor names, dtypes, shapes and bytes), so two
    checkpoints with the same id hold bit-identical weights. A checkpoint over
    `MAX_HASHED_BYTES` is named by its files' names and sizes instead ("files:..."), and a
    policy passed in as an object is "in-memory".
    """
    if model_path is None:
        return "in-memory"
    path = Path(model_path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return "unknown"
    import hashlib

    from ppo.models.sft import weights_sha256

    if sum(f.stat().st_size for f in files) > MAX_HASHED_BYTES:
        listing = ";".join(f"{f.name}:{f.stat().st_size}" for f in files)
        return "files:" + hashlib.sha256(listing.encode()).hexdigest()[:16]
    return weights_sha256(path)[:16]


def collect(model_path: str | None, threads: int, processes: int = 1, reward_model_path: str | None = None) -> dict:
    """The provenance record of a run (see the module docstring)."""
    import torch
    import transformers

    commit, dirty = source_version()
    return {"commit": commit, "dirty": dirty, "warm_start": warm_start_id(None if model_path is None else str(model_path)),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "threads": int(threads), "cpu": cpu_model(), "processes": int(processes),
            "reward_model": warm_start_id(str(reward_model_path)) if reward_model_path else ""}

"""Data parallelism: the few collectives the training loop needs, in one place.

With N processes (``torchrun`` / ``accelerate launch``), each rank samples its own prompts,
generates, scores and computes its share of the rollout batch; the model update is kept
identical on every rank by DDP's gradient all-reduce. Everything else that must not depend
on how the batch was split lives here:

- **Global statistics.** Reward and advantage whitening, the batch-scope group std, the
  token count that weights ``token_mean`` micro-batches, the KL controller's input and the
  ``target_kl`` early-stop decision all use statistics over the *whole* rollout batch.
  Whitening can instead take each process's share alone (`whitening_sum`,
  ``PPOConfig.whitening_scope="process"``), as AlpacaFarm's does.
  The math functions in ``gae/`` and ``ppo/algorithm/losses.py`` take an optional ``reduce_sum``
  (`global_sum` below) so they stay pure tensor code and still compute global moments.
- **Metrics** are means over the global batch, reduced in one all-reduce (`GlobalMeans`).
- **Seeds.** `rank_seed` derives each rank's seed from the run's seed; rank 0 keeps the
  run's own seed, so a one-process run is exactly what it was before parallelism.

- **The launcher's death ends the workers** (`watch_launcher`, ppo/parallel/launcher_watch.py). ``kill -9``
  of the torchrun / ``accelerate launch`` process cannot stop its workers; without the watcher
  they would go on training as orphans and write ``summary.json`` into a run nobody watches.
- **One accelerate state per process** (`make_accelerator`): a second trainer in the same
  process with another ``mixed_precision`` is refused with a message saying why.

With one process (no ``torch.distributed`` group) every function is the identity, so the
loop reads the same either way.
"""

from __future__ import annotations

import gc
import hashlib
import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from ppo.parallel.launcher_watch import LAUNCHER_POLL_SECONDS, launched_as_worker, watch_launcher  # noqa: F401 (public here)


def make_accelerator(config):
    """The run's `accelerate.Accelerator` (looked up on each call: tests swap in their own),
    with a clear error when this process already runs another precision."""
    from accelerate import Accelerator

    watch_launcher()
    try:
        return Accelerator(cpu=config.device == "cpu", mixed_precision=config.mixed_precision)
    except ValueError as error:
        if "already been initialized" not in str(error):
            raise
        from accelerate.state import AcceleratorState

        current = AcceleratorState().mixed_precision
        raise ValueError(
            f"PPOConfig.mixed_precision={config.mixed_precision!r}: this process already set up accelerate with "
            f"mixed_precision={current!r} (an earlier RLTrainer), and accelerate keeps one precision per process. "
            "Run this trainer in its own process, or, once the earlier trainer is no longer used, call "
            "accelerate.state.AcceleratorState._reset_state(True) first") from None


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main_process() -> bool:
    return rank() == 0


def rank_seed(seed: int, process_rank: int) -> int:
    """The seed of one rank: `seed` itself on rank 0, a hash of (seed, rank) elsewhere.

    Hashing instead of ``seed + rank`` keeps ranks of one run from colliding with other
    runs' seeds (seed 0 rank 1 must not sample what seed 1 rank 0 samples).
    """
    if process_rank == 0:
        return seed
    digest = hashlib.sha256(f"ppo-details/{seed}/{process_rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**63 - 1)


def _collective_device() -> torch.device:
    """NCCL reduces GPU tensors only; gloo (CPU runs) reduces CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(values: torch.Tensor, op) -> torch.Tensor:
    if not is_distributed():
        return values
    result = values.detach().to(_collective_device(), copy=True)
    dist.all_reduce(result, op=op)
    return result.to(values.device)


def global_sum(values: torch.Tensor) -> torch.Tensor:
    """Elementwise sum of `values` over all ranks (a new tensor; the input is untouched)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def whitening_sum(scope: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The `reduce_sum` reward and advantage whitening take (`PPOConfig.whitening_scope`):
    `global_sum` for ``"global"`` (the statistics of the whole rollout batch, however many
    processes hold it), None for ``"process"`` (each process's share alone: AlpacaFarm's
    ``torch_ops.whiten`` runs on each of its 8 processes' rollouts with no all-reduce)."""
    if scope not in ("global", "process"):
        raise ValueError(f"whitening scope must be 'global' or 'process', got {scope!r}")
    return global_sum if scope == "global" else None


def global_max(values: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of `values` over all ranks."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def global_mean(values: torch.Tensor) -> float:
    """Mean of every element of `values` on every rank (ranks may hold different counts)."""
    moments = global_sum(torch.stack([values.detach().double().sum(),
                                      torch.tensor(values.numel(), dtype=torch.float64, device=values.device)]))
    return float(moments[0] / moments[1]) if moments[1] > 0 else float("nan")


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank when `flag` is True on at least one (keeps decisions in step)."""
    return bool(global_sum(torch.tensor([float(flag)], device=device))[0] > 0)


def gather_objects(values: list[Any]) -> list[Any]:
    """Concatenate a list of picklable objects from every rank, in rank order."""
    if not is_distributed():
        return list(values)
    per_rank: list[list[Any] | None] = [None] * world_size()
    dist.all_gather_object(per_rank, list(values))
    return [item for chunk in per_rank for item in chunk]


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value` on every rank."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def broadcast_tensors_(tensors) -> None:
    """Overwrite each tensor in place with rank 0's (what DDP does to a model it wraps)."""
    if not is_distributed():
        return
    with torch.no_grad():
        for tensor in tensors:
            sent = tensor.detach().to(_collective_device(), copy=True)
            dist.broadcast(sent, src=0)
            tensor.copy_(sent)


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group at the end of a run: every rank waits for the others, then
    the group is destroyed. A rank that exits with its group alive tears the group's
    communication threads down during interpreter exit, while another rank may still be
    talking to it, which can abort that process (SIGABRT, "terminate called without an
    active exception") after a run that finished correctly. No group: nothing to do.

    Garbage is collected first: a finished trainer's DDP wrappers hold the group's backend,
    and while anything holds it `destroy_process_group` cannot end the gloo threads, which
    then die at interpreter exit with the same abort (seen in about one 2-process run in
    four before this collection). Callers drop their trainers before calling this."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        barrier()
    while _closers:  # a vLLM engine tears down its own groups, and the default one with them
        _closers.pop()()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_closers: list[Callable[[], None]] = []


def close_before_shutdown(close: Callable[[], None]) -> None:
    """Have `shutdown` call `close` after the last barrier and before the group goes: for
    what holds process groups of its own (ppo/parallel/vllm_sampler.py), whose teardown at
    interpreter exit would find the groups already destroyed."""
    _closers.append(close)


class GlobalMeans:
    """Means over the whole (global) batch, reduced across ranks in a single all-reduce.

    Each entry is a (sum, count) pair; `result()` sums both over ranks and divides, so a
    metric is the same whether one process holds the batch or N processes hold a part each.
    A metric whose count is 0 everywhere (e.g. the length of correct answers when none
    was correct) is NaN.

    >>> means = GlobalMeans()
    >>> means.add("score", torch.tensor([1.0, 0.0, 1.0]))
    >>> means.add("length_correct", torch.tensor([4.0, 9.0, 6.0]), torch.tensor([1.0, 0.0, 1.0]))
    >>> means.result()
    {'score': 0.6666666666666666, 'length_correct': 5.0}
    """

    def __init__(self):
        # name -> [weighted sum, weight], each a float64 tensor or a Python float: a step adds
        # about 60 of them, so each add is kept to one or two small ops
        self._totals: dict[str, list] = {}

    def add(self, name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add every element of `values` (those where `mask` is nonzero, weighted by it)."""
        values = values.detach()
        if mask is None:
            self.add_weighted(name, values.sum(dtype=torch.float64), float(values.numel()))
            return
        weights = mask.detach().double().expand_as(values)
        self.add_weighted(name, (values.double() * weights).sum(), weights.sum())

    def add_weighted(self, name: str, weighted_sum: torch.Tensor | float, weight: torch.Tensor | float) -> None:
        """Add a pre-weighted sum and its total weight (accumulates if `name` exists)."""
        total = self._totals.get(name)
        if total is None:
            self._totals[name] = [weighted_sum, weight]
        else:
            total[0], total[1] = total[0] + weighted_sum, total[1] + weight

    def result(self) -> dict[str, float]:
        if not self._totals:
            return {}
        flat = [x for pair in self._totals.values() for x in pair]
        tensors = [x for x in flat if torch.is_tensor(x)]
        device = tensors[0].device if tensors else torch.device("cpu")
        if tensors:  # one copy off the device for all of them
            read = iter(torch.stack([x.to(device, torch.float64).reshape(()) for x in tensors]).tolist())
            flat = [next(read) if torch.is_tensor(x) else float(x) for x in flat]
        stacked = global_sum(torch.tensor(flat, dtype=torch.float64, device=device)).view(-1, 2)
        return {name: float(s / w) if w > 0 else float("nan") for name, (s, w) in zip(self._totals, stacked.tolist())}

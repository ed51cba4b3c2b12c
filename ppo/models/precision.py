"""Numeric precision: master-weight dtype, one autocast context for every model, fp16 loss scaling.

Implementation details that live here:

- **fp32 master weights** (`PPOConfig.model_dtype`, `master_dtype`): transformers loads a
  bf16 checkpoint in bf16 by default. Adam updates of size lr ~ 1e-6 are far below bf16's
  resolution (8 bits of mantissa: a weight of 0.02 moves in steps of ~1e-4), so almost
  every update rounds away: 18 of 74,048 weights changed in 2 steps at lr 1e-6. Weights
  stay float32 by default and low precision comes from autocast (`mixed_precision`).
- **The same precision context for policy, reference and reward model**
  (`prepare_frozen`): accelerate wraps the forward of every model that passes through
  ``prepare`` in autocast. A frozen model that does not would run in fp32 while the policy
  runs in bf16, and the two disagree on identical weights: a fake KL at step 1 (k1 of
  0.0038 where policy == reference), which ``kl_clip_at_zero`` turns into a positive bias.
- **One loss scaler, unscaled once per step** (`clip_grad_norms`, `step_optimizers`): with
  fp16 a `GradScaler` multiplies the loss; gradients must be divided back exactly once
  before clipping. Policy and critic have separate optimizers by default, and clipping each
  through ``accelerator.clip_grad_norm_`` unscales *all* optimizers each time, so the second
  call raises. Stepping each optimizer through accelerate also calls ``scaler.update()``
  after the first one, which resets the scaler's record and makes the second step divide
  the critic's gradients by the scale again. Here each optimizer is unscaled once, each
  group clipped on its own norm, every optimizer stepped, then the scaler updated once
  (the multi-optimizer recipe of the torch AMP docs). An overflow (inf gradients) is the
  scaler's to handle, by skipping that step and lowering its scale, so under loss scaling
  the non-finite guard checks the loss only (`loss_scaling`).
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": None}


def master_dtype(name: str) -> torch.dtype | None:
    """`PPOConfig.model_dtype` as a torch dtype; None for "auto" (as the checkpoint saved it)."""
    if name not in MODEL_DTYPES:
        raise ValueError(f"PPOConfig.model_dtype: expected one of {list(MODEL_DTYPES)}, got {name!r}")
    return MODEL_DTYPES[name]


def cast_master_weights(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """Cast an already built model's floating-point weights to `model_dtype` (no-op for "auto")."""
    dtype = master_dtype(name)
    return model.to(dtype) if dtype is not None else model


def prepare_frozen(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Place a frozen model (reference, reward model) on the device and give its forward
    the same autocast wrapper the policy got from ``accelerator.prepare``.

    ``evaluation_mode=True`` skips the DDP wrapper (nothing to synchronise in a model that
    is never trained) but keeps the mixed-precision wrapper.
    """
    return accelerator.prepare_model(model, evaluation_mode=True)


def _raw(optimizer):
    """The torch optimizer inside accelerate's wrapper."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def loss_scaling(accelerator) -> bool:
    """Whether fp16 loss scaling is on: then a non-finite gradient is an overflow that
    ``scaler.step`` answers by skipping the step and lowering the scale, not an error."""
    return getattr(accelerator, "scaler", None) is not None


def clip_scale(max_norm: float, total_norm: float) -> float:
    """The factor ``clip_grad_norm_`` multiplies gradients by: min(1, max_norm / (norm + 1e-6))."""
    return min(1.0, max_norm / (total_norm + 1e-6))


def grad_norm(parameters: list[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients of `parameters` together (parameters without one skipped),
    in float32 (half-precision squares overflow)."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    return float(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).norm()) if grads else 0.0


def clip_grad_norms(accelerator, optimizers: list, parameter_groups: list[list[torch.nn.Parameter]],
                    max_norm: float, joint: bool = False) -> list[float]:
    """Unscale fp16 gradients once, then clip each parameter group on its own L2 norm, or
    (`joint`: one optimizer over policy and critic, AlpacaFarm's layout) all groups together
    on their joint norm, as one ``clip_grad_norm_`` call over their concatenation would.

    Returns each group's norm before clipping. Float32 gradients of one device, unsharded
    (one process or DDP, whose gradients are already averaged), take `_clip_local`: one
    pass of per-tensor norms serves every group's norm and the joint one. Otherwise each
    call is accelerate's own ``clip_grad_norm_`` (which also knows FSDP and DeepSpeed), except
    for this project's own sharded models (`PPOConfig.sharding`), whose shards take `_clip_sharded`.
    """
    scaler = accelerator.scaler if loss_scaling(accelerator) else None
    if scaler is not None:
        for optimizer in optimizers:
            scaler.unscale_(_raw(optimizer))
    grads = [[p.grad for p in group if p.grad is not None] for group in parameter_groups]
    if any(isinstance(g, DTensor) for group in grads for g in group):
        return _clip_sharded(grads, max_norm, joint)
    if _local_float32(accelerator, [g for group in grads for g in group]):
        return _clip_local(grads, max_norm, joint)
    clip = accelerator.clip_grad_norm_ if scaler is None else torch.nn.utils.clip_grad_norm_
    if not joint:
        return [float(clip(group, max_norm)) for group in parameter_groups]
    total = float(clip([p for group in parameter_groups for p in group], max_norm))
    scale = clip_scale(max_norm, total)  # what clipping multiplied every gradient by
    return [grad_norm(group) / scale if scale > 0 else math.inf for group in parameter_groups]


def _local_float32(accelerator, grads: list[torch.Tensor]) -> bool:
    from accelerate.utils import DistributedType

    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.XLA)
    return (not sharded and bool(grads) and all(type(g) is torch.Tensor for g in grads)
            and len({(g.device, g.dtype) for g in grads}) == 1 and grads[0].dtype == torch.float32)


def _clip_local(grads: list[list[torch.Tensor]], max_norm: float, joint: bool) -> list[float]:
    """`clip_grad_norm_`'s arithmetic (norm of the per-tensor norms; gradients times
    min(1, max_norm / (norm + 1e-6))) from one ``_foreach_norm`` over every group, the
    multiply skipped where that factor is 1 (a multiply by 1.0 changes nothing)."""
    flat = [g for group in grads for g in group]
    per_tensor = torch._foreach_norm(flat, 2)
    sizes = [len(group) for group in grads]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    norms = [torch.linalg.vector_norm(torch.stack(per_tensor[start:start + size]), 2) if size else torch.zeros(())
             for start, size in zip(starts, sizes)]
    if joint:  # one clip over the concatenation: the norm of every per-tensor norm
        clipped = [(torch.linalg.vector_norm(torch.stack(per_tensor), 2), flat)]
    else:
        clipped = list(zip(norms, grads))
    for total, group in clipped:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if group and float(coef) < 1.0:
            torch._foreach_mul_(group, coef)
    return [float(n) for n in norms]


def _clip_sharded(grads: list[list[torch.Tensor]], max_norm: float, joint: bool) -> list[float]:
    """`_clip_local` for FSDP's sharded gradients (sharding="fsdp"): each rank sums the squares
    of its own shards, one all-reduce makes the whole norms, and each rank scales its shards."""
    from ppo.parallel.distributed import global_sum

    shards = [[g.to_local() for g in group] for group in grads]
    squares = torch.stack([torch.stack(torch._foreach_norm(group, 2, dtype=torch.float32)).double().square().sum()
                           if group else torch.zeros((), dtype=torch.float64) for group in shards])
    norms = global_sum(squares).sqrt()  # [groups]
    totals = [norms.square().sum().sqrt()] * len(shards) if joint else list(norms)
    with torch.no_grad():
        for total, group in zip(totals, shards):
            coef = min(1.0, max_norm / (float(total) + 1e-6))
            if group and coef < 1.0:
                torch._foreach_mul_(group, coef)
    return [float(n) for n in norms]


def step_optimizers(accelerator, optimizers: list) -> None:
    """Step every optimizer, then update the loss scaler once; zero the gradients.

    With a scaler, ``scaler.step`` skips an optimizer's step when its gradients hold inf or
    NaN (fp16 overflow) and the single ``update`` then lowers the scale.
    """
    scaler = getattr(accelerator, "scaler", None)
    for optimizer in optimizers:
        if scaler is None:
            _step(optimizer)
        else:
            scaler.step(_raw(optimizer))
    if scaler is not None:
        scaler.update()
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)


def _step(optimizer) -> None:
    """``optimizer.step()``, skipping accelerate's wrapper where all it would do is call the
    torch optimizer's step (no loss scaler, no XLA all-reduce, gradients synchronised): the
    wrapper looks up on every call whether an optional package is installed."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DistributedType

    if (type(optimizer) is AcceleratedOptimizer and optimizer.scaler is None and optimizer.gradient_state.sync_gradients
            and optimizer.accelerator_state.distributed_type != DistributedType.XLA):
        optimizer.optimizer.step()
    else:
        optimizer.step()

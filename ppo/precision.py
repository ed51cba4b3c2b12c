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
  (the multi-optimizer recipe of the torch AMP docs).
"""

from __future__ import annotations

import torch

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


def clip_grad_norms(accelerator, optimizers: list, parameter_groups: list[list[torch.nn.Parameter]],
                    max_norm: float) -> list[float]:
    """Unscale fp16 gradients once, then clip each parameter group on its own L2 norm.

    Returns each group's norm before clipping. Without a loss scaler this is accelerate's
    own ``clip_grad_norm_`` per group (which also knows FSDP and DeepSpeed).
    """
    scaler = getattr(accelerator, "scaler", None)
    if scaler is None:
        return [float(accelerator.clip_grad_norm_(group, max_norm)) for group in parameter_groups]
    for optimizer in optimizers:
        scaler.unscale_(_raw(optimizer))
    return [float(torch.nn.utils.clip_grad_norm_(group, max_norm)) for group in parameter_groups]


def step_optimizers(accelerator, optimizers: list) -> None:
    """Step every optimizer, then update the loss scaler once; zero the gradients.

    With a scaler, ``scaler.step`` skips an optimizer's step when its gradients hold inf or
    NaN (fp16 overflow) and the single ``update`` then lowers the scale.
    """
    scaler = getattr(accelerator, "scaler", None)
    for optimizer in optimizers:
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(_raw(optimizer))
    if scaler is not None:
        scaler.update()
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)

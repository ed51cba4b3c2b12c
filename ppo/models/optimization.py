"""The optimizers of a run: AdamW over the policy and the critic, the learning-rate schedule,
and one optimizer step (gradient norms and clipping, the non-finite guards, the step).

Implementation details that live here:

- **One AdamW over policy and critic, or one each** (`PPOConfig.separate_value_optimizer`,
  `build_optimizers`). AlpacaFarm and TRL step one optimizer over both models, the critic's
  parameters in a group of their own so that `value_lr` still applies to them; this project
  gives the critic its own AdamW by default.
- **Clipping on the joint norm or on each model's own** (`PPOConfig.max_grad_norm`,
  `optimizer_step`). With one shared optimizer the clip uses the joint norm of both models
  (AlpacaFarm), so a large critic gradient scales the policy's step down as well; with
  separate optimizers each model is clipped on its own norm.
- **The learning-rate schedule** (`PPOConfig.lr_schedule`, `build_lr_scheduler`):
  transformers' schedules, advanced once per RL step as AlpacaFarm does.
- **Critic warm-up** (`PPOConfig.critic_warmup_steps`, `optimizer_step(train_policy=False)`):
  the policy's gradients are dropped before the step, so AdamW skips its parameters (no
  update, no moment or step-count change) even when one optimizer holds both models.
- **Fused AdamW** (`adamw_kernel`, exact): the whole update in one kernel per parameter
  group, equal to the loop over parameters to float rounding (tests/test_lean_forward.py).

Mixed-precision unscaling and the norm pass itself are ppo/models/precision.py's; what stops a run
on a NaN is ppo/run/guards.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ppo.run import guards
from ppo.models.precision import clip_grad_norms, clip_scale, loss_scaling, step_optimizers


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters the optimizer updates (LoRA freezes the base weights: no Adam state for them)."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw_kernel(models: list) -> dict:
    """``{"fused": True}`` when torch's fused AdamW handles every trainable parameter (float
    dtypes; one kernel per parameter group), else ``{"foreach": True}`` (one kernel per state
    tensor kind)."""
    dtypes = {p.dtype for model in models if model is not None for p in trainable(model)}
    if dtypes <= {torch.float16, torch.bfloat16, torch.float32, torch.float64}:
        return {"fused": True}
    return {"foreach": True}


@dataclass
class Optimizers:
    """A run's optimizers and learning-rate schedules (built by `ppo.models.setup.build_models`).

    `policy` is the policy's AdamW (the critic's parameters a second group of it when there is
    no `value` optimizer: `separate_value_optimizer` False), as accelerate prepared it;
    `schedulers` step once per RL step; `parameters` are the policy's and the critic's
    parameters (empty without a critic), for clipping and the finiteness guard, looked up
    once (checkpoints load into them).
    """

    policy: torch.optim.Optimizer
    value: torch.optim.Optimizer | None
    schedulers: list
    parameters: list[list[torch.nn.Parameter]]

    def step(self, accelerator, max_grad_norm: float | None, step: int, loss: float | None = None,
             train_policy: bool = True) -> dict[str, float]:
        """One optimizer step of both models (`optimizer_step`); the gradient norms before clipping."""
        return optimizer_step(accelerator, self.policy, self.value, self.parameters, max_grad_norm, step, loss,
                              train_policy=train_policy)

    def step_schedules(self) -> None:
        """Advance every learning-rate schedule by one RL step."""
        for scheduler in self.schedulers:
            scheduler.step()

    @property
    def lr(self) -> float:
        """The policy's learning rate now (its first parameter group's)."""
        return self.policy.param_groups[0]["lr"]

    def all(self) -> list[torch.optim.Optimizer]:
        """The optimizers that exist: the policy's, and the critic's own when it has one."""
        return [o for o in (self.policy, self.value) if o is not None]


def build_optimizers(config, policy: torch.nn.Module, value_model: torch.nn.Module | None):
    """``(policy_optimizer, value_optimizer)``: AdamW over the policy, and over the critic
    either its own (`separate_value_optimizer`, the default) or none, the critic then being
    a second group of the policy's optimizer (AlpacaFarm, TRL) with `value_lr` still its own."""
    adam = dict(betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps, weight_decay=config.weight_decay, **adamw_kernel([policy, value_model]))
    if value_model is None:
        return torch.optim.AdamW(trainable(policy), lr=config.lr, **adam), None
    value_lr = config.value_lr if config.value_lr is not None else config.lr
    if config.separate_value_optimizer:
        return (torch.optim.AdamW(trainable(policy), lr=config.lr, **adam),
                torch.optim.AdamW(trainable(value_model), lr=value_lr, **adam))
    groups = [{"params": trainable(policy), "lr": config.lr}, {"params": trainable(value_model), "lr": value_lr}]
    return torch.optim.AdamW(groups, **adam), None


def build_lr_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """transformers' schedule, advanced once per RL step (as AlpacaFarm does).

    'linear' is `get_linear_schedule_with_warmup`, piecewise: lr * s / warmup for s < warmup
    (step 0 trains at 0), the full lr at s = warmup, then linear to 0 at `total_steps`.
    'constant' is `get_constant_schedule_with_warmup`.
    """
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    if schedule == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    return get_constant_schedule_with_warmup(optimizer, warmup_steps)


def optimizer_step(accelerator, policy_optimizer, value_optimizer, parameters: list[list[torch.nn.Parameter]],
                   max_grad_norm: float | None, step: int, loss: float | None = None,
                   train_policy: bool = True) -> dict[str, float]:
    """Clip the gradients, step the optimizer(s) and zero the gradients; return the gradient
    norms before clipping. `parameters` are the policy's and the critic's (empty without one);
    `step` is the step being taken, for the guards' messages.

    A non-finite `loss` (the minibatch's weighted loss) or gradient norm stops the run before
    the step, and a non-finite weight after it (ppo/run/guards.py).

    ``policy_grad_norm`` / ``value_grad_norm`` are each model's L2 gradient norm before
    clipping; ``policy_grad_scale`` is the factor clipping multiplied the policy's gradient by
    (1 = not clipped). Worked example: one shared optimizer, gradient norms 3 (policy) and 4
    (critic), `max_grad_norm` 1: the joint norm is 5, so both gradients are multiplied by 1/5
    and ``policy_grad_scale`` is 0.2; with separate optimizers the policy's is 1/3.
    `train_policy` False (critic warm-up) leaves the policy's weights and Adam state as they are.
    """
    policy_params, value_params = parameters
    if not train_policy:
        # None, not zero: AdamW skips a parameter without a gradient entirely, where a zero
        # gradient would still advance its step count and decay its moments.
        for param in policy_params:
            param.grad = None
    # No clipping = clipping at infinity: the same call still unscales mixed-precision
    # gradients and returns the norm, and multiplies by 1.
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    metrics = {}
    optimizers = [o for o in (policy_optimizer, value_optimizer) if o is not None]
    if value_params and value_optimizer is None:  # one optimizer: one joint norm (AlpacaFarm)
        metrics["policy_grad_norm"], metrics["value_grad_norm"] = clip_grad_norms(
            accelerator, optimizers, [policy_params, value_params], max_norm, joint=True)
        scale = clip_scale(max_norm, math.hypot(metrics["policy_grad_norm"], metrics["value_grad_norm"]))
    else:  # each model clipped on its own norm; fp16 gradients unscaled once for both
        norms = clip_grad_norms(accelerator, optimizers, [policy_params] + ([value_params] if value_params else []),
                                max_norm)
        metrics["policy_grad_norm"] = norms[0]
        scale = clip_scale(max_norm, metrics["policy_grad_norm"])
        if value_params:
            metrics["value_grad_norm"] = norms[1]
    metrics["policy_grad_scale"] = scale
    # Before the step: a NaN loss or gradient would make every weight NaN. With fp16 loss
    # scaling a non-finite gradient is an overflow the scaler answers (it skips this step
    # and lowers its scale), so there only the loss is checked.
    checked = {} if loss_scaling(accelerator) else {k: v for k, v in metrics.items() if k.endswith("grad_norm")}
    guards.check_update(checked if loss is None else {"loss": loss, **checked}, step)
    step_optimizers(accelerator, optimizers)
    guards.check_parameters(policy_params + value_params, step)
    return metrics

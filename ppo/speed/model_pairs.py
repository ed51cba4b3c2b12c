"""Two models of the same architecture and shapes run as one (PPOConfig.paired_critic_pass).

PPO trains a policy and a critic that are, on the testbed and in the usual setups, the same
network with different weights and heads. On small models each of their passes is a chain
of small kernels, so ppo/speed/lean_forward.py runs a batch's update pass through both at once:
`Stacked` reads the pair's weights stacked, ``[2, ...]``, and the lean layer code turns each
product into one batched product over the two models. `same_architecture` decides when that
computes exactly what the two passes compute. The same idea as PyTorch's model-ensembling
recipe (`torch.func.stack_module_state` with `vmap`).

`side_by_side` stores the pair's parameters in one ``[2, N]`` tensor (the first model's in its
first row, each twin at the same place in the second), so a pass reads each pair's stacked
weights as a view of the two rows instead of copying them with ``torch.stack``
(`_SideBySide`); a pair that is not stored so (a copy of one model, a model moved to another
device) is stacked by copying, with the same result.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class Stacked:
    """Two backbones of the same architecture and shapes read as one (PPOConfig.paired_critic_pass).

    A parameter reads as both models' stacked, ``[2, ...]`` (with autograd: each model's
    gradient is its half of the stacked one's): a view when `side_by_side` stored the pair in
    one tensor, else through ``torch.stack``; a submodule holding parameters as the pair of
    both; anything else (sizes, the activation, the rotary tables) as the first model's, which
    `same_architecture` found equal to the second's. So the same layer code (`_gpt2_hidden`,
    `_llama_hidden`) runs a batch whose first half goes through the first model and second
    half through the second: the products become batched products over the two (`_conv1d`,
    `_linear`), the norms apply each half's weights, and every other kernel runs once over
    both halves.

    The pair must compute alike (`same_architecture`): only the first model's plain
    attributes are read. `views` maps a first-model parameter to its stacked view; the pair
    at the top builds it once per pass (`stacked_views`) and hands it to its submodules."""

    def __init__(self, first: nn.Module, second: nn.Module, markers: tuple[str, ...] = (),
                 views: dict[int, torch.Tensor] | None = None):
        self._first, self._second = first, second
        self._views = stacked_views(first, second) if views is None else views
        for name in markers:  # instance attributes read from the pair as from the first (ppo.speed.lean_forward's switches)
            self.__dict__[name] = first.__dict__.get(name)

    def __getattr__(self, name: str):
        attribute = getattr(self._first, name)
        if isinstance(attribute, nn.Parameter):
            view = self._views.get(id(attribute))
            return view if view is not None else torch.stack([attribute, getattr(self._second, name)])
        if isinstance(attribute, nn.ModuleList):
            pair = [Stacked(a, b, views=self._views) for a, b in zip(attribute, getattr(self._second, name))]
        elif isinstance(attribute, nn.Module) and _holds_parameters(attribute):
            pair = Stacked(attribute, getattr(self._second, name), views=self._views)
        else:
            return attribute
        # A submodule pair is looked up once per pass: a later read finds it in __dict__ and
        # skips this method. (Parameters are not kept: each pass makes its own views.)
        self.__dict__[name] = pair
        return pair


def side_by_side(first: nn.Module, second: nn.Module) -> None:
    """Store the parameters of `first` and their twins in `second` (same names and shapes:
    `same_architecture`) in one new ``[2, N]`` tensor per dtype: the first model's in its first
    row, each twin in the second row at the same column, each parameter a view. The values,
    the Parameter objects (so optimizers and tied weights) and the state dicts are unchanged,
    and each model's parameters stay together in one block as after loading; only where the
    numbers live moves, so that `Stacked` reads each pair's stacked weights as a view of the
    two rows instead of a copy. A later ``load_state_dict`` copies into the views."""
    pairs = list(zip((p for _, p in first.named_parameters()), (p for _, p in second.named_parameters())))
    with torch.no_grad():
        for dtype in {a.dtype for a, _ in pairs}:
            group = [(a, b) for a, b in pairs if a.dtype == dtype]
            rows = torch.empty(2, sum(a.numel() for a, _ in group), dtype=dtype, device=group[0][0].device)
            start = 0
            for a, b in group:
                both = rows[:, start:start + a.numel()]
                both[0].copy_(a.reshape(-1))
                both[1].copy_(b.reshape(-1))
                a.data, b.data = both[0].view(a.shape), both[1].view(b.shape)
                start += a.numel()
    _TWIN_PLANS.pop(first, None)  # the twins are new: `stacked_views` works them out again


def _twin_offset(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """How many elements after `a` its twin `b` starts in their shared storage, when both are
    contiguous and do not overlap (`side_by_side`); None otherwise."""
    if not (a.is_contiguous() and b.is_contiguous() and a.shape == b.shape and a.dtype == b.dtype
            and a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()):
        return None
    gap = b.storage_offset() - a.storage_offset()
    return gap if gap >= a.numel() else None


class _SideBySide(torch.autograd.Function):
    """Parameter pairs stored in one storage read as their stacked ``[2, ...]`` views: the
    forward copies nothing, and each model's gradient is its half of the view's gradient.
    Inputs: the offsets from each first-model parameter to its twin, then the first model's
    parameters, then the second's, in the same order."""

    @staticmethod
    def forward(ctx, gaps, *parameters):
        ctx.set_materialize_grads(False)
        firsts = parameters[:len(parameters) // 2]
        return tuple(a.detach().as_strided((2, *a.shape), (gap, *a.stride()), a.storage_offset())
                     for a, gap in zip(firsts, gaps))

    @staticmethod
    def backward(ctx, *grads):
        return ((None,) + tuple(None if g is None else g[0] for g in grads)
                + tuple(None if g is None else g[1] for g in grads))


def stacked_views(first: nn.Module, second: nn.Module) -> dict[int, torch.Tensor]:
    """``{id(first-model parameter): [2, ...] view}`` for every pair stored side by side, made
    by one `_SideBySide` call (one autograd node for the pass); other pairs are not in it."""
    plan = _twin_plan(first, second)
    if not plan.gaps:
        return {}
    views = _SideBySide.apply(plan.gaps, *plan.firsts, *plan.seconds)
    views = (views,) if torch.is_tensor(views) else views  # one output comes back bare
    return dict(zip(plan.ids, views))


class _TwinPlan:
    """The twin parameters of a pair stored side by side and their offsets, as `stacked_views`
    reads them. Walking both models' parameters and checking every twin's layout took 0.5 ms
    a pass on the identical-work GPT-2 pair, so the plan is kept per first model while it is
    still true: the same second model, each twin still the parameter its module holds under
    its name, and every twin's data where it was. Moving or replacing a model's data or a
    parameter makes a new plan; a parameter added later is not in the plan and is stacked by
    copying (`Stacked`)."""

    def __init__(self, first: nn.Module, second: nn.Module):
        self.second = weakref.ref(second)
        twins = [(a, b, gap) for (_, a), (_, b) in zip(first.named_parameters(), second.named_parameters())
                 if (gap := _twin_offset(a, b)) is not None]
        self.firsts = tuple(a for a, _, _ in twins)
        self.seconds = tuple(b for _, b, _ in twins)
        self.gaps = tuple(gap for _, _, gap in twins)
        self.ids = tuple(id(a) for a in self.firsts)
        # each twin's module's parameter dict and name (the dict, not the module: the plan must
        # not keep the models alive, as it lives in a weak-keyed table)
        owners = {id(p): (module._parameters, name) for model in (first, second) for module in model.modules()
                  for name, p in module._parameters.items() if p is not None}
        self.owners = tuple(owners[id(p)] for p in self.firsts + self.seconds)
        self.addresses = self._addresses()

    def _addresses(self) -> tuple:
        return tuple((a.data_ptr(), b.data_ptr(), a.shape, a.stride(), b.stride())
                     for a, b in zip(self.firsts, self.seconds))

    def holds(self, second: nn.Module) -> bool:
        return (self.second() is second
                and all(parameters.get(name) is p
                        for (parameters, name), p in zip(self.owners, self.firsts + self.seconds))
                and self.addresses == self._addresses())


_TWIN_PLANS: "weakref.WeakKeyDictionary[nn.Module, _TwinPlan]" = weakref.WeakKeyDictionary()


def _twin_plan(first: nn.Module, second: nn.Module) -> _TwinPlan:
    plan = _TWIN_PLANS.get(first)
    if plan is None or not plan.holds(second):
        plan = _TWIN_PLANS[first] = _TwinPlan(first, second)
    return plan


def _holds_parameters(module: nn.Module) -> bool:
    """Whether `module` or a module under it has a parameter, as ``next(module.parameters(), None)``
    tells (a name registered as None is no parameter), without its generator walk."""
    return (any(p is not None for p in module._parameters.values())
            or any(child is not None and _holds_parameters(child) for child in module._modules.values()))


def _settings(module: nn.Module) -> dict:
    """What a module's forward reads besides tensors: its plain attributes (sizes, eps, scaling)."""
    return {key: value for key, value in vars(module).items()
            if isinstance(value, (int, float, str, tuple)) and not key.startswith("_") and key != "training"}


def same_architecture(first: nn.Module, second: nn.Module) -> bool:
    """Whether two backbones compute the same function of their own weights: the same module
    tree and classes, parameters of the same shapes, dtypes and devices, the same plain
    settings (eps, head sizes, scaling) and equal buffers (rotary tables)."""
    modules, others = dict(first.named_modules()), dict(second.named_modules())
    if modules.keys() != others.keys():
        return False
    for name, module in modules.items():
        other = others[name]
        if type(module) is not type(other) or _settings(module) != _settings(other):
            return False
        pairs = [(module._parameters, other._parameters), (module._buffers, other._buffers)]
        for own, their in pairs:
            if own.keys() != their.keys():
                return False
            for key, tensor in own.items():
                twin = their[key]
                if (tensor is None) != (twin is None):
                    return False
                if tensor is not None and (tensor.shape != twin.shape or tensor.dtype != twin.dtype
                                           or tensor.device != twin.device):
                    return False
        if any(not torch.equal(buffer, others[name]._buffers[key])
               for key, buffer in module._buffers.items() if buffer is not None):
            return False
    return True

"""Two models of the same architecture and shapes run as one (PPOConfig.paired_critic_pass).

PPO trains a policy and a critic that are, on the testbed and in the usual setups, the same
network with different weights and heads. On small models each of their passes is a chain
of small kernels, so ppo/lean_forward.py runs a batch's update pass through both at once:
`Stacked` reads the pair's weights stacked, ``[2, ...]``, and the lean layer code turns each
product into one batched product over the two models. `same_architecture` decides when that
computes exactly what the two passes compute. The same idea as PyTorch's model-ensembling
recipe (`torch.func.stack_module_state` with `vmap`).
"""

from __future__ import annotations

import torch
from torch import nn


class Stacked:
    """Two backbones of the same architecture and shapes read as one (PPOConfig.paired_critic_pass).

    A parameter reads as both models' stacked, ``[2, ...]``, through ``torch.stack`` (with
    autograd: each model's gradient is its half of the stacked one's); a submodule holding
    parameters as the pair of both; anything else (sizes, the activation, the rotary tables)
    as the first model's, which `same_architecture` found equal to the second's. So the same
    layer code (`_gpt2_hidden`, `_llama_hidden`) runs a batch whose first half goes through
    the first model and second half through the second: the products become batched products
    over the two (`_conv1d`, `_linear`), the norms apply each half's weights, and every other
    kernel runs once over both halves.

    The pair must compute alike (`same_architecture`): only the first model's plain
    attributes are read."""

    def __init__(self, first: nn.Module, second: nn.Module, markers: tuple[str, ...] = ()):
        self._first, self._second = first, second
        for name in markers:  # instance attributes read from the pair as from the first (ppo.lean_forward's switches)
            self.__dict__[name] = first.__dict__.get(name)

    def __getattr__(self, name: str):
        attribute = getattr(self._first, name)
        if isinstance(attribute, nn.Parameter):
            return torch.stack([attribute, getattr(self._second, name)])
        if isinstance(attribute, nn.ModuleList):
            return [Stacked(a, b) for a, b in zip(attribute, getattr(self._second, name))]
        if isinstance(attribute, nn.Module) and next(attribute.parameters(), None) is not None:
            return Stacked(attribute, getattr(self._second, name))
        return attribute


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

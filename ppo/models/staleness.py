"""Simulated staleness: rollouts sampled by the policy as it was k training steps ago.

An asynchronous RL pipeline (verl's fully async trainer, AReaL, prime-rl, SkyRL, NeMo-RL,
OpenRLHF) samples with weights that lag the trainer's: the engine generates batch t while the
trainer is still updating on batch t-1, so by the time batch t is trained on, it was drawn by
a policy k versions old (the pipeline's staleness bound). `PPOConfig.rollout_staleness` makes
that lag an exact, synchronous, seedable toggle: at training step t the responses are sampled
by the weights the policy had at the start of step ``max(0, t - k)``, kept bit for bit, so its
effect (and each off-policy correction's) can be measured in one process with everything
else equal.

One version is one training step (every optimizer step of `train_step`): the unit in which
asynchronous pipelines count staleness and sync the engine's weights. The old log-probs the
loss uses are still those of the policy being trained (the recomputed forward pass, the
"proximal" policy) unless ``logprobs_from_generation`` takes the sampler's, and the sampler's
own log-probs (those of the stale policy) are what the rollout corrections weigh against
(`ppo.algorithm.rollout_correction`).

``rollout_staleness = 0`` samples from the policy itself: no copy, no snapshot, the loop as
without this module. With k > 0 the history keeps k + 1 snapshots of the policy's state dict
and one frozen copy of the policy that sampling runs on (with vLLM, the engine syncs from that
copy, so its weights lag by k syncs).
"""

from __future__ import annotations

import copy
from collections import deque

import torch
from torch import nn


class PolicyHistory:
    """The weights rollouts are sampled with under `rollout_staleness` (see the module's docstring).

    Args:
        policy: the policy being trained (unwrapped: not the DDP wrapper).
        staleness: k >= 0, how many training steps the sampling weights lag.

    Call `sampling_policy(step)` before sampling in every training step: its first call in a
    step records the policy's current weights as version `step` (later calls in the same
    step, e.g. dynamic sampling's further rounds, record nothing) and it returns the module to
    sample with (the policy itself when k = 0).
    """

    def __init__(self, policy: nn.Module, staleness: int):
        if staleness < 0:
            raise ValueError(f"rollout_staleness must be >= 0, got {staleness}")
        self.policy = policy
        self.staleness = staleness
        self.snapshots: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=staleness + 1)
        self.sampler = self._frozen_copy(policy) if staleness else policy
        self.version: int | None = None  # the training step whose start-of-step weights `sampler` holds

    @staticmethod
    def _frozen_copy(policy: nn.Module) -> nn.Module:
        """A copy of `policy` that never trains; objects it only points to (a paired critic, set
        by the lean forward) are shared, not copied."""
        from ppo.speed.lean_forward import PAIR_ATTRIBUTE

        memo = {}
        paired = getattr(policy, PAIR_ATTRIBUTE, None)
        if paired is not None:
            memo[id(paired)] = paired
        sampler = copy.deepcopy(policy, memo)
        sampler.requires_grad_(False)
        return sampler

    def sampling_policy(self, step: int) -> nn.Module:
        """Record the policy's weights as version `step`; the module to sample step `step` with."""
        if not self.staleness:
            return self.policy
        newest = self.snapshots[-1][0] if self.snapshots else None
        if newest is not None and step < newest:
            raise ValueError(f"PolicyHistory: step {step} after step {newest}; steps only move forward")
        if step != newest:  # the first call of this step (dynamic sampling may sample again within it)
            with torch.no_grad():
                self.snapshots.append((step, {name: tensor.detach().clone() for name, tensor in
                                              self.policy.state_dict().items()}))
        version, weights = self.snapshots[0]  # step max(0, step - k): the oldest kept
        if version != self.version:
            self.sampler.load_state_dict(weights)
            self.version = version
        self.sampler.train(self.policy.training)  # sample in the same mode as the policy would
        return self.sampler

    def lag(self, step: int) -> int:
        """How many training steps the weights sampling step `step` lag (k, or fewer at the start)."""
        return min(step, self.staleness)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The kept snapshots (steps and weights): a resumed run samples from the same versions."""
        return {"staleness": self.staleness, "snapshots": [(step, weights) for step, weights in self.snapshots]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("staleness") != self.staleness:
            raise ValueError(f"checkpoint kept snapshots for rollout_staleness={state.get('staleness')}, "
                             f"this run has {self.staleness}")
        self.snapshots.clear()
        for step, weights in state["snapshots"]:
            self.snapshots.append((step, weights))
        self.version = None  # the next sampling_policy loads the oldest snapshot

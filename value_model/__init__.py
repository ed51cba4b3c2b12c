"""Scalar-head models: the PPO critic (value model) and the reward model.

`ScalarHeadModel` wraps any HF backbone with a linear head giving one number per token.
The critic's loss (with value clipping) lives in `ppo.algorithm.losses.value_loss`.
"""

from .model import ScalarHeadModel

__all__ = ["ScalarHeadModel"]

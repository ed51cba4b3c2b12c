"""The old import path `ppo.losses`, kept for users' code: the losses live in
`ppo/algorithm/losses.py` (aggregation, value, entropy and KL terms) and
`ppo/algorithm/policy_losses.py` (`policy_loss` and its variants)."""

from ppo.algorithm.losses import *  # noqa: F401,F403
from ppo.algorithm.policy_losses import POLICY_LOSSES, policy_loss  # noqa: F401

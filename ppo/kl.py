"""The old import path `ppo.kl`, kept for users' code: the module is `ppo/algorithm/kl.py`."""

from ppo.algorithm.kl import *  # noqa: F401,F403

"""Advantage estimation: GAE, masked whitening, group-relative baselines, and a registry.

- `gae/gae.py`: `compute_gae`, token-level GAE and the critic's returns.
- `gae/whiten.py`: `whiten`, masked advantage / reward whitening.
- `gae/group.py`: `group_advantages` (GRPO, batch-std, Dr. GRPO) and `rloo_advantages`.
- `gae/registry.py`: `ADVANTAGE_ESTIMATORS`, `register_advantage_estimator`,
  `estimate_advantages`, the single entry point the training loop calls.
"""

from .gae import compute_gae
from .group import group_advantages, rloo_advantages
from .registry import ADVANTAGE_ESTIMATORS, estimate_advantages, register_advantage_estimator
from .whiten import whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "compute_gae",
    "estimate_advantages",
    "group_advantages",
    "register_advantage_estimator",
    "rloo_advantages",
    "whiten",
]

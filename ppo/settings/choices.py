"""The values a `PPOConfig` field may take, where a check needs them.

Plain data with no imports from the project, so that the config (`ppo/config.py`), its
checks (`ppo/settings/config_checks.py`) and the modules that implement each choice can all
read them without depending on one another. ``ppo.config`` re-exports every name.
"""

from __future__ import annotations

KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "abs", "k1+", "k3+", "abs+", "full")  # ppo/algorithm/kl.py
ADVANTAGE_ESTIMATOR_NAMES = ("gae", "grpo", "dr_grpo", "rloo", "reinforce", "rft", "reinforce_plus_plus",
                             "reinforce_plus_plus_baseline", "remax", "maxrl", "grpo_passk", "gdpo")
GSM8K_ANSWER_MODES = ("strict", "flexible")  # implemented in ppo/tasks/gsm8k.py `extract_answer`
TASK_NAMES = ("arithmetic", "preference", "gsm8k", "custom", "math")  # ppo/tasks/__init__.py build_task
CHAT_TEMPLATE_MODES = ("auto", "on", "off")  # ppo/tasks/chat.py
# Seeds are 64-bit in torch; per-rank seeds are hashed into [0, 2**63) (ppo/parallel/distributed.py).
MAX_SEED = 2**63 - 1
LOSS_AGG_NAMES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "prompt_mean",
                  "token_sum")
REWARD_WHITENING_MODES = ("masked", "stats", "alpacafarm")  # ppo/algorithm/rewards.py whiten_rewards
WHITENING_SCOPES = ("global", "process")  # ppo/parallel/distributed.py whitening_sum
METRIC_DENOMINATORS = ("tokens", "all_positions")  # ppo/run/metrics.py over_all_positions
SCORE_POSITIONS = ("last_token", "after_last_token")  # ppo/algorithm/rewards.py shape_rewards
KL_CONTROLLER_NAMES = ("ziegler", "alpacafarm")  # ppo/algorithm/kl.py make_kl_controller
DIFFICULTY_FILTER_MODES = ("resample", "renormalize", "mask")  # ppo/algorithm/filtering.py
# report_to: tracker name -> (module to import, pip extra that installs it; None: a base requirement).
TRACKERS = {"tensorboard": ("tensorboard", None), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"),
            "trackio": ("trackio", "trackio")}

"""The columns of a sweep's results.csv: one row per run, fixed columns first.

Kept apart from ``ablations.run_results`` (which fills them) so that what only needs their
names (an ablation file's claims, checked against the columns before any run) imports no
reader of results.
"""

from __future__ import annotations

from ppo.run.provenance import FIELDS as PROVENANCE_FIELDS

WHOLE_RUN_SUFFIX = ":all"  # results.csv column "<extra metric>:all": its mean over every step

# Fixed per-run columns, in CSV order; extra-metric columns follow.
RUN_COLUMNS = (
    "ablation", "variant", "seed", "status", "error", "path", "steps", "total_steps",
    "initial_sampled_accuracy", "final_sampled_accuracy", "final_greedy_accuracy", "accuracy_gain",
    "late_sampled_accuracy", "late_accuracy_gain", "reward", "kl", "kl_k1", "entropy", "response_length_correct", "response_length_incorrect",
    "wall_seconds", "samples", "metric", "metric_value", "reused_from",
) + tuple(f"prov_{name}" for name in PROVENANCE_FIELDS)
# Training-metric columns that are last-10% means of the metrics.jsonl key of the same name.
TAIL_COLUMNS = ("reward", "kl", "kl_k1", "entropy", "response_length_correct", "response_length_incorrect")
# Non-numeric per-run columns: never averaged over seeds.
TEXT_COLUMNS = ("ablation", "variant", "seed", "status", "error", "path", "metric", "reused_from", "warnings") + tuple(
    f"prov_{name}" for name in PROVENANCE_FIELDS)

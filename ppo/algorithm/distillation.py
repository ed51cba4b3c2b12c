"""On-policy distillation: the student's own samples, scored token by token by a teacher.

The student samples responses as in RL; at every response position the loss is the reverse
KL from the student to the teacher, ``KL(pi_student || pi_teacher)``, exact over the whole
vocabulary (`ppo.algorithm.kl.full_kl`, the estimator ``kl_estimator="full"`` already uses
for the reference). Reverse, not forward: it is measured on the student's own distribution,
so it is mode-seeking (the student is pushed off tokens the teacher finds unlikely, not
spread over everything the teacher might say), and the states it is measured in are the
ones the student visits, the on-policy form of Qwen3's strong-to-weak distillation
(Qwen3 Technical Report, arXiv 2505.09388, strong-to-weak distillation). A sampled form on the student's tokens alone,
``log pi_student(y_t) - log pi_teacher(y_t)`` (k1), is its one-sample estimate.

In the loop (`PPOConfig.teacher_model_path`, `distill_coef`, `distill_only`): the teacher is a
frozen model beside the reference (ppo/models/setup.py, ppo/models/teacher.py); at every
update micro-batch `ppo.models.forward_passes.ForwardPasses.distillation_loss` runs the
policy (with autograd) and the teacher (without) over the rollout's tokens and hands both
full log-softmaxes to `distillation_loss` below; `RLTrainer._update` adds it to the policy
loss times `distill_coef`, or, with `distill_only`, trains on it alone. Logged as
``distill_kl``, the mean per-token KL over the loss's tokens.
"""

from __future__ import annotations

import torch

from ppo.algorithm.kl import full_kl
from ppo.algorithm.losses import _masked_mean, aggregate


def reverse_kl_to_teacher(log_probs: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact ``KL(student || teacher)`` at each position, ``[B, T]``, from both models' full
    log-softmax ``[B, T, V]``; differentiable through the student's.

    Worked example (one position, two tokens): student [0.5, 0.5], teacher [0.25, 0.75]:
    0.5 log(0.5 / 0.25) + 0.5 log(0.5 / 0.75) = 0.14384.
    """
    return full_kl(log_probs, teacher_log_probs)  # [B, T]


def sampled_reverse_kl(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """The one-sample (k1) estimate of the same KL on the student's sampled tokens, ``[B, T]``:
    ``log pi_student(y_t) - log pi_teacher(y_t)``; unbiased for it under the student's sampling."""
    return logprobs - teacher_logprobs


def distillation_loss(log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor,
                      loss_agg: str = "token_mean", max_len: int | None = None, skip_empty_rows: bool = False,
                      group_share: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The per-token exact reverse KL to the teacher aggregated over `mask` by `loss_agg`
    (`ppo.algorithm.losses.aggregate`, as the policy loss is); returns
    ``(loss, {"distill_kl": mean per-token KL over the mask})``."""
    per_token = reverse_kl_to_teacher(log_probs, teacher_log_probs)  # [B, T]
    loss = aggregate(per_token, mask, loss_agg, max_len, skip_empty_rows=skip_empty_rows, group_share=group_share)
    with torch.no_grad():
        metrics = {"distill_kl": _masked_mean(per_token, mask.bool()).item()}
    return loss, metrics

"""On-policy distillation's loss (ppo/algorithm/distillation.py) against a dense reverse KL
written out by hand over the vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from ppo.algorithm.distillation import distillation_loss, reverse_kl_to_teacher, sampled_reverse_kl


def test_distill_reverse_kl_worked_example():
    student = torch.log(torch.tensor([[[0.5, 0.5]]]))  # [B=1, T=1, V=2]
    teacher = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert reverse_kl_to_teacher(student, teacher).item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.14384, abs=1e-5)


def test_distill_loss_equals_dense_reverse_kl_by_hand_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    student_logits = torch.randn(2, 3, 5, generator=g).requires_grad_(True)  # [B, T, V]
    teacher_logits = torch.randn(2, 3, 5, generator=g)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, metrics = distillation_loss(torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1),
                                      mask, loss_agg="token_mean")
    # By hand: softmax and the KL sum over the vocabulary at each real position, then the token mean.
    dense_logits = student_logits.detach().clone().requires_grad_(True)
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if mask[b, t] == 0:
                continue
            z_s = sum(math.exp(x) for x in dense_logits[b, t].tolist())
            z_t = sum(math.exp(x) for x in teacher_logits[b, t].tolist())
            kl = 0.0
            for v in range(5):
                p = math.exp(dense_logits[b, t, v].item()) / z_s
                q = math.exp(teacher_logits[b, t, v].item()) / z_t
                kl += p * math.log(p / q)
            total, count = total + kl, count + 1
    assert loss.item() == pytest.approx(total / count, abs=1e-6)
    assert metrics["distill_kl"] == pytest.approx(total / count, abs=1e-6)
    # Gradient: the same dense expression in torch, position by position.
    p, q = torch.softmax(dense_logits, -1), torch.softmax(teacher_logits, -1)
    dense = ((p * (p.log() - q.log())).sum(-1) * mask).sum() / mask.sum()
    dense.backward()
    loss.backward()
    torch.testing.assert_close(student_logits.grad, dense_logits.grad, atol=1e-6, rtol=1e-5)
    assert student_logits.grad[1, 1:].abs().max() == 0  # padding gets no gradient


def test_distill_sampled_estimate_is_unbiased_for_the_exact_kl():
    """E over the student's own tokens of log pi - log teacher is the exact reverse KL."""
    student = torch.log_softmax(torch.tensor([[[1.0, 0.0, -1.0]]]), -1)
    teacher = torch.log_softmax(torch.tensor([[[0.0, 2.0, 0.5]]]), -1)
    tokens = torch.arange(3)
    per_token = sampled_reverse_kl(student[0, 0, tokens], teacher[0, 0, tokens])  # each token's estimate
    expectation = (student[0, 0].exp() * per_token).sum()
    assert expectation.item() == pytest.approx(reverse_kl_to_teacher(student, teacher).item(), abs=1e-6)

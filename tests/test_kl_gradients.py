"""The exact KL over the vocabulary, the straight-through and importance-weighted estimators:
values and gradients on a 2-token vocabulary worked by hand, and `full` against a dense loop."""

import math

import pytest
import torch

from ppo.algorithm.kl import full_kl, importance_weighted_kl, kl_penalty
from ppo.algorithm.losses import kl_loss

LOG2 = math.log(2.0)
X1 = math.log(0.5 / 0.75)  # log-ratio of token 1


def two_token_policy(theta: float = 0.0):
    """pi = softmax([theta, 0]) (0.5 / 0.5 at theta = 0), ref = [0.25, 0.75]; d log pi(0)/d theta
    = 1 - pi(0) = 0.5 and d log pi(1)/d theta = -0.5."""
    theta = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    log_pi = torch.log_softmax(torch.stack([theta, torch.zeros((), dtype=torch.float64)]), -1)
    log_ref = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
    return theta, log_pi, log_ref


# estimator -> (value, d/d theta) at the sampled token 0, worked by hand with x = log 2:
# k1 = x, grad 0.5; k2 = x^2/2, grad x * 0.5; k3 = e^-x + x - 1 = x - 0.5, grad (1 - e^-x) * 0.5;
# k1+ / k3+: k1's / k3's value, k2's gradient (straight-through).
TOKEN_0 = {
    "k1": (LOG2, 0.5),
    "k2": (0.5 * LOG2**2, 0.5 * LOG2),
    "k3": (LOG2 - 0.5, 0.25),
    "k1+": (LOG2, 0.5 * LOG2),
    "k3+": (LOG2 - 0.5, 0.5 * LOG2),
}


@pytest.mark.parametrize("estimator", sorted(TOKEN_0))
def test_value_and_gradient_at_one_token(estimator):
    theta, log_pi, log_ref = two_token_policy()
    value = kl_penalty(log_pi[0].view(1, 1), log_ref[0].view(1, 1), estimator)
    (grad,) = torch.autograd.grad(value.sum(), theta)
    expected_value, expected_grad = TOKEN_0[estimator]
    assert value.item() == pytest.approx(expected_value, abs=1e-12)
    assert grad.item() == pytest.approx(expected_grad, abs=1e-12)


def expected_gradient(per_token) -> float:
    """sum_a pi(a) * d/d theta of `per_token(log_pi, log_ref, a)` at theta = 0 (pi = 0.5 / 0.5)."""
    total = 0.0
    for a in (0, 1):
        theta, log_pi, log_ref = two_token_policy()
        (grad,) = torch.autograd.grad(per_token(log_pi, log_ref, a).sum(), theta)
        total += 0.5 * grad.item()
    return total


TRUE_GRADIENT = 0.25 * math.log(3.0)  # d/d theta KL(pi || ref) = 0.25 * (log 2 - log(2/3))


@pytest.mark.parametrize("estimator, expected", [
    ("k1", 0.0),                   # E[grad log pi] = 0: k1 in the loss does nothing on average
    ("k2", TRUE_GRADIENT),         # unbiased
    ("k1+", TRUE_GRADIENT), ("k3+", TRUE_GRADIENT),
    ("k3", 0.25),                  # the gradient of the forward KL(ref || pi) = -sum ref * grad log pi
])
def test_expected_gradient_in_the_loss(estimator, expected):
    grad = expected_gradient(lambda lp, lr, a: kl_penalty(lp[a].view(1, 1), lr[a].view(1, 1), estimator))
    assert grad == pytest.approx(expected, abs=1e-12)


def test_importance_weighted_k3_value_and_gradient():
    """On-policy the weight is 1 in value, but its gradient adds k3 * grad log pi: at token 0
    0.25 + (log 2 - 0.5) * 0.5 = 0.5 log 2, and the expectation is the true KL gradient."""
    theta, log_pi, log_ref = two_token_policy()
    logp, ref = log_pi[0].view(1, 1), log_ref[0].view(1, 1)
    value = importance_weighted_kl(kl_penalty(logp, ref, "k3"), logp, logp.detach())
    (grad,) = torch.autograd.grad(value.sum(), theta)
    assert value.item() == pytest.approx(LOG2 - 0.5, abs=1e-12)
    assert grad.item() == pytest.approx(0.5 * LOG2, abs=1e-12)
    weighted = expected_gradient(lambda lp, lr, a: importance_weighted_kl(
        kl_penalty(lp[a].view(1, 1), lr[a].view(1, 1), "k3"), lp[a].view(1, 1), lp[a].detach().view(1, 1)))
    assert weighted == pytest.approx(TRUE_GRADIENT, abs=1e-12)


def test_importance_weighted_k3_is_unbiased_off_policy():
    """Tokens drawn from pi_old = [0.8, 0.2]: sum_a old(a) * grad[(pi/old)(a) * k3(a)] is still
    the true gradient, while plain k2 under the same samples is not."""
    old = torch.tensor([0.8, 0.2], dtype=torch.float64)

    def mean_grad(per_token):
        total = 0.0
        for a in (0, 1):
            theta, log_pi, log_ref = two_token_policy()
            logp, ref = log_pi[a].view(1, 1), log_ref[a].view(1, 1)
            (grad,) = torch.autograd.grad(per_token(logp, ref, old[a].log().view(1, 1)).sum(), theta)
            total += old[a].item() * grad.item()
        return total

    weighted = mean_grad(lambda lp, lr, lo: importance_weighted_kl(kl_penalty(lp, lr, "k3"), lp, lo))
    plain_k2 = mean_grad(lambda lp, lr, lo: kl_penalty(lp, lr, "k2"))
    assert weighted == pytest.approx(TRUE_GRADIENT, abs=1e-12)
    assert plain_k2 == pytest.approx(0.8 * 0.5 * LOG2 + 0.2 * -0.5 * X1, abs=1e-12)
    assert abs(plain_k2 - TRUE_GRADIENT) > 0.04


def test_full_kl_two_tokens_value_and_gradient():
    theta, log_pi, log_ref = two_token_policy()
    kl = full_kl(log_pi.view(1, 1, 2), log_ref.view(1, 1, 2))
    (grad,) = torch.autograd.grad(kl.sum(), theta)
    assert kl.item() == pytest.approx(0.5 * math.log(4.0 / 3.0), abs=1e-12)
    assert grad.item() == pytest.approx(TRUE_GRADIENT, abs=1e-12)


def test_full_kl_matches_a_dense_loop():
    generator = torch.Generator().manual_seed(0)
    log_pi = torch.log_softmax(torch.randn(3, 4, 11, generator=generator), -1)
    log_ref = torch.log_softmax(torch.randn(3, 4, 11, generator=generator), -1)
    dense = torch.zeros(3, 4, dtype=torch.float64)
    for b in range(3):
        for t in range(4):
            for v in range(11):
                p = math.exp(log_pi[b, t, v].item())
                dense[b, t] += p * (log_pi[b, t, v].item() - log_ref[b, t, v].item())
    assert torch.allclose(full_kl(log_pi, log_ref).double(), dense, atol=1e-6, rtol=0)


def test_full_kl_is_zero_on_zero_padding_and_checks_shapes():
    assert full_kl(torch.zeros(1, 2, 5), torch.zeros(1, 2, 5)).abs().max() == 0
    with pytest.raises(ValueError, match="does not match"):
        full_kl(torch.zeros(1, 2, 5), torch.zeros(1, 2, 4))


def test_kl_loss_full_and_weighted():
    generator = torch.Generator().manual_seed(1)
    log_pi = torch.log_softmax(torch.randn(2, 3, 5, generator=generator), -1)
    log_ref = torch.log_softmax(torch.randn(2, 3, 5, generator=generator), -1)
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    logp, ref = log_pi.gather(-1, tokens[..., None])[..., 0], log_ref.gather(-1, tokens[..., None])[..., 0]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = kl_loss(logp, ref, mask, "full", log_probs=log_pi, ref_log_probs=log_ref)
    assert loss.item() == pytest.approx((full_kl(log_pi, log_ref) * mask).sum().item() / 4, abs=1e-6)
    old = logp - 0.1
    weighted, _ = kl_loss(logp, ref, mask, "k3", old_logprobs=old)
    plain = kl_penalty(logp, ref, "k3") * torch.exp(torch.tensor(0.1))
    assert weighted.item() == pytest.approx((plain * mask).sum().item() / 4, rel=1e-6)
    unweighted, _ = kl_loss(logp, ref, mask, "k3")
    assert unweighted.item() == pytest.approx((kl_penalty(logp, ref, "k3") * mask).sum().item() / 4, rel=1e-6)


# ---- in the loop --------------------------------------------------------------------------
TINY = dict(rollout_batch_size=8, response_length=12, eval_size=8, eval_every=0, total_steps=3, save_every=0,
            progress=False, log_samples=0, lr=1e-2)


def count_ones(prompts, responses):
    return [float(response.count("1")) for response in responses]


def run_steps(config, steps=3):
    from ppo.trainer import RLTrainer

    trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "9+9="], reward_fn=count_ones)
    return [trainer.train_step() for _ in range(steps)]


def without_timing(row):
    """The row without wall times, as text (NaN equals NaN there)."""
    return repr({k: v for k, v in row.items() if not k.startswith("time_") and k != "wall_seconds"})


def test_logging_the_full_kl_changes_nothing_else(tmp_path, tiny_model_dir):
    from ppo.config import preset

    config = preset("alpacafarm", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    kl_coef=0.05, value_init="policy", **TINY)
    plain = run_steps(config)
    logged = run_steps(config.replace(log_full_kl=True, output_dir=str(tmp_path / "b")))
    assert all("kl_full" not in row for row in plain)
    assert logged[0]["kl_full"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference before its first update
    assert logged[-1]["kl_full"] > 0
    assert [without_timing({k: v for k, v in row.items() if k != "kl_full"}) for row in logged] == \
        [without_timing(row) for row in plain]


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_the_full_estimator_in_the_loop(tmp_path, tiny_model_dir, placement):
    from ppo.config import preset

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / placement),
                    group_size=4, kl_coef=0.1, kl_estimator="full", kl_placement=placement,
                    ppo_epochs=2, num_minibatches=2, **TINY)
    rows = run_steps(config)
    assert rows[0]["kl_full"] == pytest.approx(0.0, abs=1e-6)
    for row in rows:
        assert row["kl"] == pytest.approx(row["kl_full"], rel=1e-6, abs=1e-9)  # the estimate in use is the exact KL
    assert rows[-1]["kl_full"] > 0
    if placement == "loss":
        assert all(math.isfinite(row["kl_loss"]) for row in rows)


def test_importance_weighted_kl_in_the_loop(tmp_path, tiny_model_dir):
    """On-policy the weight is 1, so the logged KL loss of the first minibatch step is k3's."""
    from ppo.config import preset

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "w"),
                    group_size=4, kl_coef=0.1, kl_estimator="k3", kl_placement="loss", **TINY)
    plain = run_steps(config, steps=1)
    weighted = run_steps(config.replace(kl_loss_importance_weight=True, output_dir=str(tmp_path / "v")), steps=1)
    assert weighted[0]["kl_loss"] == pytest.approx(plain[0]["kl_loss"], rel=1e-6, abs=1e-12)


@pytest.mark.slow  # the study on the pinned warm start: about 20 s (make test-all)
def test_the_gradient_study_on_the_pinned_warm_start():
    """A small run of `python -m ablations.kl_gradient_study`: the exact expectations follow
    the derivation (docs/derivations.md), whatever the Monte-Carlo noise."""
    from ablations.kl_gradient_study import markdown_table, run_study

    results = run_study(batches=8, groups=4, prompts=4, response_length=4)
    on, off = results["on-policy"]["pairs"], results["off-policy"]["pairs"]
    for pair in ("k1|reward", "k2|loss", "k1+|loss", "k3+|loss", "k3·IS|loss"):
        cosine, error, _ = on[pair]["expected"]
        assert cosine > 0.9999 and error < 1e-4, pair
    assert on["k1|loss"]["expected"][2] < 1e-4  # zero expected gradient
    assert on["k3|loss"]["expected"][1] > 0.05  # the forward KL(ref || pi)'s gradient
    assert off["k3·IS|loss"]["expected"][1] < 1e-4  # still exact off-policy
    assert off["k2|loss"]["expected"][1] > 1e-3  # no longer exact
    assert "`k3·IS` in the loss" in markdown_table(results, 8, 4)


# ---- reference refresh ----------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.0, 0.25])
def test_reference_refresh_resets_or_mixes(tmp_path, tiny_model_dir, alpha):
    from ppo.config import preset
    from ppo.trainer import RLTrainer

    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "r"),
                    group_size=4, kl_coef=0.1, ref_update_every=2, ref_update_alpha=alpha, log_full_kl=True,
                    **TINY)
    trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "9+9="], reward_fn=count_ones)

    def weights(model):
        return [p.detach().clone() for p in model.parameters()]

    start = weights(trainer.ref_policy)
    trainer.train_step()
    assert all(torch.equal(a, b) for a, b in zip(start, weights(trainer.ref_policy)))  # step 1: not yet
    trainer.train_step()
    policy = weights(trainer.policy)
    for before, after, now in zip(start, weights(trainer.ref_policy), policy):
        assert torch.allclose(after, alpha * now + (1 - alpha) * before, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(start, policy))  # the policy did move
    row = trainer.train_step()  # sampled from the policy the reference was just reset to
    if alpha == 1.0:
        assert row["kl_full"] == pytest.approx(0.0, abs=1e-6)

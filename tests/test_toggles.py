"""Toggles that live in the training loop, each shown to change what it claims to change.

Small runs on a tiny random model; the math toggles are tested in their own modules.
"""

import math

import pytest
import torch

from ppo.config import PPOConfig
from ppo.trainer import RLTrainer

TINY = dict(rollout_batch_size=8, response_length=10, eval_size=4, eval_every=0, total_steps=2, save_every=0,
            progress=False, log_samples=1, lr=1e-3)


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


PROMPTS = ["1+1=", "2+3=", "9+9=", "11+1="]


def trainer(tmp_path, tiny_model_dir, **overrides):
    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"),
                       **{**TINY, **overrides})
    return RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_value_init_modes(tmp_path, tiny_model_dir):
    from_policy = trainer(tmp_path, tiny_model_dir, value_init="policy")
    random_init = trainer(tmp_path, tiny_model_dir, value_init="random", seed=5)  # seed 0 built the fixture
    policy_first = next(from_policy.policy.base_model.parameters())
    assert torch.equal(next(from_policy.value_model.backbone.parameters()), policy_first)
    assert not torch.equal(next(random_init.value_model.backbone.parameters()), policy_first)
    assert from_policy.value_model.head.weight.abs().sum() == 0  # zeroed head


def test_separate_or_shared_value_optimizer(tmp_path, tiny_model_dir):
    separate = trainer(tmp_path, tiny_model_dir, value_lr=5e-4)
    assert separate.value_optimizer is not None
    assert separate.value_optimizer.param_groups[0]["lr"] == 5e-4
    shared = trainer(tmp_path, tiny_model_dir, separate_value_optimizer=False)
    assert shared.value_optimizer is None and len(shared.policy_optimizer.param_groups) == 2
    n_value = sum(1 for _ in shared.value_model.parameters())
    assert len(shared.policy_optimizer.param_groups[1]["params"]) == n_value


def _set_grads(model, value):
    """Zero every gradient, then put `value` in one entry: the model's grad norm is |value|."""
    parameters = list(model.parameters())
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    parameters[0].grad.view(-1)[0] = value


@pytest.mark.parametrize("separate, max_grad_norm, policy_scale", [
    (False, 1.0, 0.2),      # shared: joint norm sqrt(3^2 + 4^2) = 5 -> both scaled by 1/5
    (True, 1.0, 1 / 3),     # separate: the policy is clipped on its own norm 3
    (False, None, 1.0),     # no clipping
])
def test_gradient_norms_and_clip_scale(tmp_path, tiny_model_dir, separate, max_grad_norm, policy_scale):
    run = trainer(tmp_path, tiny_model_dir, separate_value_optimizer=separate, max_grad_norm=max_grad_norm)
    _set_grads(run.policy, 3.0)
    _set_grads(run.value_model, 4.0)
    metrics = run._optimizer_step()
    assert metrics["policy_grad_norm"] == pytest.approx(3.0, rel=1e-5)  # before clipping
    assert metrics["value_grad_norm"] == pytest.approx(4.0, rel=1e-5)
    assert metrics["policy_grad_scale"] == pytest.approx(policy_scale, rel=1e-5)
    # The norms reach metrics.jsonl through a training step.
    logged = run.train_step()
    assert logged["policy_grad_norm"] > 0 and 0 < logged["policy_grad_scale"] <= 1


def test_joint_gradient_norm_by_hand_and_without_half_precision_overflow():
    from ppo.models.precision import grad_norm
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (2, 3, 1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0, 12.0])  # c has none: skipped
    assert grad_norm([a, b, c]) == pytest.approx(13.0)
    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    half.grad = torch.full((2,), 60000.0, dtype=torch.float16)  # each fits fp16, the norm does not
    assert grad_norm([half]) == pytest.approx(60000.0 * 2 ** 0.5, rel=1e-4)


@pytest.mark.parametrize("joint", [True, False])
@pytest.mark.parametrize("max_norm", [0.5, 1e9, math.inf])
def test_one_norm_pass_clips_exactly_as_clip_grad_norm(joint, max_norm):
    """`clip_grad_norms`' local path (one ``_foreach_norm`` for every group's norm and the
    joint one, no multiply by 1) leaves bitwise the gradients ``clip_grad_norm_`` leaves,
    and reports the same norms as accelerate's path (bf16 gradients take that one)."""
    from accelerate import Accelerator
    from ppo.models.precision import clip_grad_norms, grad_norm

    def groups(dtype=torch.float32):
        torch.manual_seed(0)
        made = [[torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in (300, 7, 64)] for _ in range(2)]
        for group in made:
            for p in group:
                p.grad = torch.randn(p.shape).to(dtype) * 0.1
        made[1].append(torch.nn.Parameter(torch.zeros(3)))  # no gradient: skipped
        return made

    accelerator = Accelerator(cpu=True)
    local, expected = groups(), groups()
    before = [grad_norm(group) for group in local]
    norms = clip_grad_norms(accelerator, [], local, max_norm, joint=joint)
    for group in (expected if not joint else [[p for group in expected for p in group]]):
        torch.nn.utils.clip_grad_norm_(group, max_norm)
    for got, want in zip(local, expected):
        for p, q in zip(got, want):
            assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)
    assert norms == pytest.approx(before, rel=1e-6)
    clipped = max_norm < math.hypot(*before) if joint else max_norm < max(before)
    assert clipped == (max_norm == 0.5)  # the case that must multiply, and two that must not
    half = groups(torch.bfloat16)
    half_before = [grad_norm(group) for group in half]
    assert clip_grad_norms(accelerator, [], half, max_norm, joint=joint) == pytest.approx(half_before, rel=2e-2)


def test_no_value_model_for_group_estimators(tmp_path, tiny_model_dir):
    grpo = trainer(tmp_path, tiny_model_dir, advantage_estimator="grpo", group_size=4)
    assert grpo.value_model is None and grpo.value_optimizer is None
    metrics = grpo.train_step()
    assert "vf_loss" not in metrics and "time_value_forward" not in metrics


def test_temperature_scaling_changes_old_logprobs(tmp_path, tiny_model_dir):
    entropies = {}
    for scale in (True, False):
        torch.manual_seed(0)
        run = trainer(tmp_path / str(scale), tiny_model_dir, temperature=2.0, scale_logits_by_temperature=scale)
        entropies[scale] = run.train_step()["entropy_rollout"]
    # Same seed, same samples; dividing logits by T=2 flattens the distribution, so the
    # sampled tokens' log-probs are lower (higher surprisal) than with T=1 logits.
    assert entropies[True] > entropies[False]


def test_logprobs_from_generation_match_recomputed(tmp_path, tiny_model_dir):
    values = {}
    for from_generation in (False, True):
        torch.manual_seed(0)
        run = trainer(tmp_path / str(from_generation), tiny_model_dir, logprobs_from_generation=from_generation,
                      temperature=0.7)
        values[from_generation] = run.train_step()["entropy_rollout"]
    assert values[True] == pytest.approx(values[False], abs=1e-4)


def test_mask_truncated_responses_removes_them_from_the_loss(tmp_path, tiny_model_dir, monkeypatch):
    import ppo.trainer as trainer_module

    seen = {}
    real_generate, real_policy_loss = trainer_module.generate, trainer_module.policy_loss

    def spy_generate(*args, **kwargs):
        seen["rollout"] = real_generate(*args, **kwargs)
        return seen["rollout"]

    def spy_policy_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        seen["loss_mask"] = mask.detach().clone()
        return real_policy_loss(logprobs, old_logprobs, advantages, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "generate", spy_generate)
    monkeypatch.setattr(trainer_module, "policy_loss", spy_policy_loss)
    for toggle in (True, False):
        run = trainer(tmp_path / str(toggle), tiny_model_dir, mask_truncated_responses=toggle)
        run.train_step()
        rollout = seen["rollout"]
        truncated = ~rollout.has_eos
        assert truncated.any()  # a random tiny model rarely stops within 10 tokens
        rows_in_loss = seen["loss_mask"].sum(-1) > 0  # one minibatch of all 8 rows, in shuffled order
        assert int(rows_in_loss.sum()) == (int(rollout.has_eos.sum()) if toggle else len(rollout))


def test_difficulty_filter_masks_groups(tmp_path, tiny_model_dir):
    # Reward = correctness of "count_ones > 0"; the band (0, 1) keeps only mixed groups.
    run = trainer(tmp_path, tiny_model_dir, advantage_estimator="grpo", group_size=4, difficulty_filter=True,
                  retire_mastered=True)
    metrics = run.train_step()
    assert 0.0 <= metrics["kept_group_frac"] <= 1.0
    assert metrics["zero_advantage_group_frac_kept"] == 0.0 or metrics["kept_group_frac"] == 0.0
    assert "retired_prompts" in metrics
    # resample (the default mode): whole rounds of 8 responses until the band is filled, at most 4
    assert 1 <= metrics["sampling_rounds"] <= 4
    assert metrics["responses_generated"] == metrics["sampling_rounds"] * 8 == metrics["samples_generated"]


def test_target_kl_stops_the_epochs_early(tmp_path, tiny_model_dir):
    run = trainer(tmp_path, tiny_model_dir, ppo_epochs=8, num_minibatches=2, lr=5e-2, target_kl=1e-6)
    assert run.train_step()["early_stopped"] == 1.0
    free = trainer(tmp_path / "free", tiny_model_dir, ppo_epochs=8, num_minibatches=2, lr=5e-2)
    assert free.train_step()["early_stopped"] == 0.0


def test_dropout_is_disabled_unless_asked(tmp_path, tiny_model_dir):
    run = trainer(tmp_path, tiny_model_dir)
    assert all(m.p == 0.0 for m in run.policy.modules() if isinstance(m, torch.nn.Dropout))


def test_top_k_one_is_greedy(tmp_path, tiny_model_dir):
    torch.manual_seed(0)
    run = trainer(tmp_path, tiny_model_dir, top_k=1, advantage_estimator="rloo", group_size=4)
    metrics = run.train_step()
    # with top_k=1 every sample of a group is the same greedy response: rewards are equal
    assert metrics["advantage_abs_mean"] == 0.0


def _spy_rewards(monkeypatch):
    """Record the rollout and the per-token rewards each train_step hands to the estimator."""
    import ppo.trainer as trainer_module

    seen = {}
    real_generate, real_estimate = trainer_module.generate, trainer_module.estimate_advantages

    def spy_generate(*args, **kwargs):
        seen["rollout"] = real_generate(*args, **kwargs)
        return seen["rollout"]

    def spy_estimate(name, **kwargs):
        seen["token_rewards"] = kwargs["token_rewards"].detach().clone()
        return real_estimate(name, **kwargs)

    monkeypatch.setattr(trainer_module, "generate", spy_generate)
    monkeypatch.setattr(trainer_module, "estimate_advantages", spy_estimate)
    return seen


def test_format_reward_adds_the_bonus_to_well_formed_responses(tmp_path, tiny_model_dir, monkeypatch):
    # The custom task's answers always "have an answer", so well formed = ended with EOS.
    seen = _spy_rewards(monkeypatch)
    scores = {}
    for coef in (0.0, 0.5):
        run = trainer(tmp_path / str(coef), tiny_model_dir, advantage_estimator="grpo", group_size=4, kl_coef=0.0,
                      format_reward_coef=coef, response_length=24)
        metrics = run.train_step()
        scores[coef] = seen["token_rewards"].sum(-1)
    has_eos = seen["rollout"].has_eos.float()  # same seed, same model: the same rollout both times
    assert 0 < has_eos.sum() < len(has_eos)
    assert torch.allclose(scores[0.5] - scores[0.0], 0.5 * has_eos)
    assert metrics["well_formed_rate"] == pytest.approx(float(has_eos.mean()))


def test_length_reward_warmup_switches_it_on_after_the_warmup(tmp_path, tiny_model_dir):
    run = trainer(tmp_path, tiny_model_dir, advantage_estimator="grpo", group_size=4, total_steps=3,
                  length_reward_coef=0.5, length_reward_warmup_steps=2)
    assert [run.train_step()["length_reward_coef"] for _ in range(3)] == [0.0, 0.0, 0.5]


def test_rft_trains_only_on_kept_samples(tmp_path, tiny_model_dir):
    # count_ones >= 1 keeps responses with a "1"; the advantage is 1 on them and 0 elsewhere.
    run = trainer(tmp_path, tiny_model_dir, advantage_estimator="rft", group_size=4, kl_coef=0.0,
                  whiten_advantages=False, response_length=24)
    metrics = run.train_step()
    assert run.value_model is None
    assert 0.0 <= metrics["advantage_mean"] <= 1.0 and metrics["advantage_abs_mean"] == metrics["advantage_mean"]


def _clip_batch():
    """A hand batch [2, 4]: mask [[1, 1, 1, 0], [1, 0, 0, 0]] (4 tokens, 8 positions), A = +1,
    ratios [[1.5, 1.0, 0.5, pad], [1.5, pad, pad, pad]]; padding holds a ratio of 3 that no
    metric may read. With clip 0.2 the two ratios of 1.5 are clipped."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    ratios = torch.tensor([[1.5, 1.0, 0.5, 3.0], [1.5, 3.0, 3.0, 3.0]])
    return ratios.log(), torch.zeros(2, 4), torch.ones(2, 4), mask


def test_metric_denominator_all_positions_divides_by_every_padded_position():
    """metric_denominator: 'tokens' averages the clip fraction and approx_kl over the 4 real
    tokens, 'all_positions' over the 8 positions of the padded tensor, AlpacaFarm's
    ``(pg_losses2 > pg_losses).mean()`` and ``0.5 * ((logprob - old_logprob) ** 2).mean()`` over
    [B, response_len] (tatsu-lab/alpaca_farm@30717dd ppo_trainer.py L253, L258), whose padding
    has log-prob 0 under both policies. By hand: 2 clipped tokens, so 2/4 and 2/8; approx_kl
    sums 0.5 log(1.5)^2 twice and 0.5 log(0.5)^2 once, 0.40465, so /4 and /8."""
    from ppo.algorithm.policy_losses import policy_loss
    from ppo.run.metrics import UpdateTally

    logprobs, old_logprobs, advantages, mask = _clip_batch()
    _, metrics = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2)
    kl_sum = 2 * 0.5 * math.log(1.5) ** 2 + 0.5 * math.log(0.5) ** 2
    assert metrics["clipfrac"] == pytest.approx(0.5) and metrics["approx_kl"] == pytest.approx(kl_sum / 4)
    # AlpacaFarm's formulas, written out over the padded tensor (padding: log-probs 0, ratio 1).
    af_logprobs = torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(af_logprobs - old_logprobs)
    pg_losses, pg_losses2 = -advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)
    af_clipfrac = (pg_losses2 > pg_losses).float().mean().item()
    af_approxkl = (0.5 * (af_logprobs - old_logprobs) ** 2).mean().item()
    assert af_clipfrac == pytest.approx(0.25) and af_approxkl == pytest.approx(kl_sum / 8)
    for denominator, clipfrac, approx_kl in (("tokens", 0.5, kl_sum / 4), ("all_positions", af_clipfrac, af_approxkl)):
        # The whole batch as one micro-batch, and as two micro-batches of one row each
        # (token-share weights 3/4 and 1/4, as token_mean weighs them): the same result.
        whole = UpdateTally(denominator)
        whole.add(metrics, 1.0, {}, 0.0, loss_mask=mask)
        split = UpdateTally(denominator)
        for row, weight in ((0, 0.75), (1, 0.25)):
            _, row_metrics = policy_loss(logprobs[row:row + 1], old_logprobs[row:row + 1], advantages[row:row + 1],
                                         mask[row:row + 1], clip_low=0.2)
            split.add(row_metrics, weight, {}, 0.0, loss_mask=mask[row:row + 1])
        for tally in (whole, split):
            result = tally.result(stopped_early=False)
            assert result["clipfrac"] == pytest.approx(clipfrac), denominator
            assert result["approx_kl"] == pytest.approx(approx_kl), denominator
            assert result["pg_loss"] == pytest.approx(metrics["pg_loss"] if tally is whole else result["pg_loss"])
    with pytest.raises(ValueError, match="metric_denominator"):
        UpdateTally("padding")


def test_metric_denominator_changes_the_log_not_the_update(tmp_path, tiny_model_dir):
    """The same step under both denominators: identical weights (target_kl and the loss read the
    token means), and the logged clip fraction and approx_kl scaled by tokens / positions."""
    from ppo.models.policy import load_tokenizer

    # Frequent stop tokens give the random model responses shorter than the width: padding to count.
    stops = load_tokenizer(tiny_model_dir).convert_tokens_to_ids(["1", "3", "5", "7"])
    runs = {}
    for denominator in ("tokens", "all_positions"):
        torch.manual_seed(0)
        run = trainer(tmp_path / denominator, tiny_model_dir, metric_denominator=denominator, ppo_epochs=2, lr=3e-2,
                      total_steps=1, pad_to_response_length=True, stop_token_ids=stops)
        runs[denominator] = (run.train_step(), params(run.policy))
    (tokens, tokens_weights), (positions, positions_weights) = runs["tokens"], runs["all_positions"]
    assert all(torch.equal(a, b) for a, b in zip(tokens_weights, positions_weights))
    assert tokens["approx_kl"] > 0 and tokens["clipfrac"] > 0
    assert tokens["response_length"] < TINY["response_length"]  # padding to count
    share = tokens["response_length"] / TINY["response_length"]  # real tokens / positions
    assert positions["approx_kl"] == pytest.approx(tokens["approx_kl"] * share, rel=1e-5)
    assert positions["clipfrac"] == pytest.approx(tokens["clipfrac"] * share, rel=1e-5, abs=1e-9)

"""Presets against their sources: the tables in docs/presets.md, AlpacaFarm's fixed-width
semantics and TRL's PPO step recomputed independently, and the new toggles' effects.

The independent implementations below are written from the upstream math over plain
padded tensors (loops over time, no project function), so a change to the project's
functions that moves a preset away from its source fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from gae import estimate_advantages, whiten
from ppo.algorithm.buffer import accumulation_weights
from ppo.config import PRESETS, TESTBED_ADJUSTMENTS, TESTBED_SCALE, PPOConfig, preset
from ppo.algorithm.kl import kl_penalty
from ppo.algorithm.losses import aggregate, critic_loss_mask, token_loss_weights, value_loss
from ppo.algorithm.policy_losses import policy_loss
from ppo.algorithm.rewards import apply_missing_eos, score_positions, shape_rewards, whiten_rewards, whitening_gae_mask
from ppo.models.rollout import Rollout, pad_to_width

PRESETS_DOC = Path(__file__).resolve().parent.parent / "docs" / "presets.md"
TABLE_COLUMNS = ("field", "preset", "upstream", "file", "line", "commit", "status")
_LITERAL = re.compile(r"^`([^`]+)`$")


def source_tables() -> dict[str, list[dict[str, str]]]:
    """Preset name -> the rows of its table in docs/presets.md."""
    tables: dict[str, list[dict[str, str]]] = {}
    current = None
    for line in PRESETS_DOC.read_text().splitlines():
        heading = re.match(r"^## `([a-z_]+)`\s*$", line)
        if heading:
            current = tables.setdefault(heading[1], [])
            continue
        if current is None or not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(TABLE_COLUMNS), f"presets.md row {cells[0]} has {len(cells)} cells"
        current.append(dict(zip(TABLE_COLUMNS, cells)))
    return tables


def literal(cell: str):
    match = _LITERAL.match(cell)
    if match is None:
        return None
    try:
        return ast.literal_eval(match[1])
    except (ValueError, SyntaxError):  # code quoted from the source, not a value
        return None


def test_every_preset_has_a_source_table():
    assert set(source_tables()) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_source_table_quotes_the_preset(name):
    config, testbed = preset(name), preset(name, testbed=True)
    wrong = []
    for row in source_tables()[name]:
        field = row["field"].strip("`")
        assert hasattr(config, field), f"{name}: no PPOConfig field {field}"
        quoted = literal(row["preset"])
        if quoted != getattr(config, field):
            wrong.append(f"{field}: table says {row['preset']}, preset gives {getattr(config, field)!r}")
        upstream = literal(row["upstream"])
        if row["status"].startswith(("same", "shrunk")) and upstream is not None and upstream != quoted:
            wrong.append(f"{field}: marked {row['status'][:6]!r} but upstream {upstream!r} != {quoted!r}")
        if row["status"].startswith("shrunk for the testbed"):
            scaled = set(TESTBED_SCALE) | set(TESTBED_ADJUSTMENTS.get(name, {}))
            if field not in scaled or getattr(testbed, field) == quoted:
                wrong.append(f"{field}: marked shrunk for the testbed, but the testbed does not change it")
        assert re.match(r"^(same|shrunk|deliberate difference)", row["status"]), row["status"]
    assert not wrong, f"docs/presets.md table of {name!r} disagrees:\n" + "\n".join(wrong)


# ------------------------------------------------------------------ a fixed ragged batch
B, WIDTH = 8, 12
LENGTHS = torch.tensor([3, 7, 1, 5, 9, 2, 6, 4])  # the longest response is 9 < WIDTH


def ragged_batch(width: int):
    torch.manual_seed(0)
    mask = (torch.arange(width)[None, :] < LENGTHS[:, None]).float()  # [B, width]
    logprobs = -torch.rand(B, width) * mask  # padding log-probs 0, as AlpacaFarm's ignore_index makes them
    ref_logprobs = (logprobs - 0.3 * torch.randn(B, width)) * mask
    values = torch.randn(B, width) * mask  # the critic's values, 0 on padding here (docs/presets.md)
    new_logprobs = (logprobs + 0.4 * torch.randn(B, width)) * mask
    scores = torch.tensor([1.0, -0.5, 2.0, 0.3, -1.2, 0.8, 0.0, 1.5])
    return mask, logprobs, ref_logprobs, values, new_logprobs, scores


def alpacafarm_reference(scores, logprobs, ref_logprobs, values, new_logprobs, beta, cliprange, width):
    """AlpacaFarm's rollout and loss over a batch padded to `width`, written out step by step."""
    kl = torch.clamp(logprobs - ref_logprobs, min=0.0)
    rewards = -beta * kl
    for row in range(B):  # the score at the last non-pad position
        rewards[row, int(LENGTHS[row]) - 1] += scores[row]
    flat = rewards.double().flatten()
    mean, std = flat.mean(), flat.std(unbiased=False)
    rewards = ((rewards.double() - mean) / (std + 1e-8) + mean).float()  # shift_mean=False, no mask
    advantages = torch.zeros(B, width)
    last = torch.zeros(B)
    for t in reversed(range(width)):  # gamma = lambda = 1 over every column
        next_values = values[:, t + 1] if t < width - 1 else torch.zeros(B)
        last = rewards[:, t] + next_values - values[:, t] + last
        advantages[:, t] = last
    returns = advantages + values
    flat = advantages.double().flatten()
    advantages = ((advantages.double() - flat.mean()) / (flat.std(unbiased=False) + 1e-8)).float()
    new_logprobs = new_logprobs.clone().requires_grad_(True)
    ratio = torch.exp(new_logprobs - logprobs)
    losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange))
    loss = losses.mean()  # over [B, width], padding included
    loss.backward()
    return rewards, advantages, returns, loss.detach(), new_logprobs.grad


def test_alpacafarm_preset_equals_alpacafarm_math_over_the_padded_width():
    cfg = preset("alpacafarm", testbed=True, response_length=WIDTH)
    assert cfg.pad_to_response_length and cfg.whiten_advantages_over_padding
    mask, logprobs, ref_logprobs, values, new_logprobs, scores = ragged_batch(WIDTH)
    # The project's phases 4-7 as the trainer runs them under this config.
    kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero) * mask
    token_rewards = shape_rewards(scores, kl, mask, cfg.kl_coef)
    token_rewards = whiten_rewards(token_rewards, mask, cfg.reward_whitening_mode)
    advantages, returns = estimate_advantages(
        "gae", token_rewards=token_rewards, response_mask=whitening_gae_mask(mask, cfg.reward_whitening_mode),
        values=values, gamma=cfg.gamma, lam=cfg.lam)
    advantages = whiten(advantages, None if cfg.whiten_advantages_over_padding else mask)
    new = new_logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(new, logprobs, advantages, mask, clip_low=cfg.cliprange, loss_agg=cfg.loss_agg,
                          max_len=cfg.response_length)
    loss.backward()

    ref_rewards, ref_adv, ref_returns, ref_loss, ref_grad = alpacafarm_reference(
        scores, logprobs, ref_logprobs, values, new_logprobs, cfg.kl_coef, cfg.cliprange, WIDTH)
    close = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(token_rewards, ref_rewards, **close)
    torch.testing.assert_close(returns, ref_returns, **close)
    torch.testing.assert_close(advantages * mask, ref_adv * mask, **close)  # real tokens: what the loss sees
    # AlpacaFarm's padding log-probs are the constant 0 (no gradient); the real tokens' must agree.
    torch.testing.assert_close(new.grad, ref_grad * mask, **close)
    # AlpacaFarm's value also holds padding's constant -A_pad (ratio 1 there): no gradient.
    padding_term = (-ref_adv * (1 - mask)).sum() / (B * WIDTH)
    torch.testing.assert_close(loss.detach() + padding_term, ref_loss, **close)


def test_alpacafarm_critic_loss_equals_alpacafarm_over_the_padded_width():
    """value_loss_over_padding: the critic's values on padding enter GAE over every column,
    and its clipped loss is a mean over the whole padded [B, response_len] tensor."""
    cfg = preset("alpacafarm", testbed=True, response_length=WIDTH)
    assert cfg.value_loss_over_padding
    mask, logprobs, ref_logprobs, _, new_logprobs, scores = ragged_batch(WIDTH)
    torch.manual_seed(2)
    values = torch.randn(B, WIDTH)  # the old critic's values, padding included
    vpred = values + 0.5 * torch.randn(B, WIDTH)  # the update's, padding included
    assert (values * (1 - mask)).abs().sum() > 0
    # The project's phases 5-7 as the trainer runs them under this config.
    kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero) * mask
    token_rewards = whiten_rewards(shape_rewards(scores, kl, mask, cfg.kl_coef), mask, cfg.reward_whitening_mode)
    gae_mask = torch.ones_like(mask) if cfg.value_loss_over_padding else whitening_gae_mask(mask, "alpacafarm")
    _, returns = estimate_advantages("gae", token_rewards=token_rewards, response_mask=gae_mask, values=values,
                                     gamma=cfg.gamma, lam=cfg.lam)
    new_values = vpred.clone().requires_grad_(True)
    critic_mask = critic_loss_mask(mask, cfg.value_loss_over_padding, cfg.score_position)
    vf, _ = value_loss(new_values, values, returns, critic_mask, clip_range_value=cfg.cliprange_value)
    vf.backward()

    _, _, ref_returns, _, _ = alpacafarm_reference(scores, logprobs, ref_logprobs, values, new_logprobs,
                                                   cfg.kl_coef, cfg.cliprange, WIDTH)
    theirs = vpred.clone().requires_grad_(True)
    clipped = torch.clamp(theirs, min=values - cfg.cliprange_value, max=values + cfg.cliprange_value)
    ref_vf = 0.5 * torch.maximum((theirs - ref_returns) ** 2.0, (clipped - ref_returns) ** 2.0).mean()
    ref_vf.backward()
    close = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns, ref_returns, **close)  # padding columns included
    torch.testing.assert_close(vf.detach(), ref_vf.detach(), **close)
    torch.testing.assert_close(new_values.grad, theirs.grad, **close)
    assert (new_values.grad * (1 - mask)).abs().sum() > 0  # padding trains the critic
    # Off, the critic sees the real tokens only and the loss differs.
    masked, _ = value_loss(vpred, values, returns, mask, clip_range_value=cfg.cliprange_value)
    assert abs(float(masked) - float(ref_vf.detach())) > 1e-3


def test_critic_loss_on_padding_is_exact_for_1_vs_4_micro_batches():
    """Token shares over the critic's own mask make accumulation exact for it too."""
    mask = ragged_batch(WIDTH)[0]
    mask[5] = 0  # a row left out of the loss (filtered) stays out of the critic's
    torch.manual_seed(3)
    values, returns, vpred = torch.randn(B, WIDTH), torch.randn(B, WIDTH), torch.randn(B, WIDTH)
    critic = critic_loss_mask(mask, over_padding=True)
    assert critic[5].sum() == 0 and critic[0].sum() == WIDTH
    whole, _ = value_loss(vpred, values, returns, critic, clip_range_value=0.2)
    parts = [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    _, weights = accumulation_weights([mask[p] for p in parts], "seq_mean_token_sum_norm",
                                      value_masks=[critic[p] for p in parts])
    accumulated = sum(w * value_loss(vpred[p], values[p], returns[p], critic[p], clip_range_value=0.2)[0]
                      for w, p in zip(weights, parts))
    torch.testing.assert_close(accumulated, whole)


def test_padding_width_changes_alpacafarm_whitening():
    """The same batch at the batch's own width and padded: AlpacaFarm's returns depend on it."""
    mask, _, _, _, _, scores = ragged_batch(WIDTH)
    narrow = mask[:, :9]
    kl = torch.zeros_like(narrow)
    own = whiten_rewards(shape_rewards(scores, kl, narrow, 0.0), narrow, "alpacafarm")
    fixed = whiten_rewards(shape_rewards(scores, torch.zeros_like(mask), mask, 0.0), mask, "alpacafarm")
    assert not torch.allclose(own, fixed[:, :9])
    masked_own = whiten_rewards(shape_rewards(scores, kl, narrow, 0.0), narrow, "masked")
    masked_fixed = whiten_rewards(shape_rewards(scores, torch.zeros_like(mask), mask, 0.0), mask, "masked")
    torch.testing.assert_close(masked_own, masked_fixed[:, :9])  # masked statistics ignore the width


def epsilon_placement_at_the_preset_width() -> dict[str, float]:
    """Where the epsilon sits in whitening, at the alpacafarm preset's real scale: the pinned
    reward model's scores of 512 SFT responses (the ``response_a`` of its first 512 preference
    pairs: `rollout_batch_size` SFT samples) placed on their last token of a ``[512, 300]``
    batch (`response_length` 300, the width AlpacaFarm pads to), the KL 0 as at the first step.
    Compares this project's reward whitening (``rsqrt(var + 1e-8)``) with AlpacaFarm's
    ``torch_ops.whiten`` (``/ (std + 1e-8)``), then GAE (gamma = lambda = 1, values 0, every
    column) and advantage whitening in each form. Returns the shaped-reward std, the relative
    gap of the two scale factors, the largest relative difference of the whitened rewards and
    the largest absolute difference of the whitened advantages (and the largest advantage)."""
    from ppo.models.policy import load_tokenizer
    from ppo.tasks.preferences import load_preferences
    from ppo.tasks.rlhf import pinned_path
    from value_model import ScalarHeadModel
    from value_model.reward_model import encode_responses, score_texts

    config = preset("alpacafarm")
    rows, width = config.rollout_batch_size, config.response_length
    path = pinned_path()
    pairs = load_preferences(path / "preferences.jsonl")[:rows]
    model, tokenizer = ScalarHeadModel.from_pretrained(path).eval(), load_tokenizer(path)
    prompts, texts, eos = [p["prompt"] for p in pairs], [p["response_a"] for p in pairs], [p["eos_a"] for p in pairs]
    scores = score_texts(model, tokenizer, prompts, texts, eos).double()  # [512]
    lengths = encode_responses(tokenizer, texts, eos)[1].sum(-1)  # [512]
    shaped = torch.zeros(rows, width, dtype=torch.float64)  # [512, 300]
    shaped[torch.arange(rows), lengths - 1] = scores
    mask = torch.ones_like(shaped)
    ours = whiten_rewards(shaped, mask, "alpacafarm")  # [512, 300]
    mean, std = shaped.mean(), shaped.std(unbiased=False)
    theirs = (shaped - mean) / (std + 1e-8) + mean  # AlpacaFarm torch_ops.whiten(shift_mean=False)
    advantages = {}
    for name, rewards in (("ours", ours), ("theirs", theirs)):
        running, columns = torch.zeros(rows, dtype=torch.float64), []
        for t in reversed(range(width)):  # gamma = lambda = 1, values 0
            running = rewards[:, t] + running
            columns.append(running)
        raw = torch.stack(columns[::-1], dim=1)
        advantages[name] = (whiten(raw) if name == "ours"
                            else (raw - raw.mean()) / (raw.std(unbiased=False) + 1e-8))
    return {"std": float(std), "scale_gap": float((std + 1e-8) * torch.rsqrt(std ** 2 + 1e-8) - 1),
            "reward_gap": float(((ours - theirs).abs() / theirs.abs()).max()),
            "advantage_gap": float((advantages["ours"] - advantages["theirs"]).abs().max()),
            "advantage_max": float(advantages["theirs"].abs().max())}


def test_epsilon_placement_at_the_alpacafarm_width_is_what_presets_md_says():
    """docs/presets.md states the gap between the two epsilon placements at the preset's real
    width; every figure of that sentence is this measurement on the committed reward model and
    preference data, rounded as written."""
    gap = epsilon_placement_at_the_preset_width()
    assert 0.01 < gap["std"] < 0.2 and gap["scale_gap"] < 0  # a small std: the epsilon matters more
    def sci(value: float, digits: int) -> str:  # 2.6e-6, as the page writes it
        return f"{value:.{digits}e}".replace("e-0", "e-")

    text = " ".join(PRESETS_DOC.read_text().split())
    stated = (f"shaped-reward std of {gap['std']:.3f}", f"differ by {sci(abs(gap['scale_gap']), 1)}",
              f"at most {sci(gap['reward_gap'], 1)} relative", f"at most {sci(gap['advantage_gap'], 0)}",
              f"as large as {gap['advantage_max']:.1f}")
    missing = [phrase for phrase in stated if phrase not in text]
    assert not missing, f"docs/presets.md does not state the measured {missing}"


def test_pad_to_width_adds_padding_columns_only():
    rollout = Rollout(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                      torch.tensor([[5, 2], [6, 7]]), torch.tensor([[1, 1], [1, 0]]), torch.tensor([True, False]),
                      generation_logits=torch.ones(2, 2, 4))
    padded = pad_to_width(rollout, 5, pad_token_id=0)
    assert padded.response_ids.tolist() == [[5, 2, 0, 0, 0], [6, 7, 0, 0, 0]]
    assert padded.response_mask.tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert padded.generation_logits.shape == (2, 5, 4) and padded.generation_logits[:, 2:].abs().sum() == 0
    assert padded.response_lengths.tolist() == rollout.response_lengths.tolist()
    with pytest.raises(ValueError):
        pad_to_width(rollout, 1, 0)


def test_whitening_advantages_over_padding_moves_real_token_advantages():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    advantages = torch.tensor([[1.0, 2.0, 5.0, 5.0], [3.0, 5.0, 5.0, 5.0]])  # padding holds 5
    masked = whiten(advantages, mask)
    unmasked = whiten(advantages, None)
    assert abs(float(masked[mask.bool()].mean())) < 1e-6
    assert float(unmasked[mask.bool()].mean()) < -0.5  # the padding's 5s pulled the mean up


# ------------------------------------------------------------------ TRL PPO v0.19.1
def trl_reference(scores, has_eos, logprobs, ref_logprobs, values, new_logprobs, new_values, cfg):
    """TRL's PPOTrainer step on responses that fill the width (its default: no stop token)."""
    width = logprobs.shape[1]
    scores = scores.clone()
    scores[~has_eos] -= cfg.missing_eos_penalty
    rewards = -cfg.kl_coef * (logprobs - ref_logprobs)
    rewards[:, width - 1] += scores  # sequence_length + 1 == width falls back to the last token
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(width)):
        next_values = values[:, t + 1] if t < width - 1 else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + cfg.gamma * next_values - values[:, t]
        last = delta + cfg.gamma * cfg.lam * last
        advantages[:, t] = last
    returns = advantages + values
    flat = advantages.double().flatten()
    # Population variance here; TRL's masked_var is the sample variance (docs/presets.md).
    advantages = ((advantages.double() - flat.mean()) * torch.rsqrt(flat.var(unbiased=False) + 1e-8)).float()
    new_logprobs = new_logprobs.clone().requires_grad_(True)
    new_values = new_values.clone().requires_grad_(True)
    clipped_values = torch.clamp(new_values, values - cfg.cliprange_value, values + cfg.cliprange_value)
    vf_loss = 0.5 * torch.maximum((new_values - returns) ** 2, (clipped_values - returns) ** 2).mean()
    ratio = torch.exp(new_logprobs - logprobs)
    pg_loss = torch.maximum(-advantages * ratio,
                            -advantages * torch.clamp(ratio, 1 - cfg.cliprange, 1 + cfg.cliprange)).mean()
    (pg_loss + cfg.vf_coef * vf_loss).backward()  # no gradient clipping before optimizer.step()
    return advantages, returns, pg_loss.detach(), vf_loss.detach(), new_logprobs.grad, new_values.grad


def test_trl_ppo_preset_equals_trl_step_math():
    cfg = preset("trl_ppo", testbed=True, response_length=6)
    assert cfg.max_grad_norm is None and cfg.missing_eos == "penalty" and cfg.missing_eos_penalty == 1.0
    torch.manual_seed(1)
    width = cfg.response_length
    mask = torch.ones(B, width)
    logprobs, ref_logprobs = -torch.rand(B, width), -torch.rand(B, width)
    values, new_values = torch.randn(B, width), torch.randn(B, width)
    new_logprobs = logprobs + 0.4 * torch.randn(B, width)
    scores, has_eos = torch.randn(B), torch.tensor([True, False] * (B // 2))

    kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero) * mask
    adjusted = apply_missing_eos(scores, has_eos, cfg.missing_eos, cfg.missing_eos_penalty)
    token_rewards = shape_rewards(adjusted, kl, mask, cfg.kl_coef)
    advantages, returns = estimate_advantages("gae", token_rewards=token_rewards, response_mask=mask,
                                              values=values, gamma=cfg.gamma, lam=cfg.lam)
    advantages = whiten(advantages, mask)
    new_lp, new_v = new_logprobs.clone().requires_grad_(True), new_values.clone().requires_grad_(True)
    pg, _ = policy_loss(new_lp, logprobs, advantages, mask, clip_low=cfg.cliprange, loss_agg=cfg.loss_agg)
    vf, _ = value_loss(new_v, values, returns, mask, clip_range_value=cfg.cliprange_value)
    (pg + cfg.vf_coef * vf).backward()

    ref = trl_reference(scores, has_eos, logprobs, ref_logprobs, values, new_logprobs, new_values, cfg)
    close = dict(atol=1e-5, rtol=1e-5)
    for ours, theirs in zip((advantages, returns, pg.detach(), vf.detach(), new_lp.grad, new_v.grad), ref):
        torch.testing.assert_close(ours, theirs, **close)


def trl_reference_with_stop(scores, lengths, logprobs, ref_logprobs, values, new_logprobs, new_values, cfg):
    """TRL's PPOTrainer step with `stop_token="eos"` on responses of `lengths` tokens (the
    stop token included; a response that fills the width has none), written from
    trl/trainer/ppo_trainer.py L494-586 and utils.py `first_true_indices`."""
    rows, width = logprobs.shape
    invalid = 1.0  # INVALID_LOGPROB
    index = torch.arange(width).repeat(rows, 1)
    sequence_lengths = lengths - 1  # first_true_indices(response == pad) - 1: the last real token
    padding_mask = index > sequence_lengths[:, None]
    padding_mask_p1 = index > (sequence_lengths + 1)[:, None]
    logprobs = logprobs.masked_fill(padding_mask, invalid)
    ref_logprobs = ref_logprobs.masked_fill(padding_mask, invalid)
    values = values.masked_fill(padding_mask_p1, 0)
    scores = scores.clone()
    contain_eos = lengths < width  # every shorter response ends with its stop token here
    scores[~contain_eos] -= cfg.missing_eos_penalty
    rewards = -cfg.kl_coef * (logprobs - ref_logprobs)
    actual_end = torch.where(sequence_lengths + 1 < width, sequence_lengths + 1, sequence_lengths)
    rewards[torch.arange(rows), actual_end] += scores
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(rows)
    for t in reversed(range(width)):
        next_values = values[:, t + 1] if t < width - 1 else torch.zeros(rows)
        last = rewards[:, t] + cfg.gamma * next_values - values[:, t] + cfg.gamma * cfg.lam * last
        advantages[:, t] = last
    returns = advantages + values
    real = ~padding_mask
    flat = advantages[real].double()
    # Population variance here; TRL's masked_var is the sample variance (docs/presets.md).
    advantages = ((advantages.double() - flat.mean()) * torch.rsqrt(flat.var(unbiased=False) + 1e-8)).float()
    advantages = advantages.masked_fill(padding_mask, 0)
    new_logprobs = new_logprobs.clone().requires_grad_(True)
    new_values = new_values.clone().requires_grad_(True)
    vpred = new_values.masked_fill(padding_mask_p1, 0)
    clipped = torch.clamp(vpred, values - cfg.cliprange_value, values + cfg.cliprange_value)
    vf_max = torch.max((vpred - returns) ** 2, (clipped - returns) ** 2)
    vf_loss = 0.5 * vf_max[~padding_mask_p1].mean()
    ratio = torch.exp(new_logprobs.masked_fill(padding_mask, invalid) - logprobs)
    pg_max = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - cfg.cliprange, 1 + cfg.cliprange))
    pg_loss = pg_max[real].mean()
    (pg_loss + cfg.vf_coef * vf_loss).backward()
    return advantages, returns, pg_loss.detach(), vf_loss.detach(), new_logprobs.grad, new_values.grad


def test_trl_ppo_score_after_the_stop_token_equals_trl():
    """score_position="after_last_token": TRL puts the score one column after the stop
    token (where the width has one), and its critic values and is trained on that column."""
    cfg = preset("trl_ppo", testbed=True, response_length=WIDTH)
    assert cfg.score_position == "after_last_token" and cfg.stop_token_ids is None  # the testbed's EOS stop
    lengths = torch.tensor([3, 7, 1, 5, WIDTH, 2, 6, WIDTH - 1])  # one fills the width, one ends on its last-but-one
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    torch.manual_seed(4)
    logprobs, ref_logprobs = -torch.rand(B, WIDTH) * mask, -torch.rand(B, WIDTH) * mask
    values, new_values = torch.randn(B, WIDTH), torch.randn(B, WIDTH)
    new_logprobs = (logprobs + 0.4 * torch.randn(B, WIDTH)) * mask
    scores = torch.randn(B)

    kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero) * mask
    adjusted = apply_missing_eos(scores, lengths < WIDTH, cfg.missing_eos, cfg.missing_eos_penalty)
    token_rewards = shape_rewards(adjusted, kl, mask, cfg.kl_coef, score_position=cfg.score_position)
    reward_mask = score_positions(mask, cfg.score_position)
    old_values = values * reward_mask  # ForwardPasses.values: the critic's positions
    advantages, returns = estimate_advantages("gae", token_rewards=token_rewards, response_mask=reward_mask,
                                              values=old_values, gamma=cfg.gamma, lam=cfg.lam)
    advantages = whiten(advantages, mask)
    new_lp, new_v = new_logprobs.clone().requires_grad_(True), new_values.clone().requires_grad_(True)
    pg, _ = policy_loss(new_lp, logprobs, advantages, mask, clip_low=cfg.cliprange, loss_agg=cfg.loss_agg)
    vf, _ = value_loss(new_v, old_values, returns, critic_loss_mask(mask, cfg.value_loss_over_padding,
                                                                     cfg.score_position),
                       clip_range_value=cfg.cliprange_value)
    (pg + cfg.vf_coef * vf).backward()

    ref = trl_reference_with_stop(scores, lengths, logprobs, ref_logprobs, values, new_logprobs, new_values, cfg)
    close = dict(atol=1e-5, rtol=1e-5)
    ours = (advantages * mask, returns, pg.detach(), vf.detach(), new_lp.grad, new_v.grad)
    for name, a, b in zip(("advantages", "returns", "pg_loss", "vf_loss", "logprob grad", "value grad"), ours, ref):
        torch.testing.assert_close(a, b, **close, msg=name)
    # The score sits after the stop token, on the last token only where the width ends.
    assert token_rewards[0, 3] - (-cfg.kl_coef * kl[0, 3]) == pytest.approx(float(adjusted[0]))
    assert token_rewards[4, WIDTH - 1] - (-cfg.kl_coef * kl[4, WIDTH - 1]) == pytest.approx(float(adjusted[4]))
    # With the score on the last token instead, TRL's returns are not reproduced.
    last = shape_rewards(adjusted, kl, mask, cfg.kl_coef)
    _, last_returns = estimate_advantages("gae", token_rewards=last, response_mask=mask, values=values * mask,
                                          gamma=cfg.gamma, lam=cfg.lam)
    assert not torch.allclose(last_returns * mask, ref[1] * mask, atol=1e-3)


# ------------------------------------------------------------------ seq_mean_token_sum
def test_seq_mean_token_sum_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(values, mask, "seq_mean_token_sum").item() == pytest.approx(5.0)  # (6 + 4) / 2
    assert token_loss_weights(torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]]), "seq_mean_token_sum").tolist() == [2.5, 2.5]


@pytest.mark.parametrize("skip_empty_rows", [False, True])
def test_seq_mean_token_sum_is_exact_for_1_vs_4_micro_batches(skip_empty_rows):
    torch.manual_seed(3)
    rows, width = 8, 5
    mask = (torch.rand(rows, width) > 0.4).float()
    mask[2] = 0  # an empty row
    advantages, old = torch.randn(rows, width), -torch.rand(rows, width)
    theta = (-torch.rand(rows, width)).requires_grad_(True)

    def grad(micro: int) -> torch.Tensor:
        theta.grad = None
        chunks = [slice(k * rows // micro, (k + 1) * rows // micro) for k in range(micro)]
        weights, _ = accumulation_weights([mask[c] for c in chunks], "seq_mean_token_sum", skip_empty_rows)
        for c, w in zip(chunks, weights):
            loss, _ = policy_loss(theta[c], old[c], advantages[c], mask[c], loss_agg="seq_mean_token_sum",
                                  skip_empty_rows=skip_empty_rows)
            (loss * w).backward()
        return theta.grad.clone()

    torch.testing.assert_close(grad(1), grad(4), atol=1e-7, rtol=1e-6)


def test_adam_betas_reach_the_optimizer():
    from ppo.models.optimization import build_optimizers

    config = PPOConfig(adam_beta1=0.8, adam_beta2=0.95, separate_value_optimizer=False)
    policy_opt, _ = build_optimizers(config, torch.nn.Linear(2, 2), None)
    assert policy_opt.param_groups[0]["betas"] == (0.8, 0.95)
    with pytest.raises(ValueError, match="adam_beta2"):
        PPOConfig(adam_beta2=1.0)

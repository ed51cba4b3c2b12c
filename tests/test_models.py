"""Value model (scalar head) and teacher-forced log-probs."""

import math

import pytest
import torch

from ppo.models.logprobs import logprobs_from_logits, response_logprobs, response_values
from ppo.models.policy import ModelLoadError, load_policy
from value_model import ScalarHeadModel


def test_logprobs_temperature_scaling_hand_case():
    logits = torch.tensor([[[2.0, 0.0]]])
    tokens = torch.tensor([[0]])
    # T = 1: p = e^2 / (e^2 + 1); T = 2: p = e / (e + 1)
    assert logprobs_from_logits(logits, tokens, 1.0).item() == pytest.approx(math.log(math.e**2 / (math.e**2 + 1)))
    assert logprobs_from_logits(logits, tokens, 2.0).item() == pytest.approx(math.log(math.e / (math.e + 1)))
    _, entropy = logprobs_from_logits(torch.zeros(1, 1, 4), tokens, 1.0, with_entropy=True)
    assert entropy.item() == pytest.approx(math.log(4))


def test_response_logprobs_match_a_manual_forward(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    pad = tokenizer.pad_token_id
    query = torch.tensor([[pad, 1, 5, 6], [1, 5, 6, 7]])
    query_mask = (query != pad).long()
    response = torch.tensor([[8, 9, pad], [8, 9, 10]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logprobs = response_logprobs(model, query, query_mask, response, response_mask, temperature=0.7)
    # row 1 has no padding: compare with a plain forward pass
    with torch.no_grad():
        full = model(torch.cat([query[1:], response[1:]], dim=1)).logits[0]
    manual = torch.log_softmax(full[3:6] / 0.7, -1).gather(-1, response[1][:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs[1], manual, atol=1e-5, rtol=1e-5)
    # row 0's first two tokens equal the same prompt without left padding
    with torch.no_grad():
        alone = model(torch.tensor([[1, 5, 6, 8, 9]])).logits[0]
    manual0 = torch.log_softmax(alone[2:4] / 0.7, -1).gather(-1, torch.tensor([[8], [9]])).squeeze(-1)
    torch.testing.assert_close(logprobs[0, :2], manual0, atol=1e-5, rtol=1e-5)


def test_value_model_zero_head_save_load(tmp_path, tiny_model_dir):
    policy, _ = load_policy(tiny_model_dir)
    critic = ScalarHeadModel.from_policy(policy, head_init="zero")
    query, mask = torch.tensor([[1, 5, 6]]), torch.ones(1, 3, dtype=torch.long)
    values = response_values(critic, query, mask, torch.tensor([[7, 8]]), torch.ones(1, 2, dtype=torch.long))
    assert values.shape == (1, 2) and torch.equal(values, torch.zeros(1, 2))  # zeroed head: values start at 0
    # the critic is a separate network: changing it leaves the policy untouched
    with torch.no_grad():
        next(critic.backbone.parameters()).add_(1.0)
    assert not torch.equal(next(critic.backbone.parameters()), next(policy.base_model.parameters()))
    reward_model = ScalarHeadModel.from_policy(policy, head_init="normal", kind="reward")
    assert reward_model.head.weight.abs().sum() > 0
    reward_model.save_pretrained(tmp_path / "rm")
    loaded = ScalarHeadModel.from_pretrained(tmp_path / "rm")
    assert loaded.kind == "reward"
    with torch.no_grad():
        torch.testing.assert_close(loaded(query), reward_model(query))
    as_critic = ScalarHeadModel.from_pretrained(tmp_path / "rm", zero_head=True)
    assert as_critic.head.weight.abs().sum() == 0


def test_plain_causal_lm_is_not_a_reward_model(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a scalar-head model"):
        ScalarHeadModel.from_pretrained(tiny_model_dir)

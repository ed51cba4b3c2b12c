"""AlpacaFarm's other methods (ppo/algorithm/feedback_methods.py, ppo/tasks/feedback_methods.py):
each objective on a fixed batch, with values computed by hand or by a transcription of
AlpacaFarm's own code (tatsu-lab/alpaca_farm@30717dd)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from ppo.algorithm.feedback_methods import (best_of_n_choice, best_of_n_kl, full_kl_and_entropy, quantile_tokens,
                                            quark_loss, supervised_nll)
from ppo.models.policy import encode_prompts
from ppo.models.tiny_model import TinyModelConfig, build_char_tokenizer, build_tiny_model
from ppo.tasks import feedback_methods as fm
from ppo.tasks.base import Problem

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer()
    return build_tiny_model(TINY, tokenizer).eval(), tokenizer


# ---------------------------------------------------------------------------------- best-of-n
def test_best_of_n_picks_the_argmax_proxy_never_the_gold():
    proxy = torch.tensor([[0.2, 0.9, -1.0, 0.3],   # prompt 0: sample 1
                          [5.0, 5.0, 1.0, 4.0],    # prompt 1: a tie goes to the first
                          [-3.0, -2.0, -2.5, -9.0]])  # prompt 2: sample 1 (all negative)
    assert best_of_n_choice(proxy).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="prompts, n"):
        best_of_n_choice(torch.tensor([1.0, 2.0]))


def test_best_of_n_kl_formula_by_hand():
    assert best_of_n_kl(1) == 0.0  # best-of-1 is the policy itself
    assert best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert best_of_n_kl(16) == pytest.approx(2.772588722 - 0.9375)


def test_best_of_n_evaluation_returns_the_proxy_argmax_sample(monkeypatch):
    """evaluate_method with best_of_n: of each problem's n samples the one the reward model
    scores highest is judged by the gold, whatever the gold thinks of the others."""
    problems = [Problem("2+3=", "5"), Problem("4+4=", "8")]
    # per problem 3 samples: the proxy prefers a wrong answer on problem 0 and the right one on problem 1
    texts = ["2+3=5;#5", "2+3=6;#6", "2+3=5;chk5;#5", "4+4=9;#9", "4+4=8;#8", "4+4=7;#7"]
    proxy = torch.tensor([0.1, 0.8, 0.3, 0.0, 0.5, 0.4])
    monkeypatch.setattr(fm, "sample_responses", lambda *a, **k: (list(texts), [True] * 6, []))

    class Proxy:
        def score(self, prompts, responses, has_eos):
            assert prompts == ["2+3=", "2+3=", "2+3=", "4+4=", "4+4=", "4+4="]
            return proxy.clone()

    policy, tokenizer = tiny_policy()
    reference = {"problems": problems, "gold": [0.0, 0.0]}  # the SFT reference samples were both wrong
    metrics = fm.evaluate_method(fm.Trained(policy, tokenizer, best_of_n=3), policy, tokenizer,
                                 fm.PreferenceTask(), Proxy(), reference, fm.ComparisonConfig(), seed=1)
    assert metrics["proxy_reward"] == pytest.approx((0.8 + 0.5) / 2)
    assert metrics["gold_reward"] == pytest.approx((0.0 + 1.0) / 2)  # "#6" is wrong, "#8" right
    assert metrics["win_rate_vs_sft"] == pytest.approx((0.5 + 1.0) / 2)  # a tie, then a win
    assert metrics["kl_to_sft"] == pytest.approx(best_of_n_kl(3)) and metrics["kl_kind"] == "best_of_n_formula"
    assert metrics["rm_queries_per_response"] == 3
    assert metrics["response_length"] == pytest.approx((len("2+3=6;#6") + 1 + len("4+4=8;#8") + 1) / 2)


# ---------------------------------------------------------------------------------- expert iteration
def test_expert_iteration_objective_is_the_mean_token_nll():
    logprobs = torch.tensor([[-0.5, -1.5, -7.0], [-2.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert supervised_nll(logprobs, mask).item() == pytest.approx((0.5 + 1.5 + 2.0) / 3)


def test_expert_iteration_fine_tunes_on_each_prompts_best_of_n(monkeypatch):
    """Each round samples n per prompt, the reward model picks one per prompt, and only the
    picked samples are trained on; every sample counts as a reward-model query."""
    config = fm.ComparisonConfig(rm_queries=12, rollout_batch_size=4, quark_step_batch=4, expert_rounds=2, expert_n=3)
    rounds = []

    def fake_sample(policy, tokenizer, problems, max_new_tokens, seed):
        rounds.append([p.prompt for p in problems])
        return [f"r{len(rounds)}s{i}" for i in range(len(problems))], [True] * len(problems), []

    class Proxy:
        def score(self, prompts, responses, has_eos):
            return torch.tensor([0.0, 2.0, 1.0, 3.0, -1.0, 0.5])  # best: sample 1 of prompt 0, 0 of prompt 1

    trained_on = []
    monkeypatch.setattr(fm, "sample_responses", fake_sample)
    monkeypatch.setattr(fm, "fine_tune", lambda policy, tok, examples, *a, **k: trained_on.append(examples) or 5)
    result = fm.train_expert_iteration("policy", "tok", fm.PreferenceTask(), Proxy(), config, seed=1)
    assert len(rounds) == 2 and all(len(r) == 6 and r[0] == r[1] == r[2] for r in rounds)  # n contiguous samples
    assert [[(text, eos) for _, text, eos in examples] for examples in trained_on] == [
        [("r1s1", True), ("r1s3", True)], [("r2s1", True), ("r2s3", True)]]
    assert trained_on[0][0][0] == rounds[0][0] and trained_on[0][1][0] == rounds[0][3]
    assert result.rm_queries == 12 and result.optimizer_steps == 10


# ---------------------------------------------------------------------------------- Quark
def alpacafarm_sort_and_get(rewards, num_tokens):
    """A transcription of AlpacaFarm's DataPool.sort_and_get (quark_trainer.py L78-99 @30717dd):
    Python's sort by reward, highest first, then equal chunks with the remainder last."""
    order = [i for i, _ in sorted(enumerate(rewards), key=lambda x: x[-1], reverse=True)]
    size = len(rewards)
    chunk_sizes = [size // num_tokens] * num_tokens
    chunk_sizes[-1] += size % num_tokens
    tokens = [None] * size
    position = 0
    for chunk, chunk_size in enumerate(chunk_sizes):
        for index in order[position:position + chunk_size]:
            tokens[index] = chunk
        position += chunk_size
    return tokens


def test_quark_quantile_assignment_by_hand():
    # 10 responses, 4 quantiles: chunks of 2, 2, 2 and the last 4 (the remainder goes to the worst)
    rewards = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.8, 0.0, 0.7, 0.2, 0.6, 0.4])
    assert quantile_tokens(rewards, 4).tolist() == [3, 0, 3, 2, 0, 3, 1, 3, 1, 2]
    # ties keep their pool order, as Python's sort does
    assert quantile_tokens(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]), 2).tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="at least 2"):
        quantile_tokens(rewards, 1)


@pytest.mark.parametrize("size,num_tokens", [(10, 4), (64, 4), (7, 3), (33, 5)])
def test_quark_quantiles_equal_alpacafarm_sort_and_get(size, num_tokens):
    generator = torch.Generator().manual_seed(size)
    rewards = torch.randint(0, 6, (size,), generator=generator).float()  # many ties
    assert quantile_tokens(rewards, num_tokens).tolist() == alpacafarm_sort_and_get(rewards.tolist(), num_tokens)


def test_quark_kl_and_entropy_by_hand():
    # one position: policy [0.5, 0.5] over the two original tokens (a third, added token is dropped)
    logits = torch.tensor([[[0.0, 0.0, 5.0]]])
    ref_logits = torch.tensor([[[math.log(1.0), math.log(3.0)]]])  # q = [0.25, 0.75]
    kl, entropy = full_kl_and_entropy(logits, ref_logits, vocab_size=2)
    assert kl.item() == pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75))  # 0.5 ln(4/3)
    assert entropy.item() == pytest.approx(math.log(2))


def test_quark_kl_and_entropy_equal_alpacafarms_formula():
    """quark_trainer.py L221-224 @30717dd: F.kl_div(log_softmax(ref), softmax(pi)).sum(-1) and
    -(softmax * log_softmax).sum(-1), over the logits cut to the original vocabulary."""
    generator = torch.Generator().manual_seed(0)
    logits, ref_logits = torch.randn(3, 5, 9, generator=generator), torch.randn(3, 5, 7, generator=generator)
    kl, entropy = full_kl_and_entropy(logits, ref_logits, vocab_size=7)
    cut = logits[..., :7]
    expected_kl = F.kl_div(F.log_softmax(ref_logits, -1), F.softmax(cut, -1), reduction="none").sum(-1)
    expected_entropy = -(cut.softmax(-1) * cut.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(kl, expected_kl)
    torch.testing.assert_close(entropy, expected_entropy)


def test_quark_loss_terms_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    kl = torch.tensor([[0.1, 0.2], [0.3, 5.0]])
    entropy = torch.tensor([[1.0, 1.0], [2.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = quark_loss(logprobs, kl, entropy, mask, kl_coef=0.5, entropy_coef=0.1, response_length=4)
    # tokens: (1 + 0.05 - 0.1) + (2 + 0.1 - 0.1) + (0.5 + 0.15 - 0.2) = 3.4, over 2 rows x 4 positions
    assert loss.item() == pytest.approx(3.4 / 8)
    assert metrics["nll"] == pytest.approx(3.5 / 3) and metrics["kl_per_sequence"] == pytest.approx(0.6 / 2)
    with pytest.raises(ValueError, match="response_length"):
        quark_loss(logprobs, kl, entropy, mask, 0.5, 0.1, response_length=1)


def test_quark_loss_equals_alpacafarms_padded_mean():
    """QuarkTrainer.compute_loss L229-236 @30717dd: every term zero on padding, then .mean()
    over the [B, response_len] tensor."""
    generator = torch.Generator().manual_seed(1)
    logprobs, kl, entropy = (torch.randn(4, 6, generator=generator) for _ in range(3))
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] + [0] * 5, [1] * 5 + [0]])
    padded = [F.pad(t * mask, (0, 10 - 6)) for t in (logprobs, kl, entropy)]  # response_len 10
    expected = (-padded[0] * 1.0 + padded[1] * 0.05 - padded[2] * 0.02).mean()
    loss, _ = quark_loss(logprobs, kl, entropy, mask, kl_coef=0.05, entropy_coef=0.02, response_length=10)
    assert loss.item() == pytest.approx(expected.item())


def test_quark_control_token_placement_and_reference_without_it():
    """The policy reads <bos><reward_k><prompt>, the reference <bos><prompt> (AlpacaFarm masks the
    token out of the reference's query); the control tokens are new ids the policy never samples."""
    policy, tokenizer = tiny_policy()
    ref, _ = tiny_policy()
    tokens = [fm.quark_token(k) for k in range(4)]
    policy_tokenizer, original = fm.add_control_tokens(policy, tokenizer, tokens, seed=0)
    assert original == len(tokenizer) and len(policy_tokenizer) == original + 4
    ids = encode_prompts(policy_tokenizer, [fm.conditioned("12+3=", tokens[2])])[0]
    plain = encode_prompts(tokenizer, ["12+3="])[0]
    assert ids == [plain[0], policy_tokenizer.convert_tokens_to_ids(tokens[2]), *plain[1:]]
    assert ids[1] == original + 2
    # new embedding rows: the mean of the old rows plus noise of their spread
    rows = policy.get_input_embeddings().weight
    spread = rows[:original].std(0).max().item()
    assert torch.allclose(rows[original:].mean(0), rows[:original].mean(0), atol=3 * spread)
    # never sampled: their logits are -inf
    logits = policy(input_ids=torch.tensor([ids])).logits
    assert torch.isinf(logits[..., original:]).all() and torch.isfinite(logits[..., :original]).all()

    # One quark_update: its metrics are taken before the step; the policy reads the token, the reference not.
    config = fm.ComparisonConfig(quark_kl_coef=0.3, quark_entropy_coef=0.1)
    examples = [(Problem("12+3=", "15"), "12+3=15;#15", True, 2), (Problem("4+5=", "9"), "4+5=9;#9", False, 0)]
    batch = fm._batch(policy_tokenizer, ["<reward_2>12+3=", "<reward_0>4+5="], ["12+3=15;#15", "4+5=9;#9"],
                      [True, False])
    ref_batch = fm._batch(tokenizer, ["12+3=", "4+5="], ["12+3=15;#15", "4+5=9;#9"], [True, False])
    with torch.no_grad():
        logits = fm._response_logits(policy, *batch)
        expected_kl, _ = full_kl_and_entropy(logits, fm._response_logits(ref, *ref_batch), original)
    mask = batch[3].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, batch[2].unsqueeze(-1)).squeeze(-1)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    metrics = fm.quark_update(policy, ref, policy_tokenizer, tokenizer, examples, config, original, optimizer)
    assert metrics["nll"] == pytest.approx(float(-(logprobs * mask).sum() / mask.sum()), rel=1e-5)
    assert metrics["kl_per_token"] == pytest.approx(float((expected_kl * mask).sum() / mask.sum()), rel=1e-5)


# ---------------------------------------------------------------------------------- preference-data methods
ROWS = [
    {"prompt": "1+1=", "response_a": "#2", "response_b": "#3", "preferred": "a", "eos_a": True, "eos_b": False},
    {"prompt": "2+2=", "response_a": "#5", "response_b": "chk4;#4", "preferred": "b", "eos_a": True, "eos_b": True},
]


def test_feedme_picks_the_preferred_responses():
    assert fm.feedme_examples(ROWS) == [("1+1=", "#2", True), ("2+2=", "chk4;#4", True)]


def test_reward_conditioning_token_placement():
    examples = fm.reward_conditioning_examples(ROWS)
    assert examples == [("<good>1+1=", "#2", True), ("<bad>1+1=", "#3", False),
                        ("<good>2+2=", "chk4;#4", True), ("<bad>2+2=", "#5", True)]
    policy, tokenizer = tiny_policy()
    conditioned_tokenizer, original = fm.add_control_tokens(policy, tokenizer, [fm.GOOD_TOKEN, fm.BAD_TOKEN], seed=0)
    ids = encode_prompts(conditioned_tokenizer, [examples[0][0], examples[1][0]])
    assert [row[1] for row in ids] == [original, original + 1]  # <bos>, then the good / bad token
    assert ids[0][2:] == ids[1][2:] == encode_prompts(tokenizer, ["1+1="])[0][1:]


def test_feedme_and_reward_conditioning_read_the_reward_models_training_split(tmp_path):
    from value_model.reward_model import split_pairs

    rows = [dict(ROWS[i % 2], prompt=f"{i}+1=", gold_a=0.0, gold_b=1.0, annotator="a", answer="1") for i in range(20)]
    (tmp_path / "preferences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = fm.RLHFConfig(heldout_fraction=0.2, seed=3)
    train = fm.preference_rows(tmp_path, config)
    assert train == split_pairs(rows, 0.2, 3)[0] and len(train) == 16


def test_reward_conditioning_and_feedme_fine_tune_lowers_their_nll():
    """The supervised step of FeedME and reward conditioning: a few steps on fixed examples
    lower their mean token NLL, and the step count is epochs x batches."""
    policy, tokenizer = tiny_policy()
    conditioned_tokenizer, _ = fm.add_control_tokens(policy, tokenizer, [fm.GOOD_TOKEN, fm.BAD_TOKEN], seed=0)
    examples = fm.reward_conditioning_examples(ROWS)

    def nll():
        with torch.no_grad():
            batch = fm._batch(conditioned_tokenizer, *zip(*examples))
            return supervised_nll(fm.response_logprobs(policy, *batch), batch[3]).item()

    before = nll()
    steps = fm.fine_tune(policy, conditioned_tokenizer, examples, epochs=5, batch_size=3, lr=1e-2, seed=0)
    assert steps == 10 and nll() < before - 0.5

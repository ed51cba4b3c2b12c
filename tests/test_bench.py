"""The compute floor: FLOPs counted on real tokens only, and the passes a step cannot avoid."""

from types import SimpleNamespace

import pytest
import torch

from ppo.benchmarks.bench import (ProductTimer, calls_alone, floor_flops, format_bench, length_groups, matmul_throughput,
                             model_flops, real_sequences, sequence_flops, step_products)
from ppo.config import PPOConfig
from ppo.algorithm.dynamic_sampling import select_rollout
from ppo.models.rollout import Rollout
from ppo.trainer import RLTrainer


class LinearLM(torch.nn.Module):
    """Embedding then one bias-free linear layer: 2 * tokens * H * V FLOPs forward."""

    def __init__(self, vocab=7, hidden=5):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.out = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.out(self.embed(input_ids)))


def _rollout():
    # row 0: 2 real query tokens + 3 real response tokens; row 1: 3 + 1; row 2: 1 + 4
    query_ids = torch.tensor([[0, 4, 5], [4, 5, 6], [0, 0, 4]])
    query_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    response_ids = torch.tensor([[1, 2, 3, 0], [2, 0, 0, 0], [1, 1, 2, 3]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    return Rollout(query_ids, query_mask, response_ids, response_mask, torch.tensor([True, True, False]))


def _real_token_groups(rollout):
    return length_groups([(torch.cat(pair), len(pair[0])) for pair in real_sequences(rollout)])


def test_real_tokens_are_grouped_by_length_without_padding():
    groups, prompt_lengths = _real_token_groups(_rollout())
    # rows of one length and one prompt length share a group
    assert [g.tolist() for g in groups] == [[[4, 5, 6, 2]], [[4, 1, 1, 2, 3]], [[4, 5, 1, 2, 3]]]
    assert prompt_lengths == [3, 1, 2]


def test_flops_are_counted_on_real_tokens_forward_and_backward():
    model = LinearLM(vocab=7, hidden=5)
    groups, _ = _real_token_groups(_rollout())  # 4 + 5 + 5 = 14 real tokens (15 padded columns x 3 rows = 21)
    assert model_flops(model, groups, backward=False) == 2 * 14 * 5 * 7
    # backward: the input gradient and the weight gradient, each as large as the forward
    assert model_flops(model, groups, backward=True) == 3 * 2 * 14 * 5 * 7
    assert all(p.grad is None for p in model.parameters())


def test_a_repeated_prompt_is_counted_once():
    """A prompt the batch repeats is counted once; a batch of distinct prompts counts every
    real token but each row's last (`_rollout`'s 14 real tokens, 3 rows: 11)."""
    model = LinearLM(vocab=7, hidden=5)
    rollout = _rollout()
    repeated = Rollout(torch.tensor([[0, 4, 5], [4, 5, 6], [0, 4, 5]]), torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1]]),
                       rollout.response_ids, rollout.response_mask, rollout.has_eos)
    per_token = 2 * 5 * 7
    assert sequence_flops(model, rollout, backward=False) == 11 * per_token  # no prompt repeats
    # rows: 2 + 3, 3 + 1, 2 + 4 real tokens = 15, 12 without each last; the shared prompt
    # [4, 5] once: 12 - 2 = 10
    assert sequence_flops(model, repeated, backward=False) == 10 * per_token
    assert sequence_flops(model, repeated, backward=True) == 3 * 10 * per_token


def test_the_last_layer_counts_only_the_rows_that_are_read(char_tokenizer):
    """On the lean path the floor counts the last layer's prompt rows as keys and values
    only: per dropped row, the attention products (4 H L), the attention output projection
    (2 H^2), the MLP (4 H I) and the head (2 H V) are not counted."""
    from ppo.speed import lean_forward
    from ppo.models.tiny_model import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    H, I, rows, length, keep = 32, 64, 3, 9, 6
    model = build_tiny_model(TinyModelConfig(arch="gpt2", hidden_size=H, num_layers=2, num_heads=2,
                                             intermediate_size=I), char_tokenizer).eval()
    V = model.lm_head.out_features
    ids = torch.randint(3, 15, (rows, length))
    module_call = model_flops(model, [ids], backward=False)
    assert model_flops(model, [ids], backward=False, keep_from=[keep]) == module_call  # not on the lean path
    assert lean_forward.enable(model) == []
    full = model_flops(model, [ids], backward=False, keep_from=[0])  # every row of every layer
    trimmed = model_flops(model, [ids], backward=False, keep_from=[keep])
    assert full - trimmed == rows * keep * (4 * H * length + 2 * H * H + 4 * H * I + 2 * H * V)


@pytest.mark.slow  # counts the products of a profiled step: about 20 s (make test-all)
def test_floor_counts_only_unavoidable_passes(tmp_path, tiny_model_dir):
    base = dict(model_path=str(tiny_model_dir), rollout_batch_size=8, response_length=8, progress=False,
                value_init="policy", eval_every=0)
    ppo = RLTrainer(PPOConfig(output_dir=str(tmp_path / "p"), ppo_epochs=2, num_minibatches=2, **base))
    torch.manual_seed(0)
    rollout = ppo._sample_and_score(8).rollout
    flops = floor_flops(ppo.config, ppo.models, ppo.passes, rollout)
    # two optimizer steps per batch: the old critic's values need their own pass
    assert set(flops) == {"generate", "reference_forward", "value_forward", "update"}
    assert flops["reference_forward"] == flops["generate"]
    # ... over the rows outside the update's first micro-batch, whose own pass gives theirs
    critic = ppo.models.value_module
    assert ppo.passes.reuses_update_forward
    assert flops["value_forward"] < sequence_flops(critic, rollout, backward=False)
    assert flops["value_forward"] == sequence_flops(critic, select_rollout(rollout, torch.arange(4, 8)), backward=False)
    # each epoch: forward + backward (3x a forward) of policy and of a same-sized critic
    assert flops["update"] > 2 * 3 * flops["generate"]
    one_step = RLTrainer(PPOConfig(output_dir=str(tmp_path / "o"), ppo_epochs=1, num_minibatches=1, kl_coef=0.0,
                                   **base))
    assert set(floor_flops(one_step.config, one_step.models, one_step.passes, rollout)) == {"generate", "update"}
    # the per-call table works on copies: the trained models are untouched
    before = [p.detach().clone() for p in ppo.policy.parameters()]
    times = calls_alone(ppo.config, ppo.models, ppo.passes, rollout)
    assert set(times) == {"generate", "policy_forward", "reference_forward", "value_forward", "update"}
    assert all(t > 0 for t in times.values())
    assert all(torch.equal(a, b) for a, b in zip(before, ppo.policy.parameters()))
    assert all(p.grad is None for p in ppo.policy.parameters())
    assert matmul_throughput(torch.nn.Linear(16, 16), tokens=32, repeats=2) > 1e6


def test_format_bench_reports_ratio_and_phases():
    result = {"name": "x", "step": 2.0, "floor": 0.5, "ratio": 4.0, "throughput": 1e11,
              "flops": {"generate": 1e9, "update": 3e9}, "phases": {"generate": 0.5, "update": 1.2},
              "alone": {"generate": 0.4, "update": 1.0}, "products": {"seconds": 0.75, "flops": 6e9, "calls": 10}}
    text = format_bench([result])
    # products: 6 GFLOP in 0.75 s = 8 GFLOP/s, 1.5x the floor's 0.5 s
    assert "| x | 2.0000 | 0.5000 | 4.0 | 4.00 | 100 | 0.7500 | 6.00 | 8 | 1.5 |" in text
    unmeasured = format_bench([{**result, "products": None}])  # a GPU run: no products read off the CPU profiler
    assert "| x | 2.0000 | 0.5000 | 4.0 | 4.00 | 100 | - | - | - | - |" in unmeasured
    assert "| x | update | 1.2000 | 1.0000 | 3.000 |" in text


def test_products_are_timed_and_counted_by_hand():
    """2 m n k per product, forward and backward: a linear layer's forward (addmm) and its
    two backward products (the input's and the weight's gradient), a plain product and a
    batched one, a linear layer in inference mode (the sampler's) and the fused attention
    kernel as its two products, each counted once; elementwise work is not a product."""
    layer = torch.nn.Linear(3, 6)
    x = torch.ones(2, 7, 3, requires_grad=True)  # 14 rows
    query, keys = torch.ones(1, 2, 1, 4), torch.ones(1, 2, 5, 4)  # 1 row, 2 heads, 1 query, 5 keys, 4 dims
    with ProductTimer() as timer:
        _ = torch.ones(4, 3) @ torch.ones(3, 5)  # 2 * 4 * 3 * 5 = 120
        layer(x).relu().sum().backward()  # 3 x 2 * 14 * 3 * 6 = 1512
        _ = torch.baddbmm(torch.zeros(2, 4, 5), torch.ones(2, 4, 3), torch.ones(2, 3, 5))  # 2 * 2 * 4 * 3 * 5 = 240
        _ = torch.ones(100).exp()
        with torch.inference_mode():
            _ = layer(torch.ones(5, 3))  # 2 * 5 * 3 * 6 = 180
            # scores 2 * (2 heads) * 1 * 4 * 5 = 80, then weights x values 80 more
            _ = torch.nn.functional.scaled_dot_product_attention(query, keys, keys)
    assert (timer.flops, timer.calls) == (120 + 1512 + 240 + 180 + 160, 7)
    assert timer.seconds > 0


@pytest.mark.slow  # as above
def test_a_steps_products_are_at_least_its_floor(tmp_path, tiny_model_dir):
    """The floor counts only the unavoidable products on real tokens, so the products a real
    step runs (timed inside it) hold at least as many FLOPs; the step still trains under the timer."""
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path), rollout_batch_size=8, response_length=8,
                       progress=False, value_init="policy", eval_every=0, ppo_epochs=2, num_minibatches=2)
    trainer = RLTrainer(config)
    captured = {}
    sample_and_score = trainer._sample_and_score

    def capture(*args, **kwargs):
        captured["batch"] = sample_and_score(*args, **kwargs)
        return captured["batch"]

    trainer._sample_and_score = capture
    products = step_products(trainer.train_step, steps=1)
    assert trainer.step == 1
    floor = floor_flops(trainer.config, trainer.models, trainer.passes, captured["batch"].rollout)
    assert products["flops"] >= sum(floor.values())
    assert products["calls"] > 0 and products["seconds"] > 0

"""The exact speed-ups leave results unchanged: the lean forward and its sampling loop
(`lean_forward`; ppo/speed/lean_forward.py, ppo/speed/lean_sampling.py), the update's forward reused for
old log-probs and values (`reuse_update_forward`), padding columns cut before a forward pass,
padding tokens skipped inside it (`padding_free`), and the policy and critic run as one pass
(`paired_critic_pass`)."""

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ppo.speed import batch_layouts, lean_forward, lean_sampling, model_pairs
from ppo.config import PPOConfig, preset
from ppo.models.logprobs import (_unpadded_inputs, padded_response_values, response_logprobs, response_logprobs_and_values,
                          response_values,
                          trim_padding)
from ppo.run.metrics import PhaseTimer
from ppo.algorithm.rewards import score_positions
from ppo.models.rollout import generate, pad_to_width
from ppo.models.tiny_model import TinyModelConfig, build_tiny_model
from ppo.models import forward_passes as passes_module
from ppo.models.optimization import adamw_kernel
from ppo.trainer import RLTrainer
from value_model import ScalarHeadModel

PROMPTS = ["12+35=", "1+2=", "99+99=", "7=", "3*4=", "10-9="] * 4


def tiny(arch, tokenizer, **kwargs):
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(**{"arch": arch, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                "intermediate_size": 64, **kwargs}), tokenizer)
    return model.eval()


def plain_and_lean(model):
    lean = copy.deepcopy(model)
    assert lean_forward.enable(lean) == []
    return model, lean


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lean_sampling_gives_generates_samples_and_log_probs(char_tokenizer, arch):
    plain, lean = plain_and_lean(tiny(arch, char_tokenizer))
    for temperature, greedy in ((1.0, False), (0.7, False), (1.0, True)):
        torch.manual_seed(3)
        expected = generate(plain, char_tokenizer, PROMPTS, 10, temperature=temperature, greedy=greedy,
                            return_logits=True)
        torch.manual_seed(3)
        got = generate(lean, char_tokenizer, PROMPTS, 10, temperature=temperature, greedy=greedy,
                       return_logits=True)
        assert torch.equal(got.response_ids, expected.response_ids)  # the same samples for a seed
        assert torch.equal(got.response_mask, expected.response_mask) and torch.equal(got.has_eos, expected.has_eos)
        torch.testing.assert_close(got.generation_logits, expected.generation_logits, atol=1e-5, rtol=1e-5)
        # the lean sampler really ran: rows stop being extended once every row has stopped
        assert got.response_ids.shape[1] <= 10
    args = (expected.query_ids, expected.query_mask, expected.response_ids, expected.response_mask)
    mask = expected.response_mask.bool()
    torch.testing.assert_close(response_logprobs(lean, *args)[mask], response_logprobs(plain, *args)[mask],
                               atol=1e-6, rtol=1e-6)
    assert lean.state_dict().keys() == plain.state_dict().keys()  # the marker is not a submodule
    lean_lp, lean_entropy = response_logprobs(lean, *args, with_entropy=True)
    lean_lp.sum().backward()  # gradients reach the model's own parameters
    assert all(p.grad is not None for p in lean.parameters() if p.requires_grad)


def test_a_drawn_token_is_torch_multinomials_draw():
    """`_draw` gives the token ``torch.multinomial(softmax(logits), 1)`` gives for a seed and
    leaves the generator where it leaves it (so every later draw is the same too)."""
    for trial, (rows, vocab, scale) in enumerate([(32, 18, 1.0), (64, 3000, 4.0), (1, 5, 0.1), (7, 100, 20.0)] * 5):
        logits = torch.randn(rows, vocab) * scale
        torch.manual_seed(trial)
        expected, after = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1), torch.rand(3)
        torch.manual_seed(trial)
        got = lean_sampling._draw(logits)
        assert torch.equal(got, expected) and torch.equal(torch.rand(3), after)


def test_sampling_refuses_non_finite_logits(char_tokenizer):
    _, lean = plain_and_lean(tiny("gpt2", char_tokenizer))
    with torch.no_grad():
        lean.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="inf or NaN"):
        generate(lean, char_tokenizer, PROMPTS[:3], 4)


def test_sampling_steps_attend_over_the_filled_cache_only(char_tokenizer, monkeypatch):
    """Eager sampling steps read the static cache only up to the token being written (the
    unfilled rest would get zero weight); the samples are generate's (test above)."""
    _, lean = plain_and_lean(tiny("llama", char_tokenizer))
    keys_read, attend = [], lean_forward._attend

    def recorded(query, key, value, bias, scaling):
        if query.shape[2] == 1:
            keys_read.append(key.shape[2])
            assert bias.shape[-1] == key.shape[2]
        return attend(query, key, value, bias, scaling)

    monkeypatch.setattr(lean_forward, "_attend", recorded)
    torch.manual_seed(3)
    rollout = generate(lean, char_tokenizer, PROMPTS, 10)
    prompt = rollout.query_ids.shape[1]
    steps = rollout.response_ids.shape[1] - 1  # the first token comes from the prefill
    layers = lean.config.num_hidden_layers
    # the prefill's last layer runs one query (the prompt's last position) over the prompt; then
    # each step's layers read the prompt and the tokens so far, not the whole buffer
    assert keys_read == [prompt] + [prompt + 1 + step for step in range(steps) for _ in range(layers)]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_finished_rows_leave_the_cache_without_changing_any_sample(char_tokenizer, arch, monkeypatch):
    """Rows that stopped are dropped from the sampling batch (`_drop_finished_rows`): the
    same samples for a seed as `generate`, the same logits wherever a token was sampled."""
    model = tiny(arch, char_tokenizer)
    plain, lean = plain_and_lean(model)
    # frequent stop tokens, so rows stop at many different steps
    stops = char_tokenizer.convert_tokens_to_ids(list("0123+="))
    batch_sizes, hidden_states = [], lean_forward.hidden_states

    def recorded(backbone, input_ids, *rest, **options):
        batch_sizes.append(input_ids.shape[0])
        return hidden_states(backbone, input_ids, *rest, **options)

    for temperature, greedy in ((1.0, False), (0.7, False), (1.0, True)):
        torch.manual_seed(11)
        expected = generate(plain, char_tokenizer, PROMPTS, 12, temperature=temperature, greedy=greedy,
                            return_logits=True, stop_token_ids=stops)
        torch.manual_seed(11)
        monkeypatch.setattr(lean_forward, "hidden_states", recorded)
        got = generate(lean, char_tokenizer, PROMPTS, 12, temperature=temperature, greedy=greedy,
                       return_logits=True, stop_token_ids=stops)
        monkeypatch.undo()
        assert torch.equal(got.response_ids, expected.response_ids)
        assert torch.equal(got.response_mask, expected.response_mask)
        mask = expected.response_mask.bool()
        torch.testing.assert_close(got.generation_logits[mask], expected.generation_logits[mask], atol=1e-5, rtol=1e-5)
    assert min(batch_sizes) < len(PROMPTS)  # rows really left the cache


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_last_layer_runs_only_the_rows_that_are_read(char_tokenizer, arch, monkeypatch):
    """`hidden_states(..., keep_from=k)`: the last layer's queries, attention output and
    MLP run on columns k.. only (keys and values on all), with the outputs and gradients
    of the full pass at those columns."""
    model = tiny(arch, char_tokenizer)
    backbone = model.base_model
    ids = torch.randint(3, 15, (5, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    rows, activation = [], lean_forward._activation

    def recorded(act, x):
        rows.append(x.shape[1])
        return activation(act, x)

    monkeypatch.setattr(lean_forward, "_activation", recorded)
    full = lean_forward.hidden_states(backbone, ids, positions, mask)
    (full[:, 6:] ** 2).sum().backward()
    full_grads = [p.grad.clone() for p in backbone.parameters()]
    model.zero_grad()
    rows.clear()
    kept = lean_forward.hidden_states(backbone, ids, positions, mask, keep_from=6)
    (kept ** 2).sum().backward()
    assert rows == [9, 3]  # the first layer's MLP on all 9 columns, the last one's on 3
    torch.testing.assert_close(kept, full[:, 6:], atol=1e-6, rtol=1e-6)
    for p, want in zip(backbone.parameters(), full_grads):
        torch.testing.assert_close(p.grad, want, atol=1e-4 * want.abs().max().item(), rtol=1e-5)  # sums regrouped


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lean_values_match_the_scalar_head_model(char_tokenizer, arch):
    policy = tiny(arch, char_tokenizer)
    critic = ScalarHeadModel.from_policy(policy, head_init="normal").eval()
    lean = copy.deepcopy(critic)
    assert lean_forward.enable(lean) == []
    torch.manual_seed(0)
    rollout = generate(policy, char_tokenizer, PROMPTS, 8)
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    mask = rollout.response_mask.bool()
    torch.testing.assert_close(response_values(lean, *args)[mask], response_values(critic, *args)[mask],
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_critic_on_padding_is_the_module_call_over_the_padded_width(char_tokenizer, arch):
    """value_loss_over_padding: the critic's values at every column of the padded response
    are the plain module call over the whole padded sequence with its attention mask
    (padding masked out as keys, at position 1), as AlpacaFarm's value model runs; the lean
    path declines this pass and gives the same; real tokens keep the values of the usual
    pass, and every padding column gets a value of its own."""
    policy = tiny(arch, char_tokenizer)
    critic = ScalarHeadModel.from_policy(policy, head_init="normal").eval()
    lean = copy.deepcopy(critic)
    assert lean_forward.enable(lean) == []
    torch.manual_seed(0)
    rollout = pad_to_width(generate(policy, char_tokenizer, PROMPTS[:6], 6), 9, char_tokenizer.pad_token_id)
    q, qm, r, rm = rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask
    assert (rm == 0).any()
    ids, mask = torch.cat([q, r], 1), torch.cat([qm, rm], 1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # transformers' prepare_inputs_for_generation
    with torch.no_grad():
        by_hand = critic(input_ids=ids, attention_mask=mask, position_ids=positions)[:, q.shape[1] - 1:-1]
        padded = padded_response_values(critic, q, qm, r, rm)
        padded_lean = padded_response_values(lean, q, qm, r, rm)
        usual = response_values(critic, q, qm, r, rm)
    assert padded.shape == rm.shape
    torch.testing.assert_close(padded, by_hand, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(padded_lean, padded, atol=0, rtol=0)
    real = rm.bool()
    torch.testing.assert_close(padded[real], usual[real], atol=1e-6, rtol=1e-6)
    assert (padded[~real].abs() > 1e-4).all()
    longest = int(rm.sum(-1).max())  # the usual pass skips the columns no row reaches: zeros there
    assert torch.equal(usual[:, longest:], torch.zeros_like(usual[:, longest:]))


@pytest.mark.parametrize("toggle", ["value_loss_over_padding", "score_position"])
def test_critic_passes_cover_padding_or_the_column_after_the_last_token(char_tokenizer, toggle):
    """ForwardPasses: the old values and the update's values follow the critic's positions
    (every padded column, or one column past the last token), the policy's passes do not."""
    policy = tiny("gpt2", char_tokenizer)
    critic = ScalarHeadModel.from_policy(policy, head_init="normal").eval()
    torch.manual_seed(0)
    rollout = pad_to_width(generate(policy, char_tokenizer, PROMPTS[:4], 6), 8, char_tokenizer.pad_token_id)
    rm = rollout.response_mask
    on = dict(value_loss_over_padding=True) if toggle == "value_loss_over_padding" else dict(
        score_position="after_last_token")
    values, update = {}, {}
    for name, overrides in (("off", {}), ("on", on)):
        config = PPOConfig(pad_to_response_length=True, reuse_update_forward=False, **overrides)
        passes = passes_module.ForwardPasses(policy, critic, None, config, torch.Generator(), lambda n: n,
                                             PhaseTimer())
        with torch.no_grad():
            values[name] = passes.values(rollout)
            update[name] = passes.update({"rows": torch.arange(len(rm)), "query_ids": rollout.query_ids,
                                          "query_mask": rollout.query_mask, "response_ids": rollout.response_ids,
                                          "response_mask": rm})
    covered = torch.ones_like(rm) if toggle == "value_loss_over_padding" else score_positions(rm, "after_last_token")
    extra = covered.bool() & ~rm.bool()
    assert extra.any()
    assert torch.equal(values["off"][~rm.bool()], torch.zeros(int((~rm.bool()).sum())))
    assert (values["on"][extra].abs() > 1e-4).all() and (update["on"]["values"][extra].abs() > 1e-4).all()
    assert torch.equal(values["on"] * (1 - covered), torch.zeros_like(values["on"]))
    torch.testing.assert_close(values["on"][rm.bool()], values["off"][rm.bool()], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(update["on"]["values"][covered.bool()], values["on"][covered.bool()],
                               atol=1e-6, rtol=1e-6)
    for key in ("logprobs", "entropy"):  # the policy's passes are unchanged
        assert torch.equal(update["on"][key], update["off"][key])


def test_lean_path_is_refused_where_it_would_compute_something_else(char_tokenizer):
    with_dropout = tiny("gpt2", char_tokenizer, dropout=0.1)
    assert lean_forward.enable(with_dropout) == ["GPT2LMHeadModel"]
    assert lean_forward.lean_backbone(with_dropout) is None
    model = tiny("llama", char_tokenizer)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert lean_forward.enable(model) == ["LlamaForCausalLM"]
    assert lean_forward.enable(torch.nn.Linear(2, 2)) == ["Linear"]


def test_padding_columns_are_cut_and_restored_exactly(char_tokenizer):
    model = tiny("llama", char_tokenizer)
    torch.manual_seed(1)
    rollout = generate(model, char_tokenizer, PROMPTS[:6], 6)
    q, qm, r, rm = rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask
    # Two extra padding columns on each side: cut before the forward, zeros after it.
    pad = char_tokenizer.pad_token_id
    wide = (torch.cat([torch.full((len(q), 2), pad), q], 1), torch.cat([torch.zeros(len(q), 2, dtype=qm.dtype), qm], 1),
            torch.cat([r, torch.full((len(r), 2), pad)], 1), torch.cat([rm, torch.zeros(len(r), 2, dtype=rm.dtype)], 1))
    cut = trim_padding(*wide)
    assert [t.shape for t in cut] == [q.shape, qm.shape, r.shape, rm.shape]
    narrow = response_logprobs(model, q, qm, r, rm)
    padded = response_logprobs(model, *wide)
    assert padded.shape == (len(r), r.shape[1] + 2)
    torch.testing.assert_close(padded[:, :r.shape[1]] * rm, narrow * rm, atol=1e-6, rtol=0)
    assert torch.equal(padded[:, r.shape[1]:], torch.zeros(len(r), 2))


def _count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


def _run(config, steps=3, prompts=("1+1=", "2+3=", "9+9=", "4+1=")):
    trainer = RLTrainer(config, prompts=list(prompts), reward_fn=_count_ones)
    rows = [trainer.train_step() for _ in range(steps)]
    weights = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    if trainer.value_model is not None:
        weights = torch.cat([weights] + [p.detach().flatten() for p in trainer.value_model.parameters()])
    return trainer, rows, weights


def _assert_same_run(a, b, tolerance, clipfrac_slack=0.0):
    (_, rows_a, weights_a), (_, rows_b, weights_b) = a, b
    torch.testing.assert_close(weights_a, weights_b, atol=tolerance, rtol=tolerance)
    for row_a, row_b in zip(rows_a, rows_b):
        for key, value in row_a.items():
            if key.startswith("time_") or not isinstance(value, float):
                continue
            # A clip fraction counts tokens past a threshold: where the two runs round
            # differently, a value at the boundary may land on either side (`clipfrac_slack`).
            slack = max(clipfrac_slack, tolerance) if "clipfrac" in key else tolerance
            assert row_b[key] == pytest.approx(value, rel=tolerance, abs=slack, nan_ok=True), key


# value_loss_over_padding off: these runs compare the critic's lean passes (shared prompts, no
# padding, paired with the policy); the critic on padding takes the module call, which
# test_critic_on_padding_is_the_module_call_over_the_padded_width checks.
SETTINGS = dict(task="custom", rollout_batch_size=8, response_length=8, total_steps=3, eval_every=0, save_every=0,
                progress=False, log_samples=0, lr=3e-3, ppo_epochs=1, num_minibatches=1, value_init="policy",
                value_loss_over_padding=False)

# Adam divides each gradient by its own running size, so a weight whose gradient is nothing
# but rounding moves by a good part of lr either way when adam_eps is below that rounding.
# Against the two passes, the one-pass layout's weights differed by 9e-5 after three steps at
# the presets' eps (1e-5), and at 1e-8 by 1e-2, the third step sampling other tokens; at 1e-4
# by 3e-7. An eps above the rounding keeps the comparison about the passes.
ADAM_ABOVE_ROUNDING = {"adam_eps": 1e-4}


def _layout(name: str, monkeypatch) -> dict:
    """Settings for a run-level test of the shared-prompt layout `name`."""
    if name == "two_passes":
        monkeypatch.setattr(batch_layouts, "ONE_PASS_MAX_SCORES", 0)
        return {}
    return ADAM_ABOVE_ROUNDING  # the one-pass layout rounds differently (longer masked key rows)


@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 2)])
@pytest.mark.parametrize("name", ["grpo", "alpacafarm"])
def test_reusing_the_update_forward_changes_nothing(tmp_path, tiny_model_dir, name, epochs, minibatches, monkeypatch):
    """The update's first micro-batch runs its forward pass before the advantages and gives
    its rows' old log-probs and values; the old passes run over the other rows only (none
    with one epoch of one minibatch). The same metrics and weights as separate old passes."""
    config = preset(name, model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    group_size=4 if name == "grpo" else 1,
                    **{**SETTINGS, "ppo_epochs": epochs, "num_minibatches": minibatches})
    # The one-pass layout of shared prompts rounds by where a row sits in its group, and the
    # update shuffles the rows: a separate old pass would give ratios of 1 +- 5e-7, where the
    # per-row layouts give 1 exactly. This test is about the reuse, so it keeps those.
    monkeypatch.setattr(batch_layouts, "ONE_PASS_MAX_SCORES", 0)
    passes, logprobs = [], passes_module.response_logprobs

    def recorded(model, query_ids, *rest, **options):  # (rows, with autograd) of every log-prob pass
        passes.append((len(query_ids), torch.is_grad_enabled()))
        return logprobs(model, query_ids, *rest, **options)

    def recorded_pair(policy, value_model, query_ids, *rest, **options):  # a paired pass is a log-prob pass too
        passes.append((len(query_ids), torch.is_grad_enabled()))
        return pair(policy, value_model, query_ids, *rest, **options)

    pair = passes_module.response_logprobs_and_values
    monkeypatch.setattr(passes_module, "response_logprobs", recorded)
    monkeypatch.setattr(passes_module, "response_logprobs_and_values", recorded_pair)
    reused = _run(config)
    reused_passes, passes[:] = sorted(passes), []
    separate = _run(config.replace(reuse_update_forward=False, output_dir=str(tmp_path / "b")))
    assert reused[0].passes.reuses_update_forward and not separate[0].passes.reuses_update_forward
    batch, micro = 8, 8 // minibatches
    reference = [(batch, False)]  # the reference model's pass, over every row either way
    updates = [(micro, True)] * (epochs * minibatches)  # one forward with autograd per micro-batch
    rest = [(batch - micro, False)] if batch > micro else []  # the old pass over the other rows only
    assert reused_passes == sorted((rest + reference + updates) * 3)  # three steps
    assert sorted(passes) == sorted(([(batch, False)] + reference + updates) * 3)
    _assert_same_run(reused, separate, 1e-6)


@pytest.mark.parametrize("layout", ["one_pass", "two_passes"])
@pytest.mark.parametrize("name", ["grpo", "alpacafarm"])
def test_lean_forward_changes_nothing_but_rounding(tmp_path, tiny_model_dir, name, layout, monkeypatch):
    config = preset(name, model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    group_size=4 if name == "grpo" else 1, **{**SETTINGS, "ppo_epochs": 2, **_layout(layout, monkeypatch)})
    lean = _run(config)
    assert lean_forward.lean_backbone(lean[0].accelerator.unwrap_model(lean[0].policy)) is not None
    plain = _run(config.replace(lean_forward=False, output_dir=str(tmp_path / "b")))
    assert lean_forward.lean_backbone(plain[0].accelerator.unwrap_model(plain[0].policy)) is None
    # one token of about 60 for a clip fraction: a token at the threshold may land on either side
    _assert_same_run(lean, plain, 1e-5, clipfrac_slack=1 / 50)


def _mlp_tokens(monkeypatch, call):
    """Run `call`; return the shape each MLP of the lean path ran on: ``(tokens,)`` packed,
    ``(rows, columns)`` on a grid."""
    tokens, activation = [], lean_forward._activation

    def recorded(act, x):
        tokens.append(tuple(x.shape[:-1]))
        return activation(act, x)

    monkeypatch.setattr(lean_forward, "_activation", recorded)
    result = call()
    monkeypatch.setattr(lean_forward, "_activation", activation)
    return tokens, result


@pytest.mark.parametrize("layout", ["one_pass", "two_passes"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_each_distinct_prompt_runs_once_with_the_same_results(char_tokenizer, arch, layout, monkeypatch):
    """share_prompt_prefix: each distinct prompt's tokens run once, in one pass over the
    prompt groups (a small batch: `PromptGroups`) or in a prompt pass and then the responses
    alone (`SharedPrompts`); log-probs, entropies, values and gradients equal the per-row
    pass to float rounding."""
    if layout == "two_passes":
        monkeypatch.setattr(batch_layouts, "ONE_PASS_MAX_SCORES", 0)
    model = tiny(arch, char_tokenizer)
    torch.manual_seed(5)
    rollout = generate(model, char_tokenizer, PROMPTS, 7)  # 6 distinct prompts, each 4 times
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    mask = rollout.response_mask.bool()
    shared, per_row = copy.deepcopy(model), copy.deepcopy(model)
    lean_forward.enable(shared, share_prompts=True)
    lean_forward.enable(per_row, share_prompts=False)
    prompt_rows, hidden_states = [], lean_forward.hidden_states

    def recorded(backbone, input_ids, *rest, **options):
        prompt_rows.append(input_ids.shape)
        return hidden_states(backbone, input_ids, *rest, **options)

    monkeypatch.setattr(lean_forward, "hidden_states", recorded)
    tokens, (lp_shared, ent_shared) = _mlp_tokens(monkeypatch, lambda: response_logprobs(shared, *args, with_entropy=True))
    (ids, real, _), query_length, _ = _unpadded_inputs(*args)
    real = real[:, :-1]  # the last column never runs
    first, rows = lean_forward.distinct_prompts(ids[:, :query_length], real[:, :query_length])
    prompts, responses = int(real[first, :query_length].sum()), int(real[:, query_length:].sum())
    if layout == "two_passes":  # 6 distinct prompts x their columns, then 24 rows x the response columns
        assert [shape[0] for shape in prompt_rows] == [6, 24]
        assert prompt_rows[1][1] == rollout.response_ids.shape[1] - 1
        assert tokens == [(prompts,), (len(first),), (responses,), (responses,)]  # last layers: from the prompt's last column
    else:  # one pass over 6 group rows: each prompt once, then its 4 rows' response tokens back to back
        assert prompt_rows == []
        width = query_length + max(int(real[rows == group, query_length:].sum()) for group in range(len(first)))
        assert tokens == [(len(first), width), (len(first), width - query_length + 1)]
        assert len(first) * width < int(real.sum())  # fewer positions than the per-row pass's real tokens
    lp_row, ent_row = response_logprobs(per_row, *args, with_entropy=True)
    torch.testing.assert_close(lp_shared[mask], lp_row[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent_shared[mask], ent_row[mask], atol=1e-6, rtol=1e-6)
    (lp_shared * mask).sum().backward()
    (lp_row * mask).sum().backward()
    for (name, a), b in zip(shared.named_parameters(), per_row.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5, msg=name)
    critic = ScalarHeadModel.from_policy(model, head_init="normal").eval()
    shared_critic, row_critic = copy.deepcopy(critic), copy.deepcopy(critic)
    lean_forward.enable(shared_critic, share_prompts=True)
    lean_forward.enable(row_critic, share_prompts=False)
    torch.testing.assert_close(response_values(shared_critic, *args)[mask], response_values(row_critic, *args)[mask],
                               atol=1e-6, rtol=1e-6)


def test_one_pass_over_prompt_groups_is_the_per_row_arithmetic(char_tokenizer):
    """In float64, where rounding cannot hide a difference, the one-pass layout's log-probs
    equal the per-row pass's exactly here and its gradients to 1e-12: each token attends to
    the same keys (its prompt once, its own row's earlier tokens) and nothing else. Groups of
    different sizes, prompts of different lengths, responses that stop early."""
    model = tiny("gpt2", char_tokenizer)
    torch.manual_seed(3)
    prompts = ["12+35="] * 5 + ["7="] * 2 + ["99+99="] * 4
    rollout = generate(model, char_tokenizer, prompts, 6)
    model = model.double()
    response_mask = rollout.response_mask.clone()
    for row, length in ((1, 2), (5, 1), (6, 4), (9, 3)):  # responses that stopped early, right-padded
        response_mask[row, length:] = 0
    response_ids = rollout.response_ids.masked_fill(response_mask == 0, char_tokenizer.pad_token_id)
    args = (rollout.query_ids, rollout.query_mask, response_ids, response_mask)
    mask = response_mask.bool()
    assert len(set(mask.sum(1).tolist())) == 5  # responses of several lengths
    grouped, per_row = copy.deepcopy(model), copy.deepcopy(model)
    lean_forward.enable(grouped, share_prompts=True)
    lean_forward.enable(per_row, share_prompts=False)
    (ids, real, _), query_length, _ = _unpadded_inputs(*args)
    first, rows = lean_forward.distinct_prompts(ids[:, :query_length], real[:, :query_length])
    layout = batch_layouts.PromptGroups.of(real[:, :-1], query_length, first, rows, torch.float64)
    assert layout is not None and layout.bias.shape[0] == 3  # one attention row per prompt group
    lp_grouped, ent_grouped = response_logprobs(grouped, *args, with_entropy=True)
    lp_row, ent_row = response_logprobs(per_row, *args, with_entropy=True)
    torch.testing.assert_close(lp_grouped[mask], lp_row[mask], atol=1e-12, rtol=0)
    torch.testing.assert_close(ent_grouped[mask], ent_row[mask], atol=1e-12, rtol=0)
    (lp_grouped * mask).sum().backward()
    (lp_row * mask).sum().backward()
    for (name, a), b in zip(grouped.named_parameters(), per_row.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=0, msg=name)


def test_prompt_groups_run_in_one_pass_only_while_their_grid_is_small(char_tokenizer, monkeypatch):
    """A batch whose grouped attention grid would exceed ONE_PASS_MAX_SCORES keeps the two
    passes; the layout of a step is built once and reused while its batch is the same."""
    mask = torch.ones(8, 10, dtype=torch.long)
    first, rows = torch.tensor([0, 4]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    layout = batch_layouts.PromptGroups.of(mask, 4, first, rows, torch.float32)  # 2 groups x (4 + 4 x 6) columns
    assert layout.bias.shape == (2, 1, 28, 28)
    assert batch_layouts.PromptGroups.of(mask, 4, first, rows, torch.float32, max_scores=2 * 28 * 28 - 1) is None
    built = []
    monkeypatch.setattr(batch_layouts.prompt_groups, "arguments", None)
    monkeypatch.setattr(batch_layouts.prompt_groups, "function",
                        lambda *a: built.append(1) or batch_layouts.PromptGroups.of(*a))
    for _ in range(3):  # the reference, old-policy and update passes of one batch
        batch_layouts.prompt_groups(mask, 4, first, rows, torch.float32, 1 << 16)
    batch_layouts.prompt_groups(mask.clone(), 4, first, rows, torch.float32, 1 << 16)  # equal, another tensor
    assert len(built) == 1
    mask[0, -1] = 0  # another batch
    batch_layouts.prompt_groups(mask, 4, first, rows, torch.float32, 1 << 16)
    assert len(built) == 2


@pytest.mark.parametrize("layout", ["one_pass", "two_passes"])
@pytest.mark.parametrize("name", ["grpo", "alpacafarm"])
def test_sharing_prompts_changes_nothing_but_rounding(tmp_path, tiny_model_dir, name, layout, monkeypatch):
    config = preset(name, model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"), group_size=4,
                    **{**SETTINGS, "ppo_epochs": 2, **_layout(layout, monkeypatch)})
    shared = _run(config)
    off = _run(config.replace(share_prompt_prefix=False, output_dir=str(tmp_path / "b")))
    # one token's share of the update (about 1/100 here) for a clip fraction
    _assert_same_run(shared, off, 1e-5, clipfrac_slack=1 / 50)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_padding_free_passes_run_only_real_tokens_with_the_same_results(char_tokenizer, arch, share, monkeypatch):
    """padding_free: every MLP sees exactly the real tokens of its pass (left-padded prompts
    and right-padded responses of several lengths), and log-probs, entropies, values and
    gradients equal the padded pass's to float rounding, with and without shared prompts."""
    model = tiny(arch, char_tokenizer)
    torch.manual_seed(5)
    rollout = generate(model, char_tokenizer, PROMPTS, 7)
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    mask = rollout.response_mask.bool()
    (ids, real, _), query_length, _ = _unpadded_inputs(*args)
    ids, real = ids[:, :-1], real[:, :-1]  # the last column never runs
    assert 0 < int(real.sum()) < real.numel()  # the batch really has padding to skip
    if share:  # the two passes (small batches take one pass: test_each_distinct_prompt_runs_once...)
        monkeypatch.setattr(batch_layouts, "ONE_PASS_MAX_SCORES", 0)
    packed, padded = copy.deepcopy(model), copy.deepcopy(model)
    lean_forward.enable(packed, share_prompts=share, padding_free=True)
    lean_forward.enable(padded, share_prompts=share, padding_free=False)
    tokens, activation = [], lean_forward._activation

    def recorded(act, x):
        tokens.append(x.shape[0] if x.dim() == 2 else None)  # packed: [tokens, width]
        return activation(act, x)

    monkeypatch.setattr(lean_forward, "_activation", recorded)
    lp_packed, ent_packed = response_logprobs(packed, *args, with_entropy=True)
    monkeypatch.setattr(lean_forward, "_activation", activation)
    if share:  # the distinct prompts (last layer: their last position), then every response
        first, _ = lean_forward.distinct_prompts(ids[:, :query_length], real[:, :query_length])
        responses = int(real[:, query_length:].sum())
        assert tokens == [int(real[first, :query_length].sum()), len(first), responses, responses]
    else:  # every real token (last layer: from the prompt's last column on)
        assert tokens == [int(real.sum()), int(real[:, query_length - 1:].sum())]
    lp_padded, ent_padded = response_logprobs(padded, *args, with_entropy=True)
    torch.testing.assert_close(lp_packed[mask], lp_padded[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent_packed[mask], ent_padded[mask], atol=1e-6, rtol=1e-6)
    (lp_packed * mask).sum().backward()
    (lp_padded * mask).sum().backward()
    for (name, a), b in zip(packed.named_parameters(), padded.parameters()):  # sums regrouped: to 1e-6 of the largest
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6 * b.grad.abs().max().item(), rtol=1e-5, msg=name)
    critic = ScalarHeadModel.from_policy(model, head_init="normal").eval()
    packed_critic, padded_critic = copy.deepcopy(critic), copy.deepcopy(critic)
    lean_forward.enable(packed_critic, share_prompts=share, padding_free=True)
    lean_forward.enable(padded_critic, share_prompts=share, padding_free=False)
    torch.testing.assert_close(response_values(packed_critic, *args)[mask],
                               response_values(padded_critic, *args)[mask], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["one_pass", "two_passes"])
@pytest.mark.parametrize("name", ["grpo", "alpacafarm"])
def test_padding_free_changes_nothing_but_rounding(tmp_path, tiny_model_dir, name, layout, monkeypatch):
    config = preset(name, model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    group_size=4 if name == "grpo" else 1, **{**SETTINGS, "ppo_epochs": 2, **_layout(layout, monkeypatch)})
    assert config.padding_free  # the default
    packed = _run(config)
    padded = _run(config.replace(padding_free=False, output_dir=str(tmp_path / "b")))
    _assert_same_run(packed, padded, 1e-6)


def _paired_models(char_tokenizer, arch, dtype=torch.float32, padding_free=True):
    """A policy and a critic built from it (its own head, weights moved apart), both lean;
    returns (paired policy, its critic, unpaired policy, its critic). "llama_gqa": two query
    heads sharing one key/value head."""
    if arch == "llama_gqa":
        torch.manual_seed(0)
        policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                              pad_token_id=char_tokenizer.pad_token_id,
                                              eos_token_id=char_tokenizer.eos_token_id)).eval()
        assert policy.model.layers[0].self_attn.num_key_value_groups == 2
    else:
        policy = tiny(arch, char_tokenizer)
    policy = policy.to(dtype)
    critic = ScalarHeadModel.from_policy(policy, head_init="normal").eval()
    with torch.no_grad():  # the two backbones must not hold the same numbers
        for p in critic.parameters():
            p.add_(0.05 * torch.randn_like(p))
    models = [copy.deepcopy(m) for m in (policy, critic, policy, critic)]
    lean_forward.enable(*models, padding_free=padding_free)
    assert lean_forward.pair(models[0], models[1]) and lean_forward.paired_critic(models[0], models[1])
    assert not lean_forward.paired_critic(models[2], models[3])
    return models


@pytest.mark.parametrize("stored", ["side_by_side", "apart"])
@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "llama_gqa"])
def test_paired_pass_is_the_two_passes_arithmetic(char_tokenizer, arch, padding_free, stored, monkeypatch):
    """In float64 the paired pass of policy and critic gives the two passes' log-probs,
    entropies and values exactly here and their gradients to 1e-12, each model's reaching
    its own parameters; its MLPs run once per layer over both models' tokens. The same
    whether the pair's parameters share one storage (read as views, as `pair` stores them)
    or lie apart (stacked by copying)."""
    paired, paired_critic, policy, critic = _paired_models(char_tokenizer, arch, torch.float64, padding_free)
    first, second = lean_forward.lean_backbone(paired), lean_forward.lean_backbone(paired_critic)
    if stored == "apart":
        with torch.no_grad():
            for p in second.parameters():
                p.data = p.data.clone()
    views = model_pairs.stacked_views(first, second)
    assert len(views) == (len(list(first.parameters())) if stored == "side_by_side" else 0)
    torch.manual_seed(3)
    rollout = generate(policy, char_tokenizer, ["12+35=", "1+2=", "99+99=", "7=", "3*4=", "10-9="], 6)
    response_mask = rollout.response_mask.clone()
    for row, length in ((1, 2), (4, 1)):  # responses that stopped early
        response_mask[row, length:] = 0
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids.masked_fill(response_mask == 0, 0),
            response_mask)
    mask = response_mask.bool()
    shapes, got = _mlp_tokens(monkeypatch, lambda: response_logprobs_and_values(paired, paired_critic, *args))
    expected = response_logprobs_and_values(policy, critic, *args)
    layers = policy.config.num_hidden_layers
    single_shapes, _ = _mlp_tokens(monkeypatch, lambda: response_logprobs(policy, *args))
    assert len(shapes) == layers and len(single_shapes) == layers  # one pass, not one per model
    assert all(math.prod(s) == 2 * math.prod(t) for s, t in zip(shapes, single_shapes))  # both models' tokens
    for name in ("logprobs", "entropy", "values"):
        torch.testing.assert_close(got[name][mask], expected[name][mask], atol=1e-12, rtol=0, msg=name)
    assert not torch.allclose(got["values"][mask], got["logprobs"][mask])
    loss = lambda out: ((out["logprobs"] + 0.1 * out["entropy"] + out["values"] ** 2) * mask).sum()
    loss(got).backward()
    loss(expected).backward()
    for own, twin in ((paired, policy), (paired_critic, critic)):
        for (name, a), b in zip(own.named_parameters(), twin.parameters()):
            assert a.grad is not None, name
            torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=0, msg=name)


def test_paired_parameters_share_one_storage_with_their_values_kept(char_tokenizer):
    """`pair` stores both models' parameters in the two rows of one [2, N] tensor: values,
    Parameter objects, tied weights and state dicts unchanged, each model's parameters in one
    block; a paired pass reads each pair as a view of the two rows (no copy); loading a state
    dict writes through to it."""
    paired, paired_critic, policy, critic = _paired_models(char_tokenizer, "gpt2", torch.float32, True)
    first, second = lean_forward.lean_backbone(paired), lean_forward.lean_backbone(paired_critic)
    for own, twin in ((paired, policy), (paired_critic, critic)):
        assert own.state_dict().keys() == twin.state_dict().keys()
        assert all(torch.equal(a, b) for a, b in zip(own.state_dict().values(), twin.state_dict().values()))
    assert paired.lm_head.weight is first.wte.weight  # still tied
    views = model_pairs.stacked_views(first, second)
    storage = first.wte.weight.untyped_storage().data_ptr()
    offset = 0
    for (name, a), b in zip(first.named_parameters(), second.parameters()):
        view = views[id(a)]
        assert view.data_ptr() == a.data_ptr() and view.shape == (2, *a.shape), name  # a view, not a copy
        assert torch.equal(view[0], a) and torch.equal(view[1], b), name
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == storage, name
        assert a.storage_offset() == offset, name  # the first model's parameters one after another
        offset += a.numel()
    assert all(b.storage_offset() == a.storage_offset() + offset  # the second's in the second row
               for a, b in zip(first.parameters(), second.parameters()))
    state = {k: v + 1 for k, v in policy.state_dict().items()}
    paired.load_state_dict(state)
    views = model_pairs.stacked_views(first, second)
    assert len(views) == len(state) - 1  # lm_head.weight is wte.weight
    assert torch.equal(views[id(first.wte.weight)][0], state["transformer.wte.weight"])
    assert torch.equal(views[id(first.wte.weight)][1], critic.backbone.wte.weight)  # the critic's half untouched


def test_stacked_views_follow_parameters_that_move_or_are_replaced(char_tokenizer):
    """`stacked_views` keeps its plan of the pair's twins from pass to pass, and makes a new one
    when a twin's data moves or a parameter object is replaced: a view then never reads
    memory the model no longer uses, and the paired pass still gives the two passes' numbers."""
    paired, paired_critic, policy, critic = _paired_models(char_tokenizer, "gpt2", torch.float64, True)
    first, second = lean_forward.lean_backbone(paired), lean_forward.lean_backbone(paired_critic)
    count = len(list(first.parameters()))
    assert len(model_pairs.stacked_views(first, second)) == count
    plan = model_pairs._TWIN_PLANS[first]
    assert len(model_pairs.stacked_views(first, second)) == count and model_pairs._TWIN_PLANS[first] is plan  # kept
    torch.manual_seed(3)
    rollout = generate(policy, char_tokenizer, ["12+35=", "1+2=", "99+99="], 5)
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    mask = rollout.response_mask.bool()

    def check():
        got, expected = (response_logprobs_and_values(p, c, *args)
                         for p, c in ((paired, paired_critic), (policy, critic)))
        for name in ("logprobs", "values"):
            torch.testing.assert_close(got[name][mask], expected[name][mask], atol=1e-12, rtol=0, msg=name)

    # a parameter object replaced (as `load_state_dict(..., assign=True)` does): its pair is stacked by copying
    with torch.no_grad():
        second.ln_f.weight = torch.nn.Parameter(second.ln_f.weight + 0.5)
        critic.backbone.ln_f.weight += 0.5
    views = model_pairs.stacked_views(first, second)
    assert len(views) == count - 1 and id(first.ln_f.weight) not in views
    check()
    # every twin's data moved: nothing is side by side any more
    with torch.no_grad():
        for p in second.parameters():
            p.data = p.data.clone()
            p.add_(0.25)
        for p in critic.backbone.parameters():
            p.add_(0.25)
    assert model_pairs.stacked_views(first, second) == {}
    check()
    # stored side by side again: every twin is read as a view once more
    model_pairs.side_by_side(first, second)
    assert len(model_pairs.stacked_views(first, second)) == count
    check()


def test_a_module_holds_parameters_exactly_when_it_yields_one():
    """`Stacked` pairs a submodule when it or a module under it holds a parameter; names
    registered as None (a missing bias, an absent submodule) hold none, as for `parameters()`."""
    empty = torch.nn.Module()
    empty.register_parameter("bias", None)
    empty.register_module("missing", None)
    modules = [empty, torch.nn.Sequential(torch.nn.ReLU(), empty),
               torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2, bias=False),
               torch.nn.GELU()]
    got = [model_pairs._holds_parameters(m) for m in modules]
    assert got == [next(m.parameters(), None) is not None for m in modules] == [False, False, True, True, False]


def test_policy_and_critic_pair_only_when_they_compute_alike(char_tokenizer, monkeypatch):
    """A critic of another size, or with another norm eps, keeps its own pass; a batch that
    repeats its prompts takes the two passes, each sharing its prompts."""
    policy = tiny("llama", char_tokenizer)
    other_size = ScalarHeadModel.from_policy(tiny("llama", char_tokenizer, intermediate_size=48), head_init="zero")
    other_eps = ScalarHeadModel.from_policy(policy, head_init="zero")
    other_eps.backbone.layers[1].input_layernorm.variance_epsilon = 1e-3
    lean_forward.enable(policy, other_size, other_eps)
    assert not lean_forward.pair(policy, other_size) and not lean_forward.pair(policy, other_eps)
    assert not lean_forward.paired_critic(policy, other_size) and not lean_forward.pair(policy, None)
    same = ScalarHeadModel.from_policy(policy, head_init="zero")
    assert not lean_forward.pair(policy, same)  # not on the lean path yet
    lean_forward.enable(same)
    assert lean_forward.pair(policy, same)
    torch.manual_seed(0)
    rollout = generate(policy, char_tokenizer, PROMPTS[:4] * 2, 4)  # every prompt twice: shared, not paired
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    shapes, out = _mlp_tokens(monkeypatch, lambda: response_logprobs_and_values(policy, same, *args))
    assert len(shapes) == 2 * policy.config.num_hidden_layers  # a pass for each model, not one for both
    torch.testing.assert_close(out["values"], response_values(same, *args))
    rollout = generate(policy, char_tokenizer, PROMPTS[:5] + PROMPTS[:1], 4)  # one prompt drawn twice: paired
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    shapes, out = _mlp_tokens(monkeypatch, lambda: response_logprobs_and_values(policy, same, *args))
    assert len(shapes) == policy.config.num_hidden_layers
    torch.testing.assert_close(out["values"], response_values(same, *args))


def test_pairing_policy_and_critic_changes_nothing_but_rounding(tmp_path, tiny_model_dir, monkeypatch):
    config = preset("alpacafarm", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"),
                    **{**SETTINGS, "ppo_epochs": 2, "num_minibatches": 2})
    assert config.paired_critic_pass  # the default
    stacked, hidden_states = [], lean_forward.hidden_states

    def recorded(backbone, input_ids, *rest, **options):  # the paired passes: one backbone pair, 2B rows
        if isinstance(backbone, lean_forward.Stacked):
            stacked.append((len(input_ids), torch.is_grad_enabled()))
        return hidden_states(backbone, input_ids, *rest, **options)

    monkeypatch.setattr(lean_forward, "hidden_states", recorded)
    prompts = [f"{a}+{b}=" for a in range(30) for b in range(30)]  # batches of distinct prompts
    paired = _run(config, prompts=prompts)
    assert sorted(stacked) == [(2 * 4, True)] * 2 * 2 * 3  # every micro-batch of 4 rows, with autograd
    policy = paired[0].accelerator.unwrap_model(paired[0].policy)
    assert lean_forward.paired_critic(policy, paired[0].value_model)
    separate = _run(config.replace(paired_critic_pass=False, output_dir=str(tmp_path / "b")), prompts=prompts)
    assert not lean_forward.paired_critic(separate[0].policy, separate[0].value_model)
    _assert_same_run(paired, separate, 1e-6)


def test_fused_adamw_is_the_single_tensor_loop_to_rounding(tmp_path, tiny_model_dir):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 3))
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    assert adamw_kernel([model]) == {"fused": True}
    fused = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-8, weight_decay=0.01, **adamw_kernel([model]))
    loop = torch.optim.AdamW(twin.parameters(), lr=1e-2, eps=1e-8, weight_decay=0.01, foreach=False)
    for step in range(20):
        for p, q in zip(model.parameters(), twin.parameters()):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        loop.step()
    assert min((p - p0).abs().max().item() for p, p0 in zip(model.parameters(), start.parameters())) > 0.05
    assert all(torch.allclose(p, q, rtol=0, atol=1e-6) for p, q in zip(model.parameters(), twin.parameters()))
    # the trainer's optimizers use it
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), progress=False)
    optimizer = RLTrainer(config).policy_optimizer
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    assert optimizer.defaults["fused"] is True


def test_config_documents_the_speed_fields():
    help_text = PPOConfig.__dataclass_fields__["reuse_update_forward"].metadata
    assert PPOConfig().lean_forward and PPOConfig().reuse_update_forward
    assert help_text  # described like every field (docs row checked in test_docs)


def test_compile_forward_needs_the_lean_forward():
    with pytest.raises(ValueError, match="compile_forward"):
        PPOConfig(compile_forward=True, lean_forward=False).validate()


@pytest.mark.slow  # the first call compiles (about 2 minutes on 2 CPU cores)
def test_compiled_forward_changes_nothing_but_rounding(tmp_path, tiny_model_dir):
    config = preset("grpo", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "a"), group_size=4,
                    **{**SETTINGS, "ppo_epochs": 2})
    compiled = _run(config.replace(compile_forward=True))
    backbone = lean_forward.lean_backbone(compiled[0].accelerator.unwrap_model(compiled[0].policy))
    assert backbone.__dict__[lean_forward.COMPILE_ATTRIBUTE]
    eager = _run(config.replace(output_dir=str(tmp_path / "b")))
    _assert_same_run(compiled, eager, 1e-5)

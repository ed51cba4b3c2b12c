"""What a real checkpoint brings along: its generation config, several stop ids, a context
limit, attention kernels; and the memory toggle that recomputes activations."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ppo.config import PPOConfig
from ppo.models.logprobs import response_logprobs
from ppo.models.policy import (declared_stop_token_ids, disable_dropout, gradient_checkpointing_active, load_policy,
                        scoring_mode, set_training)
from ppo.models.rollout import PromptTooLongError, generate
from ppo.trainer import RLTrainer
from tests.test_architectures import count_digits, save_checkpoint

TINY = dict(task="custom", rollout_batch_size=4, response_length=6, ppo_epochs=1, num_minibatches=1, total_steps=2,
            save_every=0, eval_every=0, progress=False, log_samples=1, threads=1, lr=1e-2)
PROMPTS = ["1+1=", "2+3=", "9+9=", "11+1="]


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


def copy_with_generation_config(source, target, **settings):
    model = AutoModelForCausalLM.from_pretrained(source)
    for name, value in settings.items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def test_saved_generation_config_never_shapes_sampling(tmp_path, tiny_model_dir):
    """A checkpoint whose generation_config asks for penalties and truncation samples the
    same tokens as a clean one: only PPOConfig's settings reach `generate`."""
    poisoned = copy_with_generation_config(tiny_model_dir, tmp_path / "poisoned", repetition_penalty=5.0,
                                           no_repeat_ngram_size=1, top_k=2, top_p=0.5, min_new_tokens=8, do_sample=True,
                                           bad_words_ids=[[7], [8]])
    clean_model, tokenizer = load_policy(tiny_model_dir)
    poisoned_model, _ = load_policy(poisoned)
    prompts = ["1+1=", "12+34=", "9+9=", "5*5="] * 4
    torch.manual_seed(3)
    clean = generate(clean_model, tokenizer, prompts, max_new_tokens=12)
    torch.manual_seed(3)
    dirty = generate(poisoned_model, tokenizer, prompts, max_new_tokens=12)
    assert torch.equal(clean.response_ids, dirty.response_ids)
    # the saved config is left as it was for anyone else using the model
    assert poisoned_model.generation_config.repetition_penalty == 5.0
    # and this draw does repeat tokens, so no_repeat_ngram_size=1 would have changed it
    repeats = any(len(set(row[m.bool()].tolist())) < int(m.sum())
                  for row, m in zip(clean.response_ids, clean.response_mask))
    assert repeats


def test_every_declared_stop_id_ends_a_response(tmp_path, tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    greedy = generate(model, tokenizer, ["1+1="], max_new_tokens=6, greedy=True)
    first = int(greedy.response_ids[0, 0])
    assert first != tokenizer.eos_token_id
    # an "end of turn" id declared only by the checkpoint's generation config
    instruct = copy_with_generation_config(tiny_model_dir, tmp_path / "instruct",
                                           eos_token_id=[tokenizer.eos_token_id, first])
    model, tokenizer = load_policy(instruct)
    assert declared_stop_token_ids(model, tokenizer) == [tokenizer.eos_token_id, first]
    stopped = generate(model, tokenizer, ["1+1="], max_new_tokens=6, greedy=True)
    assert stopped.has_eos.tolist() == [True] and stopped.response_mask.sum().item() == 1
    # the trainer uses them by default, and PPOConfig.stop_token_ids overrides them
    trainer = RLTrainer(PPOConfig(model_path=str(instruct), output_dir=str(tmp_path / "a"), **TINY),
                        prompts=PROMPTS, reward_fn=count_ones)
    assert trainer.stop_token_ids == [tokenizer.eos_token_id, first]
    trainer = RLTrainer(PPOConfig(model_path=str(instruct), output_dir=str(tmp_path / "b"),
                                  stop_token_ids=[tokenizer.eos_token_id], **TINY), prompts=PROMPTS,
                        reward_fn=count_ones)
    assert trainer.stop_token_ids == [tokenizer.eos_token_id]


LONG_PROMPT = "tom has 3 apples and buys 4 more. " * 12 + "how many?"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_prompt_longer_than_the_limit_is_cut_or_refused(tmp_path, arch):
    """GPT-2 (learned positions) raised IndexError inside generate; Llama ran past its positions."""
    path = save_checkpoint(tmp_path / arch, arch, "distinct", max_positions=32)
    model, tokenizer = load_policy(path)
    assert len(tokenizer(LONG_PROMPT)["input_ids"]) > 32
    with pytest.raises(PromptTooLongError, match="max_prompt_length=26"):  # 32 positions - 6 new tokens
        generate(model, tokenizer, [LONG_PROMPT], max_new_tokens=6)
    for side in ("left", "right"):
        rollout = generate(model, tokenizer, [LONG_PROMPT, "12+3="], max_new_tokens=6, max_prompt_length=20,
                           prompt_truncation=side)
        assert rollout.query_ids.shape[1] == 20 and rollout.prompt_truncated.tolist() == [True, False]
        assert rollout.query_ids[0, 0].item() == tokenizer.bos_token_id  # BOS survives the cut
    trainer = RLTrainer(PPOConfig(model_path=str(path), output_dir=str(tmp_path / "run"), max_prompt_length=20,
                                  **TINY), prompts=[LONG_PROMPT, "12+3="], reward_fn=count_digits)
    metrics = trainer.train_step()
    assert 0.0 < metrics["prompt_truncated_frac"] < 1.0
    refusing = RLTrainer(PPOConfig(model_path=str(path), output_dir=str(tmp_path / "refuse"),
                                   prompt_truncation="error", **TINY), prompts=[LONG_PROMPT], reward_fn=count_digits)
    with pytest.raises(PromptTooLongError, match="PPOConfig.max_prompt_length"):
        refusing.train_step()


def test_prompt_plus_response_is_checked_against_the_context(tmp_path):
    path = save_checkpoint(tmp_path / "gpt2", "gpt2", "none", max_positions=32)
    with pytest.raises(ValueError, match="PPOConfig.response_length"):
        RLTrainer(PPOConfig(model_path=str(path), output_dir=str(tmp_path / "a"), **{**TINY, "response_length": 40}),
                  prompts=PROMPTS, reward_fn=count_ones)
    with pytest.raises(ValueError, match="PPOConfig.max_prompt_length: 30 prompt tokens"):
        RLTrainer(PPOConfig(model_path=str(path), output_dir=str(tmp_path / "b"), max_prompt_length=30, **TINY),
                  prompts=PROMPTS, reward_fn=count_ones)
    trainer = RLTrainer(PPOConfig(model_path=str(path), output_dir=str(tmp_path / "c"), **TINY), prompts=PROMPTS,
                        reward_fn=count_ones)
    assert trainer.max_prompt_length == 32 - TINY["response_length"]


def test_scoring_mode_is_eval_and_restores(tiny_model_dir):
    model, _ = load_policy(tiny_model_dir, dropout=True)
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5  # a live float-attribute dropout, as Llama reads it
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, model(ids).logits)
        with scoring_mode(model):
            assert torch.equal(model(ids).logits, model(ids).logits)
    assert model.training
    disable_dropout(model)
    assert model.model.layers[0].self_attn.attention_dropout == 0.0 and model.config.attention_dropout == 0.0


def test_set_training_sets_what_module_train_sets(tiny_model_dir):
    fast, _ = load_policy(tiny_model_dir)
    slow, _ = load_policy(tiny_model_dir)
    fast.model.layers[0].mlp.eval()  # a mixed state: one mode must reach every module
    slow.model.layers[0].mlp.eval()
    for mode in (True, False, True, True, False):
        set_training(fast, mode)
        slow.train(mode)
        assert [m.training for m in fast.modules()] == [m.training for m in slow.modules()] == [mode] * len(
            list(slow.modules()))
    calls = []

    class Wrapper(torch.nn.Module):  # does more than set flags: its own train() must run
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def train(self, mode=True):
            calls.append(mode)
            return super().train(mode)

    wrapped = Wrapper(fast)
    set_training(wrapped, True)
    set_training(wrapped, False)
    assert calls == [True, False] and not any(m.training for m in wrapped.modules())
    set_training(fast, True)
    fast.model.add_module("extra", torch.nn.Linear(2, 2))  # a child added after the first call
    fast.model.extra.eval()
    set_training(fast, True)
    assert fast.model.extra.training


def test_attn_implementation_is_passed_and_agrees(tmp_path, tiny_model_dir):
    eager, tokenizer = load_policy(tiny_model_dir, attn_implementation="eager")
    sdpa, _ = load_policy(tiny_model_dir, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    pad = tokenizer.pad_token_id
    query = torch.tensor([[pad, 1, 5, 6], [1, 5, 6, 7]])
    args = (query, (query != pad).long(), torch.tensor([[8, 9], [9, 10]]), torch.ones(2, 2, dtype=torch.long))
    with torch.no_grad():
        torch.testing.assert_close(response_logprobs(eager, *args), response_logprobs(sdpa, *args), atol=1e-5, rtol=0)
    trainer = RLTrainer(PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"),
                                  attn_implementation="eager", **TINY), prompts=PROMPTS, reward_fn=count_ones)
    assert trainer.accelerator.unwrap_model(trainer.policy).config._attn_implementation == "eager"


def test_gradient_checkpointing_recomputes_and_gives_the_same_update(tmp_path, tiny_model_dir):
    results = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        trainer = RLTrainer(PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / str(checkpointing)),
                                      gradient_checkpointing=checkpointing, lean_forward=False,  # module calls, so
                                      **TINY), prompts=PROMPTS,  # the hook below sees every attention call
                            reward_fn=count_ones)
        policy = trainer.accelerator.unwrap_model(trainer.policy)
        critic = trainer.accelerator.unwrap_model(trainer.value_model)
        assert gradient_checkpointing_active(policy) == gradient_checkpointing_active(critic) == checkpointing
        calls = []
        policy.model.layers[0].self_attn.register_forward_pre_hook(lambda *args: calls.append(torch.is_grad_enabled()))
        metrics = trainer.train_step()
        results[checkpointing] = (len(calls), metrics, [p.detach().clone() for p in policy.parameters()])
    plain_calls, plain_metrics, plain_params = results[False]
    ckpt_calls, ckpt_metrics, ckpt_params = results[True]
    assert ckpt_calls == plain_calls + 1  # attention ran once more: recomputed in the backward pass (a pre-hook, as recomputation stops early)
    assert ckpt_metrics["pg_loss"] == pytest.approx(plain_metrics["pg_loss"], abs=1e-6)
    for a, b in zip(plain_params, ckpt_params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

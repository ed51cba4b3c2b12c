"""LoRA through peft: adapters only are trained, the reference is the adapter-disabled base,
checkpoints are plain HF models and resume from the adapter."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ppo.config import PPOConfig, preset
from ppo.models.logprobs import response_logprobs
from ppo.models.lora import AdapterDisabledReference
from ppo.models.policy import load_policy
from ppo.trainer import RLTrainer
from value_model import ScalarHeadModel

pytest.importorskip("peft")

TINY = dict(task="custom", rollout_batch_size=8, response_length=8, total_steps=4, save_every=0, eval_every=0,
            progress=False, log_samples=1, threads=1, lr=3e-2, lora_r=4, lora_alpha=8.0)
PROMPTS = ["1+1=", "2+3=", "9+9=", "11+1="]


def count_ones(prompts, responses):
    return [float(r.count("1")) for r in responses]


def grpo(tmp_path, model_dir, **overrides):
    config = preset("grpo", model_path=str(model_dir), output_dir=str(tmp_path), group_size=4,
                    **{**TINY, **overrides})
    return RLTrainer(config, prompts=PROMPTS, reward_fn=count_ones)


def test_lora_trains_adapters_against_the_adapter_disabled_base(tmp_path, tiny_model_dir):
    trainer = grpo(tmp_path / "run", tiny_model_dir)
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    # the reference holds no weights of its own: it is the policy with the adapter off
    assert isinstance(trainer.ref_policy, AdapterDisabledReference) and trainer.ref_policy.peft_model is policy
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    optimized = [p for group in trainer.policy_optimizer.param_groups for p in group["params"]]
    assert len(optimized) == len(trainable)
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}

    first = trainer.train_step()
    assert first["kl"] == 0.0  # B = 0: the adapter starts as the identity
    for _ in range(2):
        last = trainer.train_step()
    assert last["kl"] != 0.0  # the adapter moved the policy away from the reference
    assert all(torch.equal(p, base_before[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    # the reference's log-probs are those of the untouched checkpoint
    fresh, tokenizer = load_policy(tiny_model_dir)
    pad = tokenizer.pad_token_id
    query = torch.tensor([[pad, 1, 5, 6], [1, 5, 6, 7]])
    args = (query, (query != pad).long(), torch.tensor([[8, 9], [9, 10]]), torch.ones(2, 2, dtype=torch.long))
    with torch.no_grad():
        reference = response_logprobs(trainer.ref_policy, *args)
        torch.testing.assert_close(reference, response_logprobs(fresh, *args), atol=1e-6, rtol=0)
        assert not torch.allclose(response_logprobs(trainer.policy, *args), reference, atol=1e-4)


def test_lora_checkpoint_is_a_plain_model_and_resumes_from_the_adapter(tmp_path, tiny_model_dir):
    trainer = grpo(tmp_path / "run", tiny_model_dir)
    trainer.train_step()
    trainer.train_step()
    checkpoint = trainer.save_checkpoint()
    assert (checkpoint / "policy" / "adapter" / "adapter_model.safetensors").is_file()
    policy = trainer.accelerator.unwrap_model(trainer.policy).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    merged = AutoModelForCausalLM.from_pretrained(checkpoint / "policy").eval()  # no peft needed to load it
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, policy(ids).logits, atol=1e-5, rtol=0)
    resumed = grpo(tmp_path / "run", tiny_model_dir)
    assert resumed.load_checkpoint() and resumed.step == 2
    resumed_policy = resumed.accelerator.unwrap_model(resumed.policy).eval()
    with torch.no_grad():
        assert torch.equal(resumed_policy(ids).logits, policy(ids).logits)


def test_lora_critic_with_gradient_checkpointing(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "ppo"), lora_critic=True,
                       gradient_checkpointing=True, **TINY)
    trainer = RLTrainer(config, prompts=PROMPTS, reward_fn=lambda prompts, responses: [len(r) / 8 for r in responses])
    critic = trainer.accelerator.unwrap_model(trainer.value_model)
    trainable = [name for name, p in critic.named_parameters() if p.requires_grad]
    assert {"head.weight", "head.bias"} <= set(trainable)
    assert all("lora_" in name or name.startswith("head.") for name in trainable)
    before = {n: p.detach().clone() for n, p in critic.named_parameters() if p.requires_grad}
    metrics = trainer.train_step()
    assert metrics["vf_loss"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in critic.named_parameters() if n in before)
    checkpoint = trainer.save_checkpoint()
    loaded = ScalarHeadModel.from_pretrained(checkpoint / "value").eval()
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), critic.eval()(ids), atol=1e-5, rtol=0)


def test_lora_fields_are_validated():
    with pytest.raises(ValueError, match="PPOConfig.lora_critic"):
        PPOConfig(lora_critic=True)
    with pytest.raises(ValueError, match="PPOConfig.lora_r"):
        PPOConfig(lora_r=-2)
    with pytest.raises(ValueError, match="PPOConfig.lora_alpha"):
        PPOConfig(lora_r=8, lora_alpha=0)


def test_lora_holds_no_reference_copy_and_no_full_optimizer_state(tmp_path, tiny_model_dir):
    from ppo.benchmarks.memory import state_bytes

    measured = {}
    for rank in (0, 4):
        trainer = grpo(tmp_path / f"r{rank}", tiny_model_dir, lora_r=rank)
        trainer.train_step()  # AdamW allocates its moments at the first step
        measured[rank] = state_bytes(trainer.models)
    full, lora = measured[0], measured[4]
    assert full["reference_weights"] == full["policy_weights"] and lora["reference_weights"] == 0
    assert full["optimizer_state"] == 2 * full["gradients"] == 2 * full["policy_weights"]  # Adam: two moments
    assert lora["trainable_parameters"] < 0.2 * full["trainable_parameters"]
    assert lora["optimizer_state"] == 2 * lora["gradients"] < 0.2 * full["optimizer_state"]

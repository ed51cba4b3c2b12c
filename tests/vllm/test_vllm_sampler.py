"""Sampling on vLLM (`generation_backend='vllm'`, ppo/parallel/vllm_sampler.py) against the trainer.

One GRPO testbed trainer with its engine serves the module. Tolerance: the engine's fp32
CPU kernels and the trainer's forward agree on a sampled token's log-prob to about 2e-5 at
worst (mean about 2e-7); `TOL` leaves room above that, and a stale engine misses it by
orders of magnitude.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from ppo.config import preset
from ppo.models.forward_passes import rollout_args
from ppo.models.logprobs import response_logprobs
from ppo.models.policy import load_policy
from ppo.models.rollout import generate

TOL = 1e-4  # largest |logp_sampler - logp_trainer| per token accepted (fp32, CPU)
PROMPTS = ["12+3=", "7+8=", "45+19=", "3+3=", "60+21=", "9+1=", "33+4=", "8+88="]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    pytest.importorskip("vllm")
    from ppo.trainer import RLTrainer

    config = preset("grpo", testbed=True, total_steps=20, eval_every=0, save_every=0, progress=False, threads=1,
                    device="cpu", output_dir=str(tmp_path_factory.mktemp("vllm_run")), generation_backend="vllm",
                    vllm_kv_cache_gb=0.05, seed=0)
    return RLTrainer(config)


def sample(trainer, prompts=PROMPTS, seed=0, **settings):
    """The engine's rollout of `prompts` with the run's stop tokens unless given."""
    settings = {"max_new_tokens": 16, "stop_token_ids": trainer.stop_token_ids, **settings}
    torch.manual_seed(seed)
    return trainer.vllm_sampler.generate(trainer.policy_module, trainer.tokenizer, prompts, **settings)


def trainer_logprobs(model, rollout, temperature=1.0):
    with torch.no_grad():
        return response_logprobs(model, *rollout_args(rollout), temperature=temperature) * rollout.response_mask


def gap(model, rollout, temperature=1.0) -> float:
    """Largest |logp_sampler - logp_trainer| over the rollout's real tokens."""
    return float((rollout.sampler_logprobs - trainer_logprobs(model, rollout, temperature)).abs().max())


@contextlib.contextmanager
def perturbed(policy, scale=0.05):
    """The policy's weights moved by noise inside the block, restored after."""
    saved = {k: v.clone() for k, v in policy.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    try:
        yield
    finally:
        policy.load_state_dict(saved)


# ------------------------------------------------------------------ log-probs and weight sync
def test_engine_log_probs_match_the_trainer_at_the_sampling_temperature(trainer):
    for temperature in (1.0, 0.5):
        rollout = sample(trainer, temperature=temperature)
        assert rollout.response_mask.sum() > len(PROMPTS)
        assert gap(trainer.policy_module, rollout, temperature) < TOL


def test_a_changed_policy_changes_the_engines_log_probs_once_synced(trainer):
    policy, sampler = trainer.policy_module, trainer.vllm_sampler
    before = sample(trainer, seed=3)
    with perturbed(policy):
        sampler.stale = False  # pretend synced: the engine still holds the old weights
        stale = sample(trainer, seed=3)
        assert torch.equal(stale.response_ids, before.response_ids)  # same weights, same seeds, same samples
        assert gap(policy, stale) > 100 * TOL
        sampler.stale = True  # what every optimizer step does (the hook below)
        synced = sample(trainer, seed=3)
        assert gap(policy, synced) < TOL
        assert not torch.equal(synced.response_ids, before.response_ids)
    sampler.stale = True
    assert gap(policy, sample(trainer, seed=3)) < TOL  # restored weights synced back


def test_every_optimizer_step_marks_the_engine_stale(trainer):
    trainer.vllm_sampler.stale = False
    trainer.policy_optimizer.zero_grad(set_to_none=True)
    trainer.policy_optimizer.step()  # no gradients: the weights stay, the hook still runs
    assert trainer.vllm_sampler.stale


def test_lora_policy_syncs_its_merged_weights(trainer):
    from ppo.models.lora import apply_lora

    sampler, base_policy = trainer.vllm_sampler, trainer.policy_module
    lora_policy, _ = load_policy(trainer.model_path)
    lora_policy.load_state_dict(base_policy.state_dict())
    lora_policy = apply_lora(lora_policy, r=4, alpha=8.0, targets="all-linear")
    with torch.no_grad():
        for name, p in lora_policy.named_parameters():
            if "lora_B" in name:  # B = 0 would merge to the base weights: make the adapter matter
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    sampler.policy, sampler.stale = lora_policy, True
    try:
        torch.manual_seed(4)
        rollout = sampler.generate(lora_policy, trainer.tokenizer, PROMPTS, 16, stop_token_ids=trainer.stop_token_ids)
        assert gap(lora_policy, rollout) < TOL
        assert gap(base_policy, rollout) > 100 * TOL  # the engine runs base + adapter, not the base
    finally:
        sampler.policy, sampler.stale = base_policy, True


# ------------------------------------------------------------------ sampling settings, field by field
def test_sampling_params_map_each_field():
    pytest.importorskip("vllm")
    from ppo.parallel.vllm_sampler import sampling_params

    neutral = sampling_params(64, [2])
    assert (neutral.temperature, neutral.top_k, neutral.top_p, neutral.max_tokens) == (1.0, 0, 1.0, 64)
    assert neutral.stop_token_ids == [2] and neutral.ignore_eos and neutral.seed is None
    assert (neutral.repetition_penalty, neutral.presence_penalty, neutral.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (neutral.min_p, neutral.min_tokens, neutral.logprobs) == (0.0, 0, 0)
    for field, value, attribute in [("temperature", 0.7, "temperature"), ("top_k", 5, "top_k"),
                                    ("top_p", 0.9, "top_p"), ("max_new_tokens", 7, "max_tokens"),
                                    ("stop_token_ids", [4, 9], "stop_token_ids"), ("seed", 123, "seed")]:
        settings = {"max_new_tokens": 64, "stop_token_ids": [2], field: value}
        assert getattr(sampling_params(**settings), attribute) == value, field
    assert sampling_params(64, [2], temperature=0.7, greedy=True).temperature == 0.0


def test_greedy_samples_equal_hugging_face_generate(trainer):
    hf_policy, tokenizer = load_policy(trainer.model_path)  # a plain HF model: no lean loop
    hf_policy.load_state_dict(trainer.policy_module.state_dict())
    expected = generate(hf_policy, tokenizer, PROMPTS, 16, greedy=True, stop_token_ids=trainer.stop_token_ids)
    rollout = sample(trainer, greedy=True)
    assert torch.equal(rollout.response_mask, expected.response_mask)
    assert torch.equal(rollout.response_ids, expected.response_ids)


def test_top_k_1_and_a_tiny_top_p_sample_the_greedy_response(trainer):
    greedy = sample(trainer, greedy=True).response_ids
    assert torch.equal(sample(trainer, seed=1, top_k=1).response_ids, greedy)
    assert torch.equal(sample(trainer, seed=1, top_p=1e-6).response_ids, greedy)
    assert not torch.equal(sample(trainer, seed=1).response_ids, greedy)  # pure sampling differs somewhere


def test_response_length_and_no_stop_token_run_every_response_to_the_limit(trainer):
    rollout = sample(trainer, max_new_tokens=5, stop_token_ids=[])
    assert rollout.response_ids.shape[1] == 5 and bool((rollout.response_mask == 1).all())
    assert sample(trainer, max_new_tokens=9).response_ids.shape[1] <= 9


def test_stop_token_ids_end_each_response_at_the_first_stop(trainer):
    stop = trainer.tokenizer.convert_tokens_to_ids("1")
    rollout = sample(trainer, prompts=PROMPTS * 2, stop_token_ids=[stop], max_new_tokens=24)
    assert bool(rollout.has_eos.any())
    for ids, mask, ended in zip(rollout.response_ids, rollout.response_mask, rollout.has_eos):
        real = ids[mask.bool()].tolist()
        assert stop not in real[:-1]  # nothing sampled after a stop
        assert (real[-1] == stop) == bool(ended)
        assert ended or len(real) == 24


def test_same_torch_seed_same_rollout_other_seed_other_rollout(trainer):
    first, again, other = sample(trainer, seed=11), sample(trainer, seed=11), sample(trainer, seed=12)
    assert torch.equal(first.response_ids, again.response_ids)
    assert not torch.equal(first.response_ids, other.response_ids)


def test_unsupported_architecture_is_named():
    pytest.importorskip("vllm")
    from ppo.parallel.vllm_sampler import check_architecture

    with pytest.raises(ValueError, match="NoSuchModelForCausalLM"):
        check_architecture(SimpleNamespace(architectures=["NoSuchModelForCausalLM"]))


# ------------------------------------------------------------------ training on the engine
def test_grpo_steps_on_vllm_log_the_gap_and_the_engine_follows_every_update(trainer):
    """The trainer's old pass against the engine's log-probs, every step: the engine took
    each update (a stale engine would show the update's size, as tested above)."""
    for _ in range(3):
        metrics = trainer.train_step()
        assert 0 < metrics["rollout_logprob_gap_max"] < TOL
        assert 0 <= metrics["rollout_logprob_gap_mean"] <= metrics["rollout_logprob_gap_max"]


@pytest.mark.slow
def test_grpo_on_vllm_learns_in_20_steps(tmp_path):
    """The testbed's GRPO preset on the engine: the training reward (the policy's own
    samples) of the last 5 of 20 steps beats the first 5. The same run on 'hf' moves about
    as much; per-step rewards swing with the prompts drawn, so the margin is half of that."""
    pytest.importorskip("vllm")
    from ppo.trainer import RLTrainer

    config = preset("grpo", testbed=True, total_steps=20, eval_every=0, save_every=0, progress=False, threads=1,
                    device="cpu", output_dir=str(tmp_path), generation_backend="vllm", vllm_kv_cache_gb=0.05, seed=1)
    trainer = RLTrainer(config)
    rewards = [trainer.train_step()["reward"] for _ in range(20)]
    assert sum(rewards[-5:]) / 5 >= sum(rewards[:5]) / 5 + 0.05, rewards


def test_a_stale_run_samples_on_the_engine_with_the_weights_of_k_steps_before(tmp_path):
    """rollout_staleness = 2 on vLLM: the engine is built on the frozen sampler copy and syncs
    from it, so its log-probs are those of the k-steps-old weights (within TOL), not the
    policy's. The loop's own gap metric shows it: step 0 samples with the current weights, steps
    1 and 2 still with step 0's while the policy has moved."""
    pytest.importorskip("vllm")
    from ppo.trainer import RLTrainer

    config = preset("grpo", testbed=True, total_steps=3, eval_every=0, save_every=0, progress=False, threads=1,
                    device="cpu", output_dir=str(tmp_path), generation_backend="vllm", vllm_kv_cache_gb=0.05, seed=0,
                    rollout_staleness=2)
    stale = RLTrainer(config)
    history = stale.state.policy_history
    assert stale.vllm_sampler.policy is history.sampler and history.sampler is not stale.policy_module
    gaps = []
    for _ in range(3):
        gaps.append(stale.train_step()["rollout_logprob_gap_max"])
        torch.manual_seed(0)
        rollout = stale.vllm_sampler.generate(history.sampler, stale.tokenizer, PROMPTS, 16,
                                              stop_token_ids=stale.stop_token_ids)
        assert gap(history.sampler, rollout) < TOL  # the engine holds the sampler's (old) weights
        assert gap(stale.policy_module, rollout) > 10 * TOL  # ... which the trained policy has left
    assert gaps[0] < TOL and min(gaps[1:]) > 10 * TOL, gaps

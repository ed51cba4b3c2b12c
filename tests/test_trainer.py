"""The training loop on a tiny random model: plumbing, resume, GRPO-specific guarantees.

The runs that must *learn* use the real SFT warm start and live in test_training_runs.py.
"""

import json
import math
import os

import pytest
import torch

from ppo.config import PPOConfig, preset
from ppo.trainer import RLTrainer

TINY = dict(rollout_batch_size=8, response_length=12, eval_size=8, eval_every=2, total_steps=4, save_every=0,
            progress=False, log_samples=2, lr=1e-3)


def read_metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows):
    return [{k: v for k, v in row.items() if not k.startswith("time_") and k != "wall_seconds"} for row in rows]


def test_run_directory_contents(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"), num_minibatches=2,
                       gradient_accumulation_steps=2, ppo_epochs=2, **TINY)
    summary = RLTrainer(config).train()
    run = tmp_path / "run"
    assert (run / "config.yaml").is_file() and (run / "summary.json").is_file()
    assert PPOConfig.from_yaml(run / "config.yaml") == config
    assert list(run.glob("events.out.tfevents.*"))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert "eval_sampled_accuracy" in rows[0] and "eval_sampled_accuracy" in rows[2]
    for key in ("score", "reward", "kl", "entropy", "pg_loss", "vf_loss", "clipfrac", "approx_kl", "value_error",
                "explained_variance", "response_length_correct", "time_generate", "time_update", "time_step"):
        assert key in rows[1], key
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 2 and {"prompt", "response", "score"} <= set(samples[0])
    checkpoint = run / "checkpoints" / "step_000004"
    assert (checkpoint / "policy" / "model.safetensors").is_file()
    assert (checkpoint / "value" / "scalar_head.safetensors").is_file()
    assert summary["steps"] == 4 and summary["samples"] == 32
    with pytest.raises(FileExistsError, match="resume"):
        RLTrainer(config).train()


def test_resume_matches_a_straight_run(tmp_path, tiny_model_dir):
    """N steps straight == N/2 steps, stop, resume for N/2 (same metrics and weights on CPU)."""
    common = dict(model_path=str(tiny_model_dir), num_minibatches=2, ppo_epochs=2, adaptive_kl=True,
                  kl_target=0.01, kl_horizon=100, **TINY)
    straight = RLTrainer(PPOConfig(output_dir=str(tmp_path / "a"), **common))
    straight.train()
    first = RLTrainer(PPOConfig(output_dir=str(tmp_path / "b"), **common))
    first.train(stop_after=2)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [0, 1, 2]
    resumed = RLTrainer(PPOConfig(output_dir=str(tmp_path / "b"), **common))
    resumed.train(resume=True)
    assert without_timing(read_metrics(tmp_path / "a")) == without_timing(read_metrics(tmp_path / "b"))
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    assert straight.kl_controller.value == resumed.kl_controller.value != 0.05  # adaptive beta restored


def test_a_run_is_the_same_whether_its_warm_start_was_built_or_cached(tmp_path, tiny_model_dir, monkeypatch):
    """The first run in a fresh clone trains the SFT warm start, which seeds and draws from the
    global RNGs and sets the thread count; the run that follows must be the one a cached warm
    start gives (it was not: the rollouts drew from the state the warm start's training left)."""
    import random

    import ppo.models.sft

    def cached(**kwargs):
        return tiny_model_dir

    def built(**kwargs):  # what training one does to the process's global state
        torch.manual_seed(123)
        torch.rand(1000)
        random.random()
        torch.set_num_threads(1)
        return tiny_model_dir

    rows = {}
    for name, warm_start in (("cached", cached), ("built", built)):
        monkeypatch.setattr(ppo.models.sft, "warm_start", warm_start)
        RLTrainer(PPOConfig(output_dir=str(tmp_path / name), **TINY)).train()
        rows[name] = without_timing(read_metrics(tmp_path / name))
    assert rows["built"] == rows["cached"]
    # The config's count (tests/conftest.py caps it at PPO_TEST_THREADS when that is set).
    assert torch.get_num_threads() == min(PPOConfig().threads, int(os.environ.get("PPO_TEST_THREADS") or 99))


def test_beta_zero_never_calls_the_reference_model(tmp_path, tiny_model_dir):
    calls = []
    config = preset("grpo", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "g"), group_size=4,
                    **{**TINY, "total_steps": 2})
    with_ref = RLTrainer(config)
    # the output head runs in every forward path (module call or ppo/speed/lean_forward.py)
    with_ref.ref_policy.get_output_embeddings().register_forward_hook(lambda *args: calls.append(1))
    with_ref.train_step()
    assert calls, "the spy must see reference calls when beta > 0"
    no_ref = RLTrainer(config.replace(kl_coef=0.0, output_dir=str(tmp_path / "g0")))
    assert no_ref.ref_policy is None  # never built: no forward pass, no memory
    metrics = no_ref.train_step()
    assert math.isnan(metrics["kl"]) and "time_reference_forward" not in metrics  # not measured


def count_ones(prompts, responses):
    return [float(response.count("1")) for response in responses]


def test_single_update_per_batch_has_ratio_exactly_one(tmp_path, tiny_model_dir):
    config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "g"),
                    group_size=4, **{**TINY, "lr": 1e-2})
    prompts = ["1+1=", "2+3=", "9+9="]
    trainer = RLTrainer(config, prompts=prompts, reward_fn=count_ones)
    for _ in range(3):
        metrics = trainer.train_step()
        assert metrics["advantage_abs_mean"] > 0  # there is a gradient, the policy moves
        assert metrics["ratio_mean"] == 1.0 and metrics["ratio_max"] == 1.0
        assert metrics["clipfrac"] == 0.0
    # with several updates per batch the ratio moves away from 1
    multi = RLTrainer(config.replace(ppo_epochs=4, num_minibatches=2, output_dir=str(tmp_path / "m")),
                      prompts=prompts, reward_fn=count_ones)
    metrics = multi.train_step()
    assert metrics["ratio_max"] > 1.0


def test_custom_prompts_and_reward_function(tmp_path, tiny_model_dir):
    reward_fn = count_ones
    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "c"),
                       advantage_estimator="rloo", group_size=4, **TINY)
    trainer = RLTrainer(config, prompts=["1+1=", "2+3=", "9+9="], reward_fn=reward_fn)
    summary = trainer.train()
    rows = read_metrics(tmp_path / "c")
    samples = [json.loads(line) for line in (tmp_path / "c" / "samples.jsonl").read_text().splitlines()]
    assert all(s["score"] == float(s["response"].count("1")) for s in samples)
    assert "sampled_accuracy" in summary["final_eval"] and len(rows) == 5
    with pytest.raises(ValueError, match="prompts and reward_fn"):
        RLTrainer(config.replace(output_dir=str(tmp_path / "x")))


def test_gsm8k_jsonl_task_trains_end_to_end(tmp_path, tiny_model_dir):
    rows = [{"question": "tom has 3 apples and buys 4. how many?", "answer": "3+4=7\n#### 7"},
            {"question": "half of 10?", "answer": "10/2=5\n#### 5"}]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = PPOConfig(task="gsm8k", task_path=str(path), model_path=str(tiny_model_dir),
                       output_dir=str(tmp_path / "run"), **{**TINY, "total_steps": 1})
    summary = RLTrainer(config).train()
    assert summary["steps"] == 1 and 0.0 <= summary["final_eval"]["sampled_accuracy"] <= 1.0
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("Question: ")


def test_one_tensorboard_event_per_step_holds_what_add_scalar_would(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from ppo.run.run_loop import write_scalars

    scalars = {"kl": 0.25, "reward": -1.5, "eval_sampled_accuracy": 0.625}
    plain, batched = SummaryWriter(str(tmp_path / "a")), SummaryWriter(str(tmp_path / "b"))
    for step in (1, 2):
        for tag, value in scalars.items():
            plain.add_scalar(tag, value * step, step)
        write_scalars(batched, {tag: value * step for tag, value in scalars.items()}, step)
    plain.close()
    batched.close()
    read = []
    for directory in ("a", "b"):
        events = EventAccumulator(str(tmp_path / directory))
        events.Reload()
        read.append({tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]})
    assert read[0] == read[1] and read[1]["reward"] == [(1, -1.5), (2, -3.0)]


def test_kl_at_the_sampling_temperature_is_one_quantity_for_both_temperature_toggles(tmp_path, tiny_model_dir):
    # scaled log-probs: the loss's KL is already at T = 0.7, so the two metrics coincide
    config = preset("alpacafarm", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "s"),
                    temperature=0.7,
                    value_init="policy", warmup_steps=0, **{**TINY, "total_steps": 2, "lr": 1e-2})
    prompts = ["1+1=", "2+3=", "9+9="]
    scaled = RLTrainer(config, prompts=prompts, reward_fn=count_ones)
    scaled.train_step()  # step 1: policy = reference, every KL is 0; step 2 measures a moved policy
    metrics = scaled.train_step()
    assert metrics["kl_k1_sampling"] == metrics["kl_k1"] != 0
    # unscaled: kl_k1 is at T = 1; kl_k1_sampling must equal k1 recomputed at T = 0.7 on the
    # same rollout with the policy as it was before the update
    unscaled = RLTrainer(config.replace(scale_logits_by_temperature=False, output_dir=str(tmp_path / "u")),
                         prompts=prompts, reward_fn=count_ones)
    seen = {}
    measure = unscaled.passes.sampling_temperature_kl

    def spy(rollout, kl_k1):
        seen["rollout"], seen["kl_k1"] = rollout, kl_k1
        seen["policy"] = {k: v.clone() for k, v in unscaled.accelerator.unwrap_model(unscaled.policy).state_dict().items()}
        seen["out"] = measure(rollout, kl_k1)
        return seen["out"]

    unscaled.train_step()
    unscaled.passes.sampling_temperature_kl = spy
    metrics = unscaled.train_step()
    from ppo.models.logprobs import response_logprobs
    policy = unscaled.accelerator.unwrap_model(unscaled.policy)
    policy.load_state_dict(seen["policy"])  # back to the rollout-time weights
    rollout = seen["rollout"]
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    with torch.no_grad():
        expected = (response_logprobs(policy.eval(), *args, temperature=0.7)
                    - response_logprobs(unscaled.ref_policy, *args, temperature=0.7)) * rollout.response_mask
    assert torch.allclose(seen["out"], expected, atol=1e-5)
    assert metrics["kl_k1_sampling"] == pytest.approx(expected.sum(-1).mean().item(), abs=1e-5)
    assert not torch.allclose(seen["out"], seen["kl_k1"])  # the T = 1 KL is a different number


def test_loss_weights_of_long_and_short_wrong_answers_follow_loss_agg(tmp_path, tiny_model_dir):
    # every answer is wrong (reward 0), lengths vary: GRPO's per-sequence mean gives the
    # longer ones less weight per token, Dr. GRPO's constant normaliser the same weight
    weights = {}
    for mode in ("seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"):
        config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / mode),
                        group_size=4, loss_agg=mode, **{**TINY, "total_steps": 1})
        trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=lambda p, r: [0.0] * len(r))
        metrics = trainer.train_step()
        weights[mode] = (metrics["loss_weight_incorrect_long"], metrics["loss_weight_incorrect_short"])
    long_, short = weights["seq_mean_token_mean"]
    assert long_ < short
    assert weights["seq_mean_token_sum_norm"][0] == pytest.approx(weights["seq_mean_token_sum_norm"][1])
    assert weights["token_mean"] == (1.0, 1.0)


def test_prompt_mean_is_exact_over_micro_batches_and_differs_from_token_mean(tmp_path, tiny_model_dir):
    """SkyRL's prompt_mean in the loop: the shuffle splits groups over micro-batches, and the
    update still equals one big minibatch's; it is not token_mean's update."""
    rewards = lambda prompts, responses: [float(len(r) % 3) for r in responses]  # noqa: E731 - varied advantages
    weights = {}
    for name, loss_agg, micro in (("one", "prompt_mean", 1), ("four", "prompt_mean", 4), ("token", "token_mean", 1)):
        config = preset("grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / name),
                        group_size=4, loss_agg=loss_agg, gradient_accumulation_steps=micro, seed=3,
                        **{**TINY, "total_steps": 1})
        trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=rewards)
        trainer.train_step()
        weights[name] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    for key, value in weights["one"].items():
        torch.testing.assert_close(weights["four"][key], value, atol=1e-6, rtol=1e-5)
    assert any(not torch.allclose(weights["token"][k], v, atol=1e-6) for k, v in weights["one"].items())


def test_the_example_in_rltrainers_docstring_runs(tmp_path, monkeypatch):
    """RLTrainer's docstring example, run as written (in a temporary directory): it trains
    and returns held-out metrics."""
    import inspect
    import textwrap

    doc = inspect.getdoc(RLTrainer)
    example = textwrap.dedent(doc[doc.index("::") + 2:])
    assert "RLTrainer(config, prompts=" in example and "trainer.train()" in example
    monkeypatch.chdir(tmp_path)
    printed = []
    namespace = {"print": printed.append}
    exec(compile(example, "RLTrainer docstring", "exec"), namespace)
    summary = namespace["summary"]
    assert summary["steps"] == 5 and (tmp_path / "runs" / "mine" / "metrics.jsonl").is_file()
    assert printed == [summary["final_eval"]] and "sampled_accuracy" in summary["final_eval"]


def test_resume_restores_a_refreshed_reference_and_the_adaptive_entropy_coefficient(tmp_path, tiny_model_dir):
    """A reference reset to the policy every 2 steps and an entropy coefficient adapted toward
    a target are training state: a run stopped after step 3 and resumed ends where the
    straight run does."""
    common = dict(model_path=str(tiny_model_dir), ref_update_every=2, ref_update_alpha=0.5, entropy_target=10.0,
                  entropy_coef_step=0.01, **TINY)
    straight = RLTrainer(PPOConfig(output_dir=str(tmp_path / "a"), **common))
    straight.train()
    first = RLTrainer(PPOConfig(output_dir=str(tmp_path / "b"), **common))
    first.train(stop_after=3)
    resumed = RLTrainer(PPOConfig(output_dir=str(tmp_path / "b"), **common))
    resumed.train(resume=True)
    assert without_timing(read_metrics(tmp_path / "a")) == without_timing(read_metrics(tmp_path / "b"))
    for a, b in zip(straight.ref_policy.parameters(), resumed.ref_policy.parameters()):
        assert torch.equal(a, b)
    assert straight.entropy_control.coef == resumed.entropy_control.coef > 0


def test_rloo_trains_as_dr_grpo_does_when_adam_cancels_its_constant_scale(tmp_path, tiny_model_dir):
    """The lecture's identity: RLOO's advantage is Dr. GRPO's times G/(G-1) (gae/group.py), a
    constant that Adam cancels when nothing else depends on the loss's scale (no KL term, no
    gradient-norm clip). Three steps of each then end at the same weights, and a different
    advantage (GRPO's std division, not a constant rescale) does not."""
    rewards = lambda prompts, responses: [float(len(r) % 3) for r in responses]  # noqa: E731 - varied advantages
    weights = {}
    for name, estimator, scale in (("dr_grpo", "dr_grpo", "none"), ("rloo", "rloo", "none"), ("grpo", "grpo", "group")):
        config = preset("dr_grpo", task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / name),
                        group_size=4, advantage_estimator=estimator, grpo_scale=scale, max_grad_norm=None, kl_coef=0.0, adam_eps=1e-12,
                        max_prompt_length=None,
                        seed=3, **{**TINY, "total_steps": 3, "eval_every": 0})
        trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=rewards)
        for _ in range(3):
            trainer.train_step()
        weights[name] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    moved = max((weights["dr_grpo"][k] - v).abs().max().item() for k, v in weights["grpo"].items())
    gap = max((weights["dr_grpo"][k] - v).abs().max().item() for k, v in weights["rloo"].items())
    assert moved > 1e-4  # the std-divided run goes elsewhere: the comparison can fail
    assert gap < 1e-5 and moved > 100 * gap, (gap, moved)  # float rounding only

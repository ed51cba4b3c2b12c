from ablations.bench import compute_floor, format_bench
from ppo.config import PPOConfig
from ppo.trainer import RLTrainer


def test_compute_floor_times_each_model_call(tmp_path, tiny_model_dir):
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=str(tmp_path), rollout_batch_size=8,
                       num_minibatches=2, ppo_epochs=2, response_length=8, progress=False, threads=1)
    trainer = RLTrainer(config)
    floor = compute_floor(trainer, ["1+2="] * 8)
    assert set(floor) == {"generate", "policy_forward", "reference_forward", "value_forward", "update"}
    assert all(seconds > 0 for seconds in floor.values())
    # the floor leaves no gradients behind and does not change the policy
    assert all(p.grad is None for p in trainer.policy.parameters())
    text = format_bench([{"preset": "x", "step": 2.0, "floor_total": 1.0, "ratio": 2.0,
                          "phases": {p: 0.1 for p in ("generate", "score", "policy_forward", "reference_forward",
                                                      "value_forward", "rewards", "advantages", "update")},
                          "floor": floor}])
    assert "step/floor 2.00" in text

"""Step-time benchmark: PPO and GRPO steps on the testbed against their compute floor.

A training step spends time in model calls (generation, no-grad forward passes, forward +
backward in the update) and in everything else (scoring, reward shaping, advantages, the
buffer, logging). The *compute floor* of a step is the sum of the same model calls timed
alone, back to back, with nothing else around them: no training loop can be faster.
``step / floor`` therefore measures the loop's own overhead, and the two are measured side
by side in the same process so machine noise affects both alike.

    python -m ablations bench [--steps 8] [--presets alpacafarm grpo]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from ppo.config import preset
from ppo.logprobs import response_logprobs, response_values
from ppo.rollout import generate

PHASES = ("generate", "score", "policy_forward", "reference_forward", "value_forward", "rewards", "advantages", "update")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compute_floor(trainer, prompts: list[str]) -> dict[str, float]:
    """The model calls of one step of `trainer`'s config, each timed alone (seconds)."""
    cfg = trainer.config
    policy = trainer.accelerator.unwrap_model(trainer.policy)
    floor = {}
    rollout = None

    def do_generate():
        nonlocal rollout
        rollout = generate(policy, trainer.tokenizer, prompts, cfg.response_length, temperature=cfg.temperature)

    floor["generate"] = _timed(do_generate)
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    with torch.no_grad():
        floor["policy_forward"] = _timed(lambda: response_logprobs(policy, *args))
        if trainer.ref_policy is not None:
            floor["reference_forward"] = _timed(lambda: response_logprobs(trainer.ref_policy, *args))
        if trainer.value_model is not None:
            floor["value_forward"] = _timed(lambda: response_values(trainer.value_model, *args))
    # The update: forward + backward per micro-batch and one optimizer step per minibatch,
    # for every epoch, on a throwaway copy of the optimizers' work (a plain SGD step).
    micro = cfg.micro_batch_size
    params = list(policy.parameters()) + (list(trainer.value_model.parameters()) if trainer.value_model else [])

    def do_update():
        for _ in range(cfg.ppo_epochs * cfg.num_minibatches):
            for start in range(0, cfg.minibatch_size, micro):
                rows = slice(start, start + micro)
                chunk = tuple(a[rows] for a in args)
                loss = response_logprobs(policy, *chunk, with_entropy=True)[0].mean()
                if trainer.value_model is not None:
                    loss = loss + response_values(trainer.value_model, *chunk).mean()
                loss.backward()
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad = None  # the floor counts the backward, not a parameter change

    floor["update"] = _timed(do_update)
    return floor


def bench_preset(name: str, steps: int, warmup: int = 1) -> dict:
    from ppo.trainer import RLTrainer

    with tempfile.TemporaryDirectory() as tmp:
        config = preset(name, testbed=True, output_dir=tmp, progress=False, eval_every=0)
        trainer = RLTrainer(config)
        step_times, phase_times, floors = [], {p: [] for p in PHASES}, {}
        for i in range(warmup + steps):
            metrics = trainer.train_step()
            if i < warmup:
                continue
            step_times.append(metrics["time_step"])
            for phase in PHASES:
                phase_times[phase].append(metrics.get(f"time_{phase}", 0.0))
            # the floor right after each step, same machine state, same batch shape
            prompts = [p.prompt for p in trainer.prompt_pool.sample(config.prompts_per_step)
                       for _ in range(config.group_size)]
            for key, value in compute_floor(trainer, prompts).items():
                floors.setdefault(key, []).append(value)
    step = statistics.median(step_times)
    floor_total = sum(statistics.median(v) for v in floors.values())
    return {
        "preset": name,
        "step": step,
        "phases": {p: statistics.median(v) for p, v in phase_times.items()},
        "floor": {k: statistics.median(v) for k, v in floors.items()},
        "floor_total": floor_total,
        "ratio": step / floor_total,
    }


def format_bench(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"\n{r['preset']}: step {r['step']:.3f}s  floor {r['floor_total']:.3f}s  "
                     f"step/floor {r['ratio']:.2f}")
        lines.append(f"  {'phase':20s} {'in step (s)':>12s} {'floor (s)':>10s}")
        for phase in PHASES:
            floor = r["floor"].get(phase)
            in_step = r["phases"][phase]
            if in_step == 0.0 and floor is None:
                continue
            lines.append(f"  {phase:20s} {in_step:12.3f} {floor if floor is not None else float('nan'):10.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per preset (after one warm-up step)")
    parser.add_argument("--presets", nargs="+", default=["alpacafarm", "grpo"])
    args = parser.parse_args(argv)
    results = [bench_preset(name, args.steps) for name in args.presets]
    print(format_bench(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

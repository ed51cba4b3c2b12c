"""Running a batch: one project run timed step by step, the peer's runs, and `compare`
alternating the two systems seed by seed (see `ppo.benchmarks.speed` for the work each does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .speed_summary import format_summary, median_step, summarize
from .speed_task import AdditionTask

KINDS = ("grpo", "ppo")


# ---- one run of this project --------------------------------------------------------------
def config_for(kind: str, model_path: str, seed: int, steps: int, output_dir: str, **overrides):
    """The project's `PPOConfig` for the fixed work `kind` (see the `ppo.benchmarks.speed` docstring)."""
    from ppo.config import PPOConfig

    common = dict(model_path=model_path, seed=seed, total_steps=steps, output_dir=output_dir, device="cpu",
                  threads=2, response_length=8, temperature=1.0, lr=1e-4, lr_schedule="constant", warmup_steps=0,
                  adam_eps=1e-8, weight_decay=0.0, ppo_epochs=1, num_minibatches=1, gradient_accumulation_steps=1,
                  loss_agg="token_mean", eval_every=0, save_every=0, log_samples=0, progress=False)
    if kind == "grpo":
        settings = dict(advantage_estimator="grpo", group_size=8, rollout_batch_size=32, kl_coef=0.04,
                        kl_estimator="k3", kl_placement="loss", grpo_scale="group", grpo_std_correction=1,
                        grpo_eps=1e-4, whiten_advantages=False, max_grad_norm=1.0)
    elif kind == "ppo":
        settings = dict(advantage_estimator="gae", group_size=1, rollout_batch_size=32, kl_coef=0.04,
                        kl_estimator="k1", kl_placement="reward", gamma=1.0, lam=0.95, cliprange=0.2,
                        cliprange_value=0.2, vf_coef=0.1, whiten_rewards=False, whiten_advantages=True,
                        separate_value_optimizer=False, max_grad_norm=None, value_init="policy")
    else:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    return PPOConfig(**{**common, **settings, **overrides})


def run_project(kind: str, model_path: str, seed: int, steps: int, output_dir: str, evaluate_after: bool = False,
                **overrides) -> dict:
    """Train one run in this process; per-step wall times from one step's end to the next
    (so logging is included), and held-out exact match after training if asked."""
    from ppo.run.evaluation import evaluate
    from ppo.trainer import RLTrainer

    config = config_for(kind, model_path, seed, steps, output_dir, **overrides)
    trainer = RLTrainer(config, task=AdditionTask())
    ends = []
    inner = trainer.train_step

    def timed_step():
        metrics = inner()
        ends.append(time.perf_counter())
        return metrics

    trainer.train_step = timed_step
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    # the first interval runs from the start of training (it includes the first evaluation)
    step_times = [b - a for a, b in zip(ends, ends[1:])]
    result = {"system": "project", "kind": kind, "seed": seed, "steps": steps, "step_times_all": step_times,
              "train_seconds": wall}
    if evaluate_after:
        metrics = evaluate(trainer.policy_module, trainer.tokenizer, trainer.task, max_new_tokens=8, batch_size=500, seed=1234)
        result.update(after_test_greedy_acc=metrics["greedy_accuracy"],
                      after_test_sample_t1_acc=metrics["sampled_accuracy"])
    return result


# ---- side by side -------------------------------------------------------------------------
def _run_in_subprocess(command: list[str], cwd: str | None, env: dict) -> None:
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")


def run_peer(kind: str, seed: int, steps: int, peer_dir: Path, python: str, evaluate_after: bool) -> dict:
    tag = f"speed_{kind}_s{seed}_{int(time.time())}"
    script = "grpo_run.py" if kind == "grpo" else "ppo_run.py"
    args = ["--seed", str(seed), "--steps", str(steps), "--tag", tag]
    args += ["--beta", "0.04"] if kind == "grpo" else ["--reward", "rule", "--kl-coef", "0.04", "--ppo-epochs", "1",
                                                        "--no-gc"]
    if not evaluate_after:
        args.append("--no-eval")
    env = {**os.environ, "PEER_DIR": str(peer_dir), "OMP_NUM_THREADS": "2"}
    _run_in_subprocess([python, script, *args], str(peer_dir), env)
    result = json.loads((peer_dir / "runs" / tag / "result.json").read_text())
    keep = ("step_times_all", "train_seconds", "after_test_greedy_acc", "after_test_sample_t1_acc", "versions")
    return {"system": "trl", "kind": kind, "seed": seed, "steps": steps, **{k: result[k] for k in keep if k in result}}


def run_project_subprocess(kind: str, seed: int, steps: int, model_path: str, evaluate_after: bool,
                           overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "ppo.benchmarks", "speed", "run", "--kind", kind, "--seed", str(seed),
                   "--steps", str(steps), "--model", model_path, "--json", str(out)]
        command += ["--evaluate"] if evaluate_after else []
        for override in overrides:
            command += ["--set", override]
        _run_in_subprocess(command, None, {**os.environ, "OMP_NUM_THREADS": "2"})
        return json.loads(out.read_text())



def compare(args) -> int:
    peer_dir = Path(args.peer_dir).resolve()
    model_path = args.model or str(peer_dir / "tiny-sft")
    runs = []
    order = 0
    for seed in args.seeds:
        for kind in args.kinds:
            peer_python = args.peer_python if kind == "grpo" else args.peer_python_ppo
            systems = ["trl", "project"] if order % 2 == 0 else ["project", "trl"]
            order += 1
            for system in systems:
                if system == "trl":
                    run = run_peer(kind, seed, args.steps, peer_dir, peer_python, args.evaluate)
                else:
                    run = run_project_subprocess(kind, seed, args.steps, model_path, args.evaluate, args.set)
                runs.append(run)
                print(f"{system:8s} {kind} seed {seed}: median {median_step(run['step_times_all']):.4f} s/step"
                      + (f", greedy after {run['after_test_greedy_acc']:.3f}" if "after_test_greedy_acc" in run else ""),
                      flush=True)
    table = summarize(runs)
    print(format_summary(table))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"runs": runs, "summary": table, "versions": _versions()}, indent=1))
    return 0


def _versions() -> dict:
    import accelerate
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "python": sys.version.split()[0]}

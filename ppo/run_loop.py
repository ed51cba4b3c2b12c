"""The run around the algorithm: the step loop, held-out evaluation, logging and checkpoints.

`RLTrainer.train` and `RLTrainer.evaluate` are one call each into this module. A run
directory holds `config.yaml`, tensorboard events, `metrics.jsonl` (one JSON object per
step; step 0 is the initial evaluation), `samples.jsonl`, `initial_eval.json`,
`checkpoints/` and `summary.json`. Only the main process writes them (data parallel).
What a resume may change and how damaged directories are handled: ppo/run_dir.py and
ppo/checkpoints.py (docs/reliability.md).
"""

from __future__ import annotations

import json
import math
import time
import warnings

from tqdm.auto import tqdm

from . import distributed, provenance, run_dir
from .config import describe
from .evaluation import evaluate as evaluate_policy
from .evaluation import preserve_rng_state


def evaluate(trainer) -> dict:
    """Held-out metrics; with N processes each scores every N-th problem and all are reduced."""
    cfg = trainer.config
    problems = list(trainer.task.eval_problems())
    if cfg.eval_size is not None:
        problems = problems[: cfg.eval_size]
    shard = problems[distributed.rank()::distributed.world_size()]
    seed = distributed.rank_seed(cfg.seed, distributed.rank())
    metrics = evaluate_policy(trainer.policy_module, trainer.tokenizer, trainer.task, cfg.response_length,
                              temperature=1.0, seed=seed, problems=shard, gather=distributed.gather_objects)
    if hasattr(trainer.task, "extra_eval"):
        # Task-specific held-out metrics (e.g. gold reward and win rate against the SFT
        # policy for the simulated-preference task); it reseeds, so every generator is restored.
        with preserve_rng_state():
            extra = trainer.task.extra_eval(trainer.policy_module, trainer.tokenizer, shard, cfg.response_length, seed)
        means = distributed.GlobalMeans()  # per-problem means: weight each shard by its size
        for name, value in extra.items():
            means.add_weighted(name, value * len(shard), len(shard))
        metrics.update(means.result())
    return metrics


def train(trainer, resume: bool = False, stop_after: int | None = None, restart: bool = False,
          allow_changes=()) -> dict:
    """`RLTrainer.train`: run to `total_steps`, evaluating, logging and checkpointing."""
    from torch.utils.tensorboard import SummaryWriter

    cfg, output_dir = trainer.config, trainer.output_dir
    start_time = time.perf_counter()
    main = distributed.is_main_process()  # one writer: only the main process writes the run directory
    if restart and main:
        run_dir.clear_outputs(output_dir)
    distributed.barrier()
    changes, loaded = {}, False
    if resume:
        # Refuses a changed config (unless allowed); a run killed before its first
        # checkpoint starts again from step 0.
        changes = run_dir.resume_changes(output_dir, cfg, allow_changes)
        loaded = trainer.load_checkpoint()
        if not loaded:
            warnings.warn(f"{output_dir}: no checkpoint yet; the run starts again from step 0")
    elif (output_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{output_dir}: a run already exists here; pass resume=True (--resume) to "
                              "continue it, restart=True (--restart) to start it over, or choose another "
                              "output_dir")
    distributed.barrier()  # every rank has checked before the main process creates the run
    if main:
        run_dir.open_run(output_dir, cfg, resume, trainer.step if loaded else -1, changes)
        trainer.writer = SummaryWriter(str(output_dir))
        if trainer.step == 0:
            trainer.writer.add_text("config", describe(cfg), 0)
    initial_eval = None
    if trainer.step == 0:
        initial_eval = evaluate(trainer)
        log(trainer, {"step": 0, **{f"eval_{k}": v for k, v in initial_eval.items()}})
        if main:
            (output_dir / "initial_eval.json").write_text(json.dumps(initial_eval, indent=2))
    elif (output_dir / "initial_eval.json").exists():
        initial_eval = json.loads((output_dir / "initial_eval.json").read_text())
    bar = tqdm(total=cfg.total_steps, initial=trainer.step, desc=f"RL ({cfg.advantage_estimator})",
               disable=not (cfg.progress and main), dynamic_ncols=True)
    final_eval = None
    end = cfg.total_steps if stop_after is None else min(stop_after, cfg.total_steps)
    while trainer.step < end:
        metrics = trainer.train_step()
        last = trainer.step == cfg.total_steps
        if last or (cfg.eval_every and trainer.step % cfg.eval_every == 0):
            eval_metrics = evaluate(trainer)
            metrics.update({f"eval_{k}": v for k, v in eval_metrics.items()})
            final_eval = eval_metrics if last else final_eval
        log(trainer, metrics)
        write_samples(trainer)
        if last or trainer.step == end or (cfg.save_every and trainer.step % cfg.save_every == 0):
            trainer.save_checkpoint()
        bar.update(1)
        bar.set_postfix(acc=f"{metrics['accuracy']:.2f}", kl=f"{metrics['kl']:.3f}",
                        eval=f"{metrics.get('eval_sampled_accuracy', float('nan')):.2f}")
    bar.close()
    if trainer.writer is not None:
        trainer.writer.close()
    final_eval = final_eval or evaluate(trainer)
    summary = {
        "steps": trainer.step,
        "samples": trainer.samples_generated,  # responses generated (dynamic sampling generates extra)
        "wall_seconds_this_session": time.perf_counter() - start_time,
        "initial_eval": initial_eval,
        "final_eval": final_eval,
    }
    if initial_eval:
        summary["sampled_accuracy_gain"] = final_eval["sampled_accuracy"] - initial_eval["sampled_accuracy"]
    summary["processes"] = distributed.world_size()
    # Which code, warm start, libraries, threads and machine made these numbers.
    summary["provenance"] = provenance.collect(trainer.model_path, cfg.threads, distributed.world_size())
    if main:
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def log(trainer, metrics: dict) -> None:
    """Append `metrics` to metrics.jsonl and tensorboard (main process only)."""
    if not distributed.is_main_process():
        return
    with open(trainer.output_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(metrics) + "\n")
    # One tensorboard event per step holding every scalar (the same tags, values and step
    # as one add_scalar call each, at a fraction of the cost).
    scalars = {key: float(value) for key, value in metrics.items()
               if key != "step" and isinstance(value, (int, float)) and not math.isnan(value)}
    write_scalars(trainer.writer, scalars, metrics["step"])


def write_samples(trainer) -> None:
    """Append the last step's decoded samples to samples.jsonl (main process only)."""
    if not distributed.is_main_process():
        return
    with open(trainer.output_dir / "samples.jsonl", "a") as handle:
        for sample in trainer.last_samples:
            handle.write(json.dumps(sample) + "\n")


def write_scalars(writer, scalars: dict[str, float], step: int) -> None:
    """Write `scalars` as one tensorboard event at `step`."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()])
    writer._get_file_writer().add_summary(summary, step)

"""The run around the algorithm: the step loop, held-out evaluation, logging and checkpoints.

`RLTrainer.train` and `RLTrainer.evaluate` are one call each into this module. A run
directory holds `config.yaml`, tensorboard events, `metrics.jsonl` (one JSON object per
step; step 0 is the initial evaluation), `samples.jsonl`, `initial_eval.json`,
`checkpoints/` and `summary.json`. Only the main process writes them (data parallel), and
only it sends the same rows to the trackers of `report_to` (ppo/run/trackers.py).
What a resume may change and how damaged directories are handled: ppo/run/run_dir.py and
ppo/run/checkpoints.py (docs/reliability.md).
"""

from __future__ import annotations

import json
import time
import warnings

from tqdm.auto import tqdm

from ppo.parallel import distributed, sharding
from ppo.run import provenance, run_dir, run_lock, trackers
from ppo.run.evaluation import evaluate as evaluate_policy
from ppo.run.evaluation import preserve_rng_state
from ppo.run.guards import NonFiniteError, RewardFunctionError
from ppo.run.trackers import write_scalars  # noqa: F401  (public here before trackers.py)


def evaluate(trainer) -> dict:
    """Held-out metrics; with N processes each scores every N-th problem and all are reduced."""
    cfg = trainer.config
    problems = list(trainer.task.eval_problems())
    if cfg.eval_size is not None:
        problems = problems[: cfg.eval_size]
    shard = problems[distributed.rank()::distributed.world_size()]
    seed = distributed.rank_seed(cfg.seed, distributed.rank())
    batch = {"batch_size": cfg.eval_batch_size}
    if sharding.sharded(cfg):
        batch = sharded_eval_batch(trainer.task, len(problems), distributed.world_size(), cfg.eval_samples_per_prompt)
    try:
        # Training's guards: the same prompt truncation and the same non-finite reward rule.
        metrics = evaluate_policy(trainer.policy_module, trainer.tokenizer, trainer.task, cfg.response_length,
                                  temperature=1.0, seed=seed, problems=shard, gather=distributed.gather_objects,
                                  samples_per_prompt=cfg.eval_samples_per_prompt,
                                  **batch,
                                  max_prompt_length=trainer.max_prompt_length,
                                  prompt_truncation=cfg.prompt_truncation, nonfinite_rewards=cfg.nonfinite_rewards,
                                  source=trainer._score_source())
    except (RewardFunctionError, NonFiniteError) as error:
        raise type(error)(f"held-out evaluation after step {trainer.step}: {error}") from error.__cause__
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


def sharded_eval_batch(task, problems: int, processes: int, samples_per_prompt: int = 1) -> dict:
    """Sharded models (sharding="fsdp") generate only with every rank in the same call, so each
    rank scores its whole shard (each problem `samples_per_prompt` times) in one generate call
    (shards differ by at most one problem); a held-out set smaller than the number of processes
    would leave a rank idle, and is refused."""
    if problems < processes:
        raise ValueError(f"PPOConfig.eval_size: {problems} held-out problems cannot be shared by {processes} "
                         "processes with sharded models (sharding='fsdp'); evaluate at least one per process")
    largest = -(-problems // processes)
    if getattr(task, "eval_batch_size", largest) < largest:  # the task's own sampling (extra_eval)
        task.eval_batch_size = largest
    return {"batch_size": largest * samples_per_prompt}


def train(trainer, resume: bool = False, stop_after: int | None = None, restart: bool = False,
          allow_changes=()) -> dict:
    """`RLTrainer.train`: run to `total_steps`, evaluating, logging and checkpointing.

    The main process holds the run directory's lock throughout (`run_lock.lock_run`): a second
    process starting or resuming the same run fails at once instead of mixing its steps in.
    """
    trackers.check_installed(trainer.config.report_to)  # every rank stops before anything is written
    lock, refusal = None, None
    if distributed.is_main_process():
        try:
            lock = run_lock.lock_run(trainer.output_dir)
        except run_dir.RunDirectoryError as error:
            refusal = str(error)
    refusal = distributed.broadcast_object(refusal)  # every rank stops together
    if refusal is not None:
        raise run_dir.RunDirectoryError(refusal)
    try:
        return _train(trainer, resume, stop_after, restart, allow_changes)
    finally:
        if trainer.trackers is not None:
            trainer.trackers.close()
            trainer.trackers = None
        if lock is not None:
            lock.release()


def _train(trainer, resume, stop_after, restart, allow_changes) -> dict:
    cfg, output_dir = trainer.config, trainer.output_dir
    start_time = time.perf_counter()
    main = distributed.is_main_process()  # one writer: only the main process writes the run directory
    if main:
        # Nothing the run did not write is overwritten or removed: a fresh start (or a
        # restart of something that is not a run) refuses a directory holding other files.
        if restart and run_dir.run_started(output_dir):
            run_dir.clear_outputs(output_dir)
        elif not (resume and run_dir.run_started(output_dir)):
            run_dir.check_fresh_start(output_dir)  # also a "resume" of a folder holding no run
        if resume:
            run_dir.check_run_files(output_dir)
    distributed.barrier()
    changes, loaded, finished = {}, False, None
    if resume:
        # Refuses a changed config (unless allowed); a run killed before its first
        # checkpoint starts again from step 0.
        changes = run_dir.resume_changes(output_dir, cfg, allow_changes)
        if not (output_dir / "config.yaml").is_file() and run_dir.run_started(output_dir):
            changes = "unchecked: config.yaml was missing (--allow-change all)"
        loaded = trainer.load_checkpoint(allow_changes)
        if not loaded:
            warnings.warn(f"{output_dir}: no checkpoint yet; the run starts again from step 0")
        finished = run_dir.finished_summary(output_dir, trainer.step) if loaded else None
        run_dir.check_resume_end(output_dir, trainer.step, cfg.total_steps, finished)
        if finished is not None and cfg.total_steps == trainer.step:
            trainer.already_finished = True  # finished is final: nothing is written
            return finished
    distributed.barrier()  # every rank has checked before the main process creates the run
    refusal = None
    if main:
        # Extending a finished run is recorded with the summary it replaces.
        run_dir.open_run(output_dir, cfg, resume, trainer.step if loaded else -1, changes, extends=finished)
        try:
            record = provenance.collect(trainer.model_path, cfg.threads, distributed.world_size())
            trainer.trackers = trackers.open_trackers(cfg, output_dir, record, trainer.step)
        except trackers.TrackerError as error:
            refusal = str(error)
    refusal = distributed.broadcast_object(refusal)  # a tracker that cannot start stops every rank
    if refusal is not None:
        raise trackers.TrackerError(refusal)
    initial_eval = None
    if trainer.step == 0:
        initial_eval = trainer.evaluate()
        trainer.latest_eval = (0, initial_eval)
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
        try:
            metrics = trainer.train_step()
        except RewardFunctionError as error:
            raise RewardFunctionError(f"step {trainer.step + 1} (training rollout): {error}") from error.__cause__
        last = trainer.step == cfg.total_steps
        if last or (cfg.eval_every and trainer.step % cfg.eval_every == 0):
            eval_metrics = trainer.evaluate()
            trainer.latest_eval = (trainer.step, eval_metrics)  # for the checkpoint's model card
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
    final_eval = final_eval or trainer.evaluate()
    summary = {
        "steps": trainer.step,
        "total_steps": cfg.total_steps,  # the steps planned: a run stopped earlier (stop_after) is not finished
        "samples": trainer.samples_generated,  # responses generated (dynamic sampling generates extra)
        "wall_seconds_this_session": time.perf_counter() - start_time,
        "initial_eval": initial_eval,
        "final_eval": final_eval,
    }
    if initial_eval:
        summary["sampled_accuracy_gain"] = final_eval["sampled_accuracy"] - initial_eval["sampled_accuracy"]
    summary["processes"] = distributed.world_size()
    # Settings the run accepted but never read (ppo/settings/config_checks.py inert_settings), so a
    # sweep's report can show which arms carried one.
    summary["warnings"] = list(trainer.config_warnings)
    # Which code, warm start, libraries, threads and machine made these numbers.
    summary["provenance"] = provenance.collect(trainer.model_path, cfg.threads, distributed.world_size())
    if main:
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def log(trainer, metrics: dict) -> None:
    """Append `metrics` to metrics.jsonl and send it to the trackers of report_to (main process only)."""
    if not distributed.is_main_process():
        return
    with open(trainer.output_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(metrics) + "\n")
    if trainer.trackers is not None:
        trainer.trackers.log(metrics)


def write_samples(trainer) -> None:
    """Append the last step's decoded samples to samples.jsonl, and to the trackers' tables (main process only)."""
    if not distributed.is_main_process():
        return
    with open(trainer.output_dir / "samples.jsonl", "a") as handle:
        for sample in trainer.last_samples:
            handle.write(json.dumps(sample) + "\n")
    if trainer.trackers is not None:
        trainer.trackers.log_samples(trainer.last_samples, trainer.step)

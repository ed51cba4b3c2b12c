"""The run around the algorithm: the step loop, held-out evaluation, logging and checkpoints.

`RLTrainer.train` and `RLTrainer.evaluate` are one call each into this module: a
`TrainingRun` handed the run's pieces (its state, and callables for a step, an evaluation
and the checkpoints), and `evaluate` handed the models and the task. A run directory holds
`config.yaml`, tensorboard events, `metrics.jsonl` (one JSON object per step; step 0 is the
initial evaluation), `samples.jsonl`, `initial_eval.json`, `checkpoints/` and `summary.json`.
Only the main process writes them (data parallel), and only it sends the same rows to the
trackers of `report_to` (ppo/run/trackers.py).
What a resume may change and how damaged directories are handled: ppo/run/run_dir.py and
ppo/run/checkpoints.py (docs/reliability.md).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tqdm.auto import tqdm

from ppo.parallel import distributed, sharding
from ppo.run import provenance, run_dir, run_lock, trackers
from ppo.run.evaluation import evaluate as evaluate_policy
from ppo.run.evaluation import preserve_rng_state
from ppo.run.guards import NonFiniteError, RewardFunctionError
from ppo.run.trackers import write_scalars  # noqa: F401  (public here before trackers.py)

if TYPE_CHECKING:
    from ppo.models.setup import Models
    from ppo.run.checkpoints import TrainingState


def evaluate(config, task, models: Models, step: int, source: str) -> dict:
    """Held-out metrics of `models`' policy after `step` steps (a `ppo.models.setup.Models`);
    with N processes each scores every N-th problem and all are reduced. `source` names what
    scores the responses, for error messages (`ppo.run.guards.score_source`)."""
    cfg = config
    problems = list(task.eval_problems())
    if cfg.eval_size is not None:
        problems = problems[: cfg.eval_size]
    shard = problems[distributed.rank()::distributed.world_size()]
    seed = distributed.rank_seed(cfg.seed, distributed.rank())
    batch = {"batch_size": cfg.eval_batch_size}
    if sharding.sharded(cfg):
        batch = sharded_eval_batch(task, len(problems), distributed.world_size(), cfg.eval_samples_per_prompt)
    try:
        # Training's guards: the same prompt truncation and the same non-finite reward rule.
        metrics = evaluate_policy(models.policy_module, models.tokenizer, task, cfg.response_length,
                                  temperature=1.0, seed=seed, problems=shard, gather=distributed.gather_objects,
                                  samples_per_prompt=cfg.eval_samples_per_prompt,
                                  **batch,
                                  max_prompt_length=models.max_prompt_length,
                                  prompt_truncation=cfg.prompt_truncation, nonfinite_rewards=cfg.nonfinite_rewards,
                                  source=source, thinking_budget=cfg.eval_thinking_budget)
    except (RewardFunctionError, NonFiniteError) as error:
        raise type(error)(f"held-out evaluation after step {step}: {error}") from error.__cause__
    if hasattr(task, "extra_eval"):
        # Task-specific held-out metrics (e.g. gold reward and win rate against the SFT
        # policy for the simulated-preference task); it reseeds, so every generator is restored.
        with preserve_rng_state():
            extra = task.extra_eval(models.policy_module, models.tokenizer, shard, cfg.response_length, seed)
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


class TrainingRun:
    """`RLTrainer.train`: the step loop around the algorithm, with held-out evaluation,
    logging, samples and checkpoints in the run directory.

    Args:
        config: the run's `PPOConfig`.
        output_dir: the run directory, resolved (`ppo.run.run_dir.resolve`).
        state: where the run stands (`ppo.run.checkpoints.TrainingState`): the loop reads its
            step and samples generated, and records each evaluation in ``latest_eval``.
        model_path: the warm start the policy came from (provenance), None for one passed in.
        config_warnings: settings the configuration never reads, kept in summary.json.
        train_step: one RL iteration; returns its metrics and advances ``state.step``.
        evaluate: held-out metrics of the policy now.
        save_checkpoint: writes ``checkpoints/step_N``.
        load_checkpoint: ``(allow_changes) -> bool``, restores the newest intact checkpoint.
        last_samples: the decoded samples of the step just taken (for samples.jsonl).

    After `train`, ``already_finished`` says whether a resume found the run already finished.
    """

    def __init__(self, config, output_dir: Path, state: TrainingState, *, model_path: str | None,
                 config_warnings: list[str], train_step: Callable[[], dict], evaluate: Callable[[], dict],
                 save_checkpoint: Callable[[], Path], load_checkpoint: Callable[..., bool],
                 last_samples: Callable[[], list[dict]]):
        self.config, self.output_dir, self.state = config, output_dir, state
        self.model_path, self.config_warnings = model_path, config_warnings
        self.train_step, self.evaluate = train_step, evaluate
        self.save_checkpoint, self.load_checkpoint = save_checkpoint, load_checkpoint
        self.last_samples = last_samples
        self.trackers = None  # ppo/run/trackers.py RunTrackers, main process, while train() runs
        self.already_finished = False  # set by a resume of a run that had already finished

    def train(self, resume: bool = False, stop_after: int | None = None, restart: bool = False,
              allow_changes=()) -> dict:
        """Run to `total_steps`, evaluating, logging and checkpointing; the run's summary.

        The main process holds the run directory's lock throughout (`run_lock.lock_run`): a
        second process starting or resuming the same run fails at once instead of mixing its
        steps in.
        """
        trackers.check_installed(self.config.report_to)  # every rank stops before anything is written
        lock, refusal = None, None
        if distributed.is_main_process():
            try:
                lock = run_lock.lock_run(self.output_dir)
            except run_dir.RunDirectoryError as error:
                refusal = str(error)
        refusal = distributed.broadcast_object(refusal)  # every rank stops together
        if refusal is not None:
            raise run_dir.RunDirectoryError(refusal)
        try:
            return self._train(resume, stop_after, restart, allow_changes)
        finally:
            if self.trackers is not None:
                self.trackers.close()
                self.trackers = None
            if lock is not None:
                lock.release()

    def _train(self, resume, stop_after, restart, allow_changes) -> dict:
        cfg, output_dir, state = self.config, self.output_dir, self.state
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
            loaded = self.load_checkpoint(allow_changes)
            if not loaded:
                warnings.warn(f"{output_dir}: no checkpoint yet; the run starts again from step 0")
            finished = run_dir.finished_summary(output_dir, state.step) if loaded else None
            run_dir.check_resume_end(output_dir, state.step, cfg.total_steps, finished)
            if finished is not None and cfg.total_steps == state.step:
                self.already_finished = True  # finished is final: nothing is written
                return finished
        distributed.barrier()  # every rank has checked before the main process creates the run
        refusal = None
        if main:
            # Extending a finished run is recorded with the summary it replaces.
            run_dir.open_run(output_dir, cfg, resume, state.step if loaded else -1, changes, extends=finished)
            try:
                record = provenance.collect(self.model_path, cfg.threads, distributed.world_size(), cfg.reward_model_path)
                self.trackers = trackers.open_trackers(cfg, output_dir, record, state.step)
            except trackers.TrackerError as error:
                refusal = str(error)
        refusal = distributed.broadcast_object(refusal)  # a tracker that cannot start stops every rank
        if refusal is not None:
            raise trackers.TrackerError(refusal)
        initial_eval = None
        if state.step == 0:
            initial_eval = self.evaluate()
            state.latest_eval = (0, initial_eval)
            self.log({"step": 0, **{f"eval_{k}": v for k, v in initial_eval.items()}})
            if main:
                (output_dir / "initial_eval.json").write_text(json.dumps(initial_eval, indent=2))
        elif (output_dir / "initial_eval.json").exists():
            initial_eval = json.loads((output_dir / "initial_eval.json").read_text())
        bar = tqdm(total=cfg.total_steps, initial=state.step, desc=f"RL ({cfg.advantage_estimator})",
                   disable=not (cfg.progress and main), dynamic_ncols=True)
        final_eval = None
        end = cfg.total_steps if stop_after is None else min(stop_after, cfg.total_steps)
        while state.step < end:
            try:
                metrics = self.train_step()
            except RewardFunctionError as error:
                raise RewardFunctionError(f"step {state.step + 1} (training rollout): {error}") from error.__cause__
            last = state.step == cfg.total_steps
            if last or (cfg.eval_every and state.step % cfg.eval_every == 0):
                eval_metrics = self.evaluate()
                state.latest_eval = (state.step, eval_metrics)  # for the checkpoint's model card
                metrics.update({f"eval_{k}": v for k, v in eval_metrics.items()})
                final_eval = eval_metrics if last else final_eval
            self.log(metrics)
            self.write_samples()
            if last or state.step == end or (cfg.save_every and state.step % cfg.save_every == 0):
                self.save_checkpoint()
            bar.update(1)
            bar.set_postfix(acc=f"{metrics['accuracy']:.2f}", kl=f"{metrics['kl']:.3f}",
                            eval=f"{metrics.get('eval_sampled_accuracy', float('nan')):.2f}")
        bar.close()
        final_eval = final_eval or self.evaluate()
        summary = {
            "steps": state.step,
            "total_steps": cfg.total_steps,  # the steps planned: a run stopped earlier (stop_after) is not finished
            "samples": state.samples_generated,  # responses generated (dynamic sampling generates extra)
            "wall_seconds_this_session": time.perf_counter() - start_time,
            "initial_eval": initial_eval,
            "final_eval": final_eval,
        }
        if initial_eval:
            summary["sampled_accuracy_gain"] = final_eval["sampled_accuracy"] - initial_eval["sampled_accuracy"]
        summary["processes"] = distributed.world_size()
        # Settings the run accepted but never read (ppo/settings/config_checks.py inert_settings), so a
        # sweep's report can show which arms carried one.
        summary["warnings"] = list(self.config_warnings)
        # Which code, warm start, libraries, threads and machine made these numbers.
        summary["provenance"] = provenance.collect(self.model_path, cfg.threads, distributed.world_size(), cfg.reward_model_path)
        if main:
            (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def log(self, metrics: dict) -> None:
        """Append `metrics` to metrics.jsonl and send it to the trackers of report_to (main process only)."""
        if not distributed.is_main_process():
            return
        with open(self.output_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(metrics) + "\n")
        if self.trackers is not None:
            self.trackers.log(metrics)

    def write_samples(self) -> None:
        """Append the last step's decoded samples to samples.jsonl, and to the trackers' tables (main process only)."""
        if not distributed.is_main_process():
            return
        samples = self.last_samples()
        with open(self.output_dir / "samples.jsonl", "a") as handle:
            for sample in samples:
                handle.write(json.dumps(sample) + "\n")
        if self.trackers is not None:
            self.trackers.log_samples(samples, self.state.step)

"""How long a sweep takes, projected from a few timed steps of each of its runs.

A full sweep of every registered ablation is hours on a small machine; this answers "how
long?" in minutes, and lets two versions of the code be compared on the whole sweep
without running it twice. For each distinct run of the named ablations (runs the runner
would copy instead of train, `config_fingerprint` equal, count once), seed 1 is built and
timed in this process:

- ``setup``: building the trainer (models, reference, tokenizer, task);
- ``step``: the median of `timed_steps` training steps after one warm-up step;
- ``first_step``: how much longer the warm-up step took than a timed one (first-call
  allocations; with ``--compile``, tracing and compiling the forward, which every run of a
  sweep pays in its own process: the compiled code is dropped before each timed run, so
  only inductor's disk cache carries over, as between a sweep's processes);
- ``eval``: one held-out evaluation (`RLTrainer.evaluate`);
- ``save``: one checkpoint.

A run of T steps is projected as ``startup + setup + first_step + T * step + evals * eval
+ saves * save``, with the evaluations and checkpoints `RLTrainer.train` makes (one evaluation at
the start, one every ``eval_every`` steps and at the end; a checkpoint every ``save_every``
steps and at the end) and ``startup`` the import time of the training code (each run is
its own process). Every seed of a variant is projected at seed 1's times.

What this leaves out, and why the projection is an estimate, not a measurement of the
sweep: step times drift as a policy trains (responses lengthen or shorten), and the
runner's concurrent runs share the machine (two 1-thread runs on 2 cores contend for
memory bandwidth), so the real wall time of ``--workers N`` is more than the serial sum
divided by N. The serial sum is what is reported; compare it between code versions on one
machine, alternating, rather than reading it as a clock time.

Command::

    python -m ablations estimate NAME|FILE.yaml... [--seeds 3] [--steps N] [--threads 1]
                                         [--timed-steps 2] [--json FILE] [--compile]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .tables import markdown_table


@dataclass
class RunEstimate:
    """The timings of one run and its projected seconds."""

    ablation: str
    variant: str
    total_steps: int
    setup: float
    step: float
    eval: float
    save: float
    evals: int
    saves: int
    startup: float
    runs: int  # seeds this (distinct) run is trained for
    first_step: float = 0.0  # the warm-up step's seconds beyond a timed step's (compilation)

    @property
    def run_seconds(self) -> float:
        return (self.startup + self.setup + self.first_step + self.total_steps * self.step
                + self.evals * self.eval + self.saves * self.save)

    @property
    def seconds(self) -> float:
        return self.run_seconds * self.runs


def evaluations(total_steps: int, eval_every: int) -> int:
    """Held-out evaluations `RLTrainer.train` makes in a fresh run: one at step 0, one at
    every multiple of `eval_every` and one at the last step (the final one reused).

    >>> evaluations(60, 20), evaluations(60, 0), evaluations(50, 20)
    (4, 2, 4)
    """
    in_loop = {step for step in range(1, total_steps + 1)
               if step == total_steps or (eval_every and step % eval_every == 0)}
    return 1 + len(in_loop)


def checkpoints(total_steps: int, save_every: int) -> int:
    """Checkpoints `RLTrainer.train` writes in a fresh run (every `save_every` steps, and the last).

    >>> checkpoints(60, 0), checkpoints(60, 50), checkpoints(100, 50)
    (1, 2, 2)
    """
    return len({step for step in range(1, total_steps + 1)
                if step == total_steps or (save_every and step % save_every == 0)})


def distinct_runs(names: list, seeds: "int | dict[str, int]", steps: int | None, threads: int,
                  compile_forward: bool = False) -> list[tuple]:
    """``(ablation, variant, config, runs)`` for each run the runner would train (seed 1's
    config as `run` sets it, `sweep_plan.sweep_config`; `runs` = seeds, one count for all or
    one per ablation name), identical runs across the named ablations (names or `Ablation`
    objects) counted once."""
    from .sweep_plan import config_fingerprint, plan_runs, sweep_config

    seen, out = set(), []
    for name in names:
        for spec in plan_runs(name, 1, steps, Path(tempfile.gettempdir()) / "estimate"):
            config = sweep_config(spec.config, threads, compile_forward)
            key = config_fingerprint(config)
            if key in seen:
                continue
            seen.add(key)
            out.append((spec.ablation, spec.variant, config,
                        seeds if isinstance(seeds, int) else seeds[spec.ablation]))
    return out


def time_run(ablation: str, variant: str, config, runs: int, timed_steps: int, startup: float) -> RunEstimate:
    """Build one run's trainer in a scratch directory and time it (see the module doc)."""
    from ppo.trainer import RLTrainer

    def seconds(call) -> tuple:
        start = time.perf_counter()
        result = call()
        return time.perf_counter() - start, result

    if config.compile_forward:  # a sweep's run is a fresh process: nothing compiled in memory
        import torch._dynamo

        torch._dynamo.reset()
    with tempfile.TemporaryDirectory() as scratch:
        config = config.replace(output_dir=scratch, progress=False)
        setup, trainer = seconds(lambda: RLTrainer(config))
        warm_up, _ = seconds(trainer.train_step)  # first-call allocations, compilation
        steps = [seconds(trainer.train_step)[0] for _ in range(timed_steps)]
        evaluation, _ = seconds(trainer.evaluate)
        save, _ = seconds(trainer.save_checkpoint)
    step = statistics.median(steps)
    return RunEstimate(ablation, variant, config.total_steps, setup, step, evaluation, save,
                       evaluations(config.total_steps, config.eval_every),
                       checkpoints(config.total_steps, config.save_every), startup, runs,
                       first_step=max(0.0, warm_up - step))


def format_table(estimates: list[RunEstimate]) -> str:
    lines = [markdown_table(
        ["ablation", "variant", "steps", "setup s", "first step + s", "step s", "eval s", "projected run s", "runs"],
        [[e.ablation, e.variant, e.total_steps, f"{e.setup:.1f}", f"{e.first_step:.1f}", f"{e.step:.3f}",
          f"{e.eval:.2f}", f"{e.run_seconds:.0f}", e.runs] for e in estimates])]
    total = sum(e.seconds for e in estimates)
    lines.append(f"\n{sum(e.runs for e in estimates)} runs ({len(estimates)} distinct configs x seeds): "
                 f"projected serial time {total:.0f} s ({total / 3600:.2f} h)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations estimate", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help="ablation name(s), ablation file(s) (my.yaml / my.toml, as `run` takes), or 'all'")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per variant in the projected sweep (default: an ablation file's `seeds`, else 3)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: each ablation's own)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per run (the runner gives each of its workers cpu_count // workers)")
    parser.add_argument("--timed-steps", type=int, default=2, help="timed steps per run after one warm-up step")
    parser.add_argument("--json", default=None, help="append one JSON line per run to this file")
    parser.add_argument("--compile", action="store_true",
                        help="project a `run --compile` sweep: every run's forward compiled (PPOConfig.compile_forward)")
    args = parser.parse_args(argv)
    for field in ("seeds", "threads", "timed_steps"):
        if getattr(args, field) is not None and getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be at least 1")
    start = time.perf_counter()
    importlib.import_module("ppo.trainer")  # what a run's own process imports before it starts
    from .ablation_files import AblationFileError, is_ablation_file, load_ablation_file
    from .registry import ABLATIONS

    startup = time.perf_counter() - start
    names = list(ABLATIONS) if args.names == ["all"] else list(dict.fromkeys(args.names))
    try:  # a file is read, checked and registered as `run` does; it is then named by its `name`
        names = [load_ablation_file(name).name if is_ablation_file(name) else name for name in names]
    except (AblationFileError, OSError) as error:
        parser.error(str(error))
    unknown = [name for name in names if name not in ABLATIONS]
    if unknown:
        parser.error(f"unknown ablation(s) {unknown}; `python -m ablations list` shows them "
                     "(an ablation file is named by its path, e.g. my_ablation.yaml)")
    seeds = {name: args.seeds or ABLATIONS[name].seeds or 3 for name in names}
    estimates, failed = [], []
    runs = distinct_runs(names, seeds, args.steps, args.threads, args.compile)
    for done, (ablation, variant, config, seeds) in enumerate(runs, start=1):
        label = f"[{done}/{len(runs)}] {ablation}/{variant}"
        try:
            estimate = time_run(ablation, variant, config, seeds, args.timed_steps, startup)
        except Exception as error:  # one broken run must not lose the others' timings
            print(f"{label}: failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            failed.append(f"{ablation}/{variant}")
            continue
        estimates.append(estimate)
        print(f"{label}: step {estimate.step:.3f} s (first +{estimate.first_step:.1f} s), "
              f"run {estimate.run_seconds:.0f} s", flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps({**asdict(estimate), "run_seconds": estimate.run_seconds}) + "\n")
    print(format_table(estimates))
    if failed:
        print(f"not timed (failed, left out of the total): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

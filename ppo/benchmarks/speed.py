"""Seconds per step on a fixed tiny task, this project side by side with TRL.

The work is fixed so that two libraries can be timed on exactly the same thing: a 0.8M-
parameter character-level GPT-2 (4 layers, width 128, vocabulary 18, 32 positions), SFT'd
on 2-digit addition ("12+35=" -> "47<eos>", pairs 10..99, 500 held out) until its held-out
greedy exact match reaches 0.35, then

- ``grpo``: 4 prompts x 8 samples, 8 new tokens, T = 1, k3 KL in the loss with beta 0.04,
  token-mean loss, group std (sample std), one update per batch, lr 1e-4 constant, AdamW
  eps 1e-8, gradient clipping 1.0 (TRL's GRPOTrainer defaults with these sizes);
- ``ppo``: 32 prompts x 1 sample, 8 new tokens, k1 KL 0.04 in the reward, one epoch of one
  minibatch, gamma 1, lambda 0.95, clip 0.2, value clip 0.2, vf_coef 0.1, whitened
  advantages, one AdamW over policy and critic, no gradient clipping (TRL's PPOTrainer).

Commands::

    python -m ppo.benchmarks speed model [--out DIR]            # build + SFT the task's model
    python -m ppo.benchmarks speed run --kind grpo --seed 42     # one project run, per-step times
    python -m ppo.benchmarks speed compare --peer-dir DIR --peer-python PY --peer-python-ppo PY
                                      [--seeds 42 43 44] [--steps 50] [--kinds grpo ppo] [--out FILE]
    python -m ppo.benchmarks speed pool BATCH... [--plot PNG]   # several compare batches pooled (and drawn)

``compare`` alternates runs of the two systems (peer first for one seed, project first for
the next), each in a fresh process, and reports the median seconds per step over steps
5..N per run, then the median and range over seeds. The peer is any directory with
``grpo_run.py`` / ``ppo_run.py`` that write ``runs/<tag>/result.json`` with
``step_times_all`` (a TRL harness on this task) and keeps its start model in
``PEER_DIR/tiny-sft``, which this project's runs load too (``--model`` overrides it), so
both systems start from the same weights.

One batch moves with the machine's spell (ratios 0.05-0.1 apart with no code change), so
``pool`` reads several batches (each a ``compare --out`` JSON, or the lines ``compare``
printed) and reports the medians over all their runs, the ratio, every batch's adjacent
same-seed pairs, and the batches' own ratios with their mean and its 95% interval (the batch
being the unit the ratio varies by); docs/results/data/speed/ holds the batches
docs/performance.md pools. Runs made with ``--evaluate`` add a second table to what ``compare``
and ``pool`` print: the held-out accuracy after training, project minus TRL paired by seed, with
its 95% interval and the smallest gap those pairs would detect.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from .speed_runs import KINDS, compare, config_for, run_peer, run_project, run_project_subprocess
from .speed_summary import (FIRST_TIMED_STEP, QUALITY_KEYS, adjacent_pairs, batch_label, format_pooled,
                            format_quality, format_summary, load_batch, median_step, paired_ratios, pool,
                            pooled_figure, quality_of_pairs, run_median, summarize)
from .speed_task import AdditionTask, addition_pairs, build_model

# What callers import from this module, wherever it is defined now.
__all__ = [
    "KINDS", "FIRST_TIMED_STEP", "QUALITY_KEYS", "addition_pairs", "AdditionTask", "build_model", "config_for",
    "run_project", "median_step", "run_peer", "run_project_subprocess", "adjacent_pairs", "paired_ratios",
    "quality_of_pairs", "run_median", "summarize", "format_summary", "format_quality", "load_batch", "pool",
    "format_pooled", "batch_label", "pooled_figure", "compare", "main",
]


def _parse_overrides(items: list[str]) -> dict:
    from ppo.config import parse_override

    return dict(parse_override(item) for item in items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.benchmarks speed", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model", help="build and SFT the task's model")
    model.add_argument("--out", default=".cache/speed/tiny-sft")
    one = sub.add_parser("run", help="one project run with per-step times")
    one.add_argument("--kind", choices=KINDS, required=True)
    one.add_argument("--seed", type=int, default=42)
    one.add_argument("--steps", type=int, default=50)
    one.add_argument("--model", default=None, help="model dir (default: build it under .cache/speed/tiny-sft)")
    one.add_argument("--evaluate", action="store_true", help="held-out exact match after training")
    one.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="config override")
    one.add_argument("--json", default=None, help="write the result here")
    both = sub.add_parser("compare", help="alternate TRL and project runs on the same work")
    both.add_argument("--peer-dir", required=True)
    both.add_argument("--peer-python", required=True, help="python of the venv with TRL's GRPOTrainer")
    both.add_argument("--peer-python-ppo", required=True, help="python of the venv with TRL's PPOTrainer")
    both.add_argument("--model", default=None, help="start model (default: PEER_DIR/tiny-sft)")
    both.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    both.add_argument("--steps", type=int, default=50)
    both.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    both.add_argument("--evaluate", action="store_true", help="held-out exact match after training (both)")
    both.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="project config override")
    both.add_argument("--out", default=None, help="write every run and the summary as JSON")
    pooled = sub.add_parser("pool", help="pool the runs of several compare batches")
    pooled.add_argument("batches", nargs="+", metavar="BATCH",
                        help="a compare --out JSON, or a file holding what compare printed")
    pooled.add_argument("--plot", metavar="PNG", help="also draw each batch's ratio, the mean and its interval")
    args = parser.parse_args(argv)
    if args.command == "pool":
        batches = [load_batch(path) for path in args.batches]
        table = {kind: pool(batches, kind) for kind in KINDS}
        print(format_pooled(table))
        if args.plot:
            pooled_figure([batch_label(path) for path in args.batches], table).savefig(args.plot, dpi=100)
            print(f"plot: {args.plot}")
        return 0
    if args.command == "model":
        print(build_model(args.out))
        return 0
    if args.command == "run":
        model_path = args.model
        if model_path is None:
            model_path = ".cache/speed/tiny-sft"
            if not (Path(model_path) / "config.json").exists():
                build_model(model_path)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_project(args.kind, model_path, args.seed, args.steps, tmp, args.evaluate,
                                 **_parse_overrides(args.set))
        print(f"{args.kind} seed {args.seed}: median step {median_step(result['step_times_all']):.4f} s")
        if args.json:
            Path(args.json).write_text(json.dumps(result))
        return 0
    return compare(args)


if __name__ == "__main__":
    raise SystemExit(main())

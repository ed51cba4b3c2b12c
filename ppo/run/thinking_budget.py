"""Held-out accuracy against a thinking budget: ``python -m ppo.run.thinking_budget``.

Qwen3 (arXiv 2505.09388, sec. 4.3) caps the thinking of its fused thinking / non-thinking
model: once the thinking reaches the user's budget it appends an early-exit instruction and
``</think>``, and the model answers from what it has thought so far; accuracy falls
gracefully as the budget shrinks. On the testbed the thinking is the scratchpad before the
``#`` answer marker (``27+5=32;32+8=40;chk40;#40``), so a budget of N tokens forces ``#``
after N tokens of scratchpad and scores the answer that follows
(`ppo.run.evaluation.finish_after_thinking_budget`).

For each checkpoint and each budget this evaluates the task's held-out set (sampled, at
temperature 1, `--samples-per-prompt` draws per problem, seeded per chunk as the training
evaluation is, so every budget and checkpoint sees the same sampling noise), then prints a
table and writes ``budget.csv`` and ``budget.png`` into `--out`::

    python -m ppo.run.thinking_budget warm runs/ppo runs/grpo --budgets 4 8 12 16 24 32 64 --out budget

A checkpoint is ``warm`` (the pinned SFT warm start), a run directory (its newest complete
checkpoint's policy), or any local Hugging Face causal-LM directory. "full" in the table is
the plain evaluation at the response length, no marker forced.

Qwen3's budget scaling is registered as claims tested on such curves, one checkpoint per
training seed: `ablations.budget_claims` (``python -m ablations budget-claims``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Sequence

import torch

from ppo.models.policy import load_policy
from ppo.run.evaluation import preserve_rng_state, score_generations
from ppo.tasks import ArithmeticTask

FULL = "full"  # the budget column of the unbudgeted evaluation


def policy_directory(checkpoint: str) -> Path:
    """The model directory `checkpoint` names: ``warm`` (the pinned SFT warm start), a run
    directory (its newest complete checkpoint's ``policy/``), or a model directory itself."""
    if checkpoint == "warm":
        from ppo.models.sft import warm_start

        return Path(warm_start(progress=False))
    path = Path(checkpoint)
    if (path / "checkpoints").is_dir():
        from ppo.run.run_dir import checkpoint_candidates

        candidates = checkpoint_candidates(path)
        if not candidates:
            raise FileNotFoundError(f"{path}: a run directory with no complete checkpoint")
        return candidates[0] / "policy"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not 'warm', a run directory with checkpoints/, or a model directory")
    return path


def budget_curve(model_dir: Path, budgets: Sequence[int], task=None, response_length: int = 64,
                 samples_per_prompt: int = 16, eval_size: int | None = None, seed: int = 0,
                 batch_size: int = 512, answer_tokens: int = 16) -> dict:
    """Held-out sampled accuracy of the policy at `model_dir` under each budget, and with none
    (key ``"full"``): ``{budget: summary}`` (`ppo.run.evaluation.summarise_problems`'s keys)."""
    task = task or ArithmeticTask()
    problems = list(task.eval_problems())[:eval_size]
    model, tokenizer = load_policy(model_dir)
    model.eval()
    curve = {}
    with preserve_rng_state():
        for budget in [*budgets, None]:
            curve[FULL if budget is None else budget] = score_generations(
                model, tokenizer, task, problems, response_length, greedy=False, batch_size=batch_size,
                samples_per_prompt=samples_per_prompt, seed=seed, thinking_budget=budget,
                answer_tokens=answer_tokens)
    return curve


def table(curves: dict[str, dict]) -> str:
    """A markdown table: one row per checkpoint, one column per budget (held-out sampled accuracy)."""
    columns = list(next(iter(curves.values())))
    lines = ["| checkpoint | " + " | ".join(str(c) for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for label, curve in curves.items():
        lines.append(f"| {label} | " + " | ".join(f"{curve[c]['accuracy']:.3f}" for c in columns) + " |")
    return "\n".join(lines)


def plot(curves: dict[str, dict], path: Path) -> None:
    """Accuracy against budget, one line per checkpoint; the unbudgeted accuracy as a dotted level."""
    from matplotlib.figure import Figure  # Agg through the Figure object, without pyplot

    figure = Figure(figsize=(6, 4))
    ax = figure.add_subplot()
    for index, (label, curve) in enumerate(curves.items()):
        colour = f"C{index}"
        budgets = [b for b in curve if b != FULL]
        ax.plot(budgets, [curve[b]["accuracy"] for b in budgets], marker="o", color=colour, label=label)
        ax.axhline(curve[FULL]["accuracy"], color=colour, linestyle=":", linewidth=1)
    _finish(figure, ax, "Accuracy against the thinking budget (dotted: no budget)", path)


def _finish(figure, ax, title: str, path: Path) -> None:
    """The budget plots' shared axes labels, grid and legend; saved to `path`."""
    ax.set_xlabel("thinking budget (tokens before the answer marker is forced)")
    ax.set_ylabel("held-out sampled accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def write_csv(curves: dict[str, dict], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["checkpoint", "budget", "sampled_accuracy", "sampled_accuracy_se", "answer_rate",
                         "length"])
        for label, curve in curves.items():
            for budget, summary in curve.items():
                writer.writerow([label, budget, summary["accuracy"], summary.get("accuracy_se", ""),
                                 summary["answer_rate"], summary["length"]])


def read_csv(path: Path) -> dict[str, dict]:
    """The curves a `write_csv` file holds, in its order: ``{checkpoint: {budget: summary}}``
    (budgets as ints, ``"full"`` kept), for the generated table of a committed curve."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (written by python -m ppo.run.thinking_budget ... --out {path.parent})")
    curves: dict[str, dict] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            budget = row["budget"] if row["budget"] == FULL else int(row["budget"])
            curves.setdefault(row["checkpoint"], {})[budget] = {
                "accuracy": float(row["sampled_accuracy"]), "answer_rate": float(row["answer_rate"]),
                "length": float(row["length"])}
    return curves


def write_provenance(path: Path, labels: Sequence[str], checkpoints: Sequence[str], args) -> None:
    """``provenance.json`` beside the curve: the commit (and whether the tree was dirty), each
    checkpoint's source, and the evaluation's settings."""
    import json

    from ppo.run.provenance import collect

    record = collect(None, args.threads)
    record.update(checkpoints=dict(zip(labels, checkpoints)), budgets=sorted(args.budgets),
                  samples_per_prompt=args.samples_per_prompt, eval_size=args.eval_size, seed=args.seed,
                  response_length=args.response_length, answer_tokens=args.answer_tokens)
    path.write_text(json.dumps(record, indent=2) + "\n")


def mean_curve_plot(curves: dict[str, dict], path: Path, response_length: int = 64) -> None:
    """Mean held-out accuracy over the checkpoints against the budget, with its 95% Student-t
    interval as a band; no budget is drawn at `response_length` tokens."""
    from matplotlib.figure import Figure

    from ablations.stats import mean_ci95

    budgets = list(next(iter(curves.values())))
    xs = [response_length if b == FULL else b for b in budgets]
    stats = [mean_ci95(curve[b]["accuracy"] for curve in curves.values()) for b in budgets]
    means = [s["mean"] for s in stats]
    figure = Figure(figsize=(6, 4))
    ax = figure.add_subplot()
    ax.plot(xs, means, marker="o", color="C0", label=f"mean of {len(curves)} checkpoints")
    ax.fill_between(xs, [m - s["ci"] for m, s in zip(means, stats)], [m + s["ci"] for m, s in zip(means, stats)],
                    color="C0", alpha=0.25, label="95% interval over checkpoints")
    ax.set_xticks(xs, [str(b) for b in budgets])
    _finish(figure, ax, "Accuracy against the thinking budget, trained PPO policies", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.run.thinking_budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="'warm', run directories or model directories")
    parser.add_argument("--labels", nargs="+", help="one name per checkpoint for the table and plot")
    parser.add_argument("--budgets", nargs="+", type=int, default=[4, 8, 12, 16, 24, 32, 48],
                        help="thinking budgets in tokens")
    parser.add_argument("--out", required=True, help="directory for budget.csv, budget.png, budget.md and provenance.json")
    parser.add_argument("--samples-per-prompt", type=int, default=16, help="draws per held-out problem (testbed: 16)")
    parser.add_argument("--eval-size", type=int, default=None, help="first N held-out problems; default all")
    parser.add_argument("--response-length", type=int, default=64, help="the unbudgeted response length (testbed 64)")
    parser.add_argument("--answer-tokens", type=int, default=16, help="tokens allowed after a forced marker")
    parser.add_argument("--seed", type=int, default=0, help="evaluation seed, shared by every budget and checkpoint")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.checkpoints):
        parser.error(f"--labels: {len(args.labels)} labels for {len(args.checkpoints)} checkpoints")
    if any(b < 1 for b in args.budgets):
        parser.error("--budgets: every budget must be >= 1 token")
    torch.set_num_threads(args.threads)
    labels = args.labels or args.checkpoints
    curves = {label: budget_curve(policy_directory(checkpoint), sorted(args.budgets),
                                  response_length=args.response_length, samples_per_prompt=args.samples_per_prompt,
                                  eval_size=args.eval_size, seed=args.seed, answer_tokens=args.answer_tokens)
              for label, checkpoint in zip(labels, args.checkpoints)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = table(curves)
    (out / "budget.md").write_text(markdown + "\n")
    write_csv(curves, out / "budget.csv")
    plot(curves, out / "budget.png")
    write_provenance(out / "provenance.json", labels, args.checkpoints, args)
    print(markdown)
    print(f"wrote {out / 'budget.md'}, {out / 'budget.csv'}, {out / 'budget.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

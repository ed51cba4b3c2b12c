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

**Qwen3's budget scaling as registered claims** (`BUDGET_CLAIMS`): accuracy rises with the
budget, from 8 to 16 to 32 tokens and from 32 to none, each a paired test over trained runs
(one checkpoint per training seed, labelled ``seedN``; every budget of a checkpoint sees the
same draws), with Holm's correction over the three parts. Seeds 1-3 are the pilot of the
power analysis; the claims are tested on the seeds registered after it::

    python -m ppo.run.thinking_budget RUN/seed1 RUN/seed2 RUN/seed3 --labels seed1 seed2 seed3 \\
        --budgets 8 16 32 --out PILOT
    python -m ppo.run.thinking_budget claims DIR --pilot PILOT    # also plots DIR/budget_mean.png

The committed test is ``docs/results/thinking_budget_claims`` with its pilot in ``pilot/``;
results.md's ``budget_claims:thinking_budget_claims`` block (`ablations.claims`) is generated
from it.

(``claims`` as the first argument selects this command; a checkpoint cannot be called that.)
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
# Registered after the pilot and before the tested checkpoints were evaluated. The checkpoints
# are the final policies of the `clip` arm of the powered kl_clip_at_zero rerun (AlpacaFarm's PPO,
# 60 steps, 15 seeds, commit debe9b8): seeds 1-3 the pilot (8 draws per problem, evaluation
# seed 0), seeds 4-15 tested, as many as the noisiest part needs.
BUDGET_SEEDS = tuple(range(4, 16))
BUDGET_SEEDS_BASIS = ("pilot sd 0.0149 (3 pairs): 7 seeds; run at 12", "pilot sd 0.0110 (3 pairs): 5 seeds; run at 12",
                      "pilot sd 0.0215 (3 pairs): 12 seeds")


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


def _budget_claims():
    """`BUDGET_CLAIMS`, built on first use (the claim type lives in `ablations`)."""
    from ablations.definitions import Claim

    source = "Qwen3 (arXiv 2505.09388, sec. 4.3: performance scales with the thinking budget)"
    basis = "stated: a third of the 60-step GRPO gain of the earlier sweep (+0.059)"
    parts = ((16, 8), (32, 16), (FULL, 32))
    return tuple(Claim(f"Held-out accuracy rises with the thinking budget: "
                       f"{'no budget' if more == FULL else f'{more} tokens'} over {less} tokens.", source,
                       "thinking_budget", (budget_variant(more), "sampled_accuracy"),
                       (budget_variant(less), "sampled_accuracy"), +1,
                       "held-out sampled accuracy of the trained policy (8 draws per problem)", BUDGET_SEEDS,
                       family="thinking budget", effect=0.02, effect_basis=basis, seeds_basis=BUDGET_SEEDS_BASIS[i])
                 for i, (more, less) in enumerate(parts))


def budget_variant(budget) -> str:
    """The variant name of a budget in the claims' rows: ``budget_16``, ``full``."""
    return FULL if budget == FULL else f"budget_{budget}"


def claim_rows(curves: dict[str, dict]) -> list[dict]:
    """Curves (`read_csv`) as the rows `ablations.claims` tests: one per (checkpoint, budget),
    the checkpoint's label ``seedN`` as the seed. Raises ValueError for another label."""
    rows = []
    for label, curve in curves.items():
        if not (label.startswith("seed") and label[4:].isdigit()):
            raise ValueError(f"checkpoint {label!r}: the claims need one checkpoint per training seed, "
                             "labelled seedN (--labels seed1 seed2 ...)")
        rows += [{"ablation": "thinking_budget", "variant": budget_variant(budget), "seed": int(label[4:]),
                  "status": "ok", "sampled_accuracy": summary["accuracy"]} for budget, summary in curve.items()]
    return rows


def claims_markdown(directory: Path, pilot: Path) -> str:
    """The verdicts of `BUDGET_CLAIMS` on ``DIRECTORY/budget.csv``, the power analysis on the
    pilot's, and the provenance of both."""
    import json

    from ablations.claims import claims_table
    from ablations.power import markdown as power_markdown

    claims = _budget_claims()
    pilot_rows = claim_rows(read_csv(pilot / "budget.csv"))
    lines = [claims_table(claim_rows(read_csv(directory / "budget.csv")), claims), "",
             "The power analysis it was registered with, on the pilot (checkpoints "
             f"{', '.join(f'seed{s}' for s in sorted({r['seed'] for r in pilot_rows}))}):", "",
             power_markdown(pilot_rows, claims), ""]
    for name, where in (("Tested", directory), ("Pilot", pilot)):
        record = json.loads((where / "provenance.json").read_text())
        lines.append(f"{name}: commit {record['commit'][:7]} (dirty: {record['dirty']}), "
                     f"{record['samples_per_prompt']} draws per problem, evaluation seed {record['seed']}.")
    return "\n".join(lines)


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


def claims_main(argv: Sequence[str]) -> int:
    """``python -m ppo.run.thinking_budget claims DIR --pilot PILOT``: prints `claims_markdown`
    and writes ``DIR/budget_mean.png`` (`mean_curve_plot`)."""
    parser = argparse.ArgumentParser(prog="python -m ppo.run.thinking_budget claims",
                                     description="Qwen3's budget scaling as registered claims, tested on DIR")
    parser.add_argument("directory", help="the tested checkpoints' --out directory (budget.csv, provenance.json)")
    parser.add_argument("--pilot", required=True, help="the pilot checkpoints' --out directory")
    args = parser.parse_args(list(argv))
    directory = Path(args.directory)
    try:
        print(claims_markdown(directory, Path(args.pilot)))
        mean_curve_plot(read_csv(directory / "budget.csv"), directory / "budget_mean.png")
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    print(f"wrote {directory / 'budget_mean.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["claims"]:
        return claims_main(argv[1:])
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

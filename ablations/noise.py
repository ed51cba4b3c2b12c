"""The noise budget of a sweep: how much of a quantity's spread is evaluation, how much training,
and how many seeds a question needs.

``python -m ablations noise SWEEP_DIR`` re-evaluates the final policy of every finished run of
a sweep several times (same weights, fresh evaluation draws) and splits each quantity's
seed-to-seed variance into two parts, the one-way random-effects decomposition::

    x[run, draw] = mu[variant] + t[run] + e[run, draw]     Var t = s_t^2 (training), Var e = s_e^2 (evaluation)
    s_e^2 = mean over runs of the variance over draws
    s_t^2 = max(0, Var over seeds of the run means - s_e^2 / draws)

A single evaluation then carries ``s_t^2 + s_e^2`` and the evaluation share is
``s_e^2 / (s_t^2 + s_e^2)``. Each quantity is measured at one or more evaluation precisions
(``--samples-per-prompt 1,16``: draws per held-out problem) on the same trained weights, so
"before" (one draw per problem) and "after" (several) differ only in the instrument.

What a sweep can detect comes from the paired differences the report itself uses: the arms of
one seed share the prompts, the warm start and the evaluation's sampling noise (draw 0 of
every run is evaluated with the run's own seed, as its training run did: common random
numbers). Their sd ``s_d`` gives the smallest true difference N seeds separate with 80% power
in a two-sided paired t test at 5% (`ablations.stats.paired_difference`),
``(t_{0.975,N-1} + t_{0.80,N-1}) * s_d / sqrt(N)``, and the fewest seeds for a target
difference. The same sd with the second arm on an independent draw shows what the shared draws
are worth.

Quantities (held-out, on the task's evaluation set, each a mean over its sampled responses):
``sampled_accuracy`` (the mean per-problem pass rate), ``true_kl`` (the sequence-level k1
estimate of KL(policy || reference), sum over response tokens of log pi - log pi_ref, an
unbiased estimate of the true KL), ``response_length``. Quantities that only the training log
has (for example ``late_sampled_accuracy``, the mean over the run's last evaluations) enter
with ``--row-quantity``: their paired sd and detectable size, without the split.

Writes ``--json FILE`` (every run's draws, the budget and the provenance of the code that
measured it); saved as docs/results/data/noise_NAME.json, it fills the
``<!-- generated:noise:NAME -->`` blocks of the docs (``python -m ablations claims DATA --update FILE``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .stats import mean_ci95, t_quantile_80, t_quantile_975

QUANTITIES = ("sampled_accuracy", "true_kl", "response_length")
LABELS = {"sampled_accuracy": "held-out sampled accuracy", "true_kl": "true KL (k1, nats per response)",
          "response_length": "response length (tokens)",
          "late_sampled_accuracy": "held-out sampled accuracy, mean of the late evaluations",
          "final_sampled_accuracy": "held-out sampled accuracy, final evaluation (as logged)",
          "accuracy_gain": "gain in held-out sampled accuracy over the start"}
DRAW_SEED_OFFSET = 1_000_003  # draw j > 0 evaluates with seed + j * offset: never another run's own seed


def draw_seed(seed: int, draw: int) -> int:
    """Evaluation seed of draw `draw` of the run with training seed `seed`; draw 0 is the run's own."""
    return seed if draw == 0 else seed + draw * DRAW_SEED_OFFSET


def smallest_detectable(sd: float, seeds: int) -> float:
    """The smallest true paired difference `seeds` seeds separate with 80% power (two-sided 5%).

    Worked example: sd 0.02 at 5 seeds: (2.776 + 0.941) * 0.02 / sqrt(5) = 0.0332.
    """
    if seeds < 2 or not math.isfinite(sd):
        return float("nan")
    return (t_quantile_975(seeds - 1) + t_quantile_80(seeds - 1)) * sd / math.sqrt(seeds)


def seeds_needed(sd: float, target: float, most: int = 200) -> int | None:
    """The fewest seeds (at least 3) whose `smallest_detectable` is at most `target`; None above `most`.

    Worked example: sd 0.02, target 0.025: 5 seeds detect 0.0332, 7 detect 0.0253, 8 detect 0.0231 -> 8.
    """
    if not (math.isfinite(sd) and target > 0):
        return None
    for seeds in range(3, most + 1):
        if smallest_detectable(sd, seeds) <= target:
            return seeds
    return None


def variance_split(values: dict[tuple[str, int], list[float]]) -> dict:
    """Split the variance of `values` ((variant, seed) -> that run's draws) into evaluation and
    training parts (module docstring), pooled over variants.

    Worked example: one variant, seeds 1 and 2 with draws [0.30, 0.32] and [0.40, 0.42]:
    s_e^2 = 0.0002 (each run's draw variance), run means 0.31 and 0.41 vary by 0.005, so
    s_t^2 = 0.005 - 0.0002 / 2 = 0.0049: s_e 0.0141, s_t 0.0700, evaluation share 0.039.
    """
    within = [np.var(draws, ddof=1) for draws in values.values() if len(draws) > 1]
    eval_var = float(np.mean(within)) if within else float("nan")
    draws = int(np.median([len(d) for d in values.values()])) if values else 0
    by_variant: dict[str, list[float]] = {}
    for (variant, _), run_draws in values.items():
        by_variant.setdefault(variant, []).append(float(np.mean(run_draws)))
    between = [(np.var(means, ddof=1), len(means) - 1) for means in by_variant.values() if len(means) > 1]
    dof = sum(d for _, d in between)
    mean_var = float(sum(v * d for v, d in between) / dof) if dof else float("nan")
    train_var = max(0.0, mean_var - eval_var / max(draws, 1)) if math.isfinite(eval_var) else float("nan")
    single_var = train_var + eval_var
    return {"eval_sd": math.sqrt(eval_var) if math.isfinite(eval_var) else float("nan"),
            "train_sd": math.sqrt(train_var) if math.isfinite(train_var) else float("nan"),
            "eval_share": eval_var / single_var if single_var > 0 else float("nan"),
            "draws": draws, "runs": len(values)}


def paired_sd(first: dict[int, float], second: dict[int, float]) -> tuple[float, int]:
    """The sd over seeds of ``second - first`` and the number of pairs (NaN below 2)."""
    seeds = [s for s in first if s in second and math.isfinite(first[s]) and math.isfinite(second[s])]
    stats = mean_ci95(second[s] - first[s] for s in seeds)
    return stats["sd"], stats["n"]


def budget(values: dict[tuple[str, int], list[float]], base: str, seeds: int, target: float) -> dict:
    """The variance split plus the paired sd against `base` (draw 0 of both arms: shared
    evaluation noise; and with the other arm's draw 1: independent draws), the smallest
    difference `seeds` seeds detect and the seeds `target` needs (worst pair over variants)."""
    result = variance_split(values)
    variants = sorted({variant for variant, _ in values} - {base})
    shared, independent = [], []
    first = {s: draws[0] for (v, s), draws in values.items() if v == base}
    for variant in variants:
        second = {s: draws[0] for (v, s), draws in values.items() if v == variant}
        other = {s: draws[1] for (v, s), draws in values.items() if v == variant and len(draws) > 1}
        shared.append(paired_sd(first, second))
        if other:
            independent.append(paired_sd(first, other))
    sd = max((value for value, n in shared if n >= 2), default=float("nan"))
    sd_independent = max((value for value, n in independent if n >= 2), default=float("nan"))
    result.update(paired_sd=sd, paired_sd_independent_draws=sd_independent,
                  pairs=min((n for _, n in shared), default=0),
                  detectable=smallest_detectable(sd, seeds), seeds_for_target=seeds_needed(sd, target))
    return result


# ------------------------------------------------------------------------------------ measuring
def _final_policy_dir(run_dir: Path, total_steps: int) -> Path:
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*/policy"))
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir}: no checkpoints/step_*/policy (the noise budget re-evaluates the "
                                "final policy; the run must have finished and saved it)")
    final = checkpoints[-1]
    step = int(final.parent.name.split("_")[1])
    if step != total_steps:
        raise ValueError(f"{run_dir}: the newest checkpoint is step {step}, not the run's total_steps "
                         f"{total_steps}: the run did not finish")
    return final


def measure_run(run_dir: Path, draws: int, samples_per_prompt: Sequence[int], progress=None) -> dict:
    """Every quantity of the run's final policy at each precision, `draws` times (`draw_seed`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ppo.config import PPOConfig
    from ppo.run.evaluation import evaluate, heldout_kl
    from ppo.models.setup import warm_start_path
    from ppo.models.policy import resolve_max_prompt_length
    from ppo.tasks import build_task

    config = PPOConfig.from_yaml(run_dir / "config.yaml")
    policy_dir = _final_policy_dir(run_dir, config.total_steps)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    reference = AutoModelForCausalLM.from_pretrained(warm_start_path(config)).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    task = build_task(config)
    problems = list(task.eval_problems())[: config.eval_size]
    max_prompt_length = resolve_max_prompt_length(policy, config.max_prompt_length, config.response_length)
    result: dict[str, dict[str, list[float]]] = {}
    for k in samples_per_prompt:
        per_k = result.setdefault(str(k), {**{name: [] for name in QUANTITIES}, "eval_seconds": []})
        for draw in range(draws):
            seed = draw_seed(config.seed, draw)
            start = time.perf_counter()
            metrics = evaluate(policy, tokenizer, task, config.response_length, seed=seed, problems=problems,
                               samples_per_prompt=k, batch_size=config.eval_batch_size,
                               max_prompt_length=max_prompt_length, prompt_truncation=config.prompt_truncation,
                               nonfinite_rewards=config.nonfinite_rewards)
            per_k["eval_seconds"].append(time.perf_counter() - start)  # what a run's evaluation costs
            per_k["sampled_accuracy"].append(metrics["sampled_accuracy"])
            per_k["response_length"].append(metrics["sampled_length"])
            with torch.no_grad():
                per_k["true_kl"].append(heldout_kl(policy, reference, tokenizer, problems, config.response_length,
                                                   seed=seed, samples_per_prompt=k, batch_size=config.eval_batch_size,
                                                   max_prompt_length=max_prompt_length,
                                                   prompt_truncation=config.prompt_truncation))
            if progress is not None:
                progress.update(1)
    return result


def measure_sweep(sweep_dir: Path, draws: int, samples_per_prompt: Sequence[int], threads: int = 1,
                  variants: Sequence[str] | None = None) -> list[dict]:
    """`measure_run` for every finished run of the sweep (of `variants` only, when given), with
    its variant and seed."""
    import torch
    from tqdm.auto import tqdm

    from .run_results import collect_runs

    torch.set_num_threads(threads)
    rows = [row for row in collect_runs(sweep_dir) if row["status"] == "ok"]
    if variants:
        missing = sorted(set(variants) - {row["variant"] for row in rows})
        if missing:
            raise ValueError(f"{sweep_dir}: no finished run of variant(s) {', '.join(missing)}")
        rows = [row for row in rows if row["variant"] in variants]
    if not rows:
        raise ValueError(f"{sweep_dir}: no finished run to measure")
    measured = []
    with tqdm(total=len(rows) * draws * len(samples_per_prompt), desc="noise: evaluation draws") as bar:
        for row in rows:
            draws_of_run = measure_run(Path(sweep_dir) / row["path"], draws, samples_per_prompt, progress=bar)
            measured.append({"ablation": row["ablation"], "variant": row["variant"], "seed": int(row["seed"]),
                             "draws": draws_of_run,
                             "row": {key: row.get(key) for key in ("final_sampled_accuracy", "accuracy_gain",
                                                                    "late_sampled_accuracy", "kl_k1",
                                                                    "response_length_correct")}})
    return measured


# ------------------------------------------------------------------------------------ reporting
def noise_table(measured: list[dict], base: str, seeds: int, target: float,
                row_quantities: Sequence[str] = ()) -> list[dict]:
    """One budget per quantity and precision (and per extra results.csv column, unsplit)."""
    table = []
    precisions = sorted({k for run in measured for k in run["draws"]}, key=int)
    for quantity in QUANTITIES:
        for k in precisions:
            values = {(run["variant"], run["seed"]): run["draws"][k][quantity] for run in measured if k in run["draws"]}
            table.append({"quantity": quantity, "samples_per_prompt": int(k), **budget(values, base, seeds, target)})
    for quantity in row_quantities:
        values = {(run["variant"], run["seed"]): [float(run["row"].get(quantity, float("nan")))] for run in measured}
        entry = budget(values, base, seeds, target)
        entry.update(eval_sd=float("nan"), train_sd=float("nan"), eval_share=float("nan"))
        table.append({"quantity": quantity, "samples_per_prompt": None, **entry})
    return table


PAIR_NOISE_COLUMNS = ("final_sampled_accuracy", "late_sampled_accuracy")


def pair_noise_table(rows: Sequence[dict], specs: dict | None = None, seeds: int = 5, target: float = 0.025,
                     columns: Sequence[str] = PAIR_NOISE_COLUMNS) -> str:
    """What a committed sweep's own paired differences say a comparison can see, as markdown:
    for each ablation, each variant against its base and each accuracy column, the responses per
    step (the rollout batch, ``samples / total_steps``; "base / variant" where the arms differ),
    the pairs, the paired sd (`paired_sd`), the difference `seeds` seeds detect
    (`smallest_detectable`) and the seeds `target` needs (`seeds_needed`). `specs`: the
    ablations' descriptions (`read_sweep`), default the registry's.

    Worked example: differences 0.01, 0.03, 0.02 have sd 0.01, so 5 seeds detect
    (2.776 + 0.941) * 0.01 / sqrt(5) = 0.0166 and 0.025 needs 4 seeds.
    """
    from .run_results import seed_values, spec_for
    from .variant_comparison import base_variant

    def per_step(ablation: str, variant: str) -> str:
        sizes = sorted({round(float(r["samples"]) / float(r["total_steps"])) for r in rows
                        if r["ablation"] == ablation and r["variant"] == variant and r.get("samples") and r.get("total_steps")})
        return ", ".join(map(str, sizes)) or "-"

    lines = [f"| ablation | variant - base | responses per step | quantity | pairs | paired sd | detectable at {seeds} seeds "
             f"| seeds for {target:g} |", "|---|---|---|---|---|---|---|---|"]
    for ablation in dict.fromkeys(r["ablation"] for r in rows):
        base = base_variant(ablation, [r["variant"] for r in rows if r["ablation"] == ablation], spec_for(ablation, specs))
        for variant in dict.fromkeys(r["variant"] for r in rows if r["ablation"] == ablation and r["variant"] != base):
            batches = dict.fromkeys((per_step(ablation, base), per_step(ablation, variant)))
            batch = " / ".join(batches)
            for column in columns:
                sd, n = paired_sd(seed_values(rows, ablation, base, column), seed_values(rows, ablation, variant, column))
                lines.append(f"| `{ablation}` | `{variant}` - `{base}` | {batch} | "
                             f"{LABELS.get(column, column)} | {n} | {_fmt(sd, 4)} | {_fmt(smallest_detectable(sd, seeds), 4)} | "
                             f"{_fmt(seeds_needed(sd, target))} |")
    return "\n".join(lines)


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def evaluation_cost(measured: list[dict]) -> dict[str, float]:
    """Mean seconds of one evaluation (greedy and sampled) at each precision, over every draw."""
    seconds: dict[str, list[float]] = {}
    for run in measured:
        for k, values in run["draws"].items():
            seconds.setdefault(k, []).extend(values.get("eval_seconds", []))
    return {k: float(np.mean(v)) for k, v in sorted(seconds.items(), key=lambda item: int(item[0])) if v}


def markdown(table: list[dict], seeds: int, target: float, cost: dict[str, float] | None = None) -> str:
    """The budget as a markdown table (one row per quantity and precision), and what an
    evaluation cost at each precision when `cost` is given."""
    lines = []
    lines += [f"| quantity | draws per problem | evaluation sd | training sd | evaluation share "
              f"| paired sd (shared draws) | paired sd (independent draws) | detectable at {seeds} seeds "
              f"| seeds for {target:g} |",
              "|---|---|---|---|---|---|---|---|---|"]
    for entry in table:
        digits = 4 if entry["quantity"] != "response_length" else 2
        lines.append("| " + " | ".join([
            LABELS.get(entry["quantity"], entry["quantity"]),
            _fmt(entry["samples_per_prompt"]) if entry["samples_per_prompt"] else "as logged",
            _fmt(entry["eval_sd"], digits), _fmt(entry["train_sd"], digits), _fmt(entry["eval_share"], 2),
            _fmt(entry["paired_sd"], digits), _fmt(entry["paired_sd_independent_draws"], digits),
            _fmt(entry["detectable"], digits),
            _fmt(entry["seeds_for_target"]) if entry["quantity"] not in ("true_kl", "response_length") else "-",
        ]) + " |")
    if cost and len(cost) > 1:
        low, high = min(cost, key=int), max(cost, key=int)
        lines += ["", f"One evaluation of a final policy (greedy and sampled, {high} draws per problem) took "
                      f"{cost[high] / cost[low]:.1f} times as long as with {low} draw"
                      f"{'s' if int(low) > 1 else ''} ({cost[high]:.1f} s against {cost[low]:.1f} s, "
                      "timed side by side in one process)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations noise", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a finished sweep (python -m ablations run ...)")
    parser.add_argument("--draws", type=int, default=4, help="evaluations of each final policy (>= 2)")
    parser.add_argument("--samples-per-prompt", default="1,16",
                        help="comma-separated precisions to measure: draws per held-out problem (default 1,16)")
    parser.add_argument("--variants", nargs="+", default=None, help="measure only these variants (default: all)")
    parser.add_argument("--base", default=None, help="the variant the others are paired with (default: the "
                        "sweep's first variant in sorted order)")
    parser.add_argument("--seeds", type=int, default=5, help="report the smallest difference this many seeds detect")
    parser.add_argument("--target", type=float, default=0.025,
                        help="report the seeds needed to detect this accuracy difference")
    parser.add_argument("--row-quantity", action="append", default=[],
                        help="a results.csv column to add, unsplit (e.g. late_sampled_accuracy); repeatable")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the draws and the budget here")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir():
        print(f"noise: {sweep_dir}: no such sweep directory", file=sys.stderr)
        return 2
    if args.draws < 2:
        print("noise: --draws must be >= 2 (the evaluation variance needs two draws of each run)", file=sys.stderr)
        return 2
    try:
        precisions = [int(k) for k in args.samples_per_prompt.split(",") if k.strip()]
    except ValueError:
        print(f"noise: --samples-per-prompt {args.samples_per_prompt!r}: comma-separated positive integers",
              file=sys.stderr)
        return 2
    if not precisions or min(precisions) < 1:
        print("noise: --samples-per-prompt: at least one positive integer", file=sys.stderr)
        return 2
    try:
        measured = measure_sweep(sweep_dir, args.draws, precisions, threads=args.threads, variants=args.variants)
    except (ValueError, FileNotFoundError) as error:
        print(f"noise: {error}", file=sys.stderr)
        return 1
    variants = sorted({run["variant"] for run in measured})
    base = args.base or variants[0]
    if base not in variants:
        print(f"noise: --base {base!r} is not a variant of the sweep ({', '.join(variants)})", file=sys.stderr)
        return 2
    table = noise_table(measured, base, args.seeds, args.target, args.row_quantity)
    cost = evaluation_cost(measured)
    text = markdown(table, args.seeds, args.target, cost)
    print(text)
    if args.json:
        from ppo.run.provenance import source_version

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "sweep": str(sweep_dir), "base": base, "variants": variants, "seeds": args.seeds, "target": args.target,
            "draws": args.draws, "samples_per_prompt": precisions, "measured_with": dict(zip(("commit", "dirty"), source_version())),
            "runs": measured, "table": table, "cost": cost}, indent=1, default=float) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

    python -m ablations speed model [--out DIR]            # build + SFT the task's model
    python -m ablations speed run --kind grpo --seed 42     # one project run, per-step times
    python -m ablations speed compare --peer-dir DIR --peer-python PY --peer-python-ppo PY
                                      [--seeds 42 43 44] [--steps 50] [--kinds grpo ppo] [--out FILE]
    python -m ablations speed pool BATCH... [--plot PNG]   # several compare batches pooled (and drawn)

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
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from ablations.stats import mean_ci95, paired_difference
from ppo.tasks.base import Problem, Score

KINDS = ("grpo", "ppo")
FIRST_TIMED_STEP = 5  # medians over steps 5..N (1-based): the first steps warm caches up


# ---- the task ---------------------------------------------------------------------------
def addition_pairs(n_test: int = 500, seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held-out) pairs (a, b), a and b in 10..99, shuffled with random.Random(seed)."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    return pairs[n_test:], pairs[:n_test]


class AdditionTask:
    """2-digit addition, exact match: the response must be the sum's digits and then EOS."""

    name = "addition2"

    def __init__(self):
        train, test = addition_pairs()
        self._train = [Problem(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in train]
        self._eval = [Problem(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in test]

    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_problems(self) -> Sequence[Problem]:
        return self._eval

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        return Score(correct=has_eos and response == problem.answer, has_answer=bool(response), has_eos=has_eos)

    def score_batch(self, problems, responses, has_eos) -> list[Score]:
        return [self.score(p, r, e) for p, r, e in zip(problems, responses, has_eos)]


def build_model(out_dir: str | Path, seed: int = 0, target_accuracy: float = 0.35, max_steps: int = 1000,
                threads: int = 2) -> Path:
    """Build the task's tokenizer and GPT-2 and SFT it (batch 128, AdamW lr 1e-3, loss on the
    answer and EOS) until held-out greedy exact match reaches `target_accuracy` (checked every
    25 steps). Saves model and tokenizer with save_pretrained; returns the directory."""
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    from ppo.evaluation import evaluate
    from ppo.tiny_model import build_char_tokenizer

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    tokenizer = build_char_tokenizer(alphabet="0123456789+-= ")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=128, n_layer=4, n_head=4,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    task = AdditionTask()
    train, _ = addition_pairs()
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accuracy = 0.0
    for step in range(1, max_steps + 1):
        batch = [rng.choice(train) for _ in range(128)]
        rows = [[tokenizer.bos_token_id] + tokenizer(f"{a}+{b}=", add_special_tokens=False)["input_ids"] for a, b in batch]
        answers = [tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for a, b in batch]
        width = max(len(r) + len(s) for r, s in zip(rows, answers))
        ids = torch.full((128, width), tokenizer.pad_token_id)
        labels = torch.full((128, width), -100)
        mask = torch.zeros((128, width), dtype=torch.long)
        for i, (prompt, answer) in enumerate(zip(rows, answers)):
            seq = prompt + answer
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, len(prompt):len(seq)] = torch.tensor(answer)
            mask[i, :len(seq)] = 1
        model.train()
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                 ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            accuracy = evaluate(model.eval(), tokenizer, task, max_new_tokens=8, batch_size=500)["greedy_accuracy"]
            if accuracy >= target_accuracy:
                break
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "sft_info.json").write_text(json.dumps({"steps": step, "greedy_accuracy": accuracy}, indent=1))
    return out_dir


# ---- one run of this project --------------------------------------------------------------
def config_for(kind: str, model_path: str, seed: int, steps: int, output_dir: str, **overrides):
    """The project's `PPOConfig` for the fixed work `kind` (see the module docstring)."""
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
    from ppo.evaluation import evaluate
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
        policy = trainer.accelerator.unwrap_model(trainer.policy)
        metrics = evaluate(policy, trainer.tokenizer, trainer.task, max_new_tokens=8, batch_size=500, seed=1234)
        result.update(after_test_greedy_acc=metrics["greedy_accuracy"],
                      after_test_sample_t1_acc=metrics["sampled_accuracy"])
    return result


def median_step(step_times: list[float], first_step: int = FIRST_TIMED_STEP) -> float:
    """Median of the per-step times of steps `first_step`..N (1-based)."""
    timed = step_times[first_step - 1:]
    if not timed:
        raise ValueError(f"need at least {first_step} steps, got {len(step_times)}")
    return statistics.median(timed)


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
        command = [sys.executable, "-m", "ablations", "speed", "run", "--kind", kind, "--seed", str(seed),
                   "--steps", str(steps), "--model", model_path, "--json", str(out)]
        command += ["--evaluate"] if evaluate_after else []
        for override in overrides:
            command += ["--set", override]
        _run_in_subprocess(command, None, {**os.environ, "OMP_NUM_THREADS": "2"})
        return json.loads(out.read_text())


def adjacent_pairs(runs: list[dict], kind: str) -> list[tuple[dict, dict]]:
    """`(trl, project)` for each pair of adjacent runs of `kind` with the same seed, in run
    order (`compare` runs each seed's two systems back to back, so a pair shares the
    machine's state and the start model). A run whose partner never came is left out."""
    waiting: dict = {}  # seed -> a run whose partner has not come yet
    pairs = []
    for run in runs:
        if run["kind"] != kind:
            continue
        other = waiting.pop(run.get("seed"), None)
        if other is None or other["system"] == run["system"]:
            waiting[run.get("seed")] = run
            continue
        pairs.append((other, run) if other["system"] == "trl" else (run, other))
    return pairs


def paired_ratios(runs: list[dict], kind: str) -> list[float]:
    """project / TRL seconds per step for each adjacent same-seed pair (`adjacent_pairs`);
    the ratio of medians over all runs mixes spells."""
    return [run_median(mine) / run_median(trl) for trl, mine in adjacent_pairs(runs, kind)]


QUALITY_KEYS = (("greedy", "after_test_greedy_acc"), ("sampled at T = 1", "after_test_sample_t1_acc"))


def quality_of_pairs(pairs: list[tuple[dict, dict]]) -> dict:
    """Held-out accuracy after training, project minus TRL, over `(trl, project)` pairs
    (`adjacent_pairs`; `pool` takes them per batch) that both evaluated: for greedy and sampled
    decoding, `ablations.stats.paired_difference` (mean, 95% interval, whether it excludes 0,
    and the smallest gap these pairs would detect) and the two systems' means. Empty when no
    pair evaluated."""
    pairs = [(trl, mine) for trl, mine in pairs
             if "after_test_greedy_acc" in trl and "after_test_greedy_acc" in mine]
    if not pairs:
        return {}
    out = {}
    for label, key in QUALITY_KEYS:
        base = {i: trl[key] for i, (trl, _) in enumerate(pairs)}
        variant = {i: mine[key] for i, (_, mine) in enumerate(pairs)}
        out[label] = {**paired_difference(base, variant), "trl_mean": statistics.mean(base.values()),
                      "project_mean": statistics.mean(variant.values())}
    return out


def run_median(run: dict) -> float:
    """A run's median seconds per step: from its step times, or as recorded (`load_batch`)."""
    return run["median"] if "median" in run else median_step(run["step_times_all"])


def summarize(runs: list[dict]) -> dict:
    """Per (kind, system): median step per run, then median / min / max over runs; per kind
    the ratio of the two medians and the ratios of adjacent same-seed pairs."""
    table: dict = {}
    for run in runs:
        entry = table.setdefault(run["kind"], {}).setdefault(run["system"], {"per_run": [], "greedy": []})
        entry["per_run"].append(run_median(run))
        if "after_test_greedy_acc" in run:
            entry["greedy"].append(run["after_test_greedy_acc"])  # every evaluated run, paired or not
    for kind, systems in table.items():
        for entry in systems.values():
            per_run = entry["per_run"]
            entry.update(median=statistics.median(per_run), min=min(per_run), max=max(per_run))
        if "trl" in systems and "project" in systems:
            systems["ratio"] = systems["project"]["median"] / systems["trl"]["median"]
            systems["paired_ratios"] = paired_ratios(runs, kind)
            systems["quality"] = quality_of_pairs(adjacent_pairs(runs, kind))
    return table


def _median_and_range(entry: dict | None) -> str:
    return "-" if entry is None else f"{entry['median']:.4f} ({entry['min']:.4f}-{entry['max']:.4f})"


def format_summary(table: dict) -> str:
    lines = ["| work | TRL s/step (range) | project s/step (range) | project / TRL | per seed (adjacent runs) "
             "| greedy after (TRL / project) |",
             "|---|---|---|---|---|---|"]
    for kind, systems in table.items():
        trl, mine = systems.get("trl"), systems.get("project")

        def quality(entry):
            return "-" if not entry or not entry["greedy"] else f"{statistics.mean(entry['greedy']):.3f}"

        ratio = f"{systems['ratio']:.2f}" if "ratio" in systems else "-"
        paired = ", ".join(f"{r:.2f}" for r in systems.get("paired_ratios", [])) or "-"
        lines.append(f"| {kind} | {_median_and_range(trl)} | {_median_and_range(mine)} | {ratio} | {paired} "
                     f"| {quality(trl)} / {quality(mine)} |")
    return "\n".join(lines + format_quality(table))


def format_quality(table: dict) -> list[str]:
    """The lines of the quality table (after a blank line) for a `summarize` or `pool` table's
    ``quality`` entries; none when no pair evaluated."""
    rows = [(kind, label, d) for kind, entry in table.items() if entry
            for label, d in entry.get("quality", {}).items()]
    if not rows:
        return []
    lines = ["", "| work | held-out accuracy after | TRL / project (means) | project - TRL, paired by seed "
             "(95% interval) | pairs | the interval excludes 0 | smallest gap these pairs detect |",
             "|---|---|---|---|---|---|---|"]
    for kind, label, d in rows:
        detectable = f"{d['detectable']:.3f}" if math.isfinite(d["detectable"]) else "-"  # none from one pair
        lines.append(f"| {kind} | {label} | {d['trl_mean']:.3f} / {d['project_mean']:.3f} | "
                     f"{_mean_and_interval(d, signed=True)} | {d['n']} | "
                     f"{'yes' if d['separated'] else 'no'} | {detectable} |")
    return lines


# ---- several batches pooled ----------------------------------------------------------------
_PRINTED_RUN = re.compile(r"(trl|project)\s+(grpo|ppo) seed (\d+): median ([0-9.]+) s/step")


def load_batch(path: str | Path) -> list[dict]:
    """The runs of one `compare` batch in run order: from the JSON its ``--out`` wrote, or
    from the lines it printed (``trl grpo seed 42: median 0.1193 s/step``, each run's median
    to 0.1 ms), for a batch whose JSON was not kept."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)["runs"]
    runs = [{"system": m[1], "kind": m[2], "seed": int(m[3]), "median": float(m[4])}
            for m in map(_PRINTED_RUN.match, text.splitlines()) if m]
    if not runs:
        raise ValueError(f"{path}: no runs in it (expected the JSON of `compare --out` or the lines compare printed)")
    return runs


def pool(batches: list[list[dict]], kind: str) -> dict | None:
    """`kind`'s runs over several batches as `summarize` gives them (per system the median
    over every run and the range; the ratio of the two medians), with the adjacent same-seed
    pairs taken inside each batch (a pair never spans two batches), how many are at or under
    0.5, and each batch's own ratio with their mean and its 95% interval (`batch_ratio`, Student t
    over the batches: each batch ran in its own spell of the machine, so a batch, not a run, is
    the unit the ratio varies by), and the held-out accuracy after training of the pairs that
    evaluated (`quality_of_pairs`); None without runs of both systems."""
    table = summarize([run for batch in batches for run in batch]).get(kind, {})
    if "ratio" not in table:
        return None
    # the pairs of the runs put together could join two batches' runs: taken per batch instead
    pairs = [ratio for batch in batches for ratio in paired_ratios(batch, kind)]
    per_batch = [summarize(batch).get(kind, {}).get("ratio") for batch in batches]
    quality = quality_of_pairs([pair for batch in batches for pair in adjacent_pairs(batch, kind)])
    return {**table, "paired_ratios": pairs, "pairs_at_or_under_half": sum(r <= 0.5 for r in pairs),
            "per_batch": per_batch, "batch_ratio": mean_ci95(r for r in per_batch if r is not None),
            "quality": quality}


def format_pooled(pooled: dict) -> str:
    lines = ["| work | runs per system | TRL s/step (range) | project s/step (range) | project / TRL "
             "| seed pairs at or under 0.5 | pairs: range, median | per batch | batches: mean (95% interval) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, entry in pooled.items():
        if entry is None:
            continue
        pairs = entry["paired_ratios"]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}, {statistics.median(pairs):.2f}" if pairs else "-"
        per_batch = ", ".join("-" if r is None else f"{r:.2f}" for r in entry["per_batch"])
        runs = f"{len(entry['trl']['per_run'])} / {len(entry['project']['per_run'])}"
        lines.append(f"| {kind} | {runs} | {_median_and_range(entry['trl'])} "
                     f"| {_median_and_range(entry['project'])} | {entry['ratio']:.3f} | {entry['pairs_at_or_under_half']} of {len(pairs)} | "
                     f"{spread} | {per_batch} | {_mean_and_interval(entry['batch_ratio'])} |")
    return "\n".join(lines + format_quality(pooled))


def _mean_and_interval(stats: dict, signed: bool = False) -> str:
    """``0.482 (0.460 to 0.503)``, or with `signed` ``-0.100 (-0.530 to +0.330)``: a
    `mean_ci95` result; the mean alone where there is no interval (one batch, one pair)."""
    cell = "{:+.3f}" if signed else "{:.3f}"
    if not math.isfinite(stats["ci"]):
        return cell.format(stats["mean"])
    low, high = (cell.format(stats["mean"] + side * stats["ci"]) for side in (-1, 1))
    return f"{cell.format(stats['mean'])} ({low} to {high})"


def batch_label(path: str | Path) -> str:
    """The batch's name on a plot: its number for ``batchNN.txt`` / ``.json``, else the file's stem."""
    stem = Path(path).stem
    match = re.fullmatch(r"batch0*(\d+)", stem)
    return match[1] if match else stem


def pooled_figure(labels: list[str], pooled: dict, goal: float = 0.5):
    """Each batch's project / TRL ratio per kind (a point per batch, joined in batch order),
    the mean over the batches with its 95% interval (a line and a band of the kind's colour)
    and the goal as a dashed line: the `pool` table at a glance. Returns a matplotlib
    ``Figure`` (drawn through Agg, no pyplot state)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6.0, 0.28 * len(labels) + 2), 3.8))
    ax = figure.add_subplot()
    positions = range(len(labels))
    for (kind, entry), colour in zip(pooled.items(), ("tab:blue", "tab:orange", "tab:green")):
        if entry is None:
            continue
        points = [(x, r) for x, r in zip(positions, entry["per_batch"]) if r is not None]
        stats = entry["batch_ratio"]
        ax.plot([x for x, _ in points], [r for _, r in points], "o-", color=colour, markersize=4, linewidth=1,
                label=f"{kind}: mean {_mean_and_interval(stats)}")
        if math.isfinite(stats["ci"]):
            ax.axhspan(stats["mean"] - stats["ci"], stats["mean"] + stats["ci"], color=colour, alpha=0.15)
        ax.axhline(stats["mean"], color=colour, linewidth=0.8)
    ax.axhline(goal, color="black", linestyle="--", linewidth=1, label=f"goal: {goal}x")
    ax.set_xticks(list(positions), labels, fontsize=7)
    ax.set_xlabel("batch")
    ax.set_ylabel("project / TRL, seconds per step")
    ax.set_title("Side by side with TRL: each batch's ratio, the mean and its 95% interval", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    return figure


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


def _parse_overrides(items: list[str]) -> dict:
    from ppo.config import parse_override

    return dict(parse_override(item) for item in items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations speed", description=__doc__.split("\n\n")[0])
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

"""``python -m ppo.tasks.rlhf build``: the simulated-preference RLHF pipeline up to the reward model.

    SFT warm start  ->  pairs of SFT samples  ->  labels from a noisy annotator pool
                    ->  Bradley-Terry reward model  ->  normalised on SFT samples  ->  saved

Then PPO trains against that reward model while the hidden gold reward is only measured
(``ppo-train --preset alpacafarm --testbed --task preference --reward-model-path DIR
--value-init reward_model``; docs/alpacafarm.md walks through it).

Like the SFT warm start (`ppo.models.sft.warm_start`), the reward model is cached on disk under
the same cache directory, keyed by every setting of `RLHFConfig` including the SFT
config, so sweeps and tests share one deterministic reward model. `reward_model_cache_path`
gives its directory without building anything (the ablation registry uses it at import
time); `reward_model_dir` builds it if needed, under a file lock.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ppo.models.sft import DEFAULT_CACHE_DIR, SFTConfig

# Bump when the pipeline (gold reward, annotators, reward-model recipe) changes, so old
# caches are not reused.
RLHF_FORMAT_VERSION = 1


@dataclass
class RLHFConfig:
    """Settings of the reward-model build; all of them are part of the cache key.

    The defaults take a few minutes on two CPU cores (most of it sampling the pairs).
    """

    seed: int = 0
    n_pairs: int = 2000  # labelled pairs of distinct SFT samples
    noise: float = 0.25  # each label is a fair coin flip with this probability (AlpacaFarm's label noise)
    # One length preference per annotator (gold units per character, see SimulatedAnnotator);
    # the pool's size is the number of entries. Unbiased by default: the labels are the gold
    # preference plus coin-flip noise. A positive value (e.g. 0.02) makes that annotator
    # prefer longer answers, against the gold reward's brevity term.
    annotator_biases: tuple = (0.0, 0.0, 0.0, 0.0)
    heldout_fraction: float = 0.1
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-3
    normalization_samples: int = 512  # fresh SFT samples whose mean reward is set to 0
    prompts_per_batch: int = 64  # prompts per generation batch (two samples each)
    # torch intra-op threads, fixed so the result is deterministic. One thread: on a machine
    # whose cores are shared with other runs, two threads can make generation tens of times
    # slower (threads waiting on each other), and one is nearly as fast on an idle machine.
    threads: int = 1
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self):
        if isinstance(self.sft, dict):
            self.sft = SFTConfig(**self.sft)
        self.annotator_biases = tuple(self.annotator_biases)
        for name in ("n_pairs", "epochs", "batch_size", "normalization_samples", "prompts_per_batch", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"RLHFConfig.{name}: must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"RLHFConfig.noise: must be in [0, 1], got {self.noise}")
        if not self.annotator_biases:
            raise ValueError("RLHFConfig.annotator_biases: need at least one annotator")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"RLHFConfig.heldout_fraction: must be in [0, 1), got {self.heldout_fraction}")
        if self.lr <= 0:
            raise ValueError(f"RLHFConfig.lr: must be positive, got {self.lr}")

    def cache_key(self) -> str:
        settings = {k: v for k, v in asdict(self).items() if k != "sft"}
        payload = json.dumps({"version": RLHF_FORMAT_VERSION, "sft": self.sft.cache_key(), **settings},
                             sort_keys=True, default=list)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def reward_model_cache_path(config: RLHFConfig | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where the reward model for `config` lives in the cache; builds nothing."""
    config = config or RLHFConfig()
    return Path(cache_dir or DEFAULT_CACHE_DIR) / "reward_model" / config.cache_key()


def is_built(path: str | Path) -> bool:
    from value_model.reward_model import REWARD_MODEL_INFO

    return (Path(path) / REWARD_MODEL_INFO).is_file()


def reward_model_dir(config: RLHFConfig | None = None, cache_dir: str | Path | None = None,
                     progress: bool = True, force: bool = False) -> Path:
    """The directory of the cached reward model for `config`, building it if needed.

    Several runs may ask at once on a fresh machine: one builds, the others wait on the
    lock and then find the finished model (as `ppo.models.sft.warm_start`).
    """
    config = config or RLHFConfig()
    output_dir = reward_model_cache_path(config, cache_dir)
    if is_built(output_dir) and not force:
        return output_dir
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(output_dir.parent / f"{config.cache_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_built(output_dir) and not force:
                return output_dir
            return build_reward_model(config, output_dir, cache_dir=cache_dir, progress=progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_reward_model(config: RLHFConfig, output_dir: str | Path, cache_dir: str | Path | None = None,
                       progress: bool = True) -> Path:
    """Run the whole pipeline for `config` and save the reward model to `output_dir`.

    ``output_dir`` gets the model (``ScalarHeadModel.save_pretrained``), the tokenizer,
    ``preferences.jsonl`` (every labelled pair, training and held-out) and
    ``reward_model_info.json`` (config, metrics, normalisation offset, timings).
    """
    import torch

    from value_model.reward_model import (normalize_reward_model, pairwise_metrics, save_reward_model, score_texts,
                                         split_pairs, train_reward_model)

    from ppo.models.policy import load_policy
    from ppo.models.sft import warm_start
    from ppo.tasks.preferences import (AnnotatorPool, PreferenceTask, build_preference_dataset, pair_difference,
                                    sample_responses, validate_preferences)

    start = time.perf_counter()
    torch.set_num_threads(config.threads)
    sft_dir = warm_start(config.sft, cache_dir=cache_dir, progress=progress)
    torch.set_num_threads(config.threads)  # training the warm start sets its own thread count
    policy, tokenizer = load_policy(sft_dir)
    task = PreferenceTask()
    max_new_tokens = config.sft.max_new_tokens

    # ---- 1. preference pairs from the SFT policy, labelled by the noisy pool ----------
    pool = AnnotatorPool(len(config.annotator_biases), config.noise, config.annotator_biases, seed=config.seed)
    rows = build_preference_dataset(policy, tokenizer, task, config.n_pairs, seed=config.seed, pool=pool,
                                    max_new_tokens=max_new_tokens, prompts_per_batch=config.prompts_per_batch,
                                    progress=progress)
    sample_seconds = time.perf_counter() - start

    # ---- 2. Bradley-Terry reward model -------------------------------------------------
    model, metrics = train_reward_model(sft_dir, rows, epochs=config.epochs, batch_size=config.batch_size,
                                        lr=config.lr, heldout_fraction=config.heldout_fraction, seed=config.seed,
                                        progress=progress)

    # Where the reward model is right: held-out pairs split by what separates the two
    # responses under the gold reward (correctness, format, or only the re-check count).
    _, heldout = split_pairs(rows, config.heldout_fraction, config.seed)
    for kind in ("correctness", "format", "brevity"):
        subset = [r for r in heldout if pair_difference(r) == kind]
        if subset:
            breakdown = pairwise_metrics(model, tokenizer, subset)
            metrics[f"heldout_{kind}_pairs"] = breakdown["pairs"]
            metrics[f"heldout_{kind}_accuracy_gold"] = breakdown["accuracy_gold"]

    # ---- 3. normalisation: fresh SFT samples score 0 on average ----------------------
    problems = task.sample_problems(config.normalization_samples, random.Random(config.seed + 1))
    texts, has_eos, _ = sample_responses(policy, tokenizer, problems, max_new_tokens, seed=config.seed + 1)
    prompts = [p.prompt for p in problems]
    offset = normalize_reward_model(model, tokenizer, prompts, texts, has_eos)
    mean_after = score_texts(model, tokenizer, prompts, texts, has_eos).mean().item()

    validate_preferences(rows)
    info = {
        "config": json.loads(json.dumps(asdict(config), default=list)),
        "sft_dir": str(sft_dir),
        "metrics": metrics,
        "normalization": {"offset": offset, "samples": len(texts), "mean_after": mean_after},
        "label_counts": {"a": sum(r["preferred"] == "a" for r in rows), "b": sum(r["preferred"] == "b" for r in rows)},
        "sample_seconds": sample_seconds,
        "build_seconds": time.perf_counter() - start,
    }
    preferences = "".join(json.dumps(row) + "\n" for row in rows)
    return save_reward_model(model, tokenizer, output_dir, info, extra_files={"preferences.jsonl": preferences})


def format_info(info: dict) -> str:
    """The reward model's held-out accuracies and normalisation, for humans."""
    metrics = info["metrics"]
    lines = [
        f"pairs: {metrics['train_pairs']} train, {metrics['heldout_pairs']} held out "
        f"(noise {info['config']['noise']}, annotator biases {info['config']['annotator_biases']})",
        f"held-out accuracy vs noisy labels: {metrics.get('heldout_accuracy_noisy', float('nan')):.3f}",
        f"held-out accuracy vs gold:         {metrics.get('heldout_accuracy_gold', float('nan')):.3f} "
        f"(on {metrics.get('heldout_gold_pairs', 0)} pairs with a gold winner; the labels themselves agree with "
        f"gold on {metrics.get('heldout_label_gold_agreement', float('nan')):.3f})",
        "  by what separates the pair: " + ", ".join(
            f"{kind} {metrics[f'heldout_{kind}_accuracy_gold']:.3f} ({metrics[f'heldout_{kind}_pairs']} pairs)"
            for kind in ("correctness", "format", "brevity") if f"heldout_{kind}_pairs" in metrics),
        f"train accuracy vs noisy labels:    {metrics.get('train_accuracy_noisy', float('nan')):.3f}",
        f"normalisation: subtracted {info['normalization']['offset']:.4f} from the head bias; mean SFT reward now "
        f"{info['normalization']['mean_after']:.2e} over {info['normalization']['samples']} samples",
        f"built in {info['build_seconds']:.0f}s ({info['sample_seconds']:.0f}s sampling pairs)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.tasks.rlhf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or find in the cache) the reward model and print its accuracy")
    path = commands.add_parser("path", help="print the cache directory of the reward model (builds nothing)")
    for sub in (build, path):
        sub.add_argument("--pairs", type=int, default=RLHFConfig.n_pairs, help="labelled preference pairs")
        sub.add_argument("--seed", type=int, default=RLHFConfig.seed)
        sub.add_argument("--noise", type=float, default=RLHFConfig.noise, help="coin-flip label noise probability")
        sub.add_argument("--epochs", type=int, default=RLHFConfig.epochs, help="reward-model training epochs")
        sub.add_argument("--biases", type=float, nargs="+", default=list(RLHFConfig.annotator_biases),
                         help="one length preference per annotator (gold units per character); sets the pool size")
        sub.add_argument("--cache-dir", default=None, help=f"default: {DEFAULT_CACHE_DIR}")
    build.add_argument("--out", default=None, help="also copy the finished reward model to this directory")
    build.add_argument("--force", action="store_true", help="rebuild even if a cached reward model exists")
    args = parser.parse_args(argv)
    config = RLHFConfig(seed=args.seed, n_pairs=args.pairs, noise=args.noise, epochs=args.epochs,
                         annotator_biases=tuple(args.biases))
    if args.command == "path":
        print(reward_model_cache_path(config, args.cache_dir))
        return 0
    if args.out and Path(args.out).exists() and not is_built(args.out):  # never remove what it did not write
        parser.error(f"--out {args.out}: exists and holds no reward model; give a new directory")
    model_dir = reward_model_dir(config, cache_dir=args.cache_dir, force=args.force)
    if args.out:
        out = Path(args.out)
        if out.exists():
            shutil.rmtree(out)  # an earlier copy of a reward model, replaced
        shutil.copytree(model_dir, out)
        model_dir = out
    from value_model.reward_model import load_reward_model_info

    print(f"reward model: {model_dir}")
    print(format_info(load_reward_model_info(model_dir)))
    print("next: ppo-train --preset alpacafarm --testbed --task preference "
          f"--reward-model-path {model_dir} --value-init reward_model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

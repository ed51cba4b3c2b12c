"""``python -m ppo.tasks.rlhf build``: the simulated-preference RLHF pipeline up to the reward model.

    SFT warm start  ->  pairs of SFT samples  ->  labels from a noisy annotator pool
                    ->  Bradley-Terry reward model  ->  normalised on SFT samples  ->  saved

Then PPO trains against that reward model while the hidden gold reward is only measured
(``ppo-train --preset alpacafarm --testbed --task preference --reward-model-path DIR
--value-init reward_model``; docs/alpacafarm.md walks through it).

**The pinned reward model.** Like the SFT warm start (`ppo.models.sft.warm_start`), the build is
deterministic on one kind of CPU but not across kinds (two CPUs round the same products
differently, and the sampled pairs, then the reward model, drift apart). So the default
build, its preference data included, is shipped under ``ppo/tasks/reward_model/<key>/``
(`PINNED_DIR`, a few MB) and `reward_model_dir` returns it for the default settings after
checking its files against the digests its info records
(`value_model.reward_model.check_reward_model_digests`). Any other settings are built and
cached under the cache directory, keyed by every setting of `RLHFConfig` including the SFT
config. `reward_model_path` gives the directory runs read without building anything (the
ablation registry uses it at import time); `reward_model_dir` builds it if needed, under a
file lock. ``build --rebuild`` builds the default again on the machine at hand (into the
cache) and prints how close it comes to the pinned one (`compare_to_pinned`); ``describe``
writes the pinned model's numbers into docs/alpacafarm.md (`reward_model_markdown`).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ppo.models.sft import DEFAULT_CACHE_DIR, SFTConfig

# Bump when the pipeline (gold reward, annotators, reward-model recipe) changes, so old
# caches are not reused.
RLHF_FORMAT_VERSION = 1
# The shipped reward models, one directory per cache key (ppo/tasks/reward_model/README.md).
PINNED_DIR = Path(__file__).resolve().parent / "reward_model"
SOURCE_ROOT = Path(__file__).resolve().parents[2]
# The block of docs/alpacafarm.md that `describe --update` writes.
DOC_BLOCK = "reward_model"


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


def pinned_path(config: RLHFConfig | None = None) -> Path | None:
    """The shipped directory of `config`'s reward model, or None when its settings are not pinned."""
    path = PINNED_DIR / (config or RLHFConfig()).cache_key()
    return path if is_built(path) else None


def reward_model_path(config: RLHFConfig | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where runs read the reward model of `config`: the shipped directory for the pinned
    settings, else its place in the cache (`reward_model_cache_path`). Builds nothing."""
    return pinned_path(config) or reward_model_cache_path(config, cache_dir)


def is_built(path: str | Path) -> bool:
    from value_model.reward_model import REWARD_MODEL_INFO

    return (Path(path) / REWARD_MODEL_INFO).is_file()


def reward_model_dir(config: RLHFConfig | None = None, cache_dir: str | Path | None = None,
                     progress: bool = True, force: bool = False) -> Path:
    """The directory of the reward model for `config`: the shipped one for the pinned settings
    (its files checked against their recorded digests) unless `force`, else the cached one,
    built if needed (or again, with `force`).

    Several runs may ask at once on a fresh machine: one builds, the others wait on the
    lock and then find the finished model (as `ppo.models.sft.warm_start`).
    """
    from value_model.reward_model import check_reward_model_digests

    config = config or RLHFConfig()
    pinned = pinned_path(config)
    if pinned is not None and not force:
        check_reward_model_digests(pinned)
        return pinned  # identical bits on every machine
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
    ``reward_model_info.json`` (config, metrics, normalisation offset, timings, where it was
    built, and the digests of its files and weights: `reward_model_digests`).
    """
    import torch

    from value_model.reward_model import (REWARD_MODEL_INFO, normalize_reward_model, pairwise_metrics,
                                         reward_model_digests, save_reward_model, score_texts, split_pairs,
                                         train_reward_model)

    from ppo.run import provenance

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
    built = provenance.collect(str(sft_dir), config.threads)
    info = {
        "config": json.loads(json.dumps(asdict(config), default=list)),
        "sft_dir": _portable(sft_dir),
        "metrics": metrics,
        "normalization": {"offset": offset, "samples": len(texts), "mean_after": mean_after},
        "label_counts": {"a": sum(r["preferred"] == "a" for r in rows), "b": sum(r["preferred"] == "b" for r in rows)},
        "built_with": {key: built[key] for key in ("commit", "dirty", "warm_start", "torch", "transformers", "python",
                                                   "threads", "cpu")},
        "sample_seconds": sample_seconds,
        "build_seconds": time.perf_counter() - start,
    }
    preferences = "".join(json.dumps(row) + "\n" for row in rows)
    output_dir = save_reward_model(model, tokenizer, output_dir, info, extra_files={"preferences.jsonl": preferences})
    # The digests of the files as saved, then the info again (a temporary file and a rename).
    info.update(reward_model_digests(output_dir))
    tmp = output_dir / f"{REWARD_MODEL_INFO}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True, default=str))
    os.replace(tmp, output_dir / REWARD_MODEL_INFO)
    return output_dir


def _portable(path: str | Path) -> str:
    """`path` relative to the source tree when inside it (a shipped directory must not name the
    machine it was built on), else absolute."""
    path = Path(path).resolve()
    return path.relative_to(SOURCE_ROOT).as_posix() if path.is_relative_to(SOURCE_ROOT) else str(path)


def sft_dir_of(info: dict) -> Path:
    """The SFT warm start a reward model was built from (its info's ``sft_dir``)."""
    path = Path(info["sft_dir"])
    return path if path.is_absolute() else SOURCE_ROOT / path


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
    ]
    if "weights_sha256" in info:
        lines.append(f"weights sha256 {info['weights_sha256'][:16]}; preferences.jsonl sha256 "
                     f"{info['files_sha256'].get('preferences.jsonl', '?')[:16]}")
    if "built_with" in info:
        built = info["built_with"]
        lines.append(f"built at commit {str(built['commit'])[:12]} on {built['cpu']} (torch {built['torch']}, "
                     f"{built['threads']} thread(s)) in {info['build_seconds']:.0f}s "
                     f"({info['sample_seconds']:.0f}s sampling pairs)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- a rebuild against the pin
def _load_scorer(path: Path):
    from value_model import ScalarHeadModel

    from ppo.models.policy import load_tokenizer

    return ScalarHeadModel.from_pretrained(path).eval().requires_grad_(False), load_tokenizer(path)


def _heldout(path: Path, info: dict) -> list[dict]:
    from value_model.reward_model import split_pairs

    from ppo.tasks.preferences import load_preferences

    rows = load_preferences(path / "preferences.jsonl")
    return split_pairs(rows, info["config"]["heldout_fraction"], info["config"]["seed"])[1]


def closeness(rebuilt: Path, pinned: Path) -> dict:
    """How close a rebuilt reward model and its preference data come to the pinned ones.

    ``identical``: the weights are bit-identical (equal `weights_sha256`). ``max_weight_diff``:
    the largest absolute difference of any weight (backbone and head). ``heldout``: held-out
    accuracy against the noisy labels and against gold of each model (``pinned_model`` /
    ``rebuilt_model``) on each build's held-out pairs (``pinned_data`` / ``rebuilt_data``), so
    both ways. ``same_pairs``: the share of rows whose prompt and two responses are the same
    in both files, ``label_agreement``: the share of those rows with the same label, and
    ``ranking_agreement``: the share of the pinned held-out pairs the two models rank the
    same way.
    """
    import torch
    from safetensors.torch import load_file

    from value_model.reward_model import load_reward_model_info, pairwise_metrics, reward_model_digests, score_texts

    from ppo.tasks.preferences import load_preferences

    infos = {"pinned": load_reward_model_info(pinned), "rebuilt": load_reward_model_info(rebuilt)}
    digests = {"pinned": reward_model_digests(pinned), "rebuilt": reward_model_digests(rebuilt)}
    largest = 0.0
    for name in ("model.safetensors", "scalar_head.safetensors"):
        a, b = load_file(str(rebuilt / name)), load_file(str(pinned / name))
        largest = max([largest] + [float((a[k].double() - b[k].double()).abs().max()) for k in a])
    scorers = {"pinned": _load_scorer(pinned), "rebuilt": _load_scorer(rebuilt)}
    heldout = {"pinned": _heldout(pinned, infos["pinned"]), "rebuilt": _heldout(rebuilt, infos["rebuilt"])}
    accuracies = {}
    for model in ("pinned", "rebuilt"):
        for data in ("pinned", "rebuilt"):
            metrics = pairwise_metrics(*scorers[model], heldout[data])
            accuracies[f"{model}_model/{data}_data"] = {"noisy": metrics["accuracy_noisy"],
                                                        "gold": metrics.get("accuracy_gold", float("nan"))}
    rows = {"pinned": load_preferences(pinned / "preferences.jsonl"),
            "rebuilt": load_preferences(rebuilt / "preferences.jsonl")}
    keys = ("prompt", "response_a", "response_b")
    same = [(a, b) for a, b in zip(rows["pinned"], rows["rebuilt"]) if all(a[k] == b[k] for k in keys)]
    prompts = [row["prompt"] for row in heldout["pinned"]]
    margins = {}
    for model, (scorer, tokenizer) in scorers.items():
        scores = [score_texts(scorer, tokenizer, prompts, [row[f"response_{side}"] for row in heldout["pinned"]],
                              [bool(row.get(f"eos_{side}", True)) for row in heldout["pinned"]]) for side in "ab"]
        margins[model] = scores[0] - scores[1]
    return {
        "identical": digests["pinned"]["weights_sha256"] == digests["rebuilt"]["weights_sha256"],
        "same_preferences": (digests["pinned"]["files_sha256"].get("preferences.jsonl")
                             == digests["rebuilt"]["files_sha256"].get("preferences.jsonl")),
        "max_weight_diff": largest,
        "heldout": accuracies,
        "same_pairs": len(same) / max(1, len(rows["pinned"])),
        "label_agreement": sum(a["preferred"] == b["preferred"] for a, b in same) / max(1, len(same)),
        "ranking_agreement": float((torch.sign(margins["pinned"]) == torch.sign(margins["rebuilt"])).float().mean()),
    }


def compare_to_pinned(rebuilt: Path, pinned: Path) -> str:
    """What a rebuild on this machine gives against the shipped reward model, as text."""
    near = closeness(rebuilt, pinned)
    if near["identical"] and near["same_preferences"]:
        return f"bits: identical to the pinned reward model and preference data ({pinned})"
    lines = [f"bits: DIFFERENT from the pinned reward model ({pinned}); largest weight difference "
             f"{near['max_weight_diff']:.3g}",
             f"preference data: {near['same_pairs']:.3f} of the rows hold the same pair; on those the labels "
             f"agree {near['label_agreement']:.3f}",
             f"the two models rank the pinned held-out pairs the same way on {near['ranking_agreement']:.3f} of them",
             "held-out accuracy (noisy labels / gold)   pinned pairs     rebuilt pairs"]
    for model in ("pinned", "rebuilt"):
        cells = [near["heldout"][f"{model}_model/{data}_data"] for data in ("pinned", "rebuilt")]
        lines.append(f"{model + ' model':<40} " + "    ".join(f"{c['noisy']:.3f} / {c['gold']:.3f}" for c in cells))
    lines.append("RLHF runs score with the pinned reward model either way; this rebuild stays in the cache.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- the docs' numbers
def reward_model_markdown(path: str | Path | None = None) -> str:
    """The generated block of docs/alpacafarm.md: the pinned reward model's numbers, every one
    read from its committed ``reward_model_info.json`` and ``preferences.jsonl``, with where they
    come from. `path`: a reward-model directory (default: the pinned one)."""
    from value_model.reward_model import load_reward_model_info

    from ppo.tasks.preferences import load_preferences, pair_difference

    path = Path(path) if path is not None else pinned_path()
    if path is None:
        raise FileNotFoundError(f"no pinned reward model under {PINNED_DIR}")
    info = load_reward_model_info(path)
    metrics, built = info["metrics"], info.get("built_with", {})
    rows = load_preferences(path / "preferences.jsonl")
    decided = [row for row in rows if row["gold_a"] != row["gold_b"]]
    agree = sum((row["preferred"] == "a") == (row["gold_a"] > row["gold_b"]) for row in decided)
    kinds = {kind: sum(pair_difference(row) == kind for row in rows) for kind in ("correctness", "format", "brevity")}
    shown = _portable(path)

    def by(kind: str) -> str:
        pairs = metrics.get(f"heldout_{kind}_pairs", 0)
        if not pairs:
            return "no held-out pair"
        return f"{metrics[f'heldout_{kind}_accuracy_gold']:.3f} ({pairs} pair{'s' if pairs != 1 else ''})"

    lines = [
        f"From the pinned reward model [`{shown}/`](../{shown}/) (weights sha256 "
        f"`{info['weights_sha256'][:16]}`, `preferences.jsonl` sha256 "
        f"`{info['files_sha256']['preferences.jsonl'][:16]}`), built at commit `{str(built.get('commit'))[:12]}` "
        f"on {built.get('cpu', 'an unrecorded CPU')} with torch {built.get('torch', '?')} and "
        f"{built.get('threads', '?')} thread(s); written by `python -m ppo.tasks.rlhf describe --update "
        "docs/alpacafarm.md`, and `tests/test_rlhf.py` recomputes the held-out accuracies from the files.",
        "",
        "| | |",
        "|---|---|",
        f"| labelled pairs (training / held out) | {len(rows)} "
        f"({metrics['train_pairs']} / {metrics['heldout_pairs']}) |",
        f"| pairs by what separates them under gold: correctness / format / re-checks only | "
        f"{kinds['correctness']} / {kinds['format']} / {kinds['brevity']} |",
        f"| labels that agree with gold (the {len(decided)} pairs with a gold winner) | {agree / len(decided):.3f} |",
        f"| held-out accuracy against the noisy labels | {metrics['heldout_accuracy_noisy']:.3f} |",
        f"| held-out accuracy against gold ({metrics['heldout_gold_pairs']} pairs with a gold winner) | "
        f"{metrics['heldout_accuracy_gold']:.3f} |",
        f"| ... on pairs that differ in correctness | {by('correctness')} |",
        f"| ... on pairs that differ in format (a missing EOS or answer) | {by('format')} |",
        f"| ... on pairs that differ only in the number of re-checks | {by('brevity')} |",
        f"| training accuracy against the noisy labels | {metrics['train_accuracy_noisy']:.3f} |",
        f"| normalisation: mean score of {info['normalization']['samples']} SFT samples subtracted from the head's "
        f"bias | {info['normalization']['offset']:.4f} |",
    ]
    return "\n".join(lines) + "\n"


def update_doc(doc: Path, content: str) -> bool:
    """Rewrite the ``<!-- generated:reward_model -->`` block of `doc` with `content`; True if it changed."""
    import re

    text = doc.read_text()
    pattern = re.compile(rf"(<!-- generated:{DOC_BLOCK} -->\n).*?(<!-- /generated:{DOC_BLOCK} -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"{doc}: no <!-- generated:{DOC_BLOCK} --> ... <!-- /generated:{DOC_BLOCK} --> block")
    new = pattern.sub(lambda match: match.group(1) + content + match.group(2), text)
    doc.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.tasks.rlhf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="the reward model (pinned, cached or built) and its accuracy")
    path = commands.add_parser("path", help="print the directory runs read the reward model from (builds nothing)")
    describe = commands.add_parser("describe",
                                   help="the pinned reward model's numbers as markdown (docs/alpacafarm.md)")
    describe.add_argument("--update", metavar="MARKDOWN", help="rewrite the generated:reward_model block of this file")
    for sub in (build, path):
        sub.add_argument("--pairs", type=int, default=RLHFConfig.n_pairs, help="labelled preference pairs")
        sub.add_argument("--seed", type=int, default=RLHFConfig.seed)
        sub.add_argument("--noise", type=float, default=RLHFConfig.noise, help="coin-flip label noise probability")
        sub.add_argument("--epochs", type=int, default=RLHFConfig.epochs, help="reward-model training epochs")
        sub.add_argument("--biases", type=float, nargs="+", default=list(RLHFConfig.annotator_biases),
                         help="one length preference per annotator (gold units per character); sets the pool size")
        sub.add_argument("--cache-dir", default=None, help=f"default: {DEFAULT_CACHE_DIR}")
    build.add_argument("--out", default=None, help="also copy the finished reward model to this directory")
    build.add_argument("--rebuild", "--force", dest="force", action="store_true",
                       help="build it again here (into the cache), even if pinned or cached; for the pinned "
                            "settings, print how close the rebuild comes to the pinned reward model")
    args = parser.parse_args(argv)
    if args.command == "describe":
        content = reward_model_markdown()
        if args.update:
            changed = update_doc(Path(args.update), content)
            print(f"{args.update}: generated:{DOC_BLOCK} block {'updated' if changed else 'already current'}")
        else:
            print(content, end="")
        return 0
    config = RLHFConfig(seed=args.seed, n_pairs=args.pairs, noise=args.noise, epochs=args.epochs,
                         annotator_biases=tuple(args.biases))
    if args.command == "path":
        print(reward_model_path(config, args.cache_dir))
        return 0
    if args.out and Path(args.out).exists() and not is_built(args.out):  # never remove what it did not write
        parser.error(f"--out {args.out}: exists and holds no reward model; give a new directory")
    model_dir = reward_model_dir(config, cache_dir=args.cache_dir, force=args.force)
    pinned = pinned_path(config)
    if args.out:
        out = Path(args.out)
        if out.exists():
            shutil.rmtree(out)  # an earlier copy of a reward model, replaced
        shutil.copytree(model_dir, out)
        model_dir = out
    from value_model.reward_model import load_reward_model_info

    print(f"reward model: {model_dir}" + (" (pinned: the same bits on every machine)" if model_dir == pinned else ""))
    print(format_info(load_reward_model_info(model_dir)))
    if args.force and pinned is not None:
        print(compare_to_pinned(model_dir, pinned))
    print("next: ppo-train --preset alpacafarm --testbed --task preference "
          f"--reward-model-path {model_dir} --value-init reward_model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

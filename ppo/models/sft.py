"""SFT warm start: train the tiny testbed model on the task's demonstrations.

RL fine-tunes a policy that can already do the task sometimes; from a random model the
reward would almost always be 0 and nothing would be learned. This module trains the tiny
model just long enough to be *partially* competent (held-out sampled accuracy roughly
20-50%), leaving RL room to improve, and caches the result on disk keyed by its settings so
every run, test and ablation starts from the same, deterministic checkpoint.

**The pinned warm start.** Training is deterministic on one kind of CPU, but two kinds of
CPU round the same products differently, so the same commit builds different weights on
different machines. Results must start from identical bits everywhere, so the canonical
warm start (and the weaker checkpoint `PPOConfig.warm_start_steps` uses in the ablations) is
shipped in the package under ``ppo/models/warm_start/`` (a few MB of safetensors). `warm_start()`
returns it when asked for the pinned settings; any other settings are trained and cached.

Run ``ppo-sft`` (or ``python -m ppo.models.sft``) to print the warm start's held-out baseline;
``--rebuild`` trains it again here and reports whether the bits equal the pinned ones and,
when they do not, how far the held-out scores are.
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

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ppo.run.evaluation import evaluate, format_eval
from ppo.models.policy import encode_prompts, left_pad, position_ids_from_mask
from ppo.tasks.arithmetic import LEVELS, ArithmeticTask
from ppo.models.tiny_model import TinyModelConfig, build_char_tokenizer, build_tiny_model

# Bump when the SFT recipe or the task's text format changes, so old caches are not reused.
SFT_FORMAT_VERSION = 3
DEFAULT_CACHE_DIR = Path(os.environ.get("PPO_CACHE_DIR", Path(__file__).resolve().parents[2] / ".cache"))
# The shipped warm starts, one directory per cache name (ppo/models/warm_start/README.md).
PINNED_DIR = Path(__file__).resolve().parent / "warm_start"


@dataclass
class SFTConfig:
    """Settings of the warm start; all of them are part of the cache key."""

    seed: int = 0
    steps: int = 700  # tuned so the policy is partially competent (see module docstring)
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    levels: tuple = LEVELS
    max_checks: int = 3
    slip_rate: float = 0.2  # noisy demonstrator (see ArithmeticTask.slip_rate)
    max_new_tokens: int = 64  # generation budget for evaluation (and the RL default)
    threads: int = 2  # torch intra-op threads: fixed so the result is deterministic

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = TinyModelConfig(**self.model)
        self.levels = tuple(tuple(level) for level in self.levels)
        for name in ("steps", "batch_size", "max_new_tokens", "threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SFTConfig.{name}: must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"SFTConfig.lr: must be positive, got {self.lr}")

    def task(self) -> ArithmeticTask:
        return ArithmeticTask(levels=self.levels, max_checks=self.max_checks, slip_rate=self.slip_rate)

    def cache_key(self) -> str:
        payload = json.dumps({"version": SFT_FORMAT_VERSION, **asdict(self)}, sort_keys=True, default=list)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def demonstration_batch(tokenizer, problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask, labels)` for SFT; labels are -100 outside the response.

    The target is the demonstration followed by EOS, so the model learns to stop.
    """
    for problem in problems:
        if problem.demonstration is None:
            raise ValueError(f"problem {problem.prompt!r} has no demonstration to train on")
    prompt_ids = encode_prompts(tokenizer, [p.prompt for p in problems])
    # one tokenizer call for the batch's demonstrations (the same ids as one call each)
    responses = tokenizer([p.demonstration for p in problems], add_special_tokens=False)["input_ids"]
    sequences, label_rows = [], []
    for ids, response in zip(prompt_ids, responses):
        response = list(response) + [tokenizer.eos_token_id]
        sequences.append(ids + response)
        label_rows.append([-100] * len(ids) + response)
    input_ids, attention_mask = left_pad(sequences, tokenizer.pad_token_id)
    labels, _ = left_pad(label_rows, -100)  # -100 on the prompt and the padding
    return input_ids, attention_mask, labels


def sft_loss(model, input_ids, attention_mask, labels) -> torch.Tensor:
    """Mean next-token cross-entropy over response tokens."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask)).logits  # [B, L, V]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def train_sft(config: SFTConfig, output_dir: str | Path | None = None, progress: bool = True,
              stop_after: int | None = None):
    """Train the warm start from scratch; returns `(model, tokenizer)` (and saves if asked).

    `stop_after` ends the run after that many steps with the learning-rate schedule of the
    full `config.steps` run unchanged: the result is the full run's own intermediate
    checkpoint (same batches, same updates), not a shorter run with its own schedule.
    """
    if stop_after is not None and not 1 <= stop_after <= config.steps:
        raise ValueError(f"stop_after must be in [1, {config.steps}] (SFTConfig.steps), got {stop_after}")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    task = config.task()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(config.model, tokenizer)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / config.warmup_steps)
        * max(0.0, 1 - max(0, step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)),
    )
    bar = tqdm(range(stop_after or config.steps), desc="SFT warm start", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        batch = demonstration_batch(tokenizer, task.sample_problems(config.batch_size, rng))
        loss = sft_loss(model, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    if output_dir is not None:
        save_atomically(model, tokenizer, Path(output_dir))
    return model, tokenizer


def save_atomically(model, tokenizer, output_dir: Path, extra: dict | None = None) -> None:
    """Write to a temporary sibling directory, then rename: never a half-written model.

    `extra` maps file names to payloads written next to the model: text as is, anything
    else as JSON.
    """
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = output_dir.with_name(output_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)
    for name, payload in (extra or {}).items():
        text = payload if isinstance(payload, str) else json.dumps(payload, indent=2, sort_keys=True, default=str)
        (tmp_dir / name).write_text(text)
    if output_dir.exists():
        shutil.rmtree(output_dir)
    os.replace(tmp_dir, output_dir)


def warm_start(config: SFTConfig | None = None, cache_dir: str | Path | None = None,
               progress: bool = True, force: bool = False, stop_after: int | None = None) -> Path:
    """The directory of the cached SFT model for `config`, training it if needed.

    The pinned settings (``SFTConfig()``, and its step-200 checkpoint) return the shipped
    directory under ``ppo/models/warm_start/`` unless `force`, which trains into the cache. The
    directory also holds ``sft_info.json`` with the config, training time, the weights'
    digest (`weights_sha256`) and the held-out baseline metrics. `stop_after` (PPOConfig.warm_start_steps) asks for the
    run's checkpoint after that many steps, a weaker start cached next to the full one;
    `stop_after == config.steps` is the full warm start itself.
    """
    config = config or SFTConfig()
    cache_dir = Path(cache_dir or DEFAULT_CACHE_DIR)
    if stop_after == config.steps:
        stop_after = None
    name = config.cache_key() + (f"-step{stop_after}" if stop_after is not None else "")
    if (PINNED_DIR / name / "sft_info.json").is_file() and not force:
        return PINNED_DIR / name  # identical bits on every machine
    output_dir = cache_dir / "sft" / name
    return build_once(output_dir, "sft_info.json", lambda: _train_and_save(config, output_dir, progress, stop_after),
                      force)


def build_once(output_dir: Path, done_file: str, build, force: bool = False) -> Path:
    """`output_dir` when `done_file` is in it (unless `force`), else what `build()` returns,
    built under an exclusive lock beside the directory (``NAME.lock``). Several runs of a sweep
    may start at once on a fresh machine: one builds, the others wait on the lock and then find
    the finished model. Used by the warm start and the testbed teacher (ppo/models/teacher.py)."""
    if (output_dir / done_file).is_file() and not force:
        return output_dir
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(output_dir.parent / f"{output_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (output_dir / done_file).is_file() and not force:
                return output_dir
            return build()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _train_and_save(config: SFTConfig, output_dir: Path, progress: bool, stop_after: int | None = None) -> Path:
    start = time.perf_counter()
    model, tokenizer = train_sft(config, progress=progress, stop_after=stop_after)
    train_seconds = time.perf_counter() - start
    metrics = evaluate(model, tokenizer, config.task(), config.max_new_tokens, seed=config.seed)
    info = {"config": json.loads(json.dumps(asdict(config), default=list)),
            "steps_trained": stop_after or config.steps,
            "train_seconds": train_seconds, "eval": metrics}
    save_atomically(model, tokenizer, output_dir, extra={"sft_info.json": info})
    # The digest of the weights as saved (tied weights are saved once), then the info again.
    info["weights_sha256"] = weights_sha256(output_dir)
    tmp = output_dir / f"sft_info.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True, default=str))
    os.replace(tmp, output_dir / "sft_info.json")
    return output_dir


def load_sft_info(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / "sft_info.json").read_text())


def state_sha256(state_dict: dict) -> str:
    """A digest of a model's weights: names, dtypes, shapes and bytes, in name order. Equal
    digests mean bit-identical weights, whatever file format or metadata holds them."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def weights_sha256(model_dir: str | Path) -> str:
    """`state_sha256` of the safetensors weights saved in `model_dir`."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights to hash")
    state = {}
    for path in files:
        state.update(load_file(str(path)))
    return state_sha256(state)


def compare_to_pinned(rebuilt: Path, pinned: Path) -> str:
    """What a rebuild on this machine gives against the shipped warm start, as text."""
    ours, theirs = load_sft_info(rebuilt), load_sft_info(pinned)
    if weights_sha256(rebuilt) == weights_sha256(pinned):
        return f"bits: identical to the pinned warm start ({pinned})"
    from safetensors.torch import load_file

    a, b = load_file(str(rebuilt / "model.safetensors")), load_file(str(pinned / "model.safetensors"))
    largest = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    lines = [f"bits: DIFFERENT from the pinned warm start ({pinned}); largest weight difference {largest:.3g}",
             "held-out       rebuilt   pinned   difference"]
    for mode in ("greedy", "sampled"):
        x, y = ours["eval"][f"{mode}_accuracy"], theirs["eval"][f"{mode}_accuracy"]
        lines.append(f"{mode + ' accuracy':<14} {x:>7.3f}  {y:>7.3f}   {x - y:+.3f}")
    lines.append("RL runs start from the pinned warm start either way; this rebuild stays in the cache.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print the SFT warm start's held-out baseline (the pinned one for "
                                                 "the default settings; other settings are trained and cached).")
    parser.add_argument("--seed", type=int, default=SFTConfig.seed)
    parser.add_argument("--steps", type=int, default=SFTConfig.steps)
    parser.add_argument("--cache-dir", default=None, help=f"default: {DEFAULT_CACHE_DIR}")
    parser.add_argument("--rebuild", "--force", dest="force", action="store_true",
                        help="train it again here (into the cache) and compare with the pinned warm start")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="the run's checkpoint after this many steps (PPOConfig.warm_start_steps)")
    args = parser.parse_args(argv)
    config = SFTConfig(seed=args.seed, steps=args.steps)
    model_dir = warm_start(config, cache_dir=args.cache_dir, force=args.force, stop_after=args.stop_after)
    info = load_sft_info(model_dir)
    pinned = warm_start(config, stop_after=args.stop_after) if args.force else model_dir
    print(f"SFT warm start: {model_dir}" + (" (pinned: the same bits on every machine)"
                                            if model_dir.parent == PINNED_DIR else ""))
    trained = f"{info.get('steps_trained', config.steps)} of {config.steps} steps, seed {config.seed}"
    if model_dir.parent != PINNED_DIR:  # a pinned start was trained elsewhere: its time says nothing here
        trained += f", {info['train_seconds']:.1f}s"
    print(f"weights sha256 {info.get('weights_sha256', weights_sha256(model_dir))[:16]}; trained {trained}")
    print(f"held-out set: {len(config.task().eval_problems())} problems, levels {list(config.levels)} "
          "(operands, digits)")
    print(format_eval(info["eval"]))
    if args.force and pinned.parent == PINNED_DIR:
        print(compare_to_pinned(model_dir, pinned))


if __name__ == "__main__":
    main()

"""The teacher of on-policy distillation: loading it frozen, and the testbed's own teacher.

On-policy distillation (`PPOConfig.distill_coef`, `PPOConfig.distill_only`) scores the
student's own samples with a frozen teacher and trains on the per-token reverse KL to it
(`ppo.algorithm.distillation`). This module is where the teacher comes from.

Implementation details that live here:

- **Any local checkpoint** (`PPOConfig.teacher_model_path`, `resolve_teacher_path`,
  `load_teacher`): a Hugging Face causal LM directory, loaded like the policy (the same pad
  token convention, the same `model_dtype`), then frozen: eval mode, no gradients. A path
  that does not exist is refused with the path named before anything is loaded.
- **The same vocabulary** (`check_teacher_vocabulary`): the KL is a sum over the vocabulary
  at each position, token id by token id, so the teacher's output layer must have exactly as
  many ids as the policy's; a teacher of another size is refused naming both sizes. (Equal
  sizes with a different tokenizer would compare unrelated tokens: use the policy's own
  tokenizer family.)
- **The testbed's teacher** (``teacher_model_path="testbed"``, `testbed_teacher`): GRPO run
  on from the pinned SFT warm start (`ppo.models.sft`) for `TEACHER_STEPS` steps at a fixed
  seed, on the CPU, with the testbed's own settings (`preset("grpo", testbed=True)`,
  `TEACHER_RECIPE`). It is the warm start made stronger by more
  RL than any ablation arm gets, on the same tiny model and character tokenizer: so it shares
  the student's vocabulary exactly, and what a student distils from it is what more RL from
  the same start would have found. That makes the `distillation` ablation's question sharp:
  at equal samples, does imitating a better policy token by token (a dense signal at every
  position) reach as far as RL from the same start (one bit per response)?
  ``python -m ppo.models.teacher build`` builds it into the project's cache
  (``.cache/teacher/<key>``, the directory the SFT warm start is cached in) and prints its
  held-out accuracy against the warm start's; a run with ``teacher_model_path="testbed"``
  builds it the first time (with a message) and reuses it after. The build runs the RL
  trainer in a child process (``python -m ppo.cli``), so building it never touches the
  calling run's threads, seeds or devices; like the warm start, it is deterministic on one
  kind of CPU, and another kind of CPU may build different bits (`teacher_info.json`
  records the weights' digest and both accuracies).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ppo.models.policy import load_policy
from ppo.models.sft import DEFAULT_CACHE_DIR, SFT_FORMAT_VERSION, SFTConfig, build_once, weights_sha256

TESTBED = "testbed"  # the value of PPOConfig.teacher_model_path that names this module's teacher
# Bump when the recipe or what it is built from changes, so an old cached teacher is not reused.
TEACHER_FORMAT_VERSION = 1
# Twice the testbed's 100 steps and more than three times an ablation arm's 60, at the testbed's
# own rate: on the testbed that takes held-out sampled accuracy from about 0.34 to about 0.47.
TEACHER_STEPS = 200
# The build's `ppo-train` settings over `preset("grpo", testbed=True)` (the pinned warm start):
# no evaluation in between, one checkpoint at the end, fixed seed, threads and device.
TEACHER_RECIPE: dict = {
    "total_steps": TEACHER_STEPS, "seed": 1234, "threads": 1, "device": "cpu",
    "eval_every": 0, "save_every": 0, "keep_checkpoints": 1, "log_samples": 0, "report_to": "none",
}
INFO_FILE = "teacher_info.json"
# Launcher variables a child process must not inherit: it is one process, not a rank of the caller's job.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# ------------------------------------------------------------------------------ any teacher
def resolve_teacher_path(teacher_model_path: str, progress: bool = True, cache_dir: str | Path | None = None) -> Path:
    """The teacher directory `teacher_model_path` names: the testbed's teacher (built on first
    use) for ``"testbed"``, else the directory itself, which must exist."""
    if teacher_model_path == TESTBED:
        return testbed_teacher(progress=progress, cache_dir=cache_dir)
    path = Path(teacher_model_path)
    if not path.is_dir():
        found = "is a file, not a model directory" if path.exists() else "does not exist"
        raise ValueError(f"PPOConfig.teacher_model_path: {str(path)!r} {found}; give a local Hugging Face model "
                         f"directory, or {TESTBED!r} for the testbed's teacher (python -m ppo.models.teacher build)")
    return path


def vocabulary_size(model) -> int:
    """The number of token ids `model` gives a probability to: the rows of its output layer."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def check_teacher_vocabulary(policy, teacher, path: str | Path) -> None:
    """Refuse a teacher whose vocabulary size differs from the policy's (naming both)."""
    student, theirs = vocabulary_size(policy), vocabulary_size(teacher)
    if student != theirs:
        raise ValueError(f"PPOConfig.teacher_model_path: the teacher at {str(path)!r} has a vocabulary of {theirs} "
                         f"token ids and the policy {student}; on-policy distillation compares the two "
                         "distributions id by id over one vocabulary, so the teacher needs the policy's tokenizer")


def load_teacher(path: str | Path, policy, dtype: torch.dtype | str | None = torch.float32,
                 attn_implementation: str | None = None):
    """The teacher at `path`, frozen (eval mode, no gradients, dropout off), after checking
    its vocabulary against `policy`'s."""
    teacher, _ = load_policy(path, dropout=False, dtype=dtype, attn_implementation=attn_implementation)
    check_teacher_vocabulary(policy, teacher, path)
    return teacher.eval().requires_grad_(False)


# ------------------------------------------------------------------------------ the testbed's teacher
def recipe_key() -> str:
    """The cache key of the testbed teacher: its recipe and the warm start it starts from."""
    payload = json.dumps({"version": TEACHER_FORMAT_VERSION, "sft_version": SFT_FORMAT_VERSION,
                          "warm_start": SFTConfig().cache_key(), "recipe": TEACHER_RECIPE}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def testbed_teacher_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the testbed teacher is (or will be) cached: a pure function of the recipe."""
    return Path(cache_dir or DEFAULT_CACHE_DIR) / "teacher" / recipe_key()


def testbed_teacher(progress: bool = True, cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """The testbed teacher's directory, built first if it is not cached (or with `force`).
    Runs that start together wait on a lock while one of them builds it."""
    output_dir = testbed_teacher_dir(cache_dir)

    def build() -> Path:
        print(f"building the testbed teacher (GRPO from the warm start, {TEACHER_STEPS} steps on the CPU; "
              f"once, then cached in {output_dir}) ...", file=sys.stderr, flush=True)
        return build_testbed_teacher(output_dir, progress=progress)

    return build_once(output_dir, INFO_FILE, build, force)


def build_testbed_teacher(output_dir: Path, progress: bool = True) -> Path:
    """Run `TEACHER_RECIPE` with ``ppo-train`` in a child process and keep its final policy,
    with `teacher_info.json` (recipe, time, digest, held-out accuracy of teacher and warm start)."""
    root = Path(__file__).resolve().parents[2]
    env = {name: value for name, value in os.environ.items()
           if name not in _LAUNCHER_VARIABLES and not name.startswith("ACCELERATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="teacher-", dir=output_dir.parent) as scratch:
        run = Path(scratch) / "run"
        overrides = [f"--set={name}={value}" for name, value in {**TEACHER_RECIPE, "progress": progress}.items()]
        command = [sys.executable, "-m", "ppo.cli", "--preset", "grpo", "--testbed", *overrides,
                   "--output-dir", str(run)]
        start = time.perf_counter()
        finished = subprocess.run(command, env=env, cwd=root, stdout=None if progress else subprocess.DEVNULL,
                                  stderr=None if progress else subprocess.PIPE, text=True)
        seconds = time.perf_counter() - start
        if finished.returncode != 0:
            raise RuntimeError(f"building the testbed teacher failed ({' '.join(command)}):\n"
                               f"{(finished.stderr or '')[-4000:]}")
        summary = json.loads((run / "summary.json").read_text())
        final = sorted((run / "checkpoints").glob("step_*"))[-1] / "policy"
        staged = Path(scratch) / "teacher"
        shutil.copytree(final, staged)
        info = {"recipe": {"preset": "grpo", "testbed": True, **TEACHER_RECIPE}, "build_seconds": seconds,
                "weights_sha256": weights_sha256(staged), "warm_start_eval": summary["initial_eval"],
                "teacher_eval": summary["final_eval"], "provenance": summary.get("provenance", {})}
        (staged / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True, default=str))
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(staged, output_dir)
    return output_dir


def describe(info: dict) -> str:
    """The teacher against the warm start on the held-out set, as text."""
    lines = ["held-out          warm start   teacher   difference"]
    for mode in ("sampled", "greedy"):
        start, end = info["warm_start_eval"][f"{mode}_accuracy"], info["teacher_eval"][f"{mode}_accuracy"]
        lines.append(f"{mode + ' accuracy':<17} {start:>10.3f}  {end:>8.3f}   {end - start:+.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.models.teacher",
                                     description="The testbed's teacher for on-policy distillation "
                                                 "(PPOConfig.teacher_model_path='testbed').")
    parser.add_argument("command", choices=("build", "path"),
                        help="build: build it if it is not cached, then print its held-out accuracy against the "
                             "warm start's; path: print where it is cached")
    parser.add_argument("--force", action="store_true", help="build it again even if it is cached")
    parser.add_argument("--cache-dir", default=None, help=f"default: {DEFAULT_CACHE_DIR}")
    args = parser.parse_args(argv)
    if args.command == "path":
        print(testbed_teacher_dir(args.cache_dir))
        return 0
    model_dir = testbed_teacher(cache_dir=args.cache_dir, force=args.force)
    info = json.loads((model_dir / INFO_FILE).read_text())
    recipe = info["recipe"]
    print(f"testbed teacher: {model_dir}")
    print(f"GRPO from the pinned warm start: {recipe['total_steps']} steps, seed {recipe['seed']}, "
          f"threads {recipe['threads']}; built in {info['build_seconds']:.0f}s; weights sha256 "
          f"{info['weights_sha256'][:16]}")
    print(describe(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

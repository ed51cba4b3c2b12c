"""The simulated-preference task: AlpacaFarm-style RLHF on the arithmetic testbed.

AlpacaFarm replaces human raters by simulated annotators (LLM judges plus label noise) so
that RLHF can be studied cheaply, and judges the trained policies with a separate
evaluator. This module does the same on the scratchpad-addition testbed, where the
"true" quality of a response can be computed exactly:

- **The gold reward** (`gold_score`) is hidden from the learner. It is what we actually
  want: the right answer, said briefly and well-formed.
- **Simulated annotators** (`SimulatedAnnotator`, `AnnotatorPool`) see two responses to
  the same prompt and say which is better. They follow the gold reward, except that with
  probability `noise` their label is a fair coin flip (AlpacaFarm's label noise), and an
  annotator may carry a *bias* (here: a preference for longer responses).
- **Preference data** (`build_preference_dataset`): pairs of SFT samples labelled by the
  pool, saved as JSONL (`save_preferences` / `load_preferences`, validated).
- **`PreferenceTask`**: the arithmetic problems, scored by the gold reward. During RL the
  policy is trained on a reward model fitted to the preferences (`value_model.reward_model`,
  ``python -m ppo.tasks.rlhf build``); the trainer logs this task's score as ``gold_score``.
  `PreferenceTask.extra_eval` adds the held-out gold reward and the gold win rate against
  the SFT policy, the measurements that can reveal reward over-optimisation: the proxy
  (reward-model) score rising while the gold reward and the win rate stall or fall.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Sequence

import torch

from ppo.tasks.arithmetic import CHECK_PREFIX, ArithmeticTask, parse_answer
from ppo.tasks.base import Problem, Score

# The gold reward's secondary terms (see `gold_score`).
CHECK_PENALTY = 0.05  # per "chk" re-check step: the gold prefers brief answers
FORMAT_PENALTY = 0.5  # no EOS or no parseable answer after the "#" marker

BUILD_COMMAND = "python -m ppo.tasks.rlhf build"

PREFERENCE_FIELDS = ("prompt", "response_a", "response_b", "preferred", "gold_a", "gold_b", "annotator")


class MissingRewardModelError(FileNotFoundError):
    """The reward-model directory does not exist (or is not a finished build)."""


def require_reward_model(path: str | Path) -> Path:
    """`path` if it holds a saved scalar-head model, else a clear error naming the fix."""
    path = Path(path)
    if not (path / "scalar_head.json").is_file():
        raise MissingRewardModelError(
            f"{path}: no reward model here. Build the simulated-preference reward model first with "
            f"`{BUILD_COMMAND}` (it prints the directory; `python -m ppo.tasks.rlhf path` prints the default one), "
            "or pass --reward-model-path pointing at a directory written by ScalarHeadModel.save_pretrained.")
    from value_model.reward_model import check_reward_model_digests

    check_reward_model_digests(path)  # a built one records its files' digests
    return path


# ---------------------------------------------------------------------------------- the gold reward
def count_checks(response: str) -> int:
    """Number of ``chk`` re-check steps in a response.

    >>> count_checks("27+5=32;32+8=40;chk40;chk40;#40")
    2
    """
    return response.count(CHECK_PREFIX)


def gold_score(problem: Problem, response: str, has_eos: bool) -> float:
    """The hidden gold reward of one response.

    ``correct (1 or 0) - 0.05 * (number of chk steps) - 0.5 * (no EOS or no answer marker)``.

    Correctness dominates; among responses equally right, the gold prefers fewer re-check
    steps (the "quality" a verifiable reward does not see) and punishes responses that
    never finish or never commit to an answer. The RL policy never sees this number: it
    is trained on a reward model fitted to noisy pairwise labels derived from it.

    >>> p = Problem("27+5+8=", "40")
    >>> gold_score(p, "27+5=32;32+8=40;#40", True), gold_score(p, "27+5=32;32+8=40;chk40;#40", True)
    (1.0, 0.95)
    >>> gold_score(p, "27+5=32;32+8=41;#41", True), gold_score(p, "27+5=32;32+8=40;chk40", False)
    (0.0, -0.55)
    """
    answer = parse_answer(response)
    correct = answer is not None and int(answer) == int(problem.answer)
    score = (1.0 if correct else 0.0) - CHECK_PENALTY * count_checks(response)
    if answer is None or not has_eos:
        score -= FORMAT_PENALTY
    return round(score, 10)  # exact ties between equally good responses, not float noise


def pair_difference(row: dict) -> str:
    """What separates a preference row's two responses under the gold reward.

    ``"correctness"`` (one answer right, the other not), else ``"format"`` (one misses EOS
    or the answer marker), else ``"brevity"`` (only the number of ``chk`` steps differs),
    else ``"none"``. Needs the row's ``answer`` field (rows from `build_preference_dataset`
    have it).

    >>> pair_difference({"prompt": "1+2=", "answer": "3", "response_a": "1+2=3;#3",
    ...                  "response_b": "1+2=3;chk3;#3"})
    'brevity'
    """
    problem = Problem(row["prompt"], str(row["answer"]))

    def parts(response: str, has_eos: bool) -> tuple[bool, bool, int]:
        answer = parse_answer(response)
        correct = answer is not None and int(answer) == int(problem.answer)
        return correct, answer is not None and has_eos, count_checks(response)

    a = parts(row["response_a"], bool(row.get("eos_a", True)))
    b = parts(row["response_b"], bool(row.get("eos_b", True)))
    for index, kind in enumerate(("correctness", "format", "brevity")):
        if a[index] != b[index]:
            return kind
    return "none"


# ---------------------------------------------------------------------------------- annotators
class SimulatedAnnotator:
    """Says which of two responses to the same prompt is better, following the gold reward.

    Args:
        noise: probability that the label is replaced by a fair coin flip. The label then
            disagrees with gold half of the time, so the expected disagreement rate is
            ``noise / 2`` (0.125 for the default 0.25). AlpacaFarm injects label noise into
            its simulated annotators so that the reward model sees the inconsistency of
            human raters (see docs/alpacafarm.md for how its setting maps onto this one).
        bias: this annotator's length preference, in gold-reward units per character:
            ``bias * (len(a) - len(b))`` is added to the gold difference before deciding.
            Positive: likes longer responses (a verbosity bias, known in human raters and
            LLM judges); here it works against the gold reward's brevity term. None = 0.
        seed: seed of this annotator's own random numbers.

    Exact ties (equal biased gold scores) are decided by a coin flip.
    """

    def __init__(self, noise: float = 0.25, bias: float | None = None, seed: int = 0, name: str = "annotator"):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise: must be in [0, 1], got {noise}")
        self.noise = noise
        self.bias = float(bias or 0.0)
        self.name = name
        self.rng = random.Random(seed)

    def prefer(self, gold_a: float, gold_b: float, length_a: int = 0, length_b: int = 0) -> str:
        """``"a"`` or ``"b"`` from the two gold scores (and lengths, for the bias)."""
        coin = self.rng.random() < 0.5
        if self.rng.random() < self.noise:
            return "a" if coin else "b"  # label noise: a fair coin
        difference = gold_a - gold_b + self.bias * (length_a - length_b)
        if difference == 0:
            return "a" if coin else "b"
        return "a" if difference > 0 else "b"

    def compare(self, problem: Problem, response_a: str, response_b: str,
                eos_a: bool = True, eos_b: bool = True) -> str:
        """Label a pair of decoded responses to `problem`."""
        return self.prefer(gold_score(problem, response_a, eos_a), gold_score(problem, response_b, eos_b),
                           len(response_a), len(response_b))


class AnnotatorPool:
    """A pool of `n` simulated annotators; each pair is labelled by one drawn at random.

    AlpacaFarm's simulated pool mixes annotators with different prompts and models, so
    that the preferences carry the spread of opinions a crowd of raters has. Here each
    annotator has its own `bias` (``biases[i]``, None = unbiased) and the same `noise`.
    """

    def __init__(self, n: int = 4, noise: float = 0.25, biases: Sequence[float | None] | None = None, seed: int = 0):
        if n < 1:
            raise ValueError(f"n: need at least one annotator, got {n}")
        biases = [None] * n if biases is None else list(biases)
        if len(biases) != n:
            raise ValueError(f"biases: expected {n} values (one per annotator), got {len(biases)}")
        self.annotators = [SimulatedAnnotator(noise, bias, seed=seed * 1000 + i + 1, name=f"annotator_{i}")
                           for i, bias in enumerate(biases)]
        self.rng = random.Random(seed)

    def compare(self, problem: Problem, response_a: str, response_b: str,
                eos_a: bool = True, eos_b: bool = True) -> tuple[str, str]:
        """``(preferred, annotator name)`` for one pair."""
        annotator = self.rng.choice(self.annotators)
        return annotator.compare(problem, response_a, response_b, eos_a, eos_b), annotator.name


# ---------------------------------------------------------------------------------- sampling
def sample_responses(policy, tokenizer, problems: Sequence[Problem], max_new_tokens: int, seed: int,
                     temperature: float = 1.0, batch_size: int = 128):
    """One response per problem at `temperature`, seeded; the caller's RNG state is kept.

    Returns ``(texts, has_eos, rollouts)``, the rollouts being one `Rollout` per chunk of
    `batch_size` problems (for scoring by a reward model). The same policy, problems,
    seed and batch size give the same samples.
    """
    from ppo.models.rollout import decode_responses, generate

    device = next(policy.parameters()).device
    devices = [device.index or 0] if device.type == "cuda" else []
    texts, has_eos, rollouts = [], [], []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start:start + batch_size]
            rollout = generate(policy, tokenizer, [p.prompt for p in chunk], max_new_tokens, temperature=temperature)
            texts += decode_responses(tokenizer, rollout)
            has_eos += rollout.has_eos.tolist()
            rollouts.append(rollout)
    return texts, has_eos, rollouts


# ---------------------------------------------------------------------------------- the task
class PreferenceTask:
    """The arithmetic testbed scored by the hidden gold reward (for RLHF against a reward model).

    Problems are `ArithmeticTask`'s (same training distribution, same held-out set).
    `score` returns ``Score(correct=<gold correctness>, has_answer, has_eos,
    value=gold_score)``: in an RLHF run the trainer optimises the reward model and only
    logs this as ``gold_score``.

    Args:
        reward_model_path: optional; when given, `extra_eval` also reports
            ``proxy_reward``, the reward model's mean score of the evaluated samples. A
            missing directory fails here, with the command that builds it.
        base: the underlying arithmetic task (default ``ArithmeticTask()``).
        eval_batch_size: generation batch size of `extra_eval`.

    **SFT reference responses.** The win rate compares the policy's held-out samples with
    samples of the SFT policy. Those are taken on the *first* call of `extra_eval` (or
    `set_reference`) and cached on this object: the trainer's step-0 evaluation runs
    before any update, with the untouched SFT policy, so the first call sees exactly the
    SFT policy. A task object used with a different starting policy, or first called
    after training began, needs `set_reference` with the SFT policy first.
    """

    name = "preference"

    def __init__(self, reward_model_path: str | Path | None = None, base: ArithmeticTask | None = None,
                 eval_batch_size: int = 128):
        self.base = base if base is not None else ArithmeticTask()
        self.reward_model_path = None if reward_model_path is None else require_reward_model(reward_model_path)
        self.eval_batch_size = eval_batch_size
        self._reward_model = None
        self._reference: dict | None = None  # the SFT samples' key, texts and gold scores

    # -- problems ---------------------------------------------------------------------
    def sample_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return self.base.sample_problems(n, rng)

    def eval_problems(self) -> Sequence[Problem]:
        return self.base.eval_problems()

    # -- scoring ----------------------------------------------------------------------
    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        verdict = self.base.score(problem, response, has_eos)
        return Score(correct=verdict.correct, has_answer=verdict.has_answer, has_eos=has_eos,
                     value=gold_score(problem, response, has_eos))

    # -- evaluation -------------------------------------------------------------------
    @staticmethod
    def _reference_key(problems, max_new_tokens, seed) -> tuple:
        return tuple(p.prompt for p in problems), max_new_tokens, seed

    def set_reference(self, policy, tokenizer, problems: Sequence[Problem], max_new_tokens: int, seed: int) -> None:
        """Sample and cache the SFT reference responses with `policy` (the SFT policy)."""
        problems = list(problems)
        texts, has_eos, _ = sample_responses(policy, tokenizer, problems, max_new_tokens, seed,
                                             batch_size=self.eval_batch_size)
        self._store_reference(problems, max_new_tokens, seed, texts, has_eos)

    def _store_reference(self, problems, max_new_tokens, seed, texts, has_eos) -> None:
        self._reference = {"key": self._reference_key(problems, max_new_tokens, seed), "texts": list(texts),
                           "gold": [gold_score(p, t, e) for p, t, e in zip(problems, texts, has_eos)]}

    @property
    def reference_responses(self) -> list[str] | None:
        return None if self._reference is None else list(self._reference["texts"])

    def _load_reward_model(self, device):
        if self._reward_model is None:
            from value_model import ScalarHeadModel

            self._reward_model = ScalarHeadModel.from_pretrained(self.reward_model_path).eval().requires_grad_(False)
        return self._reward_model.to(device)

    @torch.no_grad()
    def extra_eval(self, policy, tokenizer, problems: Sequence[Problem], max_new_tokens: int, seed: int) -> dict:
        """Held-out gold reward and gold win rate against the SFT policy (and the proxy reward).

        One response per problem at temperature 1, seeded with `seed`. Returns:

        - ``gold_reward``: mean gold reward of the samples.
        - ``win_rate_vs_sft``: share of problems where the sample's gold reward beats the
          SFT reference response's (ties count 1/2); 0.5 on the first call, whose samples
          become the reference (see the class docstring).
        - ``checks``: mean number of ``chk`` steps (the secondary quality the gold
          penalises).
        - ``proxy_reward``: the reward model's mean score of the same samples, if the
          task was given a `reward_model_path`.
        """
        problems = list(problems)
        texts, has_eos, rollouts = sample_responses(policy, tokenizer, problems, max_new_tokens, seed,
                                                    batch_size=self.eval_batch_size)
        if self._reference is None:
            self._store_reference(problems, max_new_tokens, seed, texts, has_eos)
        elif self._reference["key"] != self._reference_key(problems, max_new_tokens, seed):
            raise ValueError("PreferenceTask.extra_eval: the SFT reference responses were sampled for other "
                             "problems, max_new_tokens or seed; call set_reference(sft_policy, ...) for this setting")
        gold = [gold_score(p, t, e) for p, t, e in zip(problems, texts, has_eos)]
        reference = self._reference["gold"]
        wins = [1.0 if g > r else 0.5 if g == r else 0.0 for g, r in zip(gold, reference)]
        metrics = {
            "gold_reward": sum(gold) / len(gold),
            "win_rate_vs_sft": sum(wins) / len(wins),
            "checks": sum(count_checks(t) for t in texts) / len(texts),
        }
        if self.reward_model_path is not None:
            from value_model.reward_model import last_token_scores

            device = next(policy.parameters()).device
            reward_model = self._load_reward_model(device)
            scores = torch.cat([last_token_scores(reward_model, r.query_ids.to(device), r.query_mask.to(device),
                                                  r.response_ids.to(device), r.response_mask.to(device)).cpu()
                                for r in rollouts])  # [N]
            metrics["proxy_reward"] = scores.mean().item()
        return metrics


# ---------------------------------------------------------------------------------- preference data
def build_preference_dataset(policy, tokenizer, task, n_pairs: int, seed: int = 0, pool: AnnotatorPool | None = None,
                             max_new_tokens: int = 64, temperature: float = 1.0, prompts_per_batch: int = 64,
                             max_batches: int | None = None, progress: bool = False) -> list[dict]:
    """`n_pairs` labelled pairs of responses sampled from `policy` (the SFT policy).

    Each prompt (drawn from ``task.sample_problems``) gets two samples at `temperature`;
    the pool labels the pair. Pairs whose two responses are identical carry no preference
    and are skipped, so more prompts are drawn until `n_pairs` are collected (an error
    after `max_batches` batches, default enough for a 10% yield).

    Rows: ``{prompt, response_a, response_b, preferred ("a"/"b"), gold_a, gold_b,
    annotator, eos_a, eos_b, answer}``. The global torch RNG state is left as it was.
    """
    from tqdm.auto import tqdm

    from ppo.models.rollout import decode_responses, generate

    if n_pairs < 1:
        raise ValueError(f"n_pairs: must be positive, got {n_pairs}")
    pool = pool if pool is not None else AnnotatorPool(seed=seed)
    rng = random.Random(seed)
    max_batches = max_batches or 10 * (n_pairs // prompts_per_batch + 1)
    rows: list[dict] = []
    device = next(policy.parameters()).device
    devices = [device.index or 0] if device.type == "cuda" else []
    bar = tqdm(total=n_pairs, desc="preference pairs", disable=not progress, dynamic_ncols=True)
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for _ in range(max_batches):
            problems = task.sample_problems(prompts_per_batch, rng)
            doubled = [p for p in problems for _ in range(2)]  # the two samples of a prompt are contiguous
            rollout = generate(policy, tokenizer, [p.prompt for p in doubled], max_new_tokens, temperature=temperature)
            texts = decode_responses(tokenizer, rollout)
            eos = rollout.has_eos.tolist()
            for i, problem in enumerate(problems):
                response_a, response_b = texts[2 * i], texts[2 * i + 1]
                if response_a == response_b or len(rows) >= n_pairs:
                    continue
                eos_a, eos_b = eos[2 * i], eos[2 * i + 1]
                preferred, annotator = pool.compare(problem, response_a, response_b, eos_a, eos_b)
                rows.append({"prompt": problem.prompt, "response_a": response_a, "response_b": response_b,
                             "preferred": preferred, "gold_a": gold_score(problem, response_a, eos_a),
                             "gold_b": gold_score(problem, response_b, eos_b), "annotator": annotator,
                             "eos_a": bool(eos_a), "eos_b": bool(eos_b), "answer": problem.answer})
                bar.update(1)
            if len(rows) >= n_pairs:
                break
    bar.close()
    if len(rows) < n_pairs:
        raise RuntimeError(f"build_preference_dataset: only {len(rows)} of {n_pairs} pairs had two different "
                           f"responses after {max_batches} batches of {prompts_per_batch} prompts")
    return rows


def _validate_row(row, where: str) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [name for name in PREFERENCE_FIELDS if name not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    if row["preferred"] not in ("a", "b"):
        raise ValueError(f"{where}: 'preferred' must be \"a\" or \"b\", got {row['preferred']!r}")
    for name in ("prompt", "response_a", "response_b"):
        if not isinstance(row[name], str):
            raise ValueError(f"{where}: '{name}' must be a string, got {type(row[name]).__name__}")
    if row["response_a"] == row["response_b"]:
        raise ValueError(f"{where}: response_a and response_b are identical (a pair must compare two responses)")
    for name in ("gold_a", "gold_b"):
        if isinstance(row[name], bool) or not isinstance(row[name], (int, float)):
            raise ValueError(f"{where}: '{name}' must be a number, got {row[name]!r}")


def validate_preferences(rows: Sequence[dict], source: str = "preferences") -> None:
    """Raise ValueError (naming `source` and the row) for any malformed preference row."""
    if not rows:
        raise ValueError(f"{source}: no preference pairs")
    for index, row in enumerate(rows):
        _validate_row(row, f"{source}: row {index}")


def save_preferences(rows: Sequence[dict], path: str | Path) -> Path:
    """Write validated rows as JSONL (one pair per line), atomically."""
    path = Path(path)
    validate_preferences(rows, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)
    return path


def load_preferences(path: str | Path) -> list[dict]:
    """Read and validate a preference JSONL file; errors name the path and line."""
    path = Path(path)
    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {error.start} of the line)") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        _validate_row(row, f"{path}:{number}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: empty preference file (no pairs)")
    return rows

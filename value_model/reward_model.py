"""The reward model: a `ScalarHeadModel` trained on pairwise preferences (Bradley-Terry).

RLHF replaces a verifiable reward by a learned one. Given pairs ``(prompt, chosen,
rejected)`` labelled by (simulated) annotators, the reward model r is fitted so that
``P(chosen > rejected) = sigmoid(r(chosen) - r(rejected))`` (the Bradley-Terry model).
Implementation details that live here:

- **Score at the last response token, EOS included** (`last_token_scores`): the model reads
  the whole response before it scores it, and the trainer reads the score at the same
  position during RL (`ppo.models.setup.Models.reward_model_scores`), so training and use agree.
- **Head init N(0, 1/sqrt(d+1))** (`ScalarHeadModel.from_policy(..., head_init="normal")`):
  OpenAI's lm-human-preferences and the N+ implementation details; the backbone starts as
  the SFT policy's, so the reward model already "reads" the responses it will judge.
- **Held-out accuracy against noisy and gold labels** (`train_reward_model`): accuracy on
  the annotators' noisy labels is capped by the noise (a label replaced by a coin flip
  with probability 0.25 is wrong 12.5% of the time); accuracy against the hidden gold
  preference says how good a proxy the reward model really is.
- **Reward normalisation** (`normalize_reward_model`): after training, the mean score of
  SFT samples is subtracted through the head's bias, so SFT responses score 0 on average
  (N+ implementation details; OpenAI's lm-human-preferences normalises the same way). The
  Bradley-Terry loss only sees differences, so the raw offset is arbitrary; fixing it
  makes "reward > 0" mean "better than the SFT policy" and keeps rewards of different
  reward models on one scale.

- **Digests** (`reward_model_digests`, `check_reward_model_digests`): a build records the
  sha256 of its weights, head and preference data in ``reward_model_info.json``; a run that
  loads the directory refuses a file that no longer matches, naming it.

`ppo.tasks.rlhf` chains these into the ``python -m ppo.tasks.rlhf build`` pipeline, and ships
the default build pinned in ``ppo/tasks/reward_model/``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ppo.models.logprobs import concat_query_response
from ppo.models.policy import encode_prompts, left_pad, load_policy

from .model import ScalarHeadModel

REWARD_MODEL_INFO = "reward_model_info.json"


# ---------------------------------------------------------------------------------- the loss
def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the preferences under Bradley-Terry.

    ``loss = -log sigmoid(r_chosen - r_rejected)``, averaged over pairs. Only the
    difference matters, so adding a constant to every reward changes nothing (hence
    `normalize_reward_model`).

    >>> round(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])).item(), 4)  # log(1 + e^-2)
    0.1269
    """
    return -F.logsigmoid(r_chosen - r_rejected).mean()


# ---------------------------------------------------------------------------------- scoring
def encode_responses(tokenizer, responses: Sequence[str], has_eos: Sequence[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded response ids and mask, ``[B, T]``; EOS appended where the response had one.

    The same layout as a rollout (`ppo.models.rollout.Rollout`): the mask covers the response up
    to and including its stop token.
    """
    rows = []
    for text, eos in zip(responses, has_eos):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append(ids + ([tokenizer.eos_token_id] if eos else []))
    width = max(1, max(len(ids) for ids in rows))
    response_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
    response_mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    for row, ids in enumerate(rows):
        if ids:
            response_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[row, : len(ids)] = 1
    return response_ids, response_mask


def last_token_scores(model: ScalarHeadModel, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
    """The model's output at each sequence's last response token, ``[B]``.

    Runs with autograd if the caller's context allows it (training), without otherwise.
    An empty response is scored at the last query token.
    """
    input_ids, attention_mask, position_ids = concat_query_response(query_ids, query_mask, response_ids, response_mask)
    scores = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)  # [B, Q+T]
    last = query_ids.shape[1] + response_mask.sum(-1) - 1  # [B]
    return scores.gather(1, last[:, None]).squeeze(1).float()  # [B]


def _batch(tokenizer, prompts, responses, has_eos, device):
    query_ids, query_mask = left_pad(encode_prompts(tokenizer, list(prompts)), tokenizer.pad_token_id)  # [B, Q]
    response_ids, response_mask = encode_responses(tokenizer, responses, has_eos)  # [B, T]
    return tuple(t.to(device) for t in (query_ids, query_mask, response_ids, response_mask))


@torch.no_grad()
def score_texts(model: ScalarHeadModel, tokenizer, prompts: Sequence[str], responses: Sequence[str],
                has_eos: Sequence[bool] | None = None, batch_size: int = 64) -> torch.Tensor:
    """Reward-model scores of decoded responses, ``[N]`` (on the CPU)."""
    has_eos = [True] * len(responses) if has_eos is None else list(has_eos)
    if not len(prompts) == len(responses) == len(has_eos):
        raise ValueError(f"score_texts: {len(prompts)} prompts, {len(responses)} responses, {len(has_eos)} eos flags")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    scores = []
    for start in range(0, len(prompts), batch_size):
        end = start + batch_size
        batch = _batch(tokenizer, prompts[start:end], responses[start:end], has_eos[start:end], device)
        scores.append(last_token_scores(model, *batch).cpu())
    model.train(was_training)
    return torch.cat(scores) if scores else torch.zeros(0)


# ---------------------------------------------------------------------------------- training
def _pair_texts(pairs: Sequence[dict]) -> tuple[list[str], list[str], list[str], list[bool], list[bool]]:
    """(prompts, chosen, rejected, chosen_eos, rejected_eos) from preference rows."""
    prompts, chosen, rejected, chosen_eos, rejected_eos = [], [], [], [], []
    for row in pairs:
        a_wins = row["preferred"] == "a"
        prompts.append(row["prompt"])
        chosen.append(row["response_a"] if a_wins else row["response_b"])
        rejected.append(row["response_b"] if a_wins else row["response_a"])
        eos_a, eos_b = bool(row.get("eos_a", True)), bool(row.get("eos_b", True))
        chosen_eos.append(eos_a if a_wins else eos_b)
        rejected_eos.append(eos_b if a_wins else eos_a)
    return prompts, chosen, rejected, chosen_eos, rejected_eos


def pairwise_metrics(model: ScalarHeadModel, tokenizer, pairs: Sequence[dict], batch_size: int = 64) -> dict:
    """Accuracy of `model` on `pairs` against the annotators' labels and against gold.

    - ``accuracy_noisy``: share of pairs where the labelled response scores higher (a tie
      counts 1/2).
    - ``accuracy_gold``: the same against the gold preference (``gold_a`` vs ``gold_b``);
      pairs with equal gold scores are skipped (``gold_pairs`` counts the rest).
    - ``label_gold_agreement``: how often the noisy labels themselves agree with gold, the
      ceiling a perfect imitator of the annotators would reach on ``accuracy_gold``.
    """
    if not pairs:
        return {"pairs": 0}
    prompts = [row["prompt"] for row in pairs]
    scores_a = score_texts(model, tokenizer, prompts, [row["response_a"] for row in pairs],
                           [bool(row.get("eos_a", True)) for row in pairs], batch_size)
    scores_b = score_texts(model, tokenizer, prompts, [row["response_b"] for row in pairs],
                           [bool(row.get("eos_b", True)) for row in pairs], batch_size)
    margin = scores_a - scores_b  # [N]: > 0 means the model prefers a
    labels_a = torch.tensor([row["preferred"] == "a" for row in pairs])
    signed = torch.where(labels_a, margin, -margin)
    noisy = ((signed > 0).float() + 0.5 * (signed == 0).float()).mean().item()
    gold_diff = torch.tensor([float(row["gold_a"]) - float(row["gold_b"]) for row in pairs])
    decided = gold_diff != 0
    metrics = {"pairs": len(pairs), "accuracy_noisy": noisy, "gold_pairs": int(decided.sum())}
    if decided.any():
        gold_signed = torch.where(gold_diff[decided] > 0, margin[decided], -margin[decided])
        metrics["accuracy_gold"] = ((gold_signed > 0).float() + 0.5 * (gold_signed == 0).float()).mean().item()
        label_matches = labels_a[decided] == (gold_diff[decided] > 0)
        metrics["label_gold_agreement"] = label_matches.float().mean().item()
    metrics["loss"] = float(-F.logsigmoid(signed).mean())
    return metrics


def split_pairs(pairs: Sequence[dict], heldout_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: a seeded shuffle, the first ``round(heldout_fraction * N)`` held out."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_heldout = int(round(heldout_fraction * len(pairs)))
    return [pairs[i] for i in order[n_heldout:]], [pairs[i] for i in order[:n_heldout]]


def train_reward_model(
    policy_path: str | Path,
    pairs: Sequence[dict],
    epochs: int = 2,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    max_grad_norm: float | None = 1.0,
    progress: bool = True,
) -> tuple[ScalarHeadModel, dict]:
    """Fit a Bradley-Terry reward model on preference rows, starting from the SFT policy.

    Args:
        policy_path: the SFT policy; its backbone initialises the reward model and its
            tokenizer encodes the pairs.
        pairs: rows as written by `ppo.tasks.preferences.build_preference_dataset`
            (``prompt``, ``response_a``, ``response_b``, ``preferred``, ``gold_a``,
            ``gold_b``; optional ``eos_a`` / ``eos_b``, default True).
        heldout_fraction: share of the pairs kept out of training and used for the
            held-out metrics (`split_pairs` with `seed` gives the same split).

    AdamW with a linear decay of the learning rate to 0. Returns ``(model, metrics)``;
    ``metrics`` holds the held-out and training-set accuracies (see `pairwise_metrics`),
    prefixed ``heldout_`` and ``train_``, and the last training loss.
    """
    if not pairs:
        raise ValueError("train_reward_model: no preference pairs")
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction: must be in [0, 1), got {heldout_fraction}")
    torch.manual_seed(seed)
    policy, tokenizer = load_policy(policy_path)
    model = ScalarHeadModel.from_policy(policy, head_init="normal", kind="reward")
    del policy
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()

    train, heldout = split_pairs(pairs, heldout_fraction, seed)
    if not train:
        raise ValueError(f"train_reward_model: no training pairs left after holding out {len(heldout)}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(train) / batch_size)
    total_steps = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total_steps))
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(total=total_steps, desc="reward model", disable=not progress, dynamic_ncols=True)
    last_loss = float("nan")
    for _ in range(epochs):
        permutation = torch.randperm(len(train), generator=generator).tolist()
        for start in range(0, len(train), batch_size):
            rows = [train[i] for i in permutation[start:start + batch_size]]
            prompts, chosen, rejected, chosen_eos, rejected_eos = _pair_texts(rows)
            # Chosen and rejected in one forward pass: rows [0, b) chosen, [b, 2b) rejected.
            batch = _batch(tokenizer, prompts + prompts, chosen + rejected, chosen_eos + rejected_eos, device)
            rewards = last_token_scores(model, *batch)  # [2b]
            r_chosen, r_rejected = rewards[: len(rows)], rewards[len(rows):]  # [b] each
            loss = bradley_terry_loss(r_chosen, r_rejected)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            schedule.step()
            last_loss = loss.item()
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.3f}", acc=f"{(r_chosen > r_rejected).float().mean().item():.2f}")
    bar.close()
    model.eval()
    metrics = {"train_pairs": len(train), "heldout_pairs": len(heldout), "epochs": epochs, "steps": total_steps,
               "final_train_loss": last_loss}
    metrics.update({f"train_{k}": v for k, v in pairwise_metrics(model, tokenizer, train).items() if k != "pairs"})
    if heldout:
        metrics.update({f"heldout_{k}": v for k, v in pairwise_metrics(model, tokenizer, heldout).items()
                        if k != "pairs"})
    return model, metrics


# ---------------------------------------------------------------------------------- normalisation
@torch.no_grad()
def normalize_reward_model(model: ScalarHeadModel, tokenizer, prompts: Sequence[str], responses: Sequence[str],
                           has_eos: Sequence[bool] | None = None, batch_size: int = 64) -> float:
    """Shift the head's bias so `responses` (SFT samples) score 0 on average; returns the offset.

    The offset is the mean score before the shift; it is subtracted from the bias, which
    moves every score by exactly that amount (the bias is added after the linear map).
    """
    if not responses:
        raise ValueError("normalize_reward_model: no samples to normalise on")
    offset = score_texts(model, tokenizer, prompts, responses, has_eos, batch_size).mean().item()
    model.head.bias.sub_(offset)
    return offset


# ---------------------------------------------------------------------------------- saving
def save_reward_model(model: ScalarHeadModel, tokenizer, output_dir: str | Path, info: dict,
                      extra_files: dict[str, str] | None = None) -> Path:
    """Write the model, its tokenizer and ``reward_model_info.json`` atomically (temp dir + rename).

    `extra_files` maps file names to text written next to them (e.g. the preference data).
    ``reward_model_info.json`` is the marker of a complete directory.
    """
    from ppo.models.sft import save_atomically

    output_dir = Path(output_dir)
    save_atomically(model, tokenizer, output_dir, extra={**(extra_files or {}), REWARD_MODEL_INFO: info})
    return output_dir


def load_reward_model_info(path: str | Path) -> dict:
    return json.loads((Path(path) / REWARD_MODEL_INFO).read_text())


# ---------------------------------------------------------------------------------- digests
# The files of a reward-model directory whose bytes `reward_model_info.json` records
# (``files_sha256``): the weights, the head and the preference data it was trained on.
DIGESTED_FILES = ("model.safetensors", "scalar_head.safetensors", "preferences.jsonl")


class RewardModelDigestError(ValueError):
    """A file of a reward-model directory is not the one its ``reward_model_info.json`` records."""


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def reward_model_digests(path: str | Path) -> dict:
    """``{"files_sha256": {name: sha256 of its bytes}, "weights_sha256": ...}`` of a saved reward
    model: the bytes of each of `DIGESTED_FILES` present (what a corrupted file changes), and
    the digest of the weights themselves, backbone and head (`ppo.models.sft.state_sha256`:
    names, dtypes, shapes and bytes; equal digests mean bit-identical weights)."""
    from safetensors.torch import load_file

    from ppo.models.sft import state_sha256

    path = Path(path)
    files = {name: file_sha256(path / name) for name in DIGESTED_FILES if (path / name).is_file()}
    state = {f"{name}/{key}": tensor for name in ("model.safetensors", "scalar_head.safetensors")
             for key, tensor in load_file(str(path / name)).items()}
    return {"files_sha256": files, "weights_sha256": state_sha256(state)}


def check_reward_model_digests(path: str | Path) -> None:
    """Refuse a reward-model directory whose files are not the ones its info records.

    A directory whose ``reward_model_info.json`` records no ``files_sha256`` (an older build, or
    a model saved by hand) passes unchecked; one that records them must match byte for byte.
    Raises `RewardModelDigestError` naming the file, both digests and what to do."""
    path = Path(path)
    info_file = path / REWARD_MODEL_INFO
    recorded = json.loads(info_file.read_text()).get("files_sha256") if info_file.is_file() else None
    for name, expected in (recorded or {}).items():
        if not (path / name).is_file():
            raise RewardModelDigestError(f"{path / name}: missing; {REWARD_MODEL_INFO} records it (sha256 "
                                         f"{expected[:16]}...). Restore the directory, or rebuild it with "
                                         "`python -m ppo.tasks.rlhf build --rebuild`")
        actual = file_sha256(path / name)
        if actual != expected:
            raise RewardModelDigestError(
                f"{path / name}: sha256 {actual[:16]}... is not the {expected[:16]}... that {REWARD_MODEL_INFO} "
                f"records: the file is corrupted or was changed. Restore it (a shipped file: git checkout -- "
                f"{path / name}), or rebuild with `python -m ppo.tasks.rlhf build --rebuild`")

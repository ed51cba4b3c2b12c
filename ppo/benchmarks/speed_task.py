"""The task `ppo.benchmarks.speed` times both libraries on: 2-digit addition and its tiny GPT-2.

A 0.8M-parameter character-level GPT-2 (4 layers, width 128, vocabulary 18, 32 positions),
SFT'd on 2-digit addition ("12+35=" -> "47<eos>", pairs 10..99, 500 held out) until its
held-out greedy exact match reaches 0.35 (`build_model`); both systems start from it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

import torch

from ppo.tasks.base import Problem, Score


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

    from ppo.run.evaluation import evaluate
    from ppo.models.tiny_model import build_char_tokenizer

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

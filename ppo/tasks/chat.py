"""Chat templates: an instruct model is prompted the way it was trained (`PPOConfig.chat_template`).

An instruct checkpoint's tokenizer carries a chat template (a Jinja program that turns a
list of messages into the text the model saw in training: role markers, end-of-turn
tokens, the opening of the assistant's turn). Prompting it with the bare question prompts
it as a base model. With ``chat_template='auto'`` (the default) and a tokenizer that has a
template, every prompt is rendered as one user turn, after an optional system message
(`system_prompt`), with the generation prompt (``add_generation_prompt=True``): the text
ends where the assistant's reply begins, so the response is the reply itself. ``'off'``
keeps the prompt text as it is (base models; a tokenizer without a template is always
treated so under ``'auto'``), ``'on'`` refuses a tokenizer without one.

Implementation details that live here:

- **What the run records**: `ChatTemplateTask` hands the trainer problems whose prompt is
  the rendered text, so ``samples.jsonl`` shows exactly what the policy was given; scorers
  and reward functions still get the prompt as written in the data (TRL passes reward
  functions the prompt too, not the template's rendering).
- **One BOS**: templates that write the BOS token themselves (Llama 3, Gemma) would get a
  second one from the encoder, which puts BOS in front of every prompt
  (`ppo.models.policy.encode_prompts`); the rendered text drops its leading BOS.
- **Stop tokens**: the token that closes an assistant turn in the template (``<|im_end|>``,
  ``<|eot_id|>``, ...) joins the stop tokens when `stop_token_ids` is None, as instruct
  checkpoints do not always declare it as an EOS id (`end_of_turn_ids`).
- **Special tokens as tokens**: the template's markers must be encoded as their special
  tokens, so ``split_special_tokens=True`` is refused with a template in use.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ppo.tasks.base import Problem, Score

_MARKER = "ppoendofturnmarker"  # a reply whose text is found again in the rendering


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def messages(prompt: str, system_prompt: str | None = None, response: str | None = None) -> list[dict]:
    """The conversation of one prompt: ``[system], user[, assistant]``."""
    turns = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    turns.append({"role": "user", "content": prompt})
    if response is not None:
        turns.append({"role": "assistant", "content": response})
    return turns


def render_prompt(tokenizer, prompt: str, system_prompt: str | None = None) -> str:
    """`prompt` as a user turn in `tokenizer`'s chat template, ending with the generation
    prompt; a leading BOS is dropped (the encoder adds it)."""
    text = tokenizer.apply_chat_template(messages(prompt, system_prompt), tokenize=False, add_generation_prompt=True)
    bos = tokenizer.bos_token
    return text[len(bos):] if bos and text.startswith(bos) else text


def end_of_turn_ids(tokenizer) -> list[int]:
    """The special token that closes an assistant turn in the template, as ``[id]``; ``[]``
    when the template writes none (or cannot render a two-turn conversation)."""
    try:
        text = tokenizer.apply_chat_template(messages("hi", response=_MARKER), tokenize=False)
    except Exception:  # a template with its own rules on roles: no end-of-turn token learnt
        return []
    after = text.split(_MARKER, 1)[1] if _MARKER in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    return [ids[0]] if ids and ids[0] in set(tokenizer.all_special_ids) else []


def for_tokenizer(task, tokenizer, config, stop_token_ids: list[int]):
    """``(task, stop_token_ids)`` as `config.chat_template` says: the task wrapped in a
    `ChatTemplateTask` and the end-of-turn token added to the stop ids (when
    `config.stop_token_ids` is None), or both as they are."""
    use = config.chat_template == "on" or (config.chat_template == "auto" and has_chat_template(tokenizer))
    if config.chat_template == "on" and not has_chat_template(tokenizer):
        raise ValueError("PPOConfig.chat_template: 'on' needs a tokenizer with a chat template, and this one has "
                         "none (a base model); use 'auto' or 'off'")
    if not use:
        if config.system_prompt is not None and config.chat_template == "auto":
            raise ValueError("PPOConfig.system_prompt: the tokenizer has no chat template, so there is no "
                             "conversation to put a system message in; remove it, or use an instruct tokenizer")
        return task, stop_token_ids
    if config.split_special_tokens:
        raise ValueError("PPOConfig.split_special_tokens: True would encode the chat template's role and end-of-turn "
                         "tokens as their characters; set it False, or chat_template='off'")
    if config.stop_token_ids is None:
        stop_token_ids = list(dict.fromkeys(list(stop_token_ids) + end_of_turn_ids(tokenizer)))
    return ChatTemplateTask(task, tokenizer, config.system_prompt), stop_token_ids


class ChatTemplateTask:
    """`task` with every prompt rendered by the chat template; scoring sees the original
    prompts. Anything else is the wrapped task's (``name``, ``reward_fn``, ...)."""

    def __init__(self, task, tokenizer, system_prompt: str | None = None):
        self.task, self.tokenizer, self.system_prompt = task, tokenizer, system_prompt
        self._rendered: dict[str, str] = {}

    def __getattr__(self, name):
        if name == "task":  # not yet set (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.task, name)

    def render(self, problem: Problem) -> Problem:
        if problem.prompt not in self._rendered:
            self._rendered[problem.prompt] = render_prompt(self.tokenizer, problem.prompt, self.system_prompt)
        return dataclasses.replace(problem, prompt=self._rendered[problem.prompt],
                                   meta={**problem.meta, "raw_prompt": problem.prompt})

    @staticmethod
    def original(problem: Problem) -> Problem:
        if "raw_prompt" not in problem.meta:
            return problem
        meta = {k: v for k, v in problem.meta.items() if k != "raw_prompt"}
        return dataclasses.replace(problem, prompt=problem.meta["raw_prompt"], meta=meta)

    def sample_problems(self, n: int, rng) -> list[Problem]:
        return [self.render(p) for p in self.task.sample_problems(n, rng)]

    def eval_problems(self) -> Sequence[Problem]:
        return [self.render(p) for p in self.task.eval_problems()]

    def score(self, problem: Problem, response: str, has_eos: bool) -> Score:
        return self.task.score(self.original(problem), response, has_eos)

    def score_batch(self, problems: Sequence[Problem], responses: list[str], has_eos: list[bool]) -> list[Score]:
        originals = [self.original(p) for p in problems]
        if hasattr(self.task, "score_batch"):
            return self.task.score_batch(originals, responses, has_eos)
        return [self.task.score(p, r, e) for p, r, e in zip(originals, responses, has_eos)]

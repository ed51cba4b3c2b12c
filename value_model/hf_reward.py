"""Hugging Face sequence-classification checkpoints as the reward model.

Most published reward models, and every one TRL's ``RewardTrainer`` writes, are an
``AutoModelForSequenceClassification`` with ``num_labels=1``: a backbone, a linear ``score``
head, and the score read at the last token that is not padding. `PPOConfig.reward_model_path`
may name such a directory instead of a `ScalarHeadModel`; `is_sequence_classifier` tells the
two apart by ``config.json``'s ``architectures``.

Implementation details that live here:

- **Text in, score out** (`SequenceClassifierReward.forward`): the reward model has its
  own tokenizer, often not the policy's, so it is given text and tokenises it itself, as
  TRL's GRPOTrainer does for a reward model (huggingface/trl@f2cd5771
  trl/trainer/grpo_trainer.py, the ``nn.Module`` branch of reward scoring): with a chat
  template, the conversation ``[system,] user: prompt, assistant: response`` rendered by
  the reward tokenizer's own template; without one, ``prompt + response``. Tokenised
  without added special tokens (the template writes its own), right-padded, and the
  score is ``logits[:, 0]``.
- **The pad id the head reads past** (``config.pad_token_id``): the model finds each row's
  last real token as the last one that is not the pad id, so the config takes the
  tokenizer's pad id (TRL's RewardTrainer sets it the same way, reward_trainer.py); a
  tokenizer without a pad token pads with EOS.
- **num_labels must be 1**: a classifier with several labels is not a reward model, and
  is refused with the number it has.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ppo.models.policy import ModelLoadError, check_model_dir, disable_dropout


def is_sequence_classifier(path: str | Path) -> bool:
    """Whether `path` holds a Hugging Face ``...ForSequenceClassification`` checkpoint."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    try:
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    except (ValueError, AttributeError):
        return False
    return any(name.endswith("ForSequenceClassification") for name in architectures)


class SequenceClassifierReward(nn.Module):
    """A sequence-classification model and its tokenizer: ``forward(prompts, responses) -> [B]``."""

    def __init__(self, model, tokenizer, system_prompt: str | None = None):
        super().__init__()
        self.model, self.tokenizer, self.system_prompt = model, tokenizer, system_prompt

    @property
    def config(self):
        return self.model.config

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str | None = torch.float32,
                        attn_implementation: str | None = None,
                        system_prompt: str | None = None) -> "SequenceClassifierReward":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = check_model_dir(path)
        kwargs = {"dtype": dtype if dtype is not None else "auto"}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        try:
            model = AutoModelForSequenceClassification.from_pretrained(str(path), **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception as error:
            raise ModelLoadError(f"{path}: cannot load a sequence-classification reward model and its tokenizer "
                                 f"({type(error).__name__}: {error})") from error
        if model.config.num_labels != 1:
            raise ModelLoadError(f"{path}: a reward model gives one score, but this classifier has num_labels="
                                 f"{model.config.num_labels}")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if tokenizer.pad_token is None:
            raise ModelLoadError(f"{path}: the tokenizer has neither a pad nor an EOS token to pad with")
        model.config.pad_token_id = tokenizer.pad_token_id
        disable_dropout(model)
        return cls(model.eval().requires_grad_(False), tokenizer, system_prompt)

    def texts(self, prompts: list[str], responses: list[str]) -> list[str]:
        """What the reward model reads: its chat template's rendering, or prompt + response."""
        from ppo.tasks.chat import has_chat_template, messages

        if not has_chat_template(self.tokenizer):
            return [prompt + response for prompt, response in zip(prompts, responses)]
        return [self.tokenizer.apply_chat_template(messages(prompt, self.system_prompt, response), tokenize=False)
                for prompt, response in zip(prompts, responses)]

    def forward(self, prompts: list[str], responses: list[str]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        batch = self.tokenizer(self.texts(prompts, responses), return_tensors="pt", padding=True,
                               padding_side="right", add_special_tokens=False).to(device)
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]  # [B]


def critic_from_sequence_classifier(path: str | Path, policy_tokenizer, zero_head: bool = True, **load_kwargs):
    """A `ScalarHeadModel` critic from a sequence-classification reward model: its backbone,
    and its ``score`` head as the scalar head (zeroed with `zero_head`, AlpacaFarm's
    value_init='reward_model'; kept, TRL's 'reward_model_head').

    The critic reads the policy's token ids, so the reward model's tokenizer must have the
    policy's vocabulary; and its head must be one linear map of the last hidden state
    (``score`` in the decoder classifiers: Llama, Qwen, Mistral, GPT-2, ...). Otherwise the
    architectures do not allow it and the error says which."""
    from value_model.model import ScalarHeadModel

    reward = SequenceClassifierReward.from_pretrained(path, **load_kwargs)
    if reward.tokenizer.get_vocab() != policy_tokenizer.get_vocab():
        raise ValueError(f"PPOConfig.value_init: the reward model at {path} has a tokenizer of its own, so a critic "
                         "built from it could not read the policy's token ids; use value_init='policy'")
    head = getattr(reward.model, "score", None)
    if not isinstance(head, nn.Linear) or head.out_features != 1:
        raise ValueError(f"PPOConfig.value_init: {type(reward.model).__name__} has no linear 'score' head over the "
                         "last hidden state to start the critic's head from; use value_init='policy'")
    critic = ScalarHeadModel(reward.model.base_model, head_init="zero", kind="value")
    if not zero_head:
        with torch.no_grad():
            critic.head.weight.copy_(head.weight.to(critic.head.weight.dtype))
            if head.bias is not None:
                critic.head.bias.copy_(head.bias.to(critic.head.bias.dtype))
    critic.requires_grad_(True)
    return critic

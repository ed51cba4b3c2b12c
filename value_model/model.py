"""`ScalarHeadModel`: any HF transformer backbone plus a linear head giving one number per token.

The same class is the PPO critic (value model: a value per response token) and the reward
model (the score is read at the last token). Implementation details that live here:

- **A separate network.** The critic is its own backbone, not a second head on the policy:
  AlpacaFarm and TRL (and the N+ implementation details) keep policy and value apart, so
  value gradients never disturb the policy's representation.
- **Initialisation** (`PPOConfig.value_init`): from the reward model with the head zeroed
  (AlpacaFarm and OpenAI's lm-human-preferences: the critic starts knowing what the reward
  model knows, predicting 0), from the SFT policy's backbone with a zeroed head, or random.
- **Reward-model head init** N(0, 1/sqrt(d+1)) (OpenAI lm-human-preferences, N+ details).

Saved like an HF model: the backbone with ``save_pretrained`` (safetensors) plus
``scalar_head.safetensors`` and ``scalar_head.json`` (which marks the directory's kind, so
loading a plain causal LM as a reward model fails with a clear message).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from ppo.models.policy import ModelLoadError, check_model_dir, disable_dropout

HEAD_WEIGHTS = "scalar_head.safetensors"
HEAD_INFO = "scalar_head.json"


class ScalarHeadModel(nn.Module):
    """Backbone hidden states -> linear head -> one scalar per position, ``[B, L]``."""

    def __init__(self, backbone: PreTrainedModel, head_init: str = "zero", kind: str = "value"):
        super().__init__()
        self.backbone = backbone
        self.kind = kind
        hidden_size = backbone.config.hidden_size
        self.head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)  # the backbone's dtype
        if head_init == "zero":
            nn.init.zeros_(self.head.weight)
        elif head_init == "normal":
            nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(hidden_size + 1))
        else:
            raise ValueError(f"head_init: expected 'zero' or 'normal', got {head_init!r}")
        nn.init.zeros_(self.head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # [B, L, H]
        return self.head(hidden).squeeze(-1)  # [B, L]

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_policy(cls, policy: PreTrainedModel, head_init: str = "zero", kind: str = "value") -> "ScalarHeadModel":
        """A copy of the policy's backbone (its LM head dropped) plus a new head."""
        return cls(copy.deepcopy(policy.base_model), head_init=head_init, kind=kind)

    @classmethod
    def random_like(cls, policy: PreTrainedModel, kind: str = "value") -> "ScalarHeadModel":
        """A freshly initialised backbone of the policy's architecture (value_init='random')."""
        backbone = type(policy.base_model)(copy.deepcopy(policy.base_model.config))
        return cls(backbone, head_init="zero", kind=kind)

    @classmethod
    def from_pretrained(cls, path: str | Path, zero_head: bool = False, dropout: bool = False,
                        dtype: torch.dtype | str | None = torch.float32,
                        attn_implementation: str | None = None) -> "ScalarHeadModel":
        """Load a saved scalar-head model (e.g. a reward model); `zero_head` for critic init.

        `dtype` float32 (the default) keeps fp32 weights for a bf16 checkpoint; "auto" or
        None loads as saved (PPOConfig.model_dtype)."""
        path = check_model_dir(path)
        info_file = path / HEAD_INFO
        if not info_file.is_file():
            raise ModelLoadError(
                f"{path}: not a scalar-head model (no {HEAD_INFO}); a reward model must be saved by "
                "ScalarHeadModel.save_pretrained"
            )
        info = json.loads(info_file.read_text())
        kwargs = {"dtype": dtype if dtype is not None else "auto"}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        backbone = AutoModel.from_pretrained(str(path), **kwargs)
        model = cls(backbone, head_init="zero", kind=info.get("kind", "value"))
        head = load_file(str(path / HEAD_WEIGHTS))
        if head["weight"].shape != model.head.weight.shape:
            raise ModelLoadError(f"{path}: head shape {tuple(head['weight'].shape)} does not match the backbone")
        model.head.load_state_dict(head)
        if zero_head:
            nn.init.zeros_(model.head.weight)
            nn.init.zeros_(model.head.bias)
        if not dropout:
            disable_dropout(model)
        return model

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """The backbone as an HF model directory plus the head; a LoRA backbone is saved
        merged (a plain backbone) with its adapter in ``adapter/`` (see ppo/models/lora.py).
        `state_dict`: this model's whole state when its own weights are shards (FSDP)."""
        from ppo.models.lora import save_policy

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        backbone_state = head_state = None
        if state_dict is not None:
            backbone_state = {k.removeprefix("backbone."): v for k, v in state_dict.items()
                              if k.startswith("backbone.")}
            head_state = {k.removeprefix("head."): v for k, v in state_dict.items() if k.startswith("head.")}
        save_policy(self.backbone, path, backbone_state)
        head_state = self.head.state_dict() if head_state is None else head_state
        save_file({k: v.detach().contiguous().cpu() for k, v in head_state.items()}, str(path / HEAD_WEIGHTS))
        (path / HEAD_INFO).write_text(json.dumps({"kind": self.kind, "hidden_size": self.head.in_features}))


def load_value_weights(model: ScalarHeadModel, path: str | Path) -> None:
    """Restore a critic saved by `ScalarHeadModel.save_pretrained` into `model` (resume)."""
    from ppo.models.lora import load_policy_weights

    path = Path(path)
    load_policy_weights(model.backbone, path, skip=(HEAD_WEIGHTS,))
    model.head.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))

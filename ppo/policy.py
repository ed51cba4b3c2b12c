"""Loading a Hugging Face causal LM as a policy, and the tokenizer conventions.

Implementation details that live here:

- **Left-padded queries** (`prepare_tokenizer`): generation appends to the right, so every
  prompt must end at the same column. Position ids are then computed from the attention
  mask (`position_ids_from_mask`) so a left-padded prompt sees positions 0, 1, 2, ... from
  its first real token, exactly as if it were unpadded.
- **A pad token distinct from EOS** (`prepare_tokenizer`): many checkpoints ship without a
  pad token and the common fix, ``pad = eos``, makes "mask the padding" also mask the
  real stop token. We add a dedicated ``<pad>`` token instead and resize the embeddings.
- **Dropout off** (`disable_dropout`): with dropout on, the log-probs of the same tokens
  differ between the rollout pass and the training pass, so the PPO ratio is not 1 even
  before any update (N+ implementation details, AlpacaFarm and TRL both disable it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

PAD_TOKEN = "<pad>"


class ModelLoadError(ValueError):
    """A model directory that cannot be loaded; the message names the path and the problem."""


def check_model_dir(path: str | Path) -> Path:
    """Fail early with a clear message if `path` is not a saved HF model directory."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: model directory does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"{path}: expected a model directory, found a file")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path}: no config.json (not a saved Hugging Face model)")
    try:
        json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{config_file}: malformed JSON ({error.msg} at line {error.lineno})") from None
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    if not weights:
        raise ModelLoadError(f"{path}: no weight files (*.safetensors or *.bin)")
    return path


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Set left padding and make sure a pad token exists and differs from EOS.

    Returns True when a new pad token was added (the model's embeddings must then be
    resized, see `load_policy`).
    """
    tokenizer.padding_side = "left"
    if tokenizer.eos_token_id is None:
        raise ModelLoadError("the tokenizer has no eos token; responses could never stop")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
        return True
    return False


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability in `model` to 0 (see module docstring)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    path = check_model_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as error:  # transformers raises many kinds; name the path
        raise ModelLoadError(f"{path}: cannot load a tokenizer ({type(error).__name__}: {error})") from error
    return tokenizer


def load_policy(
    path: str | Path,
    dropout: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any local HF causal LM and its tokenizer, ready for RL.

    Args:
        path: a directory written by ``save_pretrained`` (model and tokenizer).
        dropout: keep dropout (False, the default, disables it everywhere).
        dtype: load the weights in this dtype (default: as saved).
    """
    path = check_model_dir(path)
    tokenizer = load_tokenizer(path)
    added_pad = prepare_tokenizer(tokenizer)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype) if dtype else (
            AutoModelForCausalLM.from_pretrained(str(path))
        )
    except Exception as error:
        raise ModelLoadError(f"{path}: cannot load a causal LM ({type(error).__name__}: {error})") from error
    if added_pad:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if not dropout:
        disable_dropout(model)
    return model, tokenizer


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token; padding gets position 0.

    >>> position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, starting with BOS when the tokenizer has one.

    Tokenizers differ in whether they add BOS themselves; this makes it uniform.
    Raises ValueError on an empty prompt (naming its index).
    """
    encoded = []
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompts[{index}]: empty prompt")
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        encoded.append(ids)
    return encoded


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into `(input_ids, attention_mask)`, both `[batch, max_len]`."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        if ids:
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask

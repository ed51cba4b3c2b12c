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
  Zeroing `nn.Dropout` modules is not enough: Llama, Qwen2, OPT and GPT-NeoX copy the
  probability into plain float attributes at build time (``self.attention_dropout``,
  ``self.dropout``, OPT's ``layerdrop``) and read those in train mode, so every float
  attribute whose name says "drop" is zeroed too. Scoring passes also run in eval mode
  (`scoring_mode`), so they never depend on the mode the last update left.
- **Padded embedding matrices** (`resize_for_tokenizer`): Qwen-style checkpoints pad the
  embedding matrix beyond the vocabulary; adding a pad token must never *shrink* it.
- **Every stop id the checkpoint declares** (`declared_stop_token_ids`): instruct models
  list several end-of-turn ids in ``generation_config.eos_token_id``; the tokenizer's
  single ``eos_token_id`` misses them (`PPOConfig.stop_token_ids`).
- **Context length and prompt truncation** (`context_length`, `truncate_prompt`): a prompt
  plus the response must fit the model's positions; GPT-2 raises ``IndexError`` past them
  and RoPE models silently run past their trained range (`PPOConfig.max_prompt_length`,
  `PPOConfig.prompt_truncation`).
- **fp32 master weights** (`load_policy`'s ``dtype``): transformers loads a bf16 checkpoint
  in bf16 ("auto"), where small updates round away; `PPOConfig.model_dtype` defaults to
  float32 and mixed precision is left to autocast (`ppo/models/precision.py`).
"""

from __future__ import annotations

import contextlib
import json
import weakref
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

    Returns True when a new pad token was added (the model's embeddings may then need to
    grow, see `resize_for_tokenizer`).
    """
    tokenizer.padding_side = "left"
    if tokenizer.eos_token_id is None:
        raise ModelLoadError("the tokenizer has no eos token; responses could never stop")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
        return True
    return False


def resize_for_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Grow the embedding matrix when the tokenizer has ids beyond it; never shrink it.

    Qwen-style checkpoints pad the matrix beyond the vocabulary (151,936 rows for 151,665
    tokens): a new pad token's id already has a row there, and resizing to
    ``len(tokenizer)`` would cut the rows (and the tied output head) the checkpoint has.
    """
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer))


def _is_dropout_name(name: str) -> bool:
    # attention_dropout, hidden_dropout, resid_pdrop, embd_pdrop, OPT's layerdrop, ...
    return "drop" in name.lower()


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability in `model` to 0 (see module docstring).

    Three places hold a probability: `nn.Dropout` modules, plain float attributes that
    modules copied from the config at build time (read as ``F.dropout(x, p=self.dropout,
    training=self.training)``), and the configs themselves (read when a module is built).
    """
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and _is_dropout_name(name):
                setattr(module, name, 0.0)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            for name, value in config.to_dict().items():
                if isinstance(value, float) and not isinstance(value, bool) and _is_dropout_name(name):
                    setattr(config, name, 0.0)


_MODULE_TREES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _children_ids(modules: tuple) -> tuple:
    """Every module's children, by identity: equal for two calls exactly when the tree under
    the first module is still made of the same modules (each child is itself listed)."""
    return tuple(id(child) for module in modules for child in module._modules.values())


def _plain_train(module: torch.nn.Module) -> bool:
    """Whether ``module.train(mode)`` only sets ``training`` on it and its children:
    `Module.train`, or `PreTrainedModel.train` without hub kernels to re-cast."""
    method = type(module).train
    if method is torch.nn.Module.train:
        return True
    return method is PreTrainedModel.train and not getattr(module, "use_kernels", False)


def set_training(model: torch.nn.Module, mode: bool) -> None:
    """``model.train(mode)``, the same flags set without `Module.train`'s recursion.

    `Module.train` walks the module tree through generators and ``__setattr__`` on every
    call, and a PPO step switches policy and critic 8 times. Here the module list is taken once per model (again whenever a module
    anywhere in it was added, removed or replaced) and each ``training`` flag is written
    directly. A model in which any module does more in ``train`` than set the flags (DDP
    and peft wrappers, a Hugging Face model with hub kernels) gets its own method.
    """
    cached = _MODULE_TREES.get(model)
    if cached is None or _children_ids(cached[0]) != cached[1]:
        modules = tuple(model.modules())
        cached = (modules, _children_ids(modules), all(map(_plain_train, modules)))
        _MODULE_TREES[model] = cached
    modules, _, plain = cached
    if not plain:
        model.train(mode)
        return
    for module in modules:
        module.__dict__["training"] = mode


@contextlib.contextmanager
def scoring_mode(*models):
    """Run `models` in eval mode inside the block, then restore each one's mode.

    Old log-probs, reference log-probs and values must not depend on whether the last
    update left a model in train mode (dropout, and any other train-only behaviour).
    """
    models = [m for m in models if m is not None and hasattr(m, "training")]
    was_training = [m.training for m in models]
    for model in models:
        set_training(model, False)
    try:
        yield
    finally:
        for model, mode in zip(models, was_training):
            set_training(model, mode)


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def declared_stop_token_ids(model, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every end-of-sequence id the checkpoint declares, tokenizer's first.

    Instruct checkpoints list several (e.g. end-of-text and end-of-turn) in
    ``generation_config.eos_token_id``; the tokenizer names only one.
    """
    ids = _as_id_list(tokenizer.eos_token_id)
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        ids += _as_id_list(getattr(source, "eos_token_id", None))
    return list(dict.fromkeys(ids))


_CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def context_length(model) -> int | None:
    """Positions the model was built for (None when its config does not say)."""
    config = getattr(model, "config", None)
    for name in _CONTEXT_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_max_prompt_length(model, max_prompt_length: int | None, response_length: int) -> int | None:
    """The prompt limit of a run, checked against the model's context before any generation.

    None becomes ``context - response_length``; a limit that leaves the sequence longer
    than the context is an error naming the fields (GPT-2 would raise IndexError deep in
    ``generate``, RoPE models would silently run past the positions they were trained on).
    """
    context = context_length(model)
    if context is None:
        return max_prompt_length
    if response_length >= context:
        raise ValueError(f"PPOConfig.response_length: {response_length} new tokens do not fit the model's context "
                         f"of {context} positions with any prompt")
    if max_prompt_length is None:
        return context - response_length
    if max_prompt_length + response_length > context:
        raise ValueError(f"PPOConfig.max_prompt_length: {max_prompt_length} prompt tokens + response_length "
                         f"{response_length} = {max_prompt_length + response_length} exceed the model's context of "
                         f"{context} positions")
    return max_prompt_length


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing on a causal LM, a peft model or a
    `ScalarHeadModel` (whose transformer is ``.backbone``)."""
    target = getattr(model, "backbone", model)
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.x name
        target.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = getattr(target, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False  # a KV cache is useless in training and conflicts with recomputation


def gradient_checkpointing_active(model) -> bool:
    """Whether any layer of `model` (or a `ScalarHeadModel`'s backbone) checkpoints its activations."""
    target = getattr(model, "backbone", model)
    return any(getattr(module, "gradient_checkpointing", False) is True for module in target.modules())


def truncate_prompt(ids: list[int], max_length: int, side: str, bos_token_id: int | None = None) -> list[int]:
    """Cut a prompt's ids to `max_length`, keeping a leading BOS.

    ``side="left"`` drops the oldest tokens (the question at the end survives, as TRL's
    ``truncation_side="left"``), ``"right"`` drops the end.

    >>> truncate_prompt([1, 5, 6, 7, 8], 3, "left", bos_token_id=1)
    [1, 7, 8]
    >>> truncate_prompt([1, 5, 6, 7, 8], 3, "right", bos_token_id=1)
    [1, 5, 6]
    """
    if len(ids) <= max_length:
        return ids
    keep_bos = bos_token_id is not None and ids and ids[0] == bos_token_id
    head, body = (ids[:1], ids[1:]) if keep_bos else ([], ids)
    room = max_length - len(head)
    if room < 1:
        raise ValueError(f"max_prompt_length={max_length} leaves no room for the prompt after BOS")
    return head + (body[-room:] if side == "left" else body[:room])


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
    dtype: torch.dtype | str | None = torch.float32,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any local HF causal LM and its tokenizer, ready for RL.

    Args:
        path: a directory written by ``save_pretrained`` (model and tokenizer).
        dropout: keep dropout (False, the default, disables it everywhere).
        dtype: the weights' dtype. float32 (the default) keeps fp32 master weights even
            for a bf16 checkpoint; ``"auto"`` or None loads as saved (PPOConfig.model_dtype).
        attn_implementation: "eager", "sdpa", "flash_attention_2", ... (None: transformers
            picks; PPOConfig.attn_implementation).
    """
    path = check_model_dir(path)
    tokenizer = load_tokenizer(path)
    added_pad = prepare_tokenizer(tokenizer)
    kwargs = {"dtype": dtype if dtype is not None else "auto"}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as error:
        raise ModelLoadError(f"{path}: cannot load a causal LM ({type(error).__name__}: {error})") from error
    if added_pad:
        resize_for_tokenizer(model, tokenizer)
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
    Raises ValueError on an empty prompt (naming its index). Length limits are applied by
    the caller (`truncate_prompt`).
    """
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompts[{index}]: empty prompt")
    # One tokenizer call over the distinct prompts (a GRPO batch repeats each G times), each
    # row then given its prompt's ids.
    distinct = list(dict.fromkeys(prompts))
    batch = tokenizer(distinct, add_special_tokens=True)["input_ids"] if distinct else []
    bos = tokenizer.bos_token_id
    by_prompt = {prompt: ([bos] if bos is not None and (not ids or ids[0] != bos) else []) + list(ids)
                 for prompt, ids in zip(distinct, batch)}
    return [list(by_prompt[prompt]) for prompt in prompts]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into `(input_ids, attention_mask)`, both `[batch, max_len]`.

    >>> left_pad([[5, 6], [7]], pad_id=0)
    (tensor([[5, 6],
            [0, 7]]), tensor([[1, 1],
            [0, 1]]))
    """
    width = max(len(s) for s in sequences)
    # Two tensors built from padded lists: one call each, not a slice assignment per row.
    input_ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)
    return input_ids, attention_mask

"""The CPU testbed's tiny language model and its character-level tokenizer.

Everything in this project must run on a laptop CPU in minutes, and nothing may be
downloaded from a model hub. So the testbed builds its own model and tokenizer here, and
they are *real* Hugging Face objects: a `PreTrainedTokenizerFast` and a `LlamaForCausalLM`
(or `GPT2LMHeadModel`) that save with `save_pretrained` and load back with
`AutoTokenizer` / `AutoModelForCausalLM` exactly like a hub model. That keeps the code path
the testbed exercises identical to the one a GPU user runs with a 7B model.

The tokenizer is one token per character, with distinct pad, bos and eos tokens (a pad
token equal to eos is a classic bug source: masking pads would then mask the stop token).

Example:
    >>> tok = build_char_tokenizer()
    >>> tok.decode(tok("12+3=")["input_ids"])
    '12+3='
    >>> model = build_tiny_model(TinyModelConfig(), tok)
    >>> 500_000 < sum(p.numel() for p in model.parameters()) < 3_000_000
    True
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Digits, arithmetic, the scratchpad's separators and lowercase words: enough for the
# arithmetic task and for short English prompts in the tests.
DEFAULT_ALPHABET = string.digits + "+-*/=;:#.,?!()" + string.ascii_lowercase + " \n"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level `PreTrainedTokenizerFast`: one token per character.

    Ids 0..3 are pad, bos, eos, unk; characters follow in `alphabet` order. Unknown
    characters map to unk. Queries are left-padded (see DESIGN.md, tensor conventions).
    """
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet: characters must be unique")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in alphabet:
        vocab[char] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every char
    backend.decoder = decoders.Fuse()  # join characters back without spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=512,
    )
    return tokenizer


BPE_EOS, BPE_BOS, BPE_PAD = "<|endoftext|>", "<|startoftext|>", "<|pad|>"
BPE_PAD_MODES = ("distinct", "eos", "none")
_BPE_CORPUS = (
    "question: tom has 3 apples and buys 4 more. how many apples does he have? answer: 3+4=7 #### 7\n",
    "the quick brown fox jumps over the lazy dog. a costs 1,000 and b costs 234; the total is 1234.\n",
    "12+34=46; 7*8=56; 90-45=45; half of 10 is 5. let us think step by step about the answer.\n",
)


def build_byte_bpe_tokenizer(pad: str = "distinct", vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen style), trained in milliseconds on
    a few built-in lines, with the three pad conventions real checkpoints ship with:

    - ``"distinct"``: its own pad token;
    - ``"eos"``: pad == eos (GPT-2 style fine-tunes; masking pads would mask the stop token);
    - ``"none"``: no pad token at all (Llama, Mistral).

    Every byte has a token, so any text round-trips. Ids 0, 1 (, 2) are eos, bos (, pad).
    """
    if pad not in BPE_PAD_MODES:
        raise ValueError(f"pad: expected one of {BPE_PAD_MODES}, got {pad!r}")
    specials = [BPE_EOS, BPE_BOS] + ([BPE_PAD] if pad == "distinct" else [])
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(_BPE_CORPUS) * 4, trainer)
    pad_token = {"distinct": BPE_PAD, "eos": BPE_EOS, "none": None}[pad]
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BPE_BOS, eos_token=BPE_EOS,
                                   pad_token=pad_token, model_max_length=4096)


@dataclass
class TinyModelConfig:
    """Shape of the testbed model. The defaults give about 0.9M parameters."""

    arch: str = "llama"  # "llama" (RoPE, SwiGLU, RMSNorm) or "gpt2" (learned positions)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 256
    dropout: float = 0.0  # the RL code disables dropout anyway (see PPOConfig.disable_dropout)

    def __post_init__(self):
        if self.arch not in ("llama", "gpt2"):
            raise ValueError(f"arch: expected 'llama' or 'gpt2', got {self.arch!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)


def build_tiny_model(config: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A freshly initialised small causal LM sized for `tokenizer`'s vocabulary."""
    special = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    if config.arch == "llama":
        hf_config = LlamaConfig(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads,
            max_position_embeddings=config.max_positions,
            attention_dropout=config.dropout,
            **special,
        )
        model = LlamaForCausalLM(hf_config)
    else:
        hf_config = GPT2Config(
            n_embd=config.hidden_size,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            n_inner=config.intermediate_size,
            n_positions=config.max_positions,
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
            **special,
        )
        model = GPT2LMHeadModel(hf_config)
    # The model's own generation defaults (top_k=50 in some versions) must never leak
    # into sampling: rollout code always passes its sampling settings explicitly.
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model

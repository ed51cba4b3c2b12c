"""Real architectures, built from small random configs with dropout on, through the whole loop.

For each architecture and each tokenizer convention (no pad, pad == eos, a distinct pad):
the checkpoint loads with dropout really off, left-padded log-probs equal unpadded ones,
1 epoch x 1 minibatch of PPO and of GRPO gives a ratio of exactly 1 and no clipping, and
the checkpoint the trainer writes loads back with ``from_pretrained`` to the same logits.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from ppo.config import PPOConfig, preset
from ppo.models.logprobs import response_logprobs
from ppo.models.policy import encode_prompts, left_pad, load_policy
from ppo.models.tiny_model import BPE_PAD_MODES, build_byte_bpe_tokenizer
from ppo.trainer import RLTrainer

DROPOUT = 0.1  # every dropout knob of every config set > 0: the loader must turn them all off
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gpt2", "gpt_neox", "opt", "gemma", "phi3", "mistral")


def tiny_config(arch: str, tokenizer, max_positions: int = 128):
    """A 2-layer, 32-wide config of `arch` with every dropout probability at DROPOUT."""
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    vocab = len(tokenizer)
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=max_positions, **ids)
    padded_vocab = -(-vocab // 64) * 64 + 64  # Qwen pads the embedding matrix beyond the vocabulary
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=1, attention_dropout=DROPOUT, **common)
    if arch == "qwen2":
        return Qwen2Config(**{**common, "vocab_size": padded_vocab}, num_key_value_heads=1, attention_dropout=DROPOUT)
    if arch == "qwen3":
        return Qwen3Config(**{**common, "vocab_size": padded_vocab}, num_key_value_heads=1, head_dim=16,
                           attention_dropout=DROPOUT)
    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=max_positions,
                          resid_pdrop=DROPOUT, embd_pdrop=DROPOUT, attn_pdrop=DROPOUT, **ids)
    if arch == "gpt_neox":
        return GPTNeoXConfig(attention_dropout=DROPOUT, hidden_dropout=DROPOUT, **common)
    if arch == "opt":
        return OPTConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                         max_position_embeddings=max_positions, word_embed_proj_dim=32, dropout=DROPOUT,
                         attention_dropout=DROPOUT, activation_dropout=DROPOUT, layerdrop=DROPOUT, **ids)
    if arch == "gemma":
        return GemmaConfig(num_key_value_heads=1, head_dim=16, attention_dropout=DROPOUT, **common)
    if arch == "phi3":
        return Phi3Config(num_key_value_heads=1, resid_pdrop=DROPOUT, embd_pdrop=DROPOUT, attention_dropout=DROPOUT,
                          **common)
    if arch == "mistral":
        return MistralConfig(num_key_value_heads=1, attention_dropout=DROPOUT, sliding_window=None, **common)
    raise ValueError(arch)


def save_checkpoint(path, arch: str, pad: str, seed: int = 0, max_positions: int = 128, **config_overrides):
    """A random `arch` model and a byte-level BPE tokenizer saved like a hub checkpoint."""
    tokenizer = build_byte_bpe_tokenizer(pad)
    config = tiny_config(arch, tokenizer, max_positions)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


PROMPTS = ["12+34=", "tom has 3 apples", "half of 10 is", "a costs 1,000 and b costs 234. total?"]


def count_digits(prompts, responses):
    return [float(sum(ch.isdigit() for ch in response)) for response in responses]


def small_run(path, output_dir, name: str | None = None, **overrides) -> RLTrainer:
    common = dict(task="custom", model_path=str(path), output_dir=str(output_dir), rollout_batch_size=4,
                  response_length=6, ppo_epochs=1, num_minibatches=1, total_steps=2, save_every=0, eval_every=0,
                  progress=False, log_samples=1, lr=1e-2, threads=1, **overrides)
    config = preset(name, **common) if name else PPOConfig(**common)
    return RLTrainer(config, prompts=PROMPTS, reward_fn=count_digits)


@pytest.mark.parametrize("pad", BPE_PAD_MODES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_through_the_loop(tmp_path, arch, pad):
    path = save_checkpoint(tmp_path / "ckpt", arch, pad)
    saved_rows = AutoModelForCausalLM.from_pretrained(path).get_input_embeddings().weight.shape[0]

    # -- loading: a distinct pad, the embedding matrix never shrinks, dropout really off ---------
    model, tokenizer = load_policy(path)
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows >= saved_rows and tokenizer.pad_token_id < rows
    if arch in ("qwen2", "qwen3"):
        assert rows == saved_rows  # the new pad id fits in the padded matrix: nothing to resize
    probe = torch.tensor([encode_prompts(tokenizer, PROMPTS[:1])[0]])
    model.train()
    with torch.no_grad():
        assert torch.equal(model(probe).logits, model(probe).logits), "dropout still live in train mode"

    # -- left padding: a padded row scores its response exactly as the unpadded prompt ------------
    queries = encode_prompts(tokenizer, PROMPTS[:2])
    query_ids, query_mask = left_pad(queries, tokenizer.pad_token_id)
    response_ids = torch.tensor([[40, 41, 42], [43, 44, 45]])
    response_mask = torch.ones_like(response_ids)
    with torch.no_grad():
        batched = response_logprobs(model, query_ids, query_mask, response_ids, response_mask)
        for row, ids in enumerate(queries):
            alone = response_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                                      response_ids[row:row + 1], response_mask[row:row + 1])
            torch.testing.assert_close(batched[row:row + 1], alone, atol=1e-5, rtol=0)

    # -- one PPO and one GRPO step: 1 epoch x 1 minibatch means ratio exactly 1 -----------------
    for name, run_dir in ((None, "ppo"), ("grpo", "grpo")):
        trainer = small_run(path, tmp_path / run_dir, name, **({"group_size": 2} if name else {}))
        for step in range(2):  # step 2 starts from the train mode the first update left
            metrics = trainer.train_step()
            assert metrics["ratio_mean"] == 1.0 and metrics["ratio_max"] == 1.0, (name, step, metrics["ratio_max"])
            assert metrics["clipfrac"] == 0.0
            if name == "grpo" and step == 0:
                assert metrics["kl"] == 0.0  # reference == policy before any update

    # -- the checkpoint the trainer writes is a plain HF model directory -----------------------
    checkpoint = trainer.save_checkpoint() / "policy"
    reloaded = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert reloaded_tokenizer.pad_token_id == trainer.tokenizer.pad_token_id
    policy = trainer.accelerator.unwrap_model(trainer.policy).eval()
    probe = torch.tensor([encode_prompts(reloaded_tokenizer, PROMPTS[2:3])[0]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(probe).logits, policy(probe).logits, atol=1e-6, rtol=0)

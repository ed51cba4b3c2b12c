"""Chat templates: an instruct tokenizer's prompts are rendered with its template (one BOS,
the generation prompt, the end-of-turn token a stop token); a base tokenizer's are not."""

import json

import pytest
import torch

from ppo.config import PPOConfig
from ppo.models.policy import encode_prompts
from ppo.tasks.chat import end_of_turn_ids, render_prompt

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def chat_tokenizer():
    from ppo.models.tiny_model import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ROLE_TOKENS})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    from ppo.models.tiny_model import TinyModelConfig, build_tiny_model

    tokenizer = chat_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer)
    path = tmp_path_factory.mktemp("chat_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_chat_template_renders_one_bos_and_the_generation_prompt():
    tokenizer = chat_tokenizer()
    text = render_prompt(tokenizer, "1+1=", system_prompt="be brief")
    assert text == "<|system|>be brief<|end|><|user|>1+1=<|end|><|assistant|>"
    ids = encode_prompts(tokenizer, [text])[0]
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids == tokenizer.apply_chat_template([{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": "1+1="}],
                                                tokenize=True, add_generation_prompt=True, return_dict=False)
    assert end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids("<|end|>")]


def train_one_step(model_dir, output_dir, **overrides):
    from ppo.trainer import RLTrainer

    seen = []

    def reward_fn(prompts, responses):
        seen.extend(prompts)
        return [float(r.count("1")) for r in responses]

    config = PPOConfig(model_path=str(model_dir), advantage_estimator="rloo", group_size=2, rollout_batch_size=4,
                       response_length=6, total_steps=1, eval_every=0, eval_size=2, progress=False, save_every=0,
                       report_to=[], log_samples=4, threads=1, output_dir=str(output_dir), **overrides)
    trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=reward_fn)
    trainer.train()
    samples = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    return trainer, samples, seen


def test_chat_template_applied_in_a_run_and_visible_in_samples(tmp_path, chat_model_dir):
    trainer, samples, seen = train_one_step(chat_model_dir, tmp_path / "chat", system_prompt="be brief")
    end = trainer.tokenizer.convert_tokens_to_ids("<|end|>")
    assert end in trainer.stop_token_ids and trainer.tokenizer.eos_token_id in trainer.stop_token_ids
    assert {s["prompt"] for s in samples} <= {f"<|system|>be brief<|end|><|user|>{p}<|end|><|assistant|>"
                                              for p in ("1+1=", "2+3=")}
    assert set(seen) <= {"1+1=", "2+3="}  # the reward function gets the prompts as written
    _, plain, _ = train_one_step(chat_model_dir, tmp_path / "off", chat_template="off")
    assert {s["prompt"] for s in plain} <= {"1+1=", "2+3="}


def test_chat_template_not_applied_to_a_base_tokenizer(tmp_path, tiny_model_dir):
    trainer, samples, _ = train_one_step(tiny_model_dir, tmp_path / "base")
    assert {s["prompt"] for s in samples} <= {"1+1=", "2+3="}
    assert trainer.stop_token_ids == [trainer.tokenizer.eos_token_id]
    with pytest.raises(ValueError, match="PPOConfig.chat_template: 'on' needs a tokenizer with a chat template"):
        train_one_step(tiny_model_dir, tmp_path / "on", chat_template="on")
    with pytest.raises(ValueError, match="PPOConfig.system_prompt: the tokenizer has no chat template"):
        train_one_step(tiny_model_dir, tmp_path / "system", system_prompt="be brief")


def test_chat_template_settings_are_checked():
    assert PPOConfig(chat_template=False).chat_template == "off"  # `--chat-template off`, read as YAML
    with pytest.raises(ValueError, match="PPOConfig.chat_template: must be one of"):
        PPOConfig(chat_template="yes please")
    from ppo.settings.config_checks import inert_settings

    assert [n for n, _ in inert_settings(PPOConfig(chat_template="off", system_prompt="x"))] == ["system_prompt"]

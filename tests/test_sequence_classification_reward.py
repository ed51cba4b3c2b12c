"""Hugging Face sequence-classification checkpoints (TRL RewardTrainer's layout) as the
reward model and as the critic's initialisation."""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from ppo.config import PPOConfig
from value_model.hf_reward import SequenceClassifierReward, critic_from_sequence_classifier, is_sequence_classifier

BPE_TEMPLATE = ("{% for m in messages %}<|startoftext|>{{ m['role'] }}: {{ m['content'] }}<|endoftext|>{% endfor %}"
                "{% if add_generation_prompt %}<|startoftext|>assistant: {% endif %}")


def save_reward_model(path, tokenizer, chat_template=None, seed=0):
    """A tiny LlamaForSequenceClassification (num_labels 1) saved as TRL's RewardTrainer
    leaves its output_dir: model, tokenizer (pad id in the config), training_args.bin, README.md."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save({"output_dir": str(path), "num_labels": 1}, path / "training_args.bin")
    (path / "README.md").write_text("---\nlibrary_name: transformers\ntags: [trl, reward-trainer]\n---\n")
    return path


@pytest.fixture(scope="session")
def bpe_reward_dir(tmp_path_factory):
    from ppo.models.tiny_model import build_byte_bpe_tokenizer

    return save_reward_model(tmp_path_factory.mktemp("rm_bpe"), build_byte_bpe_tokenizer(), BPE_TEMPLATE)


def direct_score(path, text):
    """What AutoModelForSequenceClassification gives for one text, no padding anywhere."""
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()


def test_sequence_classification_reward_scores_as_the_model_does_directly(bpe_reward_dir, tmp_path):
    assert is_sequence_classifier(bpe_reward_dir) and (bpe_reward_dir / "training_args.bin").is_file()
    reward = SequenceClassifierReward.from_pretrained(bpe_reward_dir)
    prompts, responses = ["half of 10?", "tom has 3 apples"], ["5", " and buys 4 more, so 7 apples."]
    texts = reward.texts(prompts, responses)
    assert texts[0] == "<|startoftext|>user: half of 10?<|endoftext|><|startoftext|>assistant: 5<|endoftext|>"
    with torch.no_grad():
        batched = reward(prompts, responses)  # right-padded together
    assert torch.allclose(batched, torch.tensor([direct_score(bpe_reward_dir, t) for t in texts]), atol=1e-5)
    # Without a chat template the reward model reads prompt + response.
    from ppo.models.tiny_model import build_byte_bpe_tokenizer

    plain_dir = save_reward_model(tmp_path / "plain", build_byte_bpe_tokenizer(pad="none"))
    plain = SequenceClassifierReward.from_pretrained(plain_dir)
    with torch.no_grad():
        scores = plain(prompts, responses)
    assert torch.allclose(scores, torch.tensor([direct_score(plain_dir, p + r) for p, r in zip(prompts, responses)]),
                          atol=1e-5)


def test_sequence_classification_reward_model_with_its_own_tokenizer_scores_a_run(tmp_path, tiny_model_dir,
                                                                                  bpe_reward_dir):
    """The policy's char tokenizer differs from the reward model's BPE: the run's scores are
    the reward model's own scores of prompt and decoded response text."""
    from ppo.trainer import RLTrainer

    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), reward_model_path=str(bpe_reward_dir),
                       advantage_estimator="rloo", group_size=2, rollout_batch_size=4, response_length=6,
                       total_steps=1, eval_every=0, eval_size=2, progress=False, save_every=0, report_to=[],
                       log_samples=4, threads=1, output_dir=str(tmp_path / "run"))
    trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=lambda p, r: [0.0] * len(r))
    assert trainer.models.reward_reads_text
    trainer.train()
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    texts = trainer.reward_model.texts([s["prompt"] for s in samples], [s["response"] for s in samples])
    for sample, text in zip(samples, texts):
        assert sample["score"] == pytest.approx(direct_score(bpe_reward_dir, text), abs=1e-4)


def test_sequence_classification_checkpoint_starts_the_critic(tmp_path, tiny_model_dir, bpe_reward_dir, char_tokenizer):
    shared = save_reward_model(tmp_path / "rm_char", AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    score = AutoModelForSequenceClassification.from_pretrained(str(shared)).score.weight
    kept = critic_from_sequence_classifier(shared, char_tokenizer, zero_head=False)
    assert torch.equal(kept.head.weight, score) and kept.head.weight.requires_grad
    assert torch.count_nonzero(critic_from_sequence_classifier(shared, char_tokenizer).head.weight) == 0
    with pytest.raises(ValueError, match="PPOConfig.value_init: the reward model .* has a tokenizer of its own"):
        critic_from_sequence_classifier(bpe_reward_dir, char_tokenizer)
    from ppo.trainer import RLTrainer

    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), reward_model_path=str(shared),
                       value_init="reward_model_head", rollout_batch_size=4, response_length=6, total_steps=1,
                       eval_every=0, eval_size=2, progress=False, save_every=0, report_to=[], threads=1,
                       output_dir=str(tmp_path / "ppo"))
    trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=lambda p, r: [0.0] * len(r))
    assert torch.equal(trainer.models.value_module.head.weight.detach(), score)
    metrics = trainer.train_step()
    assert "vf_loss" in metrics


def test_sequence_classification_with_several_labels_is_refused(tmp_path, char_tokenizer):
    from ppo.models.policy import ModelLoadError

    path = save_reward_model(tmp_path / "two", char_tokenizer)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    config["label2id"] = {"bad": 0, "good": 1}
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(path), ignore_mismatched_sizes=True)
    model.save_pretrained(path)
    with pytest.raises(ModelLoadError, match="num_labels=2"):
        SequenceClassifierReward.from_pretrained(path)

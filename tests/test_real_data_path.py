"""The real-model path: any local HF causal LM directory plus a GSM8K-layout JSONL task."""

import json
import random

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from ppo.run.evaluation import evaluate
from ppo.models.policy import ModelLoadError, encode_prompts, load_policy, position_ids_from_mask
from ppo.models.rollout import generate
from ppo.tasks import GSM8KTask, TaskDataError, load_gsm8k_jsonl


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD_ROWS = [
    {"question": "tom has 3 apples and buys 4. how many?", "answer": "3+4=7\n#### 7"},
    {"question": "a costs 1,000 and b costs 234. total?", "answer": "1000+234=1234\n#### 1,234"},
    {"question": "half of 5?", "answer": "5/2=2.5\n#### 2.5"},
]


def test_loader_good_rows(tmp_path):
    problems = load_gsm8k_jsonl(write_jsonl(tmp_path / "train.jsonl", GOOD_ROWS + [""]))
    assert len(problems) == 3
    assert problems[0].prompt == "Question: tom has 3 apples and buys 4. how many?\nAnswer:"
    assert float(problems[1].answer) == 1234.0
    assert float(problems[2].answer) == 2.5


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"answer": "#### 3"}, "line 2.*missing field 'question'|:2: missing field 'question'"),
        ({"question": "q"}, ":2: missing field 'answer'"),
        ({"question": "q", "answer": "three"}, ":2: .*no '####"),
        ({"question": "q", "answer": "#### three"}, ":2: .*non-numeric gold answer 'three'"),
        ({"question": "   ", "answer": "#### 3"}, ":2: .*empty"),
        ({"question": 5, "answer": "#### 3"}, ":2: field 'question' must be a string"),
        ("{not json", ":2: invalid JSON"),
        ("[1, 2]", ":2: expected a JSON object"),
    ],
)
def test_loader_bad_rows_name_the_line(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROWS[0], bad_row])
    with pytest.raises(TaskDataError, match=message) as error:
        load_gsm8k_jsonl(path)
    assert str(path) in str(error.value)


def test_loader_missing_and_empty_file(tmp_path):
    with pytest.raises(TaskDataError, match="no such JSONL file"):
        load_gsm8k_jsonl(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TaskDataError, match="no rows"):
        load_gsm8k_jsonl(tmp_path / "empty.jsonl")


def test_numeric_answer_checking(tmp_path):
    task = GSM8KTask(str(write_jsonl(tmp_path / "train.jsonl", GOOD_ROWS)))
    seven, thousands, half = task.eval_problems()
    assert task.score(seven, " 3+4=7 #### 7", True).correct
    assert task.score(seven, " so #### 7.00", True).correct
    assert not task.score(seven, " #### 8", True).correct
    assert task.score(seven, " the answer is 7", True).correct  # default 'flexible': the last number
    strict = GSM8KTask(str(write_jsonl(tmp_path / "train.jsonl", GOOD_ROWS)), answer_mode="strict")
    assert not strict.score(seven, " the answer is 7", True).has_answer  # 'strict' needs '#### N'
    assert task.score(thousands, "#### 1,234", False).correct
    assert task.score(thousands, "#### $1234", True).correct
    assert task.score(half, "#### 2.5", True).correct
    assert len(task.sample_problems(5, random.Random(0))) == 5


def test_load_policy_from_local_dir(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert not any(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout))
    torch.manual_seed(0)
    rollout = generate(model, tokenizer, ["1+2=", "10+20+30="], max_new_tokens=6)
    assert rollout.response_ids.shape[0] == 2
    assert rollout.query_ids[0, 0].item() == tokenizer.pad_token_id  # left padded


def test_pad_token_added_when_missing(tmp_path, tiny_model_dir):
    """A checkpoint whose tokenizer has no pad token gets a distinct one, embeddings resized."""
    model, tokenizer = load_policy(tiny_model_dir)
    backend = tokenizer.backend_tokenizer
    no_pad = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    assert no_pad.pad_token_id is None
    path = tmp_path / "nopad"
    model.save_pretrained(path)
    no_pad.save_pretrained(path)
    vocab_before = model.get_input_embeddings().weight.shape[0]
    model2, tokenizer2 = load_policy(path)
    assert tokenizer2.pad_token_id is not None and tokenizer2.pad_token_id != tokenizer2.eos_token_id
    assert model2.get_input_embeddings().weight.shape[0] >= vocab_before
    assert tokenizer2.pad_token_id < model2.get_input_embeddings().weight.shape[0]


def test_repeated_prompts_are_encoded_once_with_the_same_ids(tiny_model_dir):
    _, tokenizer = load_policy(tiny_model_dir)
    prompts = ["12+34=", "5+6=", "12+34=", "12+34=", "5+6="]
    together = encode_prompts(tokenizer, prompts)
    assert together == [encode_prompts(tokenizer, [p])[0] for p in prompts]
    assert together[0][0] == tokenizer.bos_token_id and len(together[0]) > len(together[1])
    together[0].append(-1)  # each row owns its list
    assert together[2][-1] != -1


def test_left_padding_does_not_change_logits(tiny_model_dir):
    """Position ids from the attention mask make a padded prompt equal to the unpadded one."""
    model, tokenizer = load_policy(tiny_model_dir)
    ids = encode_prompts(tokenizer, ["12+34="])[0]
    alone = torch.tensor([ids])
    padded = torch.tensor([[tokenizer.pad_token_id] * 3 + ids])
    mask = (padded != tokenizer.pad_token_id).long()
    with torch.no_grad():
        logits_alone = model(alone).logits[0]
        logits_padded = model(padded, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[0, 3:]
    torch.testing.assert_close(logits_alone, logits_padded, atol=1e-5, rtol=1e-4)


def test_bad_model_dirs(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_policy(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{oops")
    with pytest.raises(ModelLoadError, match="config.json: malformed JSON"):
        load_policy(broken)
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="no weight files"):
        load_policy(no_weights)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ModelLoadError, match="found a file"):
        load_policy(a_file)


def test_empty_prompt_rejected(tiny_model_dir):
    _, tokenizer = load_policy(tiny_model_dir)
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty prompt"):
        encode_prompts(tokenizer, ["1+1=", ""])


def test_evaluate_on_jsonl_task(tmp_path, tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    task = GSM8KTask(str(write_jsonl(tmp_path / "t.jsonl", GOOD_ROWS)))
    metrics = evaluate(model, tokenizer, task, max_new_tokens=8)
    assert 0.0 <= metrics["greedy_accuracy"] <= 1.0
    assert 0.0 <= metrics["sampled_eos_rate"] <= 1.0

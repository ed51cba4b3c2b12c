import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ppo.models.tiny_model import TinyModelConfig, build_char_tokenizer, build_tiny_model


def test_tokenizer_round_trip_and_special_tokens(char_tokenizer):
    text = "27+5=32;32+8=40;chk40;#40"
    ids = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert char_tokenizer.decode(ids) == text
    specials = {char_tokenizer.pad_token_id, char_tokenizer.bos_token_id, char_tokenizer.eos_token_id}
    assert len(specials) == 3
    assert char_tokenizer.padding_side == "left"
    with_eos = ids + [char_tokenizer.eos_token_id]
    assert char_tokenizer.decode(with_eos, skip_special_tokens=True) == text


def test_unknown_characters_map_to_unk(char_tokenizer):
    ids = char_tokenizer("A", add_special_tokens=False)["input_ids"]
    assert ids == [char_tokenizer.unk_token_id]


def test_left_padding_in_batch(char_tokenizer):
    batch = char_tokenizer(["1+2=", "10+20="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0].item() == char_tokenizer.pad_token_id
    assert batch["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1]


def test_duplicate_alphabet_rejected():
    import pytest

    with pytest.raises(ValueError, match="alphabet"):
        build_char_tokenizer("aab")


def test_model_size_and_save_load_round_trip(tmp_path, char_tokenizer):
    for arch in ("llama", "gpt2"):
        torch.manual_seed(0)
        model = build_tiny_model(TinyModelConfig(arch=arch), char_tokenizer)
        n_params = sum(p.numel() for p in model.parameters())
        assert 500_000 <= n_params <= 3_000_000, (arch, n_params)
        path = tmp_path / arch
        model.save_pretrained(path)
        char_tokenizer.save_pretrained(path)
        loaded = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert type(loaded) is type(model)
        ids = torch.tensor([tokenizer("1+2=3")["input_ids"]])
        model.eval(), loaded.eval()
        with torch.no_grad():
            assert torch.equal(model(ids).logits, loaded(ids).logits)
        assert tokenizer.decode(ids[0]) == "1+2=3"
        assert tokenizer.eos_token_id == char_tokenizer.eos_token_id


def test_bad_model_config():
    import pytest

    with pytest.raises(ValueError, match="arch"):
        TinyModelConfig(arch="mamba")
    with pytest.raises(ValueError, match="num_heads"):
        TinyModelConfig(hidden_size=30, num_heads=4)

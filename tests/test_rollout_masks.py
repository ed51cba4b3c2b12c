import torch

from ppo.models.rollout import truncate_after_stop


def test_truncate_after_first_stop_token():
    ids = torch.tensor([[5, 6, 2, 9, 2], [2, 7, 7, 7, 7], [5, 6, 7, 8, 9]])
    out, mask, has_eos = truncate_after_stop(ids, stop_token_ids=[2], pad_token_id=0)
    assert out.tolist() == [[5, 6, 2, 0, 0], [2, 0, 0, 0, 0], [5, 6, 7, 8, 9]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert has_eos.tolist() == [True, True, False]


def test_several_stop_tokens():
    ids = torch.tensor([[5, 3, 2, 9]])
    out, mask, has_eos = truncate_after_stop(ids, stop_token_ids=[2, 3], pad_token_id=0)
    assert out.tolist() == [[5, 3, 0, 0]] and mask.tolist() == [[1, 1, 0, 0]] and has_eos.item()


def test_left_pad_by_hand():
    from ppo.models.policy import left_pad

    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]] and ids.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]] and mask.dtype == torch.long


def test_no_stop_token_runs_every_response_to_the_limit(char_tokenizer):
    """stop_token_ids=[] (TRL's default): nothing ends a response early, on either sampler;
    missing EOS then means no EOS id anywhere in the response (TRL contain_eos_token)."""
    import copy

    from ppo.speed import lean_forward
    from ppo.models.rollout import generate, responses_and_masks
    from ppo.models.tiny_model import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             char_tokenizer).eval()
    lean = copy.deepcopy(model)
    assert lean_forward.enable(lean) == []
    eos = char_tokenizer.eos_token_id
    for sampler in (model, lean):
        torch.manual_seed(1)
        rollout = generate(sampler, char_tokenizer, ["1+2=", "33+4="] * 4, 12, stop_token_ids=[])
        assert rollout.response_ids.shape == (8, 12) and rollout.response_mask.bool().all()
        assert rollout.has_eos.tolist() == (rollout.response_ids == eos).any(-1).tolist()
    raw = torch.tensor([[5, eos, 7], [5, 6, 7]])
    ids, mask, has_eos = responses_and_masks(raw, [], model, char_tokenizer)
    assert ids.tolist() == raw.tolist() and mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert has_eos.tolist() == [True, False]
    _, mask, has_eos = responses_and_masks(raw, [eos], model, char_tokenizer)  # with the stop: cut after it
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]] and has_eos.tolist() == [True, False]

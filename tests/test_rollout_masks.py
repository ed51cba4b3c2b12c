import torch

from ppo.rollout import truncate_after_stop


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
    from ppo.policy import left_pad

    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]] and ids.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]] and mask.dtype == torch.long

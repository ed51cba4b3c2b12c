import pytest
import torch

from ppo.algorithm.buffer import ExperienceBuffer


def test_every_sample_once_per_epoch_in_shuffled_minibatches():
    buffer = ExperienceBuffer({"index": torch.arange(12), "x": torch.arange(12).float()[:, None].repeat(1, 3)})
    seen = {0: [], 1: []}
    orders = []
    steps = 0
    for epoch, minibatch, micro in buffer.iterate(epochs=2, num_minibatches=3, micro_batches=2,
                                                  generator=torch.Generator().manual_seed(0)):
        assert len(micro) == 2 and all(m["index"].shape == (2,) for m in micro)
        for m in micro:
            assert torch.equal(m["x"][:, 0], m["index"].float())  # rows stay aligned across tensors
            seen[epoch] += m["index"].tolist()
        orders.append(torch.cat([m["index"] for m in micro]).tolist())
        steps += 1
    assert steps == 6  # 2 epochs x 3 minibatches
    assert sorted(seen[0]) == list(range(12)) and sorted(seen[1]) == list(range(12))
    assert seen[0] != list(range(12)) and seen[0] != seen[1]  # shuffled, freshly each epoch


def test_bad_shapes():
    with pytest.raises(ValueError, match="disagree"):
        ExperienceBuffer({"a": torch.zeros(4), "b": torch.zeros(5)})
    buffer = ExperienceBuffer({"a": torch.zeros(10)})
    with pytest.raises(ValueError, match="minibatches"):
        next(buffer.iterate(1, 3, 1))
    with pytest.raises(ValueError, match="micro-batches"):
        next(buffer.iterate(1, 2, 3))

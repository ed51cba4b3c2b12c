"""The reading guide's shape trace covers every tensor of one `train_step` call.

One PPO step (critic, KL in the reward) and one GRPO step (groups, KL in the loss) run on the
tiny random model; every local tensor of `RLTrainer.train_step` and `RLTrainer._update`
(and every field of the rollout and of a micro-batch) must have a row in the trace table of
docs/reading-guide.md, and the shape written there must have as many dimensions as the
tensor has.
"""

from __future__ import annotations

import re
import inspect
import sys
from pathlib import Path

import pytest
import torch

from ppo.config import PPOConfig
from ppo.trainer import RLTrainer

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "reading-guide.md"
_ROW = re.compile(r"^\|\s*\d+\.\d+\s*\|\s*`(?P<name>[A-Za-z_][\w.]*)`\s*\|\s*`(?P<shape>\[[^\]]*\])`", re.M)


def trace_rows() -> dict[str, int]:
    """Tensor name -> number of dimensions of the shape the trace writes for it."""
    text = GUIDE.read_text()
    start = text.index("## Shape trace of one step")
    rows = {}
    for match in _ROW.finditer(text[start:]):
        shape = match["shape"].strip("[]").strip()
        rows[match["name"]] = 0 if not shape else len(shape.split(","))
    return rows


def step_tensors(tmp_path, tiny_model_dir, **overrides) -> dict[str, torch.Tensor]:
    """Every tensor bound to a local name when train_step and _update return."""
    config = PPOConfig(task="custom", model_path=str(tiny_model_dir), output_dir=str(tmp_path / "run"),
                       rollout_batch_size=8, response_length=10, eval_every=0, total_steps=1, save_every=0,
                       progress=False, log_samples=1, **overrides)
    trainer = RLTrainer(config, prompts=["1+1=", "2+3="], reward_fn=lambda p, r: [float(x.count("1")) for x in r])
    # the methods themselves, under their timing decorators (ppo/run/metrics.py)
    wanted = {inspect.unwrap(RLTrainer.train_step).__code__, inspect.unwrap(RLTrainer._update).__code__}
    found: dict[str, torch.Tensor] = {}

    def tracer(frame, event, arg):
        if frame.f_code not in wanted:
            return None

        def on_return(frame, event, arg):
            if event == "return":
                for name, value in frame.f_locals.items():
                    if isinstance(value, torch.Tensor):
                        found[name] = value
                    elif name == "rollout":
                        found.update({f"rollout.{k}": v for k, v in vars(value).items() if isinstance(v, torch.Tensor)})
                    elif name == "micro":
                        found.update({f"micro.{k}": v for k, v in value.items()})
            return on_return

        return on_return

    sys.settrace(tracer)
    try:
        trainer.train_step()
    finally:
        sys.settrace(None)
    return found


@pytest.mark.parametrize("overrides", [
    dict(),  # PPO: critic, k1 KL in the reward
    dict(advantage_estimator="grpo", group_size=4, kl_placement="loss", kl_estimator="k3", whiten_advantages=False,
         logprobs_from_generation=True),
], ids=["ppo", "grpo"])
def test_trace_covers_every_tensor_of_a_step(tmp_path, tiny_model_dir, overrides):
    rows = trace_rows()
    tensors = step_tensors(tmp_path, tiny_model_dir, **overrides)
    assert {"advantages", "rollout.response_ids", "micro.advantages", "loss"} <= set(tensors)  # the tracer saw the step
    missing = sorted(name for name in tensors if name not in rows)
    assert not missing, f"docs/reading-guide.md shape trace has no row for {missing}"
    wrong = [f"{name}: trace says {rows[name]} dims, tensor has {tuple(t.shape)}"
             for name, t in tensors.items() if rows[name] != t.dim()]
    assert not wrong, "docs/reading-guide.md shape trace: " + "; ".join(wrong)

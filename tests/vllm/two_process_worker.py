"""Run by tests/vllm/test_vllm_two_processes.py under ``torch.distributed.run`` (2 CPU
processes, gloo): GRPO steps with one vLLM engine in each process.

    python -m torch.distributed.run --nproc_per_node 2 tests/vllm/two_process_worker.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ppo.parallel import distributed
from ppo.config import preset
from ppo.trainer import RLTrainer


def main(out: Path) -> None:
    config = preset("grpo", testbed=True, rollout_batch_size=16, total_steps=2, eval_every=0, save_every=0,
                    progress=False, threads=1, device="cpu", output_dir=str(out / "run"), generation_backend="vllm",
                    vllm_kv_cache_gb=0.05, logprobs_from_generation=True)
    trainer = RLTrainer(config)
    drawn = []
    sample = trainer._sample_and_score
    trainer._sample_and_score = lambda n: drawn.append(batch := sample(n)) or batch
    steps = [trainer.train_step() for _ in range(config.total_steps)]
    local = {"rank": distributed.rank(), "world": distributed.world_size(),
             "prompts": [[p.prompt for p in batch.problems] for batch in drawn],
             "responses": [batch.rollout.response_ids.tolist() for batch in drawn]}
    gathered = distributed.gather_objects([local])
    if distributed.is_main_process():
        (out / "result.json").write_text(json.dumps({"ranks": gathered, "steps": steps}))
    distributed.shutdown()  # closes the engine first (distributed.close_before_shutdown)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Speed and memory benchmarks of the training loop (``python -m ppo.benchmarks``).

- `ppo.benchmarks.bench`: step time against an honest compute floor (the matrix arithmetic a
  step cannot avoid, at the best throughput the machine reaches), phase by phase.
- `ppo.benchmarks.speed`: seconds per step on a fixed tiny task, side by side with TRL
  (`speed_task` the task and its model, `speed_runs` the runs, `speed_summary` the tables).
- `ppo.benchmarks.memory`: LoRA against full fine-tuning, peak memory and training-state bytes.

They measure the loop; they change nothing it computes. The ablations (what a toggle does to
learning) are `ablations/`'s.
"""

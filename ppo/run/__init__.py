"""Run bookkeeping: the run loop around train_step, the run directory and its lock, checkpoints, metrics, trackers, provenance, the model card, evaluation and the guards on scores and losses."""

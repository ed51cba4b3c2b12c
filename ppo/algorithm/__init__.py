"""The algorithm's pure math: what a reader studies. Losses, KL estimators, rewards, rollout corrections, the experience buffer, group filtering. Tensors in, tensors out; no models, no files."""

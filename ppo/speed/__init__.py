"""Exact speed paths: each computes what a plain Hugging Face forward or sampler computes, faster (tested equal). Skip on a first reading."""

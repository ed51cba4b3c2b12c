"""The policy side of the PPO stack and its training loop.

See DESIGN.md for the layout; `ppo.config.PPOConfig` holds every toggle.
"""

"""Algorithms: the ``Algorithm`` base, entropy controllers, A2C and PPO."""

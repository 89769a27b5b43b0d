"""Integrations with other RL libraries (each imports its library only when imported).

* ``alf_entropy.integrations.sb3``: an entropy controller drives the entropy
  coefficient of Stable-Baselines3's PPO, A2C and SAC
  (``pip install "alf_entropy[sb3]"``; see ``docs/sb3.md``).
"""

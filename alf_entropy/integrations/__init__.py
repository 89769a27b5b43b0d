"""Integrations with other RL libraries (each imports its library only when imported).

* ``alf_entropy.integrations.sb3``: an entropy controller drives the entropy
  coefficient of Stable-Baselines3's PPO, A2C and SAC
  (``pip install -e ".[sb3]"``; see ``docs/sb3.md``).
* ``alf_entropy.integrations.torchrl``: an entropy controller sets the alpha
  of TorchRL's ``SACLoss``/``DiscreteSACLoss`` (``docs/torchrl.md``).
* ``alf_entropy.integrations.tianshou``: an entropy controller is the
  ``alpha`` of Tianshou's ``SAC``/``DiscreteSAC`` (``docs/tianshou.md``);
  ``squashed.py`` holds the ``[-1, 1]`` box it shares with the SB3 callback.
* ``alf_entropy.integrations.trl``: an entropy controller drives the entropy
  coefficient of Hugging Face TRL's ``GRPOTrainer``
  (``pip install -e ".[trl]"``; see ``docs/llm_rl.md``), built on
  ``alf_entropy.integrations.llm`` (the trainer-independent part: one update per
  optimizer step from the step's entropy sum and token count) and
  ``alf_entropy.integrations.toy_lm`` (a tiny random LM task, no download).
* ``alf_entropy.integrations.verl``: an entropy controller sets the entropy coefficient of
  verl's v1 trainer (``pip install -e ".[verl]"``; ``docs/llm_rl.md``).
"""

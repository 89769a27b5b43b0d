"""Trainers: the on-policy training loop with summaries, evaluation and checkpoints."""
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

__all__ = ["OnPolicyTrainer"]

"""Trainers: the shared ``Trainer`` core (checkpoints, limits, summaries,
evaluation) and the on-policy training loop."""
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.trainers.trainer import Trainer

__all__ = ["OnPolicyTrainer", "Trainer"]

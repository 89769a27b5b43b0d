"""Trainers: the shared ``Trainer`` core (checkpoints, limits, summaries,
evaluation), the on-policy and the off-policy (replay buffer) training loops."""
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.trainers.trainer import Trainer

__all__ = ["OffPolicyTrainer", "OnPolicyTrainer", "Trainer"]

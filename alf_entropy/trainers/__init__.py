"""Trainers: the shared training loop (``Trainer``), its callbacks, and the
on-policy and off-policy (replay buffer) iterations."""

from alf_entropy.trainers.callbacks import (
    Callback,
    CheckpointCallback,
    EvaluationCallback,
    ProgressBarCallback,
    SignalCallback,
    SummaryCallback,
    TimeBudgetCallback,
    TrainerControl,
)
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.trainers.trainer import Trainer

__all__ = [
    "Callback",
    "CheckpointCallback",
    "EvaluationCallback",
    "OffPolicyTrainer",
    "OnPolicyTrainer",
    "ProgressBarCallback",
    "SignalCallback",
    "SummaryCallback",
    "TimeBudgetCallback",
    "Trainer",
    "TrainerControl",
]

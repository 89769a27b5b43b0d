"""Seeding the process's random number generators, for trainers and algorithms alike."""
import random

import numpy as np
import torch

__all__ = ["seed_all"]


def seed_all(seed: int) -> None:
    """Seed torch, NumPy and Python ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)

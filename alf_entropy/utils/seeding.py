"""The process's random number generators: seeding them, and drawing per agent."""
import random
from typing import Callable, Optional, Sequence

import numpy as np
import torch

__all__ = ["per_member", "seed_all"]


def seed_all(seed: int) -> None:
    """Seed torch, NumPy and Python ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def per_member(draw: Callable[[Optional[torch.Generator]], torch.Tensor],
               generators: Optional[Sequence[torch.Generator]]) -> torch.Tensor:
    """``draw(g)`` for each member's generator, stacked (``[K, ...]``); with ``generators``
    None (one agent) ``draw(None)``: torch's default generator, as a plain call draws."""
    if generators is None:
        return draw(None)
    return torch.stack([draw(g) for g in generators])

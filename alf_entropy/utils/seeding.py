"""The process's random number generators: seeding, drawing per agent, checkpoint state."""

import random
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

__all__ = ["MAX_SEED", "per_member", "rng_state", "seed_all", "set_rng_state"]

MAX_SEED = 2**31
"""Seeds are below this, so that those derived from one stay below 2**32 (NumPy's)."""


def seed_all(seed: int) -> None:
    """Seed torch, NumPy and Python ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def per_member(
    draw: Callable[[Optional[torch.Generator]], torch.Tensor],
    generators: Optional[Sequence[torch.Generator]],
) -> torch.Tensor:
    """``draw(g)`` for each member's generator, stacked (``[K, ...]``); with ``generators``
    None (one agent) ``draw(None)``: torch's default generator, as a plain call draws."""
    if generators is None:
        return draw(None)
    return torch.stack([draw(g) for g in generators])


def rng_state() -> Dict[str, Any]:
    """The torch (and CUDA), NumPy and Python ``random`` generators' states (loadable
    with ``weights_only``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (
            name,
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore the generators :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Where a run computes: the device, the ranks under ``torchrun``, the seeds."""

from typing import Any

import torch

from alf_entropy.utils import distributed
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.seeding import MAX_SEED, seed_all

__all__ = ["MAX_SEED", "per_rank", "resolve_device", "seed_all"]

RANK_SEED_OFFSET = 7_919_993
"""Rank ``r`` seeds its own samples with ``seed + r * RANK_SEED_OFFSET``."""


def resolve_device(device: Any) -> torch.device:
    """``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda[:N]"`` or a ``torch.device``.

    Raises:
        ValueError: for an unknown name, or ``"cuda"`` without CUDA.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def per_rank(name: str, total: int) -> int:
    """This rank's share of ``total`` (an int >= 1 over all ranks; ``total`` in one process),
    the binding ``name`` (``"OffPolicyTrainer.num_envs"``).

    Raises:
        ValueError: if ``total`` is not a positive multiple of the number of ranks.
    """
    world = distributed.env_world_size()
    if check_int(name, total, minimum=1) % world:
        raise ValueError(
            f"{name} ({total}) is the total over all ranks and must be divisible "
            f"by the number of ranks ({world}): e.g. --gin_param '{name} = "
            f"{-(-total // world) * world}'"
        )
    return total // world

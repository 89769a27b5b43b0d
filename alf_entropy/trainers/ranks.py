"""Where a run computes: the device, the ranks under ``torchrun``, the seeds."""
from typing import Any, Tuple

import torch

from alf_entropy.utils import distributed
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.seeding import seed_all

__all__ = ["MAX_SEED", "join_ranks", "resolve_device", "seed_all"]

MAX_SEED = 2**31
"""Seeds are below this, so that those derived from one stay below 2**32 (NumPy's)."""
RANK_SEED_OFFSET = 7_919_993
"""Rank ``r`` seeds its own samples with ``seed + r * RANK_SEED_OFFSET``."""


def resolve_device(device: Any) -> torch.device:
    """``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda[:N]"`` or a ``torch.device``.

    Raises:
        ValueError: for an unknown name, or ``"cuda"`` without CUDA.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def join_ranks(num_envs: int, device: Any, trainer_name: str) -> Tuple[int, torch.device]:
    """Join the ranks' group under ``torchrun`` (a no-op in one process); returns this
    rank's share of ``num_envs`` (the total) and its device.

    Raises:
        ValueError: if ``num_envs`` is not a positive multiple of the number of ranks.
    """
    world = distributed.env_world_size()
    if check_int("num_envs", num_envs, minimum=1) % world:
        raise ValueError(f"num_envs ({num_envs}) is the total over all ranks and must be "
                         f"divisible by the number of ranks ({world}): e.g. --gin_param "
                         f"'{trainer_name}.num_envs = {world}'")
    return num_envs // world, distributed.init_from_env(resolve_device(device))

"""``ReplayBuffer``: a ring buffer of tensors on the training device.

Each field of the stored nest (e.g. a ``Transition``) is one preallocated
tensor ``[capacity, ...]`` on ``device``.  ``add`` writes a batch of ``B``
rows at the write position (wrapping around, overwriting the oldest rows);
``sample`` draws ``batch_size`` rows uniformly with replacement with
``torch.randint`` on the device.  Positions and sizes are Python ints that
the caller's loop determines, so neither call ever reads a tensor on the host
(no GPU sync).  ``sample_members`` samples a buffer whose rows hold K
members (K agents' transitions of one step) for each member with its own
generator.  ``state_dict``/``load_state_dict`` save the filled rows, so a
checkpoint can resume a run with the same buffer content.
"""

from typing import Any, Dict, List, Optional, Sequence

import torch

from alf_entropy.data_structures import namedtuple
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

__all__ = ["ReplayBuffer", "Transition"]

Transition = namedtuple(
    "Transition",
    [
        "observation",  # [B, ...]: o_t
        "action",  # [B, ...]: a_t
        "reward",  # [B]: r_{t+1}
        "discount",  # [B]: 0 if the episode terminated at t+1, else 1
        "next_observation",  # [B, ...]: o_{t+1} (the final one when t+1 is LAST)
        "valid",  # [B] bool: False when t was LAST (a_t was ignored: o_{t+1} is a reset)
    ],
    default_value=(),
)
"""One environment step as off-policy algorithms train on it."""


class ReplayBuffer:
    """A fixed-capacity FIFO of tensor nests, sampled uniformly.

    Args:
        capacity: the number of rows kept (the oldest are overwritten).
        device: where the storage lives (``"cpu"``, ``"cuda"``, a device).

    Raises:
        ValueError: if ``capacity`` is not a positive int.

    Examples:
        >>> import torch
        >>> buffer = ReplayBuffer(capacity=1000)
        >>> buffer.add({"obs": torch.randn(8, 3), "reward": torch.randn(8)})  # 8 rows
        >>> batch = buffer.sample(32)  # with replacement
        >>> buffer.size, batch["obs"].shape
        (8, torch.Size([32, 3]))
    """

    def __init__(self, capacity: int, device: Any = "cpu"):
        self._capacity = check_int("capacity", capacity, minimum=1)
        self._device = torch.device(device)
        self._storage: Optional[Any] = None  # nest of [capacity, ...] tensors
        self._flat: List[torch.Tensor] = []
        self._pos = 0
        self._size = 0

    @property
    def capacity(self) -> int:
        """The maximum number of rows."""
        return self._capacity

    @property
    def device(self) -> torch.device:
        """Where the storage lives."""
        return self._device

    @property
    def size(self) -> int:
        """The number of rows stored (at most ``capacity``)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def _allocate(self, batch: Any) -> None:
        self._storage = nest.map_structure(
            lambda x: torch.zeros(
                (self._capacity,) + tuple(x.shape[1:]), dtype=x.dtype, device=self._device
            ),
            batch,
        )
        self._flat = nest.flatten(self._storage)

    def add(self, batch: Any) -> None:
        """Append ``B`` rows (every leaf of ``batch`` is ``[B, ...]``).

        Args:
            batch: a nest of tensors with one leading batch dimension; the
                first call fixes the structure, shapes and dtypes.

        Raises:
            TypeError: if a leaf is not a tensor (e.g. a NumPy array).
            ValueError: if the structure or a leaf shape differs from the
                first batch, or ``B`` exceeds the capacity.
        """
        leaves = nest.flatten(batch)
        for x in leaves:
            if not isinstance(x, torch.Tensor):
                raise TypeError(
                    f"ReplayBuffer.add: every leaf of batch must be a torch.Tensor, got "
                    f"{type(x).__name__} (convert with torch.as_tensor)"
                )
        if self._storage is None:
            self._allocate(batch)
        if len(leaves) != len(self._flat):
            raise ValueError(
                f"ReplayBuffer.add: batch has {len(leaves)} fields, the buffer {len(self._flat)}"
            )
        n = leaves[0].shape[0]
        if n > self._capacity:
            raise ValueError(f"ReplayBuffer.add: batch of {n} rows > capacity {self._capacity}")
        end = self._pos + n
        for store, x in zip(self._flat, leaves):
            if x.shape[0] != n or x.shape[1:] != store.shape[1:]:
                raise ValueError(
                    f"ReplayBuffer.add: leaf of shape {tuple(x.shape)} does not fit rows "
                    f"of shape {tuple(store.shape[1:])} ({n} rows)"
                )
            if end <= self._capacity:
                store[self._pos : end] = x
            else:  # wrap around
                first = self._capacity - self._pos
                store[self._pos :] = x[:first]
                store[: n - first] = x[first:]
        self._pos = end % self._capacity
        self._size = min(self._size + n, self._capacity)

    def sample(
        self, batch_size: int, generators: Optional[Sequence[torch.Generator]] = None
    ) -> Any:
        """Draw ``batch_size`` rows uniformly (with replacement); with ``generators``
        (rows of K members) each member's: :meth:`sample_members`.

        Returns:
            A nest like the added batches, every leaf ``[batch_size, ...]``.

        Raises:
            ValueError: if the buffer is empty.
        """
        if generators is not None:
            return self.sample_members(batch_size, generators)
        if self._size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty")
        idx = torch.randint(0, self._size, (batch_size,), device=self._device)
        return nest.pack_sequence_as(self._storage, [x[idx] for x in self._flat])

    def sample_members(self, batch_size: int, generators: Sequence[torch.Generator]) -> Any:
        """Draw ``batch_size`` rows for each of K members, member ``k``'s from ``generators[k]``.

        For a buffer whose rows hold K members (leaves added as ``[B, K, ...]``):
        member ``k`` gets the rows :meth:`sample` would draw with ``generators[k]``
        as torch's generator, and only its own part of them.

        Args:
            batch_size: the number of rows per member.
            generators: one generator per member (on the buffer's device).

        Returns:
            A nest like the added batches, every leaf ``[K, batch_size, ...]``.

        Raises:
            ValueError: if the buffer is empty or its rows do not hold
                ``len(generators)`` members.
        """
        if self._size == 0:
            raise ValueError("ReplayBuffer.sample_members: the buffer is empty")
        k = len(generators)
        if any(x.dim() < 2 or x.shape[1] != k for x in self._flat):
            raise ValueError(f"ReplayBuffer.sample_members: the rows do not hold {k} members")
        idx = torch.stack(
            [
                torch.randint(0, self._size, (batch_size,), device=self._device, generator=g)
                for g in generators
            ]
        )
        member = torch.arange(k, device=self._device).unsqueeze(1)
        return nest.pack_sequence_as(self._storage, [x[idx, member] for x in self._flat])

    def state_dict(self) -> Dict[str, Any]:
        """The filled rows (in storage order) and the write position.

        Returns:
            dict: ``{"pos", "size", "data"}`` with ``data`` a list of the
            leaves' first ``size`` rows (an empty list before the first add).
        """
        return {"pos": self._pos, "size": self._size, "data": [x[: self._size] for x in self._flat]}

    def load_state_dict(self, state: Dict[str, Any], example: Any) -> None:
        """Restore a ``state_dict``.

        Args:
            state: what ``state_dict`` returned.
            example: a batch nest with the stored structure (only its
                structure, trailing shapes and dtypes are used) to allocate
                the storage.

        Raises:
            ValueError: if the saved data does not fit this buffer.
        """
        size, pos, data = int(state["size"]), int(state["pos"]), state["data"]
        if size > self._capacity:
            raise ValueError(
                f"ReplayBuffer: saved {size} rows do not fit capacity {self._capacity}"
            )
        self._allocate(example)
        if size and len(data) != len(self._flat):
            raise ValueError(
                f"ReplayBuffer: saved {len(data)} fields, the buffer has {len(self._flat)}"
            )
        for store, x in zip(self._flat, data if size else []):
            if x.shape[1:] != store.shape[1:]:
                raise ValueError(
                    f"ReplayBuffer: saved rows of shape {tuple(x.shape[1:])}, expected "
                    f"{tuple(store.shape[1:])}"
                )
            store[:size] = x.to(store.device)
        self._pos, self._size = pos, size

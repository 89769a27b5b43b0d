"""Window averages whose whole state lives in registered buffers.

``WindowAverager`` averages the last ``window_size`` values.  It is an
``nn.Module``: its state moves with ``.to(device)`` and is saved by
``state_dict()``, and its updates are pure tensor ops (no ``.item()``, no
Python branching on values), so it never synchronises a GPU with the host.

It accepts an optional ``valid`` flag in ``update``: when it is a false
scalar tensor the update is a no-op, which lets a caller skip an update
without reading the flag on the host.

Semantics follow ALF (``alf/utils/averager.py``): ``get()`` is 0 before any
data, the mean of what was seen while fewer than ``window_size`` values
arrived, then the mean of the last ``window_size``; a window average is
computed as ``sum(buffer) * (1 / n)`` as ALF does.
"""
from typing import Optional

import gin
import torch
import torch.nn as nn

from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.gin_errors import PlainGinErrors

__all__ = ["WindowAverager", "ScalarWindowAverager"]


def _check_spec(tensor_spec: TensorSpec) -> None:
    if not isinstance(tensor_spec, TensorSpec):
        raise TypeError(
            f"tensor_spec must be a TensorSpec, got {type(tensor_spec).__name__}"
        )
    if not tensor_spec.dtype.is_floating_point:
        raise TypeError(f"tensor_spec.dtype must be floating point, got {tensor_spec.dtype}")


def _average_outer_dims(tensor: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """Mean over the dims of ``tensor`` in front of ``spec.shape``."""
    outer = tensor.dim() - len(spec.shape)
    if outer < 0 or tuple(tensor.shape[outer:]) != spec.shape:
        raise ValueError(
            f"tensor of shape {tuple(tensor.shape)} does not end with spec shape {spec.shape}"
        )
    if outer == 0:
        return tensor
    return tensor.mean(dim=tuple(range(outer)))


class _Averager(nn.Module, metaclass=PlainGinErrors):
    """What every averager offers: ``update``, ``get`` and ``average``."""

    def update(self, tensor: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        """Add a value; a false ``valid`` scalar tensor makes it a no-op."""
        raise NotImplementedError

    def get(self) -> torch.Tensor:
        """The current average (0 before any value)."""
        raise NotImplementedError

    def average(self, tensor: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``update`` then ``get``.

        Args:
            tensor: the value to add.
            valid: optional bool scalar tensor gating the update.

        Returns:
            The average after the update.
        """
        self.update(tensor, valid)
        return self.get()


@gin.configurable
class WindowAverager(_Averager):
    """Average of the last ``window_size`` values.

    Args:
        tensor_spec: spec of one value (outer dims of an update are averaged
            away first, as in ALF).
        window_size: how many recent values to average; at least 1.
        name: name of this averager.

    Raises:
        ValueError: if ``window_size < 1``.
        TypeError: if ``tensor_spec`` is not a floating point ``TensorSpec``.
    """

    def __init__(self, tensor_spec: TensorSpec, window_size: int, name: str = "WindowAverager"):
        super().__init__()
        _check_spec(tensor_spec)
        check_int("window_size", window_size, minimum=1)
        self._name = name
        self._spec = tensor_spec
        self._window_size = window_size
        self.register_buffer(
            "_buf", torch.zeros((window_size,) + tensor_spec.shape, dtype=tensor_spec.dtype)
        )
        # Number of values added so far: the next slot is count % window_size
        # and the number of filled slots is min(count, window_size).
        self.register_buffer("_count", torch.zeros((), dtype=torch.int64))

    @property
    def window_size(self) -> int:
        """The window size."""
        return self._window_size

    def update(self, tensor: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        """Add a value (its outer dims averaged first).

        Args:
            tensor: the value, of shape ``[..., *spec.shape]``.
            valid: optional bool scalar tensor; when false nothing changes.
        """
        value = _average_outer_dims(tensor, self._spec).to(self._buf.dtype)
        slot = (self._count % self._window_size).reshape(1)
        if valid is not None:
            old = self._buf.index_select(0, slot)[0]
            value = torch.where(valid, value, old)
            self._count.add_(valid)  # int64 += bool
        else:
            self._count.add_(1)
        self._buf.index_copy_(0, slot, value.unsqueeze(0))

    def get(self) -> torch.Tensor:
        """The current average (0 before any value).

        Returns:
            A tensor of ``spec.shape``.
        """
        n = self._count.clamp(min=1, max=self._window_size).to(self._buf.dtype)
        return self._buf.sum(dim=0) * (1.0 / n)


@gin.configurable
class ScalarWindowAverager(WindowAverager):
    """``WindowAverager`` of scalars.

    Args:
        window_size: how many recent values to average; at least 1.
        dtype: a floating point dtype.
        name: name of this averager.
    """

    def __init__(
        self,
        window_size: int,
        dtype: torch.dtype = torch.float32,
        name: str = "ScalarWindowAverager",
    ):
        super().__init__(TensorSpec((), dtype), window_size, name)

"""Tensor specs: the shape, dtype and bounds of observations and actions.

``TensorSpec``/``BoundedTensorSpec`` follow ALF's names.  An integer
``BoundedTensorSpec`` is a discrete action with ``maximum - minimum + 1``
choices; a float one is continuous.  ``from_gym_space`` converts gymnasium
spaces (``Box``, ``Discrete``, ``MultiDiscrete``, ``Dict``, ``Tuple``) and
TorchRL specs into nests of specs.
"""

import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = ["TensorSpec", "BoundedTensorSpec", "from_gym_space"]

_Number = Union[int, float, np.ndarray, Sequence[float]]


def _as_torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return torch.from_numpy(np.zeros((), dtype=np.dtype(dtype))).dtype
    except TypeError as e:
        raise TypeError(f"dtype must be a torch or numpy dtype, got {dtype!r}") from e


class TensorSpec:
    """Describes a tensor (without the batch dimension).

    Args:
        shape: the shape, without batch dimensions.
        dtype: a ``torch.dtype`` (numpy dtypes and names are accepted).
    """

    def __init__(self, shape: Sequence[int] = (), dtype: Any = torch.float32):
        if isinstance(shape, int):
            shape = (shape,)
        self._shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in self._shape):
            raise ValueError(f"shape must be non-negative, got {self._shape}")
        self._dtype = _as_torch_dtype(dtype)

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape without batch dimensions."""
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        """The ``torch.dtype``."""
        return self._dtype

    @property
    def numel(self) -> int:
        """Number of elements of one (unbatched) tensor."""
        return math.prod(self._shape)

    @property
    def is_discrete(self) -> bool:
        """True for integer (or bool) dtypes."""
        return not (self._dtype.is_floating_point or self._dtype.is_complex)

    @property
    def is_continuous(self) -> bool:
        """True for floating point dtypes."""
        return self._dtype.is_floating_point

    def zeros(self, outer_dims: Sequence[int] = (), device=None) -> torch.Tensor:
        """A zero tensor of this spec with ``outer_dims`` batch dimensions."""
        return torch.zeros(tuple(outer_dims) + self._shape, dtype=self._dtype, device=device)

    def replace(self, shape: Optional[Sequence[int]] = None, dtype: Any = None) -> "TensorSpec":
        """A copy with ``shape`` and/or ``dtype`` replaced (ALF's ``replace``).

        Args:
            shape: the new shape, or None to keep it.
            dtype: the new dtype, or None to keep it.

        Returns:
            TensorSpec: the new spec.
        """
        return TensorSpec(
            self._shape if shape is None else shape, self._dtype if dtype is None else dtype
        )

    def _key(self) -> tuple:
        """What equal specs share (and what their hash is of)."""
        return type(self).__name__, self._shape, self._dtype

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self._shape}, dtype={self._dtype})"


class BoundedTensorSpec(TensorSpec):
    """A ``TensorSpec`` with inclusive element-wise bounds.

    Args:
        shape: the shape, without batch dimensions.
        dtype: a ``torch.dtype``; integer dtypes make a discrete spec.
        minimum: lower bound, a scalar or an array broadcastable to ``shape``.
        maximum: upper bound, likewise.

    Raises:
        ValueError: if a bound does not broadcast to ``shape`` or if
            ``minimum > maximum`` anywhere.
    """

    def __init__(
        self,
        shape: Sequence[int] = (),
        dtype: Any = torch.float32,
        minimum: _Number = 0,
        maximum: Optional[_Number] = None,
    ):
        super().__init__(shape, dtype)
        if maximum is None:
            maximum = np.iinfo(np.int32).max if self.is_discrete else np.finfo(np.float32).max
        np_dtype = np.float64 if self.is_continuous else np.int64
        try:
            self._minimum = np.array(minimum, dtype=np_dtype)
            self._maximum = np.array(maximum, dtype=np_dtype)
            lo = np.broadcast_to(self._minimum, self._shape)
            hi = np.broadcast_to(self._maximum, self._shape)
        except ValueError as e:
            raise ValueError(f"minimum/maximum must broadcast to shape {self._shape}: {e}") from e
        if np.any(lo > hi):
            raise ValueError(f"minimum must be <= maximum, got minimum={minimum} maximum={maximum}")

    def replace(
        self,
        shape: Optional[Sequence[int]] = None,
        dtype: Any = None,
        minimum: Optional[_Number] = None,
        maximum: Optional[_Number] = None,
    ) -> "BoundedTensorSpec":
        """A copy with any of ``shape``, ``dtype``, ``minimum``, ``maximum`` replaced.

        Args:
            shape: the new shape, or None to keep it.
            dtype: the new dtype, or None to keep it.
            minimum: the new lower bound, or None to keep it.
            maximum: the new upper bound, or None to keep it.

        Returns:
            BoundedTensorSpec: the new spec.

        Raises:
            ValueError: if the bounds do not fit the new shape (see the constructor).
        """
        return BoundedTensorSpec(
            self._shape if shape is None else shape,
            self._dtype if dtype is None else dtype,
            self._minimum if minimum is None else minimum,
            self._maximum if maximum is None else maximum,
        )

    def sample(self, outer_dims: Sequence[int] = (), device: Any = None) -> torch.Tensor:
        """A uniform random tensor within the bounds (ALF's ``sample``).

        Integers are drawn from ``[minimum, maximum]`` inclusive (never outside
        the dtype's range), floats from ``[minimum, maximum]``.  The draw uses
        numpy seeded from torch's generator, so ``torch.manual_seed`` makes it
        reproducible.

        Args:
            outer_dims: batch dimensions in front of ``shape``.
            device: the device of the result.

        Returns:
            torch.Tensor: of shape ``outer_dims + shape`` and the spec's dtype.

        Raises:
            ValueError: for a float spec with an infinite bound.
        """
        shape = tuple(outer_dims) + self._shape
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ())))
        np_dtype = torch.empty((), dtype=self._dtype).numpy().dtype
        lo = np.broadcast_to(self._minimum, shape)
        hi = np.broadcast_to(self._maximum, shape)
        if self.is_discrete:
            if np_dtype == np.bool_:
                value = rng.integers(lo, hi, size=shape, endpoint=True).astype(np.bool_)
            else:
                info = np.iinfo(np_dtype)
                lo, hi = np.clip(lo, info.min, info.max), np.clip(hi, info.min, info.max)
                value = rng.integers(lo, hi, size=shape, dtype=np_dtype, endpoint=True)
        else:
            if not np.isfinite((lo, hi)).all():
                raise ValueError(f"sample needs finite bounds, got {self!r}")
            value = (lo + (hi - lo) * rng.random(size=shape)).astype(np_dtype)
            # Rounding to the dtype may step just outside a bound: clip in it.
            value = np.clip(value, lo.astype(np_dtype), hi.astype(np_dtype))
            value = np.where(value < lo, np.nextafter(value, np_dtype.type(np.inf)), value)
            value = np.where(value > hi, np.nextafter(value, np_dtype.type(-np.inf)), value)
        return torch.from_numpy(np.ascontiguousarray(value, dtype=np_dtype)).to(device)

    @classmethod
    def from_spec(cls, spec: TensorSpec, minimum: _Number, maximum: _Number):
        """Bounded spec with the shape and dtype of ``spec``."""
        return cls(spec.shape, spec.dtype, minimum, maximum)

    @property
    def minimum(self) -> np.ndarray:
        """Lower bound (numpy array, scalar or of ``shape``)."""
        return self._minimum

    @property
    def maximum(self) -> np.ndarray:
        """Upper bound (numpy array, scalar or of ``shape``)."""
        return self._maximum

    @property
    def num_actions(self) -> int:
        """For a scalar discrete spec: the number of choices.

        Raises:
            ValueError: if the spec is continuous or its bounds vary.
        """
        if not self.is_discrete:
            raise ValueError("num_actions is only defined for discrete specs")
        n = np.unique(self._maximum - self._minimum + 1)
        if n.size != 1:
            raise ValueError("num_actions needs the same bounds for every element")
        return int(n[0])

    def _key(self) -> tuple:
        """The bounds broadcast to ``shape``: scalar and full bounds compare equal."""
        return super()._key() + tuple(
            np.broadcast_to(b, self._shape).tobytes() for b in (self._minimum, self._maximum)
        )

    def __repr__(self) -> str:
        return (
            f"BoundedTensorSpec(shape={self._shape}, dtype={self._dtype}, "
            f"minimum={self._minimum.tolist()}, maximum={self._maximum.tolist()})"
        )


def from_gym_space(space: Any) -> Any:
    """Convert a gymnasium space (or an unbatched TorchRL spec) to a nest of specs.

    ``Box`` becomes a ``BoundedTensorSpec`` (float32 for float boxes),
    ``Discrete(n, start)`` a scalar int64 spec over ``[start, start+n-1]``,
    ``MultiDiscrete(nvec)`` an int64 spec over ``[0, nvec-1]``, ``Dict`` a
    dict and ``Tuple`` a tuple of converted sub-spaces.  TorchRL's specs
    convert alike: ``Bounded`` as a ``Box``, ``Unbounded`` to a plain
    ``TensorSpec``, ``Categorical``/``OneHot`` (one action of ``n``) and
    ``MultiCategorical``/``MultiOneHot`` to int64 specs, ``Composite`` to a dict.

    Args:
        space: a ``gymnasium.spaces.Space`` or a ``torchrl.data.TensorSpec``.

    Returns:
        A nest of ``TensorSpec`` (``BoundedTensorSpec`` where bounded).

    Raises:
        ImportError: if gymnasium is not installed (the message says what to
            install; any gymnasium from 0.29 on works here).
        TypeError: if the space type is unsupported.
    """
    if type(space).__module__.startswith("torchrl."):
        return _from_torchrl_spec(space)
    try:
        from gymnasium import spaces
    except ImportError as e:
        raise ImportError(
            f"from_gym_space/from_space needs gymnasium to read {type(space).__name__}: "
            'pip install gymnasium (any version from 0.29), or pip install -e ".[train]" '
            "(in a checkout of alf_entropy); "
            "without gymnasium, build the spec yourself, "
            "e.g. BoundedTensorSpec((), torch.int64, 0, n - 1)"
        ) from e
    if isinstance(space, spaces.Box):
        dtype = torch.float32 if np.issubdtype(space.dtype, np.floating) else space.dtype
        return BoundedTensorSpec(space.shape, dtype, space.low, space.high)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return BoundedTensorSpec((), torch.int64, start, start + int(space.n) - 1)
    if isinstance(space, spaces.MultiDiscrete):
        start = getattr(space, "start", None)
        start = np.zeros_like(space.nvec) if start is None else np.asarray(start)
        return BoundedTensorSpec(space.shape, torch.int64, start, start + space.nvec - 1)
    if isinstance(space, spaces.Dict):
        return {k: from_gym_space(s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(from_gym_space(s) for s in space.spaces)
    raise TypeError(f"Unsupported gymnasium space {type(space).__name__}: {space}")


def _from_torchrl_spec(spec: Any) -> Any:
    """``from_gym_space`` of a TorchRL spec (its module imported only here)."""
    from torchrl.data import (
        Bounded,
        Categorical,
        Composite,
        MultiCategorical,
        MultiOneHot,
        OneHot,
        Unbounded,
    )

    shape = tuple(spec.shape)
    if isinstance(spec, Composite):
        return {k: _from_torchrl_spec(s) for k, s in spec.items() if s is not None}
    if isinstance(spec, MultiOneHot):  # one-hot blocks side by side: one action per block
        nvec = np.asarray(spec.nvec)
        return BoundedTensorSpec(shape[:-1] + nvec.shape, torch.int64, 0, nvec - 1)
    if isinstance(spec, OneHot):
        return BoundedTensorSpec(shape[:-1], torch.int64, 0, spec.n - 1)
    if isinstance(spec, MultiCategorical):
        return BoundedTensorSpec(shape, torch.int64, 0, spec.nvec.cpu().numpy() - 1)
    if isinstance(spec, Categorical):  # Binary too (n=2)
        return BoundedTensorSpec(shape, torch.int64, 0, spec.n - 1)
    if not isinstance(spec, (Bounded, Unbounded)):
        raise TypeError(f"Unsupported TorchRL spec {type(spec).__name__}: {spec}")
    dtype = torch.float32 if spec.dtype.is_floating_point else spec.dtype
    if isinstance(spec, Unbounded):
        return TensorSpec(shape, dtype)
    return BoundedTensorSpec(
        shape, dtype, spec.space.low.cpu().numpy(), spec.space.high.cpu().numpy()
    )

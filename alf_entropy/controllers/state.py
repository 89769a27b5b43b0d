"""The controllers' state and constants: named tuples kept in registered buffers.

Every field of a state tuple is one buffer named ``prefix + field`` (saved by
``state_dict()``, moved by ``.to()``), of the controller's ``batch_shape``
(a window adds its length).  Constants are a second tuple, kept twice: as
NumPy scalars for the host path and as one non-persistent buffer per dtype
for the tensor path.  Layouts never depend on options: an option off is a
constant that makes its term vanish.
"""
from typing import Any, NamedTuple, Tuple, Type

import numpy as np
import torch
import torch.nn as nn

__all__ = ["StagedState", "PIDState", "SGDState", "FixedState", "WatchState", "StagedConsts",
           "PIDConsts", "Bounds", "WatchConsts", "NoConsts", "ControllerState", "WATCH_DTYPES",
           "register", "read", "views", "values", "write", "Constants"]


class StagedState(NamedTuple):
    """ALF's staged rule: ``stage`` < -2 estimating, -2 init, -1 free, 0/1 adjust."""

    log_alpha: Any
    stage: Any
    update_rate: Any
    max_entropy: Any
    ref_target: Any  # the target when the adjust stage last restarted (track_target_changes)
    window: Any  # the last ``average_window`` entropies
    seen: Any


class PIDState(NamedTuple):
    """The PID rule: integral, smoothed error, fast and slow entropy averages."""

    log_alpha: Any
    integral: Any
    err_ema: Any
    fast: Any
    slow: Any
    count: Any
    gain: Any  # the integral rate's growth: + while below the target, - above


class SGDState(NamedTuple):
    """SAC's gradient rule: the entropy window and the last gradient of ``log_alpha``."""

    log_alpha: Any
    window: Any
    seen: Any
    grad: Any


class FixedState(NamedTuple):
    """A fixed coefficient."""

    log_alpha: Any


class WatchState(NamedTuple):
    """The windup watch (and settled annealing, and the NaN/inf count)."""

    ema: Any  # the smoothed entropy
    stalled_for: Any  # updates in a row with it below the target and alpha at its ceiling
    count: Any
    settled: Any
    nonfinite: Any


WATCH_DTYPES = dict(ema=torch.float32, stalled_for=torch.int64, count=torch.int64,
                    settled=torch.int64, nonfinite=torch.int64)
"""The dtype of each field of ``WatchState``."""


class ControllerState(NamedTuple):
    """Everything the driver reads and writes in one update."""

    rule: Any  # the rule's own state (one of the tuples above)
    watch: WatchState
    target: Any  # the target now (an annealed one is state)
    span_lo: Any  # limit_log_alpha_span: the lowest and highest log_alpha since it began
    span_hi: Any


class StagedConsts(NamedTuple):
    very_slow_update_rate: Any
    slow_update_rate: Any
    fast_update_rate: Any
    min_log_alpha: Any
    retarget_rate: Any
    track: Any


class PIDConsts(NamedTuple):
    inv_scale: Any
    kp: Any
    ki: Any
    kd: Any
    err_beta: Any
    fast_beta: Any
    slow_beta: Any
    deadband: Any
    max_step: Any
    gain_growth: Any
    gain_shrink: Any
    max_gain: Any
    gain_band: Any


class Bounds(NamedTuple):
    """``log_alpha``'s floor and ceiling and ``limit_log_alpha_span``'s span (inf: none)."""

    lo: Any
    hi: Any
    span: Any


class WatchConsts(NamedTuple):
    anneal_tolerance: Any
    anneal_window: Any
    anneal_drop: Any
    anneal_final: Any


FLOAT64 = {"slow_update_rate", "fast_update_rate", "min_log_alpha"}
"""Constants that ALF's staged rule keeps in float64; all others are float32."""


def register(module: nn.Module, prefix: str, state: NamedTuple) -> None:
    """Register every field of ``state`` (tensors) as a buffer ``prefix + field``."""
    for field, value in zip(state._fields, state):
        module.register_buffer(prefix + field, value)


def read(module: nn.Module, prefix: str, cls: Type[NamedTuple]) -> Any:
    """The buffers of ``cls``'s fields, as a ``cls``."""
    return cls(*(getattr(module, prefix + f) for f in cls._fields))


def views(full: Any) -> Any:
    """NumPy views of a tuple of CPU buffers and tuples of them (one level)."""
    return type(full)(*(type(f)(*(t.detach().numpy() for t in f)) if isinstance(f, tuple)
                        else f.detach().numpy() for f in full))


def values(arrays: Any) -> Any:
    """The values of ``views(...)`` (a scalar for a 0-d array)."""
    return type(arrays)(*(type(a)(*(v[()] for v in a)) if isinstance(a, tuple) else a[()]
                          for a in arrays))


def write(targets: Any, new: Any) -> None:
    """Write ``new`` into a tuple of buffers (``copy_``) or NumPy views, tuples of them too."""
    for target, value in zip(targets, new):
        if isinstance(target, tuple):
            write(target, value)
        elif isinstance(target, torch.Tensor):
            target.copy_(value)
        else:
            target[...] = value


class Constants:
    """A tuple of constants as NumPy scalars (host) and in buffers (tensors).

    Args:
        module: the owner; the buffers are ``prefix + "32"`` and ``prefix + "64"``.
        prefix: buffer name prefix.
        values: the constants (Python numbers), a named tuple.
    """

    def __init__(self, module: nn.Module, prefix: str, values: NamedTuple):
        self._module, self._prefix, self._cls = module, prefix, type(values)
        self._f64 = [f in FLOAT64 for f in values._fields]
        for dtype, want in (("32", False), ("64", True)):
            n = sum(1 for w in self._f64 if w == want)
            module.register_buffer(prefix + dtype, torch.zeros(
                n, dtype=torch.float64 if want else torch.float32), persistent=False)
        self.set(values)

    def set(self, values: NamedTuple) -> None:
        """Take new values (a fill per element: no host-to-device copy)."""
        self.values = values
        self.host = self._cls(*(np.float64(v) if w else np.float32(v)
                                for v, w in zip(values, self._f64)))
        index = {False: 0, True: 0}
        with torch.no_grad():
            for v, w in zip(values, self._f64):
                getattr(self._module, self._prefix + ("64" if w else "32"))[index[w]].fill_(v)
                index[w] += 1

    def packed(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The buffers themselves (what a compiled function takes: no 0-d float64 tensor,
        whose value torch.compile would guard with a host read)."""
        module, prefix = self._module, self._prefix
        return getattr(module, prefix + "32"), getattr(module, prefix + "64")

    def unpack(self, packed: Tuple[torch.Tensor, torch.Tensor]) -> Any:
        """The constants as 0-d tensors (views of ``packed``)."""
        parts = {False: iter(packed[0].unbind()), True: iter(packed[1].unbind())}
        return self._cls(*(next(parts[w]) for w in self._f64))


class NoConsts(NamedTuple):
    """A rule without constants of its own."""

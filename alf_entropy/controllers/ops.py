"""The ops every rule is written in, and the entropy window.  A rule never branches in Python
on a value (each decision an ``x.where``), so it runs on CPU state as NumPy (``ScalarOps``;
``ArrayOps`` for a batch) and anywhere as tensors (``TensorOps``: no host read), with the same
bits.  Bit traps: Python-float constants are weak scalars on both (NumPy >= 2) and float32 when
``where`` chooses them; a number divided by a tensor only as ``1.0 / t`` (torch's ``c / t`` is
``c * (1 / t)``); sqrt and log in float64, then cast."""

from typing import Any, Tuple

import numpy as np
import torch

from alf_entropy.utils.math_ops import masked_mean

__all__ = [
    "ScalarOps",
    "ArrayOps",
    "TensorOps",
    "f32",
    "gate",
    "window_mean",
    "window_average",
    "member_mean",
    "WEAK_SCALARS",
]

WEAK_SCALARS = np.lib.NumpyVersion(np.__version__) >= "2.0.0"
"""NumPy >= 2 keeps a Python float beside a float32 in float32 (NEP 50), as torch does; NumPy 1
computes it in float64, so the NumPy ops give torch's bits only on NumPy >= 2."""


def _f32(v):
    return np.float32(v) if type(v) is float else v  # np.float64 is a float subclass


def _log64(v):
    with np.errstate(divide="ignore"):  # log(0) = -inf, as torch's
        return np.log(np.asarray(v, np.float64))


def f32(v: float) -> float:
    """``v`` rounded to float32 (a constant the rules combine in float32)."""
    return float(np.float32(v))


class ScalarOps:
    """One controller on the CPU: NumPy scalars and Python selects."""

    maximum, minimum, abs = staticmethod(max), staticmethod(min), staticmethod(abs)
    clip = staticmethod(lambda v, lo, hi: min(max(v, lo), hi))
    f32, f64, i32, isfinite = np.float32, np.float64, np.int32, np.isfinite
    sqrt = staticmethod(lambda v: np.float32(np.sqrt(np.float64(v))))
    log = staticmethod(lambda v: np.float32(_log64(v)))
    where = staticmethod(lambda cond, a, b: _f32(a if cond else b))

    @staticmethod
    def push(window, seen, value):
        """``window`` with ``value`` at slot ``seen % len``."""
        hit = np.arange(window.shape[-1]) == (seen % window.shape[-1])[..., None]
        return np.where(hit, np.asarray(value, window.dtype)[..., None], window)

    @staticmethod
    def via_torch(fn, *args):
        """``fn`` (of tensors) on these values, where only torch's kernels give its bits."""
        out = fn(*(torch.as_tensor(a) for a in args))
        return tuple(o.numpy()[()] for o in out) if isinstance(out, tuple) else out.numpy()[()]


class ArrayOps(ScalarOps):
    """A batch of controllers on the CPU: NumPy arrays."""

    maximum, minimum, abs = staticmethod(np.maximum), staticmethod(np.minimum), staticmethod(np.abs)
    clip = staticmethod(np.clip)
    where = staticmethod(lambda cond, a, b: np.where(cond, _f32(a), _f32(b)))


class TensorOps:
    """Tensors on any device: never reads a value on the host."""

    where, abs, isfinite, clip = torch.where, torch.abs, torch.isfinite, torch.clamp
    # of float32 values, in float64: torch's float32 sqrt is not correctly rounded
    sqrt = staticmethod(lambda t: torch.sqrt(t.double()).float())
    log = staticmethod(lambda t: torch.log(t.double()).float())
    # of a tensor and a tensor or a number (a rule's first argument is always a tensor)
    maximum = staticmethod(
        lambda a, b: torch.maximum(a, b) if torch.is_tensor(b) else torch.clamp(a, min=b)
    )
    minimum = staticmethod(
        lambda a, b: torch.minimum(a, b) if torch.is_tensor(b) else torch.clamp(a, max=b)
    )
    f32 = staticmethod(lambda t: t.float())
    f64 = staticmethod(lambda t: t.double() if torch.is_tensor(t) else t)
    i32 = staticmethod(lambda t: t.int())
    via_torch = staticmethod(lambda fn, *args: fn(*args))

    @staticmethod
    def push(window, seen, value):
        slots = torch.arange(window.shape[-1], device=window.device)
        hit = slots == (seen % window.shape[-1]).unsqueeze(-1)
        return torch.where(hit, value.unsqueeze(-1).to(window.dtype), window)


def gate(x: Any, valid: Any, new: Any, old: Any) -> Any:
    """The state ``new`` where ``valid``, else ``old``, field by field."""
    if isinstance(valid, np.bool_) or (isinstance(valid, np.ndarray) and valid.all()):
        return new if valid.all() else old
    return type(new)(
        *(
            x.where(valid.reshape(valid.shape + (1,) * (n.ndim - valid.ndim)), n, o)
            for n, o in zip(new, old)
        )
    )


def window_mean(x: Any, window: Any, seen: Any) -> Any:
    """The mean of the ``seen`` values in ``window``: ``sum * (1 / n)`` in a fixed order, as ALF."""
    total = window[..., 0]
    for i in range(1, window.shape[-1]):
        total = total + window[..., i]
    return total * (1.0 / x.f32(x.clip(seen, 1, window.shape[-1])))


def window_average(x: Any, window: Any, seen: Any, value: Any) -> Tuple:
    """ALF's ``ScalarWindowAverager``: ``(average before, average after, window, seen)``."""
    new_window = x.push(window, seen, value)
    return window_mean(x, window, seen), window_mean(x, new_window, seen + 1), new_window, seen + 1


def member_mean(x: torch.Tensor, mask: Any, batch_dims: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each member's masked mean and count (the first ``batch_dims`` dims are the members')."""
    if batch_dims and x.dim() == batch_dims:  # one element a member
        x, mask = x.unsqueeze(-1), None if mask is None else mask.unsqueeze(-1)
    return masked_mean(x, mask, dim=tuple(range(batch_dims, x.dim())) if batch_dims else None)

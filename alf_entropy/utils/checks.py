"""Argument checks shared by the package: one place for "a finite real > 0".

Each check returns the normalised value (a ``float``/``int``) or raises a
``TypeError`` (wrong type) or ``ValueError`` (out of range) that names the
argument and what is allowed, as the package's standards require.
"""
import math
import numbers
from typing import Any, Optional

__all__ = ["is_real", "check_real", "check_int"]


def is_real(value: Any) -> bool:
    """True for a real number that is not a ``bool`` (numpy scalars included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_real(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    minimum: Optional[float] = None,
    maximum: Optional[float] = None,
) -> float:
    """Return ``value`` as a finite float, or raise naming ``name``.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        positive: require ``value > 0``.
        minimum: require ``value >= minimum`` if given.
        maximum: require ``value <= maximum`` if given.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if it is not finite or out of range.
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}: {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return v


def check_int(
    name: str, value: Any, minimum: Optional[int] = None, *, allow_none: bool = False
) -> Optional[int]:
    """Return ``value`` as an int, or raise ``ValueError`` naming ``name``.

    Args:
        name: the argument's name, for the message.
        value: the value to check (a ``bool`` is rejected).
        minimum: require ``value >= minimum`` if given.
        allow_none: accept (and return) ``None``.

    Returns:
        ``int(value)``, or ``None`` when it is ``None`` and allowed.

    Raises:
        ValueError: if ``value`` is not an int or is below ``minimum``.
    """
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or (minimum is not None and value < minimum)
    ):
        allowed = "" if minimum is None else f" >= {minimum}"
        raise ValueError(
            f"{name} must be an int{allowed}{' or None' if allow_none else ''}, got {value!r}"
        )
    return int(value)

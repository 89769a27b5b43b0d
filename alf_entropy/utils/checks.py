"""Argument checks shared by the package: one place for "a finite real > 0".

Each check returns the normalised value (a ``float``/``int``) or raises a
``TypeError`` (wrong type) or ``ValueError`` (out of range) that names the
argument and what is allowed, as the package's standards require.
"""

import math
import numbers
import operator
from typing import Any, Optional, Sequence, Tuple

__all__ = [
    "is_real",
    "check_real",
    "check_int",
    "check_step",
    "check_callable",
    "check_choice",
    "check_name",
    "check_batch_shape",
]


def is_real(value: Any) -> bool:
    """True for a real number that is not a ``bool`` (numpy scalars included)."""
    return type(value) in (float, int) or (
        isinstance(value, numbers.Real) and not isinstance(value, bool)
    )


def check_real(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    minimum: Optional[float] = None,
    maximum: Optional[float] = None,
    above: Optional[float] = None,
    below: Optional[float] = None,
    finite: bool = True,
    allow_none: bool = False,
) -> Optional[float]:
    """``float(value)``, or ``TypeError`` (not a real) / ``ValueError`` (NaN, infinite
    unless ``finite=False``, or outside ``positive``/``minimum``/``maximum``/``above``/
    ``below``) naming ``name``; ``None`` passes with ``allow_none``."""
    if value is None and allow_none:
        return None
    if not is_real(value):
        raise TypeError(
            f"{name} must be a real number{' or None' if allow_none else ''}, got "
            f"{type(value).__name__}: {value!r}"
        )
    v = float(value)
    if (finite and not math.isfinite(v)) or math.isnan(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    if above is not None and not v > above:
        raise ValueError(f"{name} must be > {above}, got {value!r}")
    if below is not None and not v < below:
        raise ValueError(f"{name} must be < {below}, got {value!r}")
    return v


def check_int(
    name: str,
    value: Any,
    minimum: Optional[int] = None,
    *,
    below: Optional[int] = None,
    allow_none: bool = False,
    none_means: str = "",
) -> Optional[int]:
    """``int(value)`` (numpy integers too, not a ``bool``) in ``[minimum, below)``, else a
    ``ValueError`` naming ``name``; ``None`` passes with ``allow_none`` (``none_means``
    says what it means in the message, e.g. ``"no limit"``)."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or (minimum is not None and value < minimum)
        or (below is not None and value >= below)
    ):
        allowed = "" if minimum is None else f" >= {minimum}"
        if below is not None:
            allowed += f"{' and' if minimum is not None else ''} < {below}"
        if allow_none:
            allowed += f" or None{f' ({none_means})' if none_means else ''}"
        raise ValueError(f"{name} must be an int{allowed}, got {value!r}")
    return int(value)


def check_callable(name: str, value: Any) -> Any:
    """``value`` if callable, else ``TypeError`` naming ``name``."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if one of ``choices``, else ``ValueError`` naming ``name``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_name(name: str, value: Any) -> str:
    """``value`` if a non-empty string, else ``TypeError`` (not a string) or ``ValueError``
    (empty) naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a non-empty string, got {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def check_batch_shape(value: Any) -> Tuple[int, ...]:
    """A ``batch_shape`` as a tuple: ``()`` for one agent, ``(K,)`` for K (an int >= 1)."""
    if not isinstance(value, (tuple, list)) or len(value) > 1:
        raise ValueError(f"batch_shape must be () or (K,), got {value!r}")
    return tuple(check_int("batch_shape[0]", k, minimum=1) for k in value)


def check_step(name: str, value: Any) -> int:
    """A step or counter as an int >= 0 (anything ``operator.index`` takes, not a ``bool``)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int >= 0, got a bool")
    try:
        step = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__}") from None
    if step < 0:
        raise ValueError(f"{name} must be an int >= 0, got {step}")
    return step

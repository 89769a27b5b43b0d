"""Argument checks shared by the package: one place for "a finite real > 0".

Each check returns the normalised value (a ``float``/``int``) or raises a
``TypeError`` (wrong type) or ``ValueError`` (out of range) that names the
argument and what is allowed, as the package's standards require.
"""
import math
import numbers
import operator
from typing import Any, Optional, Sequence

__all__ = ["is_real", "check_real", "check_int", "check_step", "check_callable", "check_choice"]


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
    above: Optional[float] = None,
    below: Optional[float] = None,
    finite: bool = True,
    allow_none: bool = False,
) -> Optional[float]:
    """Return ``value`` as a float, or raise naming ``name`` and the allowed range.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        positive: require ``value > 0``.
        minimum: require ``value >= minimum`` if given.
        maximum: require ``value <= maximum`` if given.
        above: require ``value > above`` if given.
        below: require ``value < below`` if given.
        finite: reject ``inf`` and NaN (with ``False`` NaN is still
            rejected, infinities pass the range checks as any number).
        allow_none: accept (and return) ``None``.

    Returns:
        ``float(value)``, or ``None`` when it is ``None`` and allowed.

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if it is not finite (when required), NaN, or out of range.
    """
    if value is None and allow_none:
        return None
    if not is_real(value):
        raise TypeError(f"{name} must be a real number{' or None' if allow_none else ''}, got "
                        f"{type(value).__name__}: {value!r}")
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
    """Return ``value`` as an int, or raise ``ValueError`` naming ``name``.

    Args:
        name: the argument's name, for the message.
        value: the value to check (a ``bool`` is rejected; numpy integers
            are accepted).
        minimum: require ``value >= minimum`` if given.
        below: require ``value < below`` if given.
        allow_none: accept (and return) ``None``.
        none_means: what ``None`` means, for the message (e.g. ``"no limit"``).

    Returns:
        ``int(value)``, or ``None`` when it is ``None`` and allowed.

    Raises:
        ValueError: if ``value`` is not an int or is out of range.
    """
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
    """Return ``value`` if it is callable, else raise ``TypeError`` naming ``name``.

    Args:
        name: the argument's name, for the message.
        value: the value to check (a class, function or ``functools.partial``).

    Returns:
        ``value``.

    Raises:
        TypeError: if ``value`` is not callable.
    """
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError``.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        choices: the allowed values.

    Returns:
        ``value``.

    Raises:
        ValueError: if ``value`` is not one of ``choices``.
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_step(name: str, value: Any) -> int:
    """Return a step or counter ``value`` as an int >= 0.

    Args:
        name: the argument's name, for the message.
        value: the value (anything ``operator.index`` accepts, e.g. numpy
            integers; not a ``bool``).

    Returns:
        ``int(value)``.

    Raises:
        TypeError: if ``value`` is not an integer (or is a ``bool``).
        ValueError: if ``value < 0``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int >= 0, got a bool")
    try:
        step = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__}") from None
    if step < 0:
        raise ValueError(f"{name} must be an int >= 0, got {step}")
    return step

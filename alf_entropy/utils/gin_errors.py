"""Plain Python errors from gin-configurable classes called from Python.

A ``@gin.configurable`` class's constructor runs inside gin's wrapper, which
re-raises any error with ``"\\n  In call to configurable 'X' (<class ...>)"``
appended (gin-config's ``gin.utils.augment_exception_message_and_reraise``:
it raises a dynamically made subclass of the error's type whose ``__str__``
adds the text, ``from None`` inside the ``except`` block that caught the
original, so the original is the proxy's ``__context__``).  That context
helps when gin supplied the arguments; when a user calls
``EntropyTargetAlgorithm(spec, initial_alpha=-1)`` from Python it only buries
the message.

:class:`PlainGinErrors` is a metaclass (``class Algorithm(nn.Module,
metaclass=PlainGinErrors)``) whose ``__call__`` -- the outermost frame of
``Cls(...)``, around gin's wrapper -- re-raises the original error when gin
supplied none of the call's arguments (no binding of the class, or of a
configurable base, that the caller did not override, in the current scope),
and gin's augmented error otherwise.  An error kept with gin's text by a
nested construction (a sub-algorithm gin configured) keeps it when it
passes through an outer call.  Only public gin API is used
(``gin.get_bindings``); recognising gin's proxy relies on the behaviour
described above (gin-config 0.5), and :func:`plain_error` returns any error
it does not recognise unchanged.

Examples:
    >>> import gin
    >>> @gin.configurable
    ... class Rate(metaclass=PlainGinErrors):
    ...     def __init__(self, rate=1.0):
    ...         if rate <= 0:
    ...             raise ValueError(f"rate must be > 0, got {rate}")
    >>> try:
    ...     Rate(rate=-1)
    ... except ValueError as e:
    ...     print(e)
    rate must be > 0, got -1
"""
import inspect
from typing import Any, Dict, Tuple

import gin

__all__ = ["PlainGinErrors", "gin_supplies_arguments", "plain_error"]

_GIN_CALL_TEXT = "\n  In call to configurable '"
_KEPT = "_alf_entropy_gin_context_kept"  # set on a gin-augmented error that keeps its text


def _gin_original(error: BaseException) -> Any:
    """The error gin's wrapper augmented into ``error``, or None if it is not gin's proxy."""
    original = error.__context__
    if original is None or not error.__suppress_context__ or _KEPT in vars(error):
        return None
    if (type(error).__bases__ != (type(original),)
            or type(error).__name__ != type(original).__name__):
        return None
    try:
        text, inner = str(error), str(original)
    except Exception:  # a broken __str__: leave the error alone
        return None
    if not (text.startswith(inner) and _GIN_CALL_TEXT in text[len(inner):]):
        return None
    return original


def gin_supplies_arguments(cls: type, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether gin binds, in the current scope, an argument of ``cls(*args, **kwargs)``
    that the call itself does not give (for ``cls`` or any configurable base).

    Args:
        cls: the class being constructed.
        args: the positional arguments of the call.
        kwargs: the keyword arguments of the call.

    Returns:
        bool: True if some binding fills an argument the caller left out.
    """
    given = set(kwargs)
    try:
        given |= set(inspect.signature(cls).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        pass  # the arguments do not fit: the error says so; keyword names are enough
    for klass in cls.__mro__:
        try:
            bindings = gin.get_bindings(klass, resolve_references=False)
        except ValueError:  # not a registered configurable
            continue
        if set(bindings) - given:
            return True
    return False


def plain_error(error: BaseException, cls: type, args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> BaseException:
    """The error ``cls(*args, **kwargs)`` should raise, given what it raised.

    Args:
        error: what the construction raised.
        cls: the class constructed.
        args: the positional arguments of the call.
        kwargs: the keyword arguments of the call.

    Returns:
        BaseException: when gin supplied arguments: ``error`` (marked so that
        outer calls keep it); otherwise the error under gin's added layers
        (``error`` itself if gin added none).
    """
    if _gin_original(error) is None:
        return error
    if gin_supplies_arguments(cls, args, kwargs):
        setattr(error, _KEPT, True)
        return error
    original = _gin_original(error)
    while original is not None:
        error, original = original, _gin_original(original)
    return error


class PlainGinErrors(type):
    """Metaclass: ``Cls(...)`` raises plain Python errors unless gin supplied arguments.

    See the module docstring.  Construction is otherwise unchanged: gin's
    wrapper still runs (bindings, operative config), only the error raised
    to the caller differs.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            plain = plain_error(error, cls, args, kwargs)
            if plain is error:
                raise
        # Raised outside the ``except`` block, so the original does not get
        # gin's proxy as its context; its traceback still starts where it
        # was raised.
        try:
            raise plain
        finally:
            del plain

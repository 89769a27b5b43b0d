"""``forwards_arguments``: a subclass constructor that lists only what differs.

A subclass such as ``PPOAlgorithm`` takes the base class's arguments, changes
a few defaults and adds one or two of its own.  Written out in full, its
``__init__`` repeats the base's dozen-odd arguments and passes each on by
hand; written with ``**kwargs``, gin would accept any binding, so a misspelt
``PPOAlgorithm.gama = 0.9`` would no longer fail when the config is parsed.
With this decorator the subclass writes ``__init__(self, <positional>, *,
<what differs>, **kwargs)`` and still shows -- to gin, ``help()`` and IDEs --
the full signature: its positional arguments, then the base's others
(keyword-only, with the subclass's defaults where it overrides them), then its
own additions.  Every argument reaches the base explicitly (unset ones with
their defaults), so gin bindings of a configurable base class
(``ActorCriticAlgorithm.gamma``) do not leak into the subclass.
"""
import functools
import inspect
from typing import Any, Callable, Sequence, TypeVar

__all__ = ["forwards_arguments"]

_F = TypeVar("_F", bound=Callable[..., Any])
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def forwards_arguments(
    base_init: Callable[..., Any], supplied: Sequence[str] = ()
) -> Callable[[_F], _F]:
    """Give an ``__init__`` that passes ``**kwargs`` to ``base_init`` the full signature.

    Args:
        base_init: the base class's ``__init__``.
        supplied: base arguments the subclass computes itself (left out of
            the signature, so gin rejects a binding for them).

    Returns:
        A decorator: the function with that ``__signature__`` (gin reads it
        through ``inspect``), called with every argument of it filled in.

    Raises:
        TypeError: if the decorated function has no ``**kwargs``.
    """

    def decorate(init: _F) -> _F:
        sig = inspect.signature(init)
        own = sig.parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values()):
            raise TypeError(f"forwards_arguments: {init.__qualname__} must take **kwargs")
        base = inspect.signature(base_init).parameters
        params = [p for p in own.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        for name, p in base.items():
            if name in supplied or p.kind in _VARIADIC or any(q.name == name for q in params):
                continue
            params.append(own.get(name) or p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        params += [
            p for name, p in own.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in base
        ]
        full = sig.replace(parameters=params)
        init.__signature__ = full  # what gin finds when it unwraps the wrapper

        @functools.wraps(init)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = full.bind(*args, **kwargs)
            bound.apply_defaults()
            return init(*bound.args, **bound.kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate

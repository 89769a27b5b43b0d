"""Reading a pickled environment state from a checkpoint without running what it names.

A checkpoint is read with ``torch.load(weights_only=True)``, but the envs' state inside it is
a pickle, and a plain ``pickle.loads`` calls whatever a crafted file names.  Here only what an
environment's state holds is found: NumPy arrays and generators, gymnasium's and the live
env's own classes, ``collections.deque`` and ``functools.partial`` (Python's "restricting
globals" recipe); anything else is an ``UnpicklingError``.
"""

import io
import pickle
import pickletools
from typing import Any, Iterable

__all__ = ["check_pickle", "load_env_state"]

_NAMES = {
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("collections", "deque"),
    ("functools", "partial"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),  # NumPy 1
    ("alf_entropy.environments.gym_vector_env", "_make_env"),
}


class _EnvStateUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, modules: Iterable[str]):
        super().__init__(io.BytesIO(data))
        self._modules = set(modules)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NAMES or module.startswith("numpy.random."):
            return super().find_class(module, name)
        if module.split(".")[0] == "gymnasium" or module in self._modules:
            found = super().find_class(module, name)
            if isinstance(found, type):  # classes only
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of an environment state")


def load_env_state(data: bytes, modules: Iterable[str] = ()) -> Any:
    """``pickle.loads(data)`` finding only an environment state's names (module docstring),
    and the classes of ``modules`` (the live env's own, for an env outside gymnasium).

    Raises:
        pickle.UnpicklingError: if ``data`` names anything else.
    """
    return _EnvStateUnpickler(data, modules).load()


def check_pickle(data: bytes) -> None:
    """Parse ``data``'s pickle opcodes, running nothing.

    Raises:
        ValueError: if it is not a complete pickle.
    """
    try:
        for _ in pickletools.genops(data):
            pass
    except Exception as e:  # genops raises ValueError, EOFError, ... on damage
        raise ValueError(f"not a pickle: {e}") from e

"""The training progress: the one place that holds process-global training state.

Schedulers are zero-argument callables (ALF's API), so the progress they read
lives here, once per process: ``"iterations"``, ``"env_steps"``,
``"percent"`` (set by whoever trains, through :func:`update_progress`) and
``"global_counter"`` (the summaries' default step).  The trainers reset it at
start and checkpoint it (:func:`get_all_progress`, :func:`set_all_progress`);
two runs trained at once in one process would share it, so run them as
processes (as ``alf-entropy-sweep`` does).  Host Python numbers only.
"""

import numbers
from typing import Any, Dict, Mapping, Tuple

from alf_entropy.utils.checks import check_choice, check_real, check_step

__all__ = [
    "PROGRESS_TYPES",
    "check_progress_type",
    "update_progress",
    "get_progress",
    "progress_was_fed",
    "reset_progress",
    "get_all_progress",
    "set_all_progress",
    "get_global_counter",
    "set_global_counter",
    "increment_global_counter",
]

PROGRESS_TYPES: Tuple[str, ...] = ("iterations", "env_steps", "percent", "global_counter")

_progress: Dict[str, float] = {"iterations": 0.0, "env_steps": 0.0, "percent": 0.0}
_global_counter: int = 0
# Progress types set by update_progress since the last reset_progress.
_fed: set = set()


def check_progress_type(progress_type: Any) -> str:
    """``progress_type``, or ``ValueError`` naming :data:`PROGRESS_TYPES`."""
    return check_choice("progress_type", progress_type, PROGRESS_TYPES)


def update_progress(progress_type: str, value: numbers.Real) -> None:
    """Set one kind of progress to a finite ``value >= 0`` (an integer for
    ``"global_counter"``)."""
    check_progress_type(progress_type)
    v = check_real(f"value (progress {progress_type!r})", value, minimum=0)
    _fed.add(progress_type)
    if progress_type == "global_counter":
        if v != int(v):
            raise ValueError(f"value for 'global_counter' must be an integer, got {v}")
        set_global_counter(int(v))
    else:
        _progress[progress_type] = v


def get_progress(progress_type: str) -> float:
    """The current value of one kind of progress."""
    check_progress_type(progress_type)
    if progress_type == "global_counter":
        return float(_global_counter)
    return _progress[progress_type]


def reset_progress() -> None:
    """Set every progress, the global counter included, to 0."""
    for key in _progress:
        _progress[key] = 0.0
    _fed.clear()
    set_global_counter(0)


def progress_was_fed(progress_type: str) -> bool:
    """Whether this progress was set since the last reset (or is non-zero): the
    controllers warn about a forgotten ``update_progress`` with it."""
    return progress_type in _fed or get_progress(progress_type) != 0


def get_all_progress() -> Dict[str, float]:
    """A copy of every progress value (for a checkpoint)."""
    return {key: get_progress(key) for key in PROGRESS_TYPES}


def set_all_progress(progresses: Mapping[str, numbers.Real]) -> None:
    """Restore :func:`get_all_progress`'s values, all checked before any is set (missing
    types keep theirs)."""
    if not isinstance(progresses, Mapping):
        raise TypeError(
            f"progresses must be a mapping from progress type to value, got "
            f"{type(progresses).__name__}"
        )
    for key, value in progresses.items():
        check_progress_type(key)
        v = check_real(f"progresses[{key!r}]", value, minimum=0)
        if key == "global_counter" and v != int(v):
            raise ValueError(f"progresses[{key!r}] must be integral, got {v}")
    for key, value in progresses.items():
        update_progress(key, value)


def get_global_counter() -> int:
    """The global counter, the summaries' default ``step``."""
    return _global_counter


def set_global_counter(n: int) -> None:
    """Set the global counter to an integer ``n >= 0``."""
    global _global_counter
    _global_counter = check_step("n", n)


def increment_global_counter() -> int:
    """Add one to the global counter; returns its new value."""
    global _global_counter
    _global_counter += 1
    return _global_counter

"""The training progress: the one place that holds process-global training state.

Schedulers are zero-argument callables (ALF's API: ``LinearScheduler()`` in a
gin file), so the progress they read cannot be an argument; it lives here,
once per process:

* ``"iterations"``, ``"env_steps"``, ``"percent"``: set by whoever trains
  (the trainers, the SB3 and LLM integrations, or a plain loop) through
  :func:`update_progress`;
* ``"global_counter"``: the default ``step`` of every summary
  (:mod:`alf_entropy.utils.summary`), usually the number of training
  iterations.

The trainers reset it when they start (:func:`reset_progress`) and save and
restore it with their checkpoints (:func:`get_all_progress`,
:func:`set_all_progress`), so one training run per process sees a clean
progress.  Two runs trained at once in one process would share it: run them
as separate processes (as ``alf-entropy-sweep`` does).  The only other
process-global state is the summary writer, scope and ``record_if`` stack,
owned by :mod:`alf_entropy.utils.summary`.

Everything here is host-side Python numbers: reading progress never touches a
tensor.  :mod:`alf_entropy.utils.schedulers` re-exports these functions.
"""
import numbers
from typing import Any, Dict, Mapping, Tuple

from alf_entropy.utils.checks import check_real, check_step

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

PROGRESS_TYPES: Tuple[str, ...] = (
    "iterations",
    "env_steps",
    "percent",
    "global_counter",
)

_progress: Dict[str, float] = {"iterations": 0.0, "env_steps": 0.0, "percent": 0.0}
_global_counter: int = 0
# Progress types set by update_progress since the last reset_progress.
_fed: set = set()


def check_progress_type(progress_type: Any) -> str:
    """Return ``progress_type`` or raise ValueError naming the allowed set.

    Args:
        progress_type: the name to check.

    Returns:
        ``progress_type``, one of :data:`PROGRESS_TYPES`.

    Raises:
        ValueError: if it is not one of them.
    """
    if progress_type not in PROGRESS_TYPES:
        raise ValueError(
            f"Unknown progress_type {progress_type!r}; must be one of "
            f"{list(PROGRESS_TYPES)}"
        )
    return progress_type


def update_progress(progress_type: str, value: numbers.Real) -> None:
    """Set the current value of one kind of training progress.

    Setting ``"global_counter"`` is :func:`set_global_counter`.

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.
        value: the progress, a finite number >= 0 (an integer for
            ``"global_counter"``).

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if ``progress_type`` is unknown or ``value`` is not a
            finite number >= 0 (or not integral for ``"global_counter"``).
    """
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
    """Return the current value of one kind of training progress.

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.

    Returns:
        float: the progress.

    Raises:
        ValueError: if ``progress_type`` is unknown.
    """
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
    """Whether this progress was ever set (by :func:`update_progress`, or is non-zero).

    A scheduler whose progress is never fed stays at its first value; the
    entropy controllers use this to warn about a forgotten ``update_progress``.

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.

    Returns:
        bool: True once it was set since the last :func:`reset_progress`.
    """
    return progress_type in _fed or get_progress(progress_type) != 0


def get_all_progress() -> Dict[str, float]:
    """Return a copy of all progress values, e.g. to save in a checkpoint.

    Returns:
        Dict[str, float]: one entry per name in :data:`PROGRESS_TYPES`.
    """
    return {key: get_progress(key) for key in PROGRESS_TYPES}


def set_all_progress(progresses: Mapping[str, numbers.Real]) -> None:
    """Restore progress values, e.g. from :func:`get_all_progress` output.

    All entries are validated before any is applied.  Types missing from
    ``progresses`` keep their current value.

    Args:
        progresses: mapping from progress type to value.

    Raises:
        TypeError: if ``progresses`` is not a mapping.
        ValueError: if a key is not a progress type or a value is invalid
            (see :func:`update_progress`).
    """
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
    """Return the global counter, the default ``step`` of every summary.

    Returns:
        int: the counter (a host-side Python int).
    """
    return _global_counter


def set_global_counter(n: int) -> None:
    """Set the global counter.

    Args:
        n: the new value, an integer >= 0 (numpy integers are accepted).

    Raises:
        TypeError: if ``n`` is not an integer.
        ValueError: if ``n < 0``.
    """
    global _global_counter
    _global_counter = check_step("n", n)


def increment_global_counter() -> int:
    """Add one to the global counter.

    Returns:
        int: the new value of the counter.
    """
    global _global_counter
    _global_counter += 1
    return _global_counter

"""TensorBoard summaries with ALF's ``alf.summary`` API.

This module is a small, host-side port of ALF's ``alf/summary/summary_ops.py``
on top of :class:`torch.utils.tensorboard.SummaryWriter`::

    writer = summary.create_summary_writer("/tmp/run")
    summary.set_default_writer(writer)
    with summary.record_if(lambda: summary.get_global_counter() % 100 == 0):
        with summary.scope("entropy_target"):
            summary.scalar("alpha", alpha)   # tag "entropy_target/alpha"
    summary.increment_global_counter()

A summary is written only when :func:`should_record_summaries` is true: a
default writer is set, summaries are enabled (:func:`enable_summary`) and the
innermost :class:`record_if` condition returns ``True``.  When it is false,
:func:`scalar` returns at once without looking at its value, so passing a
CUDA tensor costs no device->host copy or synchronisation.  Callers that have
to *compute* a value only for a summary should guard that computation with
``if summary.should_record_summaries():``.

The global counter (the default ``step`` of every summary, usually the number
of training iterations) is a plain Python ``int``, part of the training
progress that :mod:`alf_entropy.utils.progress` owns (re-exported here).

Process-global state: the default writer, :func:`enable_summary`'s flag and
the :class:`scope` and :class:`record_if` stacks are per process, as in ALF
(a summary call deep inside an algorithm needs no writer argument).  The
trainers set the writer for a run and unset it when the run ends; these and
the progress module are the package's only process-global state.

Differences from ALF: only scalars (what the package writes); summaries are
enabled by default (ALF's trainer turns them on explicitly; here setting a
default writer is enough), and the counter is an ``int`` rather than a numpy
array.
"""
import numbers
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
from torch.utils.tensorboard import SummaryWriter

from alf_entropy.utils.checks import check_int, check_real, check_step
from alf_entropy.utils.progress import (  # re-exported: ALF's alf.summary API
    get_global_counter,
    increment_global_counter,
    set_global_counter,
)

__all__ = [
    "create_summary_writer",
    "set_default_writer",
    "get_default_writer",
    "scope",
    "scalar",
    "should_record_summaries",
    "record_if",
    "enable_summary",
    "is_summary_enabled",
    "get_global_counter",
    "set_global_counter",
    "increment_global_counter",
    "flush",
    "close",
]

_default_writer: Optional[SummaryWriter] = None
_summary_enabled: bool = True
# Each entry is the full prefix (ending with "/") for the scope; "" at the root.
_scope_stack: List[str] = [""]
_record_if_stack: List[Callable[[], bool]] = [lambda: True]


def create_summary_writer(
    root_dir: str, flush_secs: float = 10, max_queue: int = 10
) -> SummaryWriter:
    """Create a ``SummaryWriter`` writing event files under ``root_dir``.

    The writer is *not* made the default; call :func:`set_default_writer`.

    Args:
        root_dir: directory for the event files (created if missing).
        flush_secs: how often, in seconds, pending events are flushed to disk;
            must be > 0.
        max_queue: number of pending events that forces a flush; must be >= 1.

    Returns:
        SummaryWriter: the new writer.

    Raises:
        ValueError: if ``root_dir`` is empty, ``flush_secs <= 0`` or
            ``max_queue < 1``.
    """
    if not isinstance(root_dir, str) or not root_dir:
        raise ValueError(f"root_dir must be a non-empty path string, got {root_dir!r}")
    check_real("flush_secs", flush_secs, positive=True)
    check_int("max_queue", max_queue, minimum=1)
    return SummaryWriter(log_dir=root_dir, flush_secs=flush_secs, max_queue=max_queue)


def set_default_writer(writer: Optional[SummaryWriter]) -> None:
    """Set (or, with ``None``, clear) the writer used by all summary functions.

    Args:
        writer: a ``SummaryWriter``, or ``None`` to stop writing summaries.

    Raises:
        TypeError: if ``writer`` is neither a ``SummaryWriter`` nor ``None``.
    """
    global _default_writer
    if writer is not None and not isinstance(writer, SummaryWriter):
        raise TypeError(
            f"writer must be a torch.utils.tensorboard.SummaryWriter or None, "
            f"got {type(writer).__name__}"
        )
    _default_writer = writer


def get_default_writer() -> Optional[SummaryWriter]:
    """Return the default writer.

    Returns:
        Optional[SummaryWriter]: the writer set by :func:`set_default_writer`,
        or ``None`` if there is none.
    """
    return _default_writer


class scope:
    """Context manager prefixing summary names, nesting as ``"outer/inner/name"``.

    Example::

        with summary.scope("root"):
            summary.scalar("val", 1)          # tag "root/val"
            with summary.scope("train"):
                summary.scalar("val", 1)      # tag "root/train/val"
    """

    def __init__(self, name: str) -> None:
        """Create the context manager.

        Args:
            name: scope name; leading/trailing ``"/"`` are stripped.

        Raises:
            ValueError: if ``name`` is not a string or is empty after stripping.
        """
        if not isinstance(name, str) or not name.strip("/"):
            raise ValueError(f"scope name must be a non-empty string, got {name!r}")
        self._name = name.strip("/")

    @property
    def name(self) -> str:
        """str: the (stripped) name of this scope."""
        return self._name

    def __enter__(self) -> str:
        """Push the scope.

        Returns:
            str: the full prefix now in effect, e.g. ``"root/train/"``.
        """
        prefix = _scope_stack[-1] + self._name + "/"
        _scope_stack.append(prefix)
        return prefix

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Pop the scope."""
        _scope_stack.pop()


class record_if:
    """Context manager deciding, through ``cond``, whether summaries are written.

    The innermost ``record_if`` wins: ``cond`` is called by every
    :func:`should_record_summaries` inside the ``with`` block.
    """

    def __init__(self, cond: Callable[[], bool]) -> None:
        """Create the context manager.

        Args:
            cond: a zero-argument callable returning whether to record.

        Raises:
            TypeError: if ``cond`` is not callable.
        """
        if not callable(cond):
            raise TypeError(
                f"cond must be a zero-argument callable returning bool, got "
                f"{type(cond).__name__}"
            )
        self._cond = cond

    def __enter__(self) -> None:
        """Push ``cond``."""
        _record_if_stack.append(self._cond)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Pop ``cond``."""
        _record_if_stack.pop()


def enable_summary(flag: bool = True) -> None:
    """Turn all summaries on or off (they are on by default).

    Args:
        flag: ``True`` to enable, ``False`` to disable.

    Raises:
        TypeError: if ``flag`` is not a bool.
    """
    global _summary_enabled
    if not isinstance(flag, bool):
        raise TypeError(f"flag must be a bool, got {type(flag).__name__}")
    _summary_enabled = flag


def is_summary_enabled() -> bool:
    """Return whether summaries are enabled by :func:`enable_summary`.

    Returns:
        bool: the current flag (``True`` by default).
    """
    return _summary_enabled


def should_record_summaries() -> bool:
    """Whether summary functions currently write anything.

    Returns:
        bool: ``True`` iff a default writer is set, summaries are enabled and
        the innermost :class:`record_if` condition returns ``True``.
    """
    return (
        _default_writer is not None
        and _summary_enabled
        and bool(_record_if_stack[-1]())
    )


def _resolve(name: str, step: Optional[int]) -> Tuple[str, int]:
    """Return the scoped tag and the step (global counter if ``None``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    step = get_global_counter() if step is None else check_step("step", step)
    return _scope_stack[-1] + name, step


def scalar(
    name: str, value: Union[numbers.Real, torch.Tensor], step: Optional[int] = None
) -> None:
    """Write a scalar summary.

    Does nothing, without touching ``value``, unless
    :func:`should_record_summaries` is true; only then is a tensor detached
    and copied to the host.

    Args:
        name: tag, prefixed with the current :class:`scope`.
        value: a real number, or a tensor with exactly one element.
        step: the step to record at; ``None`` uses :func:`get_global_counter`.

    Raises:
        ValueError: if ``name`` is empty, or ``value`` is a tensor with more
            than one element (only checked when recording).
        TypeError: if ``value`` is neither a number nor a tensor (only checked
            when recording).
    """
    if not should_record_summaries():
        return
    tag, step = _resolve(name, step)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"scalar value for {tag!r} must have exactly one element, got "
                f"shape {tuple(value.shape)}"
            )
        number = float(value.detach().reshape(()).float().cpu())
    elif isinstance(value, numbers.Real):
        number = float(value)
    else:
        raise TypeError(
            f"scalar value for {tag!r} must be a real number or a one-element "
            f"tensor, got {type(value).__name__}"
        )
    _default_writer.add_scalar(tag, number, step)


def flush() -> None:
    """Flush pending events of the default writer to disk (no-op without one)."""
    if _default_writer is not None:
        _default_writer.flush()


def close() -> None:
    """Close the default writer and unset it (no-op without one)."""
    global _default_writer
    if _default_writer is not None:
        _default_writer.close()
        _default_writer = None

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
innermost :func:`record_if` condition returns ``True``.  When it is false,
:func:`scalar` returns at once without looking at its value, so passing a
CUDA tensor costs no device->host copy or synchronisation.  Callers that have
to *compute* a value only for a summary should guard that computation with
``if summary.should_record_summaries():``.

The global counter (the default ``step`` of every summary, usually the number
of training iterations) is a plain Python ``int``, part of the training
progress that :mod:`alf_entropy.utils.progress` owns (re-exported here).

K agents: the default writer may be a list of K writers (one run directory per
agent); a value with K elements then writes element ``k`` to writer ``k``, a single
value to all.

A writer's scalars of one step go to its event file as one event (``add_scalar`` writes
an event a value, and TensorBoard's pure-Python record writer costs ~50 us an event): the
step's event is written when a scalar of another step comes, at :func:`flush` or
:func:`close`, or when :func:`create_summary_writer`'s writer is flushed or closed. Readers
see the same points.

Process-global state: the default writer, :func:`enable_summary`'s flag and
the :func:`scope` and :func:`record_if` stacks are per process, as in ALF
(a summary call deep inside an algorithm needs no writer argument).  The
trainers set the writer for a run and unset it when the run ends; these and
the progress module are the package's only process-global state.

Differences from ALF: only scalars (what the package writes); summaries are
enabled by default (ALF's trainer turns them on explicitly; here setting a
default writer is enough), and the counter is an ``int`` rather than a numpy
array.
"""

import contextlib
import numbers
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from alf_entropy.utils.checks import check_int, check_name, check_real, check_step
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
    "last_scalars",
]

_default_writer: Union[SummaryWriter, List[SummaryWriter], None] = None
_summary_enabled: bool = True
# Each entry is the full prefix (ending with "/") for the scope; "" at the root.
_scope_stack: List[str] = [""]
_record_if_stack: List[Callable[[], bool]] = [lambda: True]
_last: Dict[str, List[Optional[float]]] = {}
# Per writer (index): the step whose values are not written yet, and those values.
_pending: Dict[int, Tuple[int, List[Summary.Value]]] = {}


def create_summary_writer(
    root_dir: str, flush_secs: float = 10, max_queue: int = 10
) -> SummaryWriter:
    """A ``SummaryWriter`` writing event files under ``root_dir`` (not made the default).

    Raises:
        ValueError: if ``root_dir`` is empty, ``flush_secs <= 0`` or ``max_queue < 1``.
        TypeError: if ``root_dir`` is not a string.
    """
    check_name("root_dir", root_dir)
    check_real("flush_secs", flush_secs, positive=True)
    check_int("max_queue", max_queue, minimum=1)
    return _Writer(log_dir=root_dir, flush_secs=flush_secs, max_queue=max_queue)


class _Writer(SummaryWriter):
    """A ``SummaryWriter`` whose ``flush`` and ``close`` write the pending step first."""

    def flush(self) -> None:
        _write_pending()
        super().flush()

    def close(self) -> None:
        _write_pending()
        super().close()


def _writers() -> List[SummaryWriter]:
    return _default_writer if isinstance(_default_writer, list) else [_default_writer]


def set_default_writer(writer: Union[SummaryWriter, Sequence[SummaryWriter], None]) -> None:
    """Set (``None``: clear) the writer of all summary functions: one, or one per agent.

    Raises:
        TypeError: if ``writer`` is not a ``SummaryWriter``, a list of them or ``None``.
    """
    global _default_writer
    writers = list(writer) if isinstance(writer, (list, tuple)) else [writer]
    if writer is not None and not (writers and all(isinstance(w, SummaryWriter) for w in writers)):
        raise TypeError(
            f"writer must be a torch.utils.tensorboard.SummaryWriter, a list of "
            f"them or None, got {type(writer).__name__}"
        )
    _write_pending()
    _default_writer = writers if isinstance(writer, (list, tuple)) else writer
    _last.clear()


def get_default_writer() -> Union[SummaryWriter, List[SummaryWriter], None]:
    """The writer set by :func:`set_default_writer` (``None`` if none)."""
    return _default_writer


def last_scalars() -> Dict[str, List[Optional[float]]]:
    """The last value written of each tag since the writer was set (one per writer)."""
    return dict(_last)


@contextlib.contextmanager
def _pushed(stack: List[Any], item: Any) -> Iterator[Any]:
    stack.append(item)
    try:
        yield item
    finally:
        stack.pop()


def scope(name: str) -> ContextManager[str]:
    """Context manager prefixing summary names, nesting as ``"outer/inner/name"``; it
    gives the prefix.

    Args:
        name: scope name; leading/trailing ``"/"`` are stripped.

    Raises:
        ValueError: if ``name`` is not a string or is empty after stripping.
    """
    if not isinstance(name, str) or not name.strip("/"):
        raise ValueError(f"scope name must be a non-empty string, got {name!r}")
    return _pushed(_scope_stack, _scope_stack[-1] + name.strip("/") + "/")


def record_if(cond: Callable[[], bool]) -> ContextManager[Any]:
    """Context manager deciding, through ``cond`` (called by every
    :func:`should_record_summaries` inside; the innermost wins), whether to write.

    Raises:
        TypeError: if ``cond`` is not callable.
    """
    if not callable(cond):
        raise TypeError(
            f"cond must be a zero-argument callable returning bool, got {type(cond).__name__}"
        )
    return _pushed(_record_if_stack, cond)


def enable_summary(flag: bool = True) -> None:
    """Turn all summaries on or off (on by default).

    Raises:
        TypeError: if ``flag`` is not a bool.
    """
    global _summary_enabled
    if not isinstance(flag, bool):
        raise TypeError(f"flag must be a bool, got {type(flag).__name__}")
    _summary_enabled = flag


def is_summary_enabled() -> bool:
    """Whether summaries are enabled by :func:`enable_summary` (default ``True``)."""
    return _summary_enabled


def should_record_summaries() -> bool:
    """Whether a default writer is set, summaries are enabled and the innermost
    :func:`record_if` condition is true."""
    return _default_writer is not None and _summary_enabled and bool(_record_if_stack[-1]())


def _numbers(tag: str, value: Any, n: int) -> List[Optional[float]]:
    """``value`` as one number per writer (None: that writer writes nothing)."""
    if isinstance(value, torch.Tensor):
        if value.numel() not in (1, n):
            raise ValueError(
                f"scalar value for {tag!r} must have exactly one element"
                + (f" or {n}, one per writer" if n > 1 else "")
                + f", got shape {tuple(value.shape)}"
            )
        values = value.detach().reshape(-1).float().cpu().tolist()
        return values * n if len(values) == 1 else values
    if isinstance(value, numbers.Real):
        return [float(value)] * n
    if (
        isinstance(value, (list, tuple))
        and len(value) == n
        and all(v is None or isinstance(v, numbers.Real) for v in value)
    ):
        return [None if v is None else float(v) for v in value]
    raise TypeError(
        f"scalar value for {tag!r} must be a real number or a one-element tensor "
        f"(or one per writer), got {type(value).__name__}"
    )


def scalar(
    name: str,
    value: Union[numbers.Real, torch.Tensor, Sequence[Optional[float]]],
    step: Optional[int] = None,
) -> None:
    """Write a scalar summary (per agent, with one writer per agent).

    Does nothing, without touching ``value``, unless :func:`should_record_summaries`;
    only then is a tensor copied to the host.

    Args:
        name: tag, prefixed with the current :func:`scope`.
        value: a real number or a one-element tensor; with K writers also a tensor of K
            elements or a list of K numbers (None: not for that agent); with one writer a
            tensor of K elements writes ``name/k`` for each.
        step: the step; ``None`` uses :func:`get_global_counter`.

    Raises:
        ValueError: for an empty ``name`` or a tensor of another size (when recording).
        TypeError: for a ``value`` of another type (when recording).
    """
    if not should_record_summaries():
        return
    check_name("name", name)
    step = get_global_counter() if step is None else check_step("step", step)
    tag = _scope_stack[-1] + name
    writers = _writers()
    if len(writers) == 1 and isinstance(value, torch.Tensor) and value.numel() > 1:
        for k, member in enumerate(value.reshape(-1)):  # one writer: a tag per member
            scalar(f"{name}/{k}", member, step)
        return
    values = _numbers(tag, value, len(writers))
    for k, number in enumerate(values):
        if number is not None:
            if _pending.get(k, (step,))[0] != step:
                _write_pending()
            _pending.setdefault(k, (step, []))[1].append(
                Summary.Value(tag=tag, simple_value=number)
            )
    _last[tag] = values


def _write_pending() -> None:
    """Write each writer's pending step as one event."""
    while _pending:
        k, (step, values) = _pending.popitem()
        writer = _writers()[k]
        if writer.file_writer is None:  # closed by its owner: add_scalar opens it again
            for v in values:
                writer.add_scalar(v.tag, v.simple_value, step)
        else:
            writer.file_writer.add_summary(Summary(value=values), step)


def flush() -> None:
    """Flush pending events of the default writer(s) to disk (no-op without one)."""
    if _default_writer is not None:
        _write_pending()
        for writer in _writers():
            writer.flush()


def close() -> None:
    """Close the default writer(s) and unset it (no-op without one)."""
    global _default_writer
    if _default_writer is not None:
        _write_pending()
        for writer in _writers():
            writer.close()
        _default_writer = None

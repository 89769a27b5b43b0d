"""Schedulers: hyper-parameters that change with training progress (ALF's API).

A port of ALF's ``alf/utils/schedulers.py``: a *scheduler* is a zero-argument
callable returning a hyper-parameter's current value (a Python float) from the
training progress, so any "float or scheduler" argument can be annealed in gin::

    PPOLoss.entropy_regularization = @LinearScheduler()
    LinearScheduler.progress_type = "percent"
    LinearScheduler.schedule = [(0, 1.0), (0.5, 0.1), (1.0, 0.01)]

The progress (``"iterations"``, ``"env_steps"``, ``"percent"`` of training
done, ``"global_counter"``) is process-global state owned by
:mod:`alf_entropy.utils.progress` (re-exported here): the trainer updates it
(:func:`update_progress`) and checkpoints it.  Evaluating a scheduler is host
arithmetic, never a device sync.  Unlike ALF, ``StepScheduler`` and
``LinearScheduler`` bisect instead of caching an index (correct when progress
goes back after a restore), and bad arguments raise ``ValueError``.
"""

import bisect
import math
import numbers
from functools import partial
from typing import Any, Callable, List, Sequence, Tuple, Union

from alf_entropy.utils.checks import check_choice, check_real, is_real
from alf_entropy.utils.progress import (  # re-exported: the progress schedulers read
    PROGRESS_TYPES,
    check_progress_type,
    get_all_progress,
    get_progress,
    progress_was_fed,
    reset_progress,
    set_all_progress,
    update_progress,
)
from alf_entropy.utils.settled_annealing import SettledAnnealing

__all__ = [
    "PROGRESS_TYPES",
    "update_progress",
    "get_progress",
    "progress_was_fed",
    "reset_progress",
    "get_all_progress",
    "set_all_progress",
    "Scheduler",
    "ConstantScheduler",
    "StepScheduler",
    "LinearScheduler",
    "ExponentialScheduler",
    "CyclicalScheduler",
    "as_scheduler",
    "SettledAnnealing",
]

Schedule = Sequence[Tuple[numbers.Real, numbers.Real]]


def _check_schedule(
    schedule: Any, finite_values: bool = True
) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Validate a non-empty ``[(progress, value), ...]`` list sorted by progress."""
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence):
        raise ValueError(f"schedule must be a list of (progress, value) pairs, got {schedule!r}")
    if not schedule:
        raise ValueError("schedule must not be empty")
    progresses: List[float] = []
    values: List[float] = []
    for i, pair in enumerate(schedule):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"schedule[{i}] must be a (progress, value) pair, got {pair!r}")
        progresses.append(check_real(f"schedule[{i}] progress", pair[0]))
        values.append(check_real(f"schedule[{i}] value", pair[1], finite=finite_values))
        if i and progresses[i] < progresses[i - 1]:
            raise ValueError(
                f"schedule progresses must be sorted in increasing order, got "
                f"{progresses[i - 1]} before {progresses[i]} at index {i}"
            )
    return tuple(progresses), tuple(values)


class Scheduler:
    """Base class of the progress-driven schedulers: ``__call__`` reads :meth:`progress`.

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.
    """

    def __init__(self, progress_type: str) -> None:
        self._progress_type = check_progress_type(progress_type)

    @property
    def progress_type(self) -> str:
        """The progress type this scheduler follows."""
        return self._progress_type

    def progress(self) -> float:
        """The current progress of :attr:`progress_type`."""
        return get_progress(self._progress_type)

    def __call__(self) -> float:
        """The value for the current progress."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def final_value(self) -> float:
        """The (limit of the) value at the end of training."""
        raise NotImplementedError(f"{type(self).__name__} must implement final_value")

    def max_value(self) -> float:
        """The largest value the schedule can produce (may be inf)."""
        raise NotImplementedError(f"{type(self).__name__} does not know its max_value")

    def _describe(self, *args: Any, **kwargs: Any) -> str:
        """ALF's constructor-like ``repr``."""
        parts = [repr(self._progress_type), *map(repr, args)]
        parts += [f"{k}={v!r}" for k, v in kwargs.items()]
        return f"{type(self).__name__}({', '.join(parts)})"


class ConstantScheduler:
    """Always ``value`` (follows no progress, as in ALF: not a :class:`Scheduler`)."""

    def __init__(self, value: numbers.Real) -> None:
        self._value = check_real("value", value, finite=False)

    def __call__(self) -> float:
        return self._value

    final_value = max_value = __call__

    def __repr__(self) -> str:
        return str(self._value)


class StepScheduler(Scheduler):
    """A piecewise-constant value: ``v0`` while ``progress < p0``, ``v_i`` while
    ``p_{i-1} <= progress < p_i``, the last value after (``pn`` itself unused, as in ALF).

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.
        schedule: ``(progress, value)`` pairs sorted by progress.
        warm_up_period: if > 0, the value rises linearly from 0 to ``v0`` over
            ``[start, start + warm_up_period)``, which must end before ``p0``.
        start: the value is 0 before it.
    """

    def __init__(
        self,
        progress_type: str,
        schedule: Schedule,
        warm_up_period: numbers.Real = 0,
        start: numbers.Real = 0,
    ) -> None:
        super().__init__(progress_type)
        self._progresses, self._values = _check_schedule(schedule, finite_values=False)
        self._warm_up_period = check_real("warm_up_period", warm_up_period, minimum=0)
        self._start = check_real("start", start, minimum=0)
        if not self._start + self._warm_up_period < self._progresses[0]:
            raise ValueError(
                f"start + warm_up_period ({self._start + self._warm_up_period}) must be "
                f"smaller than the first progress of schedule ({self._progresses[0]})"
            )

    def __call__(self) -> float:
        progress = self.progress()
        if progress < self._start:
            return 0.0
        if progress < self._start + self._warm_up_period:
            return self._values[0] * (progress - self._start) / self._warm_up_period
        index = bisect.bisect_right(self._progresses, progress)
        return self._values[min(index, len(self._progresses) - 1)]

    def final_value(self) -> float:
        return self._values[-1]

    def max_value(self) -> float:
        ramp = (0.0,) if self._start > 0 or self._warm_up_period > 0 else ()
        return max(self._values + ramp)

    def __repr__(self) -> str:
        return self._describe(
            list(zip(self._progresses, self._values)),
            warm_up_period=self._warm_up_period,
            start=self._start,
        )


class LinearScheduler(Scheduler):
    """A value interpolated linearly between ``(progress, value)`` knots, the last value
    after the last knot; two knots at one progress make a jump.

    Args:
        progress_type: one of :data:`PROGRESS_TYPES`.
        schedule: at least two finite pairs sorted by progress, the first at progress 0.

    Examples:
        >>> target = LinearScheduler("iterations", [(0, 1.0), (100, 0.2)])
        >>> update_progress("iterations", 50)  # the trainer does this
        >>> target()
        0.6
        >>> reset_progress()
    """

    def __init__(self, progress_type: str, schedule: Schedule) -> None:
        super().__init__(progress_type)
        progresses, values = _check_schedule(schedule)
        if len(progresses) < 2:
            raise ValueError(
                f"schedule must have at least two (progress, value) pairs, got {len(progresses)}"
            )
        if progresses[0] != 0:
            raise ValueError(f"the first progress of schedule must be 0, got {progresses[0]}")
        self._progresses, self._values = progresses, values

    def __call__(self) -> float:
        progress = self.progress()
        progresses, values = self._progresses, self._values
        if progress <= 0:
            return values[0]
        index = bisect.bisect_right(progresses, progress)
        if index >= len(progresses):
            return values[-1]
        lo, hi = progresses[index - 1], progresses[index]
        w = (progress - lo) / (hi - lo)
        return (1 - w) * values[index - 1] + w * values[index]

    def final_value(self) -> float:
        return self._values[-1]

    def max_value(self) -> float:
        return max(self._values)

    def __repr__(self) -> str:
        return self._describe(list(zip(self._progresses, self._values)))


class ExponentialScheduler(Scheduler):
    """``initial_value * decay_rate ** (progress / decay_time)`` (rate and time > 0)."""

    def __init__(
        self,
        progress_type: str,
        initial_value: numbers.Real,
        decay_rate: numbers.Real,
        decay_time: numbers.Real,
    ) -> None:
        super().__init__(progress_type)
        self._initial_value = check_real("initial_value", initial_value)
        self._decay_rate = check_real("decay_rate", decay_rate, positive=True)
        self._decay_time = check_real("decay_time", decay_time, positive=True)

    def __call__(self) -> float:
        return self._initial_value * self._decay_rate ** (self.progress() / self._decay_time)

    def final_value(self) -> float:
        """The exact limit (ALF says 0): 0 for a rate < 1, ``initial_value`` for 1, else
        +/- infinity."""
        if self._decay_rate < 1 or self._initial_value == 0:
            return 0.0
        if self._decay_rate == 1:
            return self._initial_value
        return math.copysign(math.inf, self._initial_value)

    def max_value(self) -> float:
        return max(self._initial_value, self.final_value())

    def __repr__(self) -> str:
        return self._describe(
            initial_value=self._initial_value,
            decay_rate=self._decay_rate,
            decay_time=self._decay_time,
        )


class CyclicalScheduler(Scheduler):
    """A value cycling between ``base_lr`` and ``bound_lr`` (ALF's signature; any
    hyper-parameter), a cycle lasting ``2 * half_cycle_size`` of progress.

    Smith, "Cyclical Learning Rates for Training Neural Networks", 2017.
    ``switch_mode="step"``: ``base_lr`` for the first half of each cycle,
    ``bound_lr`` for the second; ``"linear"``: a triangle wave between them.
    """

    def __init__(
        self,
        progress_type: str,
        base_lr: numbers.Real,
        bound_lr: numbers.Real,
        half_cycle_size: numbers.Real,
        switch_mode: str = "step",
    ) -> None:
        super().__init__(progress_type)
        self._base_lr = check_real("base_lr", base_lr)
        self._bound_lr = check_real("bound_lr", bound_lr)
        self._half_cycle_size = check_real("half_cycle_size", half_cycle_size, positive=True)
        self._switch_mode = check_choice("switch_mode", switch_mode, ("step", "linear"))
        # As in ALF: with "percent" progress the position in a (half) cycle is rounded,
        # so that e.g. 0.3 % 0.1 lands on a phase boundary.
        self._round: Callable[[float], float] = (
            partial(round, ndigits=10) if progress_type == "percent" else (lambda x: x)
        )

    def __call__(self) -> float:
        progress, half = self.progress(), self._half_cycle_size
        in_half = self._round(progress % half / half) % 1
        first_half = self._round(progress % (2 * half) / (2 * half)) % 1 < 0.5
        if self._switch_mode == "step":
            return self._base_lr if first_half else self._bound_lr
        if first_half:
            return (1 - in_half) * self._base_lr + in_half * self._bound_lr
        return in_half * self._base_lr + (1 - in_half) * self._bound_lr

    def final_value(self) -> float:
        raise RuntimeError("CyclicalScheduler is cyclical and has no final value.")

    def max_value(self) -> float:
        return max(self._base_lr, self._bound_lr)

    def __repr__(self) -> str:
        return self._describe(
            base_lr=self._base_lr,
            bound_lr=self._bound_lr,
            half_cycle_size=self._half_cycle_size,
            switch_mode=self._switch_mode,
        )


def as_scheduler(
    value_or_scheduler: Union[numbers.Real, Callable[[], float]],
) -> Callable[[], float]:
    """A number as a :class:`ConstantScheduler`; a callable unchanged; else ``TypeError``."""
    if callable(value_or_scheduler):
        return value_or_scheduler
    if is_real(value_or_scheduler):
        return ConstantScheduler(value_or_scheduler)
    raise TypeError(
        f"value_or_scheduler must be a real number or a zero-argument callable, "
        f"got {type(value_or_scheduler).__name__}"
    )

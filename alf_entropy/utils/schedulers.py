"""Schedulers: hyper-parameters that change with training progress (ALF's API).

A port of ALF's ``alf/utils/schedulers.py``.  A *scheduler* is a zero-argument
callable returning the current value of a hyper-parameter (a Python float)
from the training progress, so any argument documented as "float or
scheduler" can be annealed from a gin file::

    PPOLoss.entropy_regularization = @LinearScheduler()
    LinearScheduler.progress_type = "percent"
    LinearScheduler.schedule = [(0, 1.0), (0.5, 0.1), (1.0, 0.01)]

Training progress is process-global state owned by
:mod:`alf_entropy.utils.progress` (re-exported here): the trainer updates it
(:func:`update_progress`) and checkpoints it (:func:`get_all_progress`,
:func:`set_all_progress`).  Progress types:

* ``"iterations"``: number of training iterations done.
* ``"env_steps"``: number of environment steps taken.
* ``"percent"``: fraction of training completed, in ``[0, 1]``.
* ``"global_counter"``: the summaries' default step
  (:func:`alf_entropy.utils.progress.get_global_counter`).

Everything here is host-side Python arithmetic: evaluating a scheduler never
touches a tensor, so it costs no device synchronisation.

Differences from ALF (bug fixes, same values for monotonic progress):
``StepScheduler``/``LinearScheduler`` look the progress up by bisection
instead of caching an index, so they stay correct when progress goes back
(after a checkpoint restore or :func:`reset_progress`); bad arguments raise
``ValueError`` instead of failing asserts.
"""
import bisect
import math
import numbers
from functools import partial
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import gin

from alf_entropy.utils.checks import check_int, check_real, is_real
from alf_entropy.utils.gin_errors import PlainGinErrors
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

def _check_schedule(
    schedule: Any, arg_name: str = "schedule", finite_values: bool = True
) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Validate a ``[(progress, value), ...]`` list sorted by progress."""
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence):
        raise ValueError(
            f"{arg_name} must be a list of (progress, value) pairs, got {schedule!r}"
        )
    if len(schedule) == 0:
        raise ValueError(f"{arg_name} must not be empty")
    progresses: List[float] = []
    values: List[float] = []
    for i, pair in enumerate(schedule):
        if (
            isinstance(pair, (str, bytes))
            or not isinstance(pair, Sequence)
            or len(pair) != 2
        ):
            raise ValueError(
                f"{arg_name}[{i}] must be a (progress, value) pair, got {pair!r}"
            )
        progresses.append(check_real(f"{arg_name}[{i}] progress", pair[0]))
        values.append(check_real(f"{arg_name}[{i}] value", pair[1], finite=finite_values))
    for i in range(1, len(progresses)):
        if progresses[i] < progresses[i - 1]:
            raise ValueError(
                f"{arg_name} progresses must be sorted in increasing order, got "
                f"{progresses[i - 1]} before {progresses[i]} at index {i}"
            )
    return tuple(progresses), tuple(values)


class Scheduler(metaclass=PlainGinErrors):
    """Base class of the progress-driven schedulers.

    Constructed from Python, their argument errors are plain Python errors
    (no gin "In call to configurable" lines: ``alf_entropy.utils.gin_errors``).

    Subclasses implement ``__call__`` using :meth:`progress`, the current
    progress of type ``progress_type``.
    """

    def __init__(self, progress_type: str) -> None:
        """Create the scheduler.

        Args:
            progress_type: one of :data:`PROGRESS_TYPES` (``"iterations"``,
                ``"env_steps"``, ``"percent"``, ``"global_counter"``).

        Raises:
            ValueError: if ``progress_type`` is unknown.
        """
        self._progress_type = check_progress_type(progress_type)

    @property
    def progress_type(self) -> str:
        """str: the progress type this scheduler follows."""
        return self._progress_type

    def progress(self) -> float:
        """Return the current progress of type :attr:`progress_type`.

        Returns:
            float: the progress.
        """
        return get_progress(self._progress_type)

    def __call__(self) -> float:
        """Return the scheduled value (implemented by subclasses).

        Returns:
            float: the value for the current progress.

        Raises:
            NotImplementedError: always, in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def final_value(self) -> float:
        """Return the (limit of the) value at the end of training.

        Returns:
            float: the final value.

        Raises:
            NotImplementedError: always, in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement final_value")

    def max_value(self) -> float:
        """Return the largest value the schedule can produce (may be inf).

        Returns:
            float: the supremum of the values over all progress.

        Raises:
            NotImplementedError: in the base class (unknown).
        """
        raise NotImplementedError(f"{type(self).__name__} does not know its max_value")


@gin.configurable
class ConstantScheduler(metaclass=PlainGinErrors):
    """A scheduler that always returns the same value.

    As in ALF it does not follow any progress, so it is not a
    :class:`Scheduler` subclass.
    """

    def __init__(self, value: numbers.Real) -> None:
        """Create the scheduler.

        Args:
            value: the constant, a real number.

        Raises:
            TypeError: if ``value`` is not a real number.
        """
        self._value = check_real("value", value, finite=False)

    def __call__(self) -> float:
        """Return the constant.

        Returns:
            float: ``value``.
        """
        return self._value

    def final_value(self) -> float:
        """Return the constant.

        Returns:
            float: ``value``.
        """
        return self._value

    def max_value(self) -> float:
        """Return the constant.

        Returns:
            float: ``value``.
        """
        return self._value

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return str(self._value)


@gin.configurable
class SettledAnnealing(metaclass=PlainGinErrors):
    """A target that steps down once the entropy has settled on it (TES-SAC).

    Xu et al. 2021 ("Target Entropy Annealing for Discrete Soft Actor-Critic"):
    when the entropy has stayed within ``tolerance`` (relative) of the target
    for ``window`` consecutive controller updates, the target is lowered by
    ``(1 - factor) * |target|`` (never below ``final``), and the count starts
    over.  Updates in which the controller's windup watch finds the entropy
    stalled short of the target (alpha at its ceiling) count as well: a target
    out of reach steps down too.  This object only describes the rule: a controller given it as
    ``target_entropy`` runs the rule on its device (no host reads) and saves the
    target it is at in its ``state_dict``; its ``target_entropy`` reports it.

    Args:
        initial: the starting target.
        factor: how much of the target is kept at each step, in ``(0, 1)``.
        tolerance: the relative band around the target that counts as
            settled, in ``(0, 1)``.
        window: consecutive settled updates before a step (>= 1).
        final: the lowest target; None: ``-inf`` (no floor).

    Raises:
        TypeError, ValueError: for arguments of the wrong type or range.
    """

    def __init__(self, initial: numbers.Real, factor: float = 0.9, tolerance: float = 0.05,
                 window: int = 1000, final: Optional[numbers.Real] = None) -> None:
        self.initial = check_real("initial", initial)
        self.factor = check_real("factor", factor, above=0, below=1)
        self.tolerance = check_real("tolerance", tolerance, above=0, below=1)
        self.window = check_int("window", window, minimum=1)
        self.final = -math.inf if final is None else check_real("final", final)
        if self.final > self.initial:
            raise ValueError(f"final ({final}) must be <= initial ({initial})")

    def max_value(self) -> float:
        """The largest target it can be: ``initial``."""
        return self.initial

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return (f"SettledAnnealing(initial={self.initial}, factor={self.factor}, "
                f"tolerance={self.tolerance}, window={self.window}, final={self.final})")


@gin.configurable
class StepScheduler(Scheduler):
    """A piecewise-constant value: one value for each region of progress.

    With ``schedule=[(p0, v0), (p1, v1), ..., (pn, vn)]`` the value is ``v0``
    while ``progress < p0``, ``v_i`` while ``p_{i-1} <= progress < p_i``, and
    ``vn`` once ``progress >= p_{n-1}`` (so ``pn`` itself is never used, as in
    ALF).  An optional warm-up ramps linearly from 0 to ``v0``.
    """

    def __init__(
        self,
        progress_type: str,
        schedule: Sequence[Tuple[numbers.Real, numbers.Real]],
        warm_up_period: numbers.Real = 0,
        start: numbers.Real = 0,
    ) -> None:
        """Create the scheduler.

        Args:
            progress_type: one of :data:`PROGRESS_TYPES`.
            schedule: ``(progress, value)`` pairs sorted by progress; the
                value used is that of the smallest ``progress`` greater than
                the current progress (the last value once past all but the
                last point).
            warm_up_period: if > 0, the value rises linearly from 0 to the
                first value over ``[start, start + warm_up_period)``.
            start: progress where the warm-up begins; the value is 0 before
                ``start``.  ``start + warm_up_period`` must be smaller than the
                first progress of ``schedule``.

        Raises:
            TypeError: if a progress, value, ``warm_up_period`` or ``start``
                is not a real number.
            ValueError: if ``progress_type`` is unknown, ``schedule`` is not a
                non-empty sorted list of pairs, ``warm_up_period`` or
                ``start`` is negative, or
                ``start + warm_up_period >= schedule[0][0]``.
        """
        super().__init__(progress_type)
        self._progresses, self._values = _check_schedule(schedule, finite_values=False)
        self._warm_up_period = check_real("warm_up_period", warm_up_period, minimum=0)
        self._start = check_real("start", start, minimum=0)
        if not self._start + self._warm_up_period < self._progresses[0]:
            raise ValueError(
                f"start + warm_up_period ({self._start + self._warm_up_period}) must "
                f"be smaller than the first progress of schedule "
                f"({self._progresses[0]})"
            )

    def __call__(self) -> float:
        """Return the value for the current progress.

        Returns:
            float: the scheduled value.
        """
        progress = self.progress()
        if progress < self._start:
            return 0.0
        if progress < self._start + self._warm_up_period:
            return self._values[0] * (progress - self._start) / self._warm_up_period
        index = bisect.bisect_right(self._progresses, progress)
        index = min(index, len(self._progresses) - 1)
        return self._values[index]

    def final_value(self) -> float:
        """Return the last value of the schedule.

        Returns:
            float: ``schedule[-1][1]``.
        """
        return self._values[-1]

    def max_value(self) -> float:
        """Return the largest value (0 counts when there is a warm-up or a start).

        Returns:
            float: the largest value.
        """
        ramp = (0.0,) if self._start > 0 or self._warm_up_period > 0 else ()
        return max(self._values + ramp)

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return "StepScheduler('%s', %s, warm_up_period=%s, start=%s)" % (
            self._progress_type,
            list(zip(self._progresses, self._values)),
            self._warm_up_period,
            self._start,
        )


@gin.configurable
class LinearScheduler(Scheduler):
    """A piecewise-linear value interpolated between ``(progress, value)`` knots.

    Between ``p_{i-1}`` and ``p_i`` the value moves linearly from ``v_{i-1}``
    to ``v_i``; after the last knot it stays at the last value.  Two knots at
    the same progress make a jump.

    Examples:
        >>> target = LinearScheduler("iterations", [(0, 1.0), (100, 0.2)])
        >>> update_progress("iterations", 50)  # the trainer does this
        >>> target()
        0.6
        >>> reset_progress()
    """

    def __init__(
        self, progress_type: str, schedule: Sequence[Tuple[numbers.Real, numbers.Real]]
    ) -> None:
        """Create the scheduler.

        Args:
            progress_type: one of :data:`PROGRESS_TYPES`.
            schedule: at least two ``(progress, value)`` pairs sorted by
                progress, the first at progress 0.

        Raises:
            ValueError: if ``progress_type`` is unknown, or ``schedule`` has
                fewer than two pairs, is unsorted, does not start at progress
                0 or holds non-numeric/non-finite entries.
        """
        super().__init__(progress_type)
        progresses, values = _check_schedule(schedule)
        if len(progresses) < 2:
            raise ValueError(
                f"schedule must have at least two (progress, value) pairs, got "
                f"{len(progresses)}"
            )
        if progresses[0] != 0:
            raise ValueError(
                f"the first progress of schedule must be 0, got {progresses[0]}"
            )
        self._progresses, self._values = progresses, values

    def __call__(self) -> float:
        """Return the interpolated value for the current progress.

        Returns:
            float: the scheduled value.
        """
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
        """Return the last value of the schedule.

        Returns:
            float: ``schedule[-1][1]``.
        """
        return self._values[-1]

    def max_value(self) -> float:
        """Return the largest knot value.

        Returns:
            float: the largest value.
        """
        return max(self._values)

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return "LinearScheduler('%s', %s)" % (
            self._progress_type,
            list(zip(self._progresses, self._values)),
        )


@gin.configurable
class ExponentialScheduler(Scheduler):
    """Value ``initial_value * decay_rate ** (progress / decay_time)``."""

    def __init__(
        self,
        progress_type: str,
        initial_value: numbers.Real,
        decay_rate: numbers.Real,
        decay_time: numbers.Real,
    ) -> None:
        """Create the scheduler.

        Args:
            progress_type: one of :data:`PROGRESS_TYPES`.
            initial_value: value at progress 0.
            decay_rate: factor applied every ``decay_time`` of progress; > 0.
            decay_time: progress over which the value is multiplied by
                ``decay_rate``; > 0.

        Raises:
            TypeError: if an argument is not a real number.
            ValueError: if ``progress_type`` is unknown, an argument is not
                finite, or ``decay_rate``/``decay_time`` is not > 0.
        """
        super().__init__(progress_type)
        self._initial_value = check_real("initial_value", initial_value)
        self._decay_rate = check_real("decay_rate", decay_rate, positive=True)
        self._decay_time = check_real("decay_time", decay_time, positive=True)

    def __call__(self) -> float:
        """Return the decayed value for the current progress.

        Returns:
            float: the scheduled value.
        """
        exponent = self.progress() / self._decay_time
        return self._initial_value * self._decay_rate**exponent

    def final_value(self) -> float:
        """Return the limit of the value as progress grows.

        ALF returns 0 (assuming decay); here the limit is exact: 0 if
        ``decay_rate < 1``, ``initial_value`` if it is 1, else +/- infinity
        (or 0 for a zero ``initial_value``).

        Returns:
            float: the limit.
        """
        if self._decay_rate < 1 or self._initial_value == 0:
            return 0.0
        if self._decay_rate == 1:
            return self._initial_value
        return math.copysign(math.inf, self._initial_value)

    def max_value(self) -> float:
        """Return the supremum over progress >= 0.

        Returns:
            float: ``initial_value`` or the limit, whichever is larger.
        """
        return max(self._initial_value, self.final_value())

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return (
            "ExponentialScheduler('%s', initial_value=%s, decay_rate=%s, decay_time=%s)"
            % (
                self._progress_type,
                self._initial_value,
                self._decay_rate,
                self._decay_time,
            )
        )


@gin.configurable
class CyclicalScheduler(Scheduler):
    """A value switching cyclically between two bounds (ALF's signature).

    Reference: Leslie N. Smith, "Cyclical Learning Rates for Training Neural
    Networks", 2017.  As in ALF, the value starts at ``base_lr`` and reaches
    ``bound_lr`` (which may be larger or smaller) every ``half_cycle_size`` of
    progress, so one cycle lasts ``2 * half_cycle_size``:

    * ``switch_mode="step"``: ``base_lr`` for the first half of each cycle,
      ``bound_lr`` for the second half (e.g. a TD3-style "update the actor
      every other iteration" with ``half_cycle_size=1``);
    * ``switch_mode="linear"``: a triangle wave, linear from ``base_lr`` to
      ``bound_lr`` during the first half and back during the second.

    Despite the ALF names the scheduler can drive any hyper-parameter.
    """

    _SWITCH_MODES = ("step", "linear")

    def __init__(
        self,
        progress_type: str,
        base_lr: numbers.Real,
        bound_lr: numbers.Real,
        half_cycle_size: numbers.Real,
        switch_mode: str = "step",
    ) -> None:
        """Create the scheduler.

        Args:
            progress_type: one of :data:`PROGRESS_TYPES`.
            base_lr: the value at the start of each cycle.
            bound_lr: the value at the other bound, reached after half a cycle.
            half_cycle_size: length of half a cycle in units of the progress
                (iterations, env steps, fraction, ...); > 0.
            switch_mode: ``"step"`` or ``"linear"`` (see the class docstring).

        Raises:
            TypeError: if a bound or ``half_cycle_size`` is not a real number.
            ValueError: if ``progress_type``/``switch_mode`` is unknown, a
                bound is not finite, or ``half_cycle_size`` is not > 0.
        """
        super().__init__(progress_type)
        self._base_lr = check_real("base_lr", base_lr)
        self._bound_lr = check_real("bound_lr", bound_lr)
        self._half_cycle_size = check_real("half_cycle_size", half_cycle_size, positive=True)
        if switch_mode not in self._SWITCH_MODES:
            raise ValueError(
                f"switch_mode must be one of {list(self._SWITCH_MODES)}, got "
                f"{switch_mode!r}"
            )
        self._switch_mode = switch_mode
        self._cycle_size = 2 * self._half_cycle_size
        # As in ALF: with "percent" progress the position within a (half)
        # cycle is rounded so that e.g. 0.3 % 0.1 lands on a phase boundary.
        self._round: Callable[[float], float] = (
            partial(round, ndigits=10) if progress_type == "percent" else (lambda x: x)
        )

    def __call__(self) -> float:
        """Return the value for the current progress.

        Returns:
            float: the scheduled value.
        """
        progress = self.progress()
        half, cycle = self._half_cycle_size, self._cycle_size
        in_half = self._round(progress % half / half) % 1
        in_cycle = self._round(progress % cycle / cycle) % 1
        first_half = in_cycle < 0.5
        if self._switch_mode == "step":
            return self._base_lr if first_half else self._bound_lr
        if first_half:
            return (1 - in_half) * self._base_lr + in_half * self._bound_lr
        return in_half * self._base_lr + (1 - in_half) * self._bound_lr

    def final_value(self) -> float:
        """A cyclical schedule has no final value.

        Returns:
            float: never returns.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("CyclicalScheduler is cyclical and has no final value.")

    def max_value(self) -> float:
        """Return the larger bound.

        Returns:
            float: ``max(base_lr, bound_lr)``.
        """
        return max(self._base_lr, self._bound_lr)

    def __repr__(self) -> str:
        """Return an ALF-style, constructor-like description."""
        return (
            "CyclicalScheduler('%s', base_lr=%s, bound_lr=%s, half_cycle_size=%s, "
            "switch_mode='%s')"
            % (
                self._progress_type,
                self._base_lr,
                self._bound_lr,
                self._half_cycle_size,
                self._switch_mode,
            )
        )


def as_scheduler(
    value_or_scheduler: Union[numbers.Real, Callable[[], float]]
) -> Callable[[], float]:
    """Turn a number into a :class:`ConstantScheduler`; pass callables through.

    Args:
        value_or_scheduler: a real number or a zero-argument callable (any
            scheduler).

    Returns:
        Callable[[], float]: a scheduler.

    Raises:
        TypeError: if the argument is neither a callable nor a real number.
    """
    if callable(value_or_scheduler):
        return value_or_scheduler
    if is_real(value_or_scheduler):
        return ConstantScheduler(value_or_scheduler)
    raise TypeError(
        f"value_or_scheduler must be a real number or a zero-argument callable, "
        f"got {type(value_or_scheduler).__name__}"
    )

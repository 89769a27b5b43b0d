"""The target entropy, per member of a batch: the only place it is evaluated.

A target is a number, a ``Scheduler`` or any zero-argument callable (evaluated on the host at
every update), a ``SettledAnnealing`` (run by the controller on its device), or for a batch a
list of these.  No value above the largest entropy the spec allows is used: a constant or a
schedule whose ``max_value()`` is above it is rejected, any other callable clamped (one
warning); a schedule whose progress is never fed warns once after ``PROGRESS_GRACE`` updates.
"""
import math
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import logging

from alf_entropy.utils import nest, schedulers
from alf_entropy.utils.checks import check_real, is_real
from alf_entropy.utils.entropies import (
    GreedyProbabilityTarget,
    calc_default_target_entropy,
    calc_max_possible_entropy,
)

__all__ = ["Target", "PROGRESS_GRACE"]

PROGRESS_GRACE = 10
"""Updates after which a scheduled target whose progress was never fed warns."""


class Target:
    """A controller's target (module docstring).

    Raises:
        TypeError: if a target is neither a number nor callable.
        ValueError: if one is not finite, can exceed the reachable entropy, or a list does not
            have one entry per member.
    """

    def __init__(self, target_entropy: Any, action_spec: Any, batch_shape: Tuple[int, ...],
                 name: str):
        specs = nest.flatten(action_spec)
        self.reachable = float(sum(calc_max_possible_entropy(s) for s in specs))
        self._spec, self._name, self._updates, self._warned = action_spec, name, 0, set()
        self._batch = batch_shape
        self.set(target_entropy)

    def set(self, target_entropy: Any) -> None:
        """Take a new target (see the class); the same checks as at construction."""
        members = math.prod(self._batch)
        if isinstance(target_entropy, (list, tuple)) and self._batch:
            if len(target_entropy) != members:
                raise ValueError(f"{self._name}: target_entropy has {len(target_entropy)} "
                                 f"entries for a batch of {members} controllers")
            fns = [self._one(t) for t in target_entropy]
        else:
            fns = [self._one(target_entropy)] * members
        anneal = [f for f in fns if isinstance(f, schedulers.SettledAnnealing)]
        if anneal and (len(anneal) < len(fns) or any(a is not anneal[0] for a in anneal)):
            raise ValueError(f"{self._name}: a SettledAnnealing target must be shared by every "
                             "member of the batch")
        self.annealing: Optional[schedulers.SettledAnnealing] = anneal[0] if anneal else None
        self._fns: List[Callable[[], float]] = fns
        self.constant = all(isinstance(f, schedulers.ConstantScheduler) for f in fns) or bool(
            anneal)
        self.shared = all(f is fns[0] for f in fns)
        self.initial = self.values()

    def _one(self, target: Any) -> Any:
        if target is None:
            target = float(sum(calc_default_target_entropy(s) for s in nest.flatten(self._spec)))
            logging.info("%s: target_entropy=%s (the action spec's default)", self._name, target)
        if isinstance(target, schedulers.SettledAnnealing):
            known_max = target.max_value()
        elif callable(target):
            try:
                known_max = target.max_value()
            except (AttributeError, NotImplementedError):
                known_max = None
        elif is_real(target):
            if isinstance(target, GreedyProbabilityTarget):
                self._check_greedy(target)
            target = schedulers.ConstantScheduler(check_real("target_entropy", target))
            known_max = target.max_value()
        else:
            raise TypeError(f"target_entropy must be a number or a zero-argument callable"
                            f"{' (or a list of these)' if self._batch else ''}, got {target!r}")
        if known_max is not None and known_max > self.reachable:
            raise ValueError(
                f"{self._name}: target_entropy reaches {known_max:.4g}, above the largest entropy "
                f"the action spec allows ({self.reachable:.4g}{_example(self._spec)}); the "
                "controller would push alpha up forever")
        return target

    def _check_greedy(self, target: GreedyProbabilityTarget) -> None:
        leaves = nest.flatten(self._spec)
        if any(not leaf.is_discrete for leaf in leaves):
            raise ValueError(f"{self._name}: target_entropy is a greedy_probability_target (for "
                             f"{target.num_actions} discrete actions), but the action spec has "
                             "continuous actions; state a target in nats")
        counts = {int(leaf.maximum.max() - leaf.minimum.min()) + 1 for leaf in leaves}
        if len(leaves) == 1 and not leaves[0].shape and counts != {target.num_actions}:
            raise ValueError(f"{self._name}: target_entropy is a greedy_probability_target for "
                             f"{target.num_actions} actions, but the action spec has "
                             f"{counts.pop()}")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{self._name}: {message}", stacklevel=5)

    def _value(self, fn: Any, counting: bool) -> float:
        if isinstance(fn, schedulers.SettledAnnealing):
            return fn.initial
        value = fn()
        if not is_real(value) or not math.isfinite(value):
            raise ValueError(
                f"target_entropy must be a number or a zero-argument callable returning a finite "
                f"number; {fn!r} returned {type(value).__name__}: {value!r}")
        if value > self.reachable:
            self._warn_once("clamp", f"target_entropy {value:.4g} is above the largest entropy the "
                            f"action spec allows ({self.reachable:.4g}); clamped to it")
            value = self.reachable
        progress_type = getattr(fn, "progress_type", None)
        if counting and progress_type is not None and not schedulers.progress_was_fed(
                progress_type) and self._updates >= PROGRESS_GRACE:
            self._warn_once("progress", f"the target's progress {progress_type!r} was never fed in "
                            f"{self._updates} updates, so the target stays at its first value; "
                            "call alf_entropy.utils.schedulers.update_progress("
                            f"{progress_type!r}, value)")
        return float(value)

    def refresh(self, buffer: Any) -> None:
        """Write the target now into ``buffer`` (one controller update; constants stay)."""
        if not self.constant:
            values = self.values(counting=True)
            if self.shared:
                buffer.fill_(values[0])
            else:
                for k, v in enumerate(values):
                    buffer.view(-1)[k].fill_(v)

    def values(self, counting: bool = False) -> Sequence[float]:
        """The targets now, one per member; ``counting=True`` for a controller update."""
        if counting:
            self._updates += 1
        if self.shared:
            return [self._value(self._fns[0], counting)] * len(self._fns)
        return [self._value(f, counting) for f in self._fns]

    @property
    def fn(self) -> Any:
        """The (first member's) target as given: a scheduler, callable or ``SettledAnnealing``."""
        return self._fns[0]


def _example(spec: Any) -> str:
    leaves = nest.flatten(spec)
    if all(not s.is_continuous for s in leaves):
        return ", log N for N discrete actions"
    return ", from the bounds of the continuous actions"

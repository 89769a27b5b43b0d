"""The target entropy, per member of a batch: the only place it is evaluated (callables on
the host, before each update).  One known to exceed the spec's largest entropy is refused, any
other callable clamped to it (one warning)."""

import math

import torch
from absl import logging

from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import dist_utils, nest, schedulers
from alf_entropy.utils.checks import check_real, is_real

__all__ = ["Target", "PROGRESS_GRACE"]

PROGRESS_GRACE = 10
"""Updates after which a scheduled target whose progress was never fed warns."""


class Target:
    """A controller's target (module docstring): ``TypeError``/``ValueError`` for a bad one."""

    def __init__(self, target_entropy, action_spec, batch_shape, warn):
        leaves = nest.flatten(action_spec)
        if not leaves or not all(isinstance(s, TensorSpec) for s in leaves):
            raise TypeError(f"action_spec must be a non-empty nest of TensorSpec: {action_spec!r}")
        self.reachable = float(sum(map(dist_utils.calc_max_possible_entropy, leaves)))
        self.discrete = all(s.is_discrete for s in leaves)
        self._spec = action_spec
        self._batch = batch_shape
        self._warn = warn
        self.updates = 0
        self.set(target_entropy)

    def set(self, target_entropy, buffer=None):
        """Take a new target, checked as at construction (and write it into ``buffer``)."""
        members = math.prod(self._batch)
        if isinstance(target_entropy, (list, tuple)) and self._batch:
            if len(target_entropy) != members:
                raise ValueError(
                    f"target_entropy has {len(target_entropy)} "
                    f"entries for a batch of {members} controllers"
                )
            fns = [self._one(t) for t in target_entropy]
        else:
            fns = [self._one(target_entropy)] * members
        anneal = [f for f in fns if isinstance(f, schedulers.SettledAnnealing)]
        shared = all(f is fns[0] for f in fns)
        if anneal and not shared:
            raise ValueError(
                "a SettledAnnealing target must be shared by every member of the batch"
            )
        self.annealing = anneal[0] if anneal else None
        self._fns = fns
        self.shared = shared
        self.constant = all(isinstance(f, schedulers.ConstantScheduler) for f in fns)
        self.initial = self.values()
        if self.discrete and min(self.initial) < 0:
            raise ValueError(
                f"target_entropy {min(self.initial)} is below 0 for a discrete action space (a "
                "discrete entropy is never negative, so alpha would fall forever); negative "
                "targets such as -dim(A) are for continuous actions"
            )
        if buffer is not None:
            with torch.no_grad():
                buffer.copy_(torch.tensor(self.initial).reshape(buffer.shape))

    def now(self, buffer):
        """The target now: a float, or a tensor for a batch (an annealed one is ``buffer``)."""
        if self.annealing:
            return float(buffer) if buffer.dim() == 0 else buffer.clone()
        values = self.values()
        if buffer.dim() == 0:
            return values[0]
        return torch.tensor(values, device=buffer.device).reshape(buffer.shape)

    def _one(self, target):
        if target is None:
            target = float(
                sum(map(dist_utils.calc_default_target_entropy, nest.flatten(self._spec)))
            )
            logging.info("target_entropy=%s (the action spec's default)", target)
        if not (isinstance(target, schedulers.SettledAnnealing) or callable(target)):
            if not is_real(target):
                raise TypeError(
                    f"target_entropy must be a number or a zero-argument callable"
                    f"{' (or a list of these)' if self._batch else ''}, got {target!r}"
                )
            if isinstance(target, dist_utils.GreedyProbabilityTarget):
                target.check(self._spec, "target_entropy")
            target = schedulers.ConstantScheduler(check_real("target_entropy", target))
        try:
            known_max = target.max_value()
        except (AttributeError, NotImplementedError):
            known_max = None
        if known_max is not None and known_max > self.reachable:
            whence = (
                "log N for N discrete actions"
                if self.discrete
                else "from the bounds of the continuous actions"
            )
            raise ValueError(
                f"target_entropy reaches {known_max:.4g}, above the largest entropy "
                f"the action spec allows ({self.reachable:.4g}, {whence}); the "
                "controller would push alpha up forever"
            )
        return target

    def _value(self, fn, counting):
        if isinstance(fn, schedulers.SettledAnnealing):
            return fn.initial
        value = fn()
        if not is_real(value) or not math.isfinite(value):
            raise ValueError(
                f"target_entropy must be a number or a zero-argument callable returning a finite "
                f"number; {fn!r} returned {type(value).__name__}: {value!r}"
            )
        if value > self.reachable:
            self._warn(
                "clamp",
                f"target_entropy {value:.4g} is above the largest entropy the "
                f"action spec allows ({self.reachable:.4g}); clamped to it",
            )
            value = self.reachable
        progress_type = getattr(fn, "progress_type", None)
        if (
            counting
            and progress_type is not None
            and not schedulers.progress_was_fed(progress_type)
            and self.updates >= PROGRESS_GRACE
        ):
            self._warn(
                "progress",
                f"the target's progress {progress_type!r} was never fed in "
                f"{self.updates} updates, so the target stays at its first value; call "
                f"alf_entropy.utils.schedulers.update_progress({progress_type!r}, value)",
            )
        return float(value)

    def refresh(self, buffer):
        """Write the scheduled targets into ``buffer`` for the next update (constants stay):
        ``fill_`` from host floats, no copy that would wait for a GPU."""
        self.updates += 1
        if self.constant or self.annealing:
            return
        values = self.values(counting=True)
        with torch.no_grad():
            if self.shared:
                buffer.fill_(values[0])
            else:
                for k, value in enumerate(values):
                    buffer.view(-1)[k].fill_(value)

    def values(self, counting=False):
        """The targets now, one per member (``counting``: for an update)."""
        if self.shared:
            return [self._value(self._fns[0], counting)] * len(self._fns)
        return [self._value(f, counting) for f in self._fns]

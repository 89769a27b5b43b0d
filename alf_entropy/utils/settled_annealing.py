"""``SettledAnnealing``: a target entropy that steps down once the entropy has settled on it
(re-exported by :mod:`~alf_entropy.utils.schedulers`; it follows the controller's updates,
not the training progress)."""

import math
import numbers
from typing import Optional

from alf_entropy.utils.checks import check_int, check_real

__all__ = ["SettledAnnealing"]


class SettledAnnealing:
    """A target that steps down once the entropy has settled on it (TES-SAC).

    Xu et al. 2021, "Target Entropy Annealing for Discrete Soft Actor-Critic":
    after ``window`` consecutive controller updates with the entropy within
    ``tolerance`` (relative) of the target, or stalled short of it with alpha
    at its ceiling, the target drops by ``(1 - factor) * |target|`` (never below
    ``final``).  This object describes the rule; a controller given it as
    ``target_entropy`` runs it on its device and saves where it is.

    Args:
        initial: the starting target.
        factor: the part of the target kept at each step, in ``(0, 1)``.
        tolerance: the relative band that counts as settled, in ``(0, 1)``.
        window: consecutive settled updates before a step (>= 1).
        final: the lowest target (None: no floor).
    """

    def __init__(
        self,
        initial: numbers.Real,
        factor: float = 0.9,
        tolerance: float = 0.05,
        window: int = 1000,
        final: Optional[numbers.Real] = None,
    ) -> None:
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
        return (
            f"SettledAnnealing(initial={self.initial}, factor={self.factor}, "
            f"tolerance={self.tolerance}, window={self.window}, final={self.final})"
        )

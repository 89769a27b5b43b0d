"""ALF's staged controller (``EntropyTargetAlgorithm``), step for step."""

import math
from collections import namedtuple
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from alf_entropy.controllers.base import MIN_LOG_ALPHA, EntropyController, arguments
from alf_entropy.controllers.driver import state_type
from alf_entropy.controllers.ops import TensorOps, window_average, window_mean
from alf_entropy.utils.checks import check_int, check_real

__all__ = ["EntropyTargetAlgorithm", "describe_stage", "STUCK_UPDATES"]

STUCK_UPDATES = 1000
"""Still not adjusting after ``max(STUCK_UPDATES, 10 * average_window)`` updates: a warning."""
TARGET_MOVE = 0.05  # track_target_changes: a larger relative move restarts adjusting

# ref_target: the target when adjusting last (re)started; window: the last entropies
StagedState = state_type("StagedState", "stage update_rate max_entropy ref_target window seen")
StagedConsts = namedtuple(
    "StagedConsts",
    "very_slow_update_rate slow_update_rate fast_update_rate min_log_alpha retarget_rate track",
)


def staged_rule(x: Any, s: StagedState, entropy: Any, c: StagedConsts) -> StagedState:
    """ALF's ``adjust_alpha``, each ``if`` a select (one update may cascade through stages as
    in ALF); ALF's dtypes: float32 state, float64 ``log_alpha`` steps, floor and rates."""
    prev_avg, avg, window, seen = window_average(x, s.window, s.seen, entropy)
    log_alpha, stage, rate, max_entropy, target = (
        s.log_alpha,
        s.stage,
        s.update_rate,
        s.max_entropy,
        s.target,
    )
    decreasing = avg < prev_avg
    estimating = stage < -2
    max_entropy = x.where(estimating, x.minimum(0.8 * avg, avg / 0.8), max_entropy)
    stage = stage + estimating
    init = stage == -2  # down while the entropy rises, up by half while it falls
    step = x.where(decreasing, 0.5, -1.0) * c.very_slow_update_rate
    log_alpha = x.where(init, x.f32(x.maximum(x.f64(log_alpha + step), c.min_log_alpha)), log_alpha)
    stage = stage + (init & (avg < max_entropy))
    stage = stage + ((stage == -1) & (avg < target))  # free: wait for the target
    adjust = stage >= 0
    moved = (c.track > 0) & (x.abs(target - s.ref_target) > TARGET_MOVE * x.abs(s.ref_target))
    rate = x.where(adjust & moved, c.retarget_rate, rate)
    above = avg > target
    new_rate = x.where(above != (stage != 0), rate * 0.9, rate)  # a crossing
    new_rate = x.maximum(x.f64(new_rate), c.slow_update_rate)
    fast = entropy < x.where(target > 0, 0.5 * target, 2.0 * target)
    new_rate = x.where(fast, x.f64(c.fast_update_rate), new_rate)
    coef = x.where(above, x.where(decreasing, 0.5, -1.0), x.where(decreasing, 1.0, -0.5))
    new_log_alpha = x.f32(x.maximum(x.f64(log_alpha) + coef * new_rate, c.min_log_alpha))
    return s._replace(
        log_alpha=x.where(adjust, new_log_alpha, log_alpha),
        stage=x.where(adjust, x.i32(above), stage),
        update_rate=x.where(adjust, x.f32(new_rate), rate),
        max_entropy=max_entropy,
        ref_target=x.where(moved, target, s.ref_target),
        window=window,
        seen=seen,
    )


def describe_stage(stage: Any) -> str:
    """A staged controller's ``stage`` (an int or 0-d integer tensor) in words.

    Example:
        >>> describe_stage(-3)
        'stage -3: estimating max_entropy (1 more update), then init, free and adjust'
    """
    if isinstance(stage, torch.Tensor) and stage.numel() == 1 and not stage.is_floating_point():
        stage = int(stage)
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)):
        raise TypeError(f"stage must be an int or a 0-d integer tensor, got {stage!r}")
    stage = int(stage)
    left, side = -2 - stage, "above" if stage > 0 else "at or below"
    what = (
        f"estimating max_entropy ({left} more update{'s' if left > 1 else ''}), then init, "
        "free and adjust"
        if stage < -2
        else "init (alpha moves until the average entropy is below max_entropy)"
        if stage == -2
        else "free (alpha frozen until the entropy falls below the target)"
        if stage == -1
        else f"adjust (the average entropy is {side} the target)"
    )
    return f"stage {stage}: {what}"


def _alf_rate(rate):
    """ALF's ``torch.tensor(rate)``: float32 from a Python float, float64 from ``np.log(2)``."""
    return float(torch.tensor(rate).double())


class EntropyTargetAlgorithm(EntropyController):
    """ALF's staged controller: ``alpha`` keeps the entropy >= a target, in the stages that
    ``describe_stage`` names (docs/controllers.md).  Shared arguments: ``EntropyController``'s:

    Args:
        skip_free_stage: start in the adjust stage.
        max_entropy: upper bound of the entropy; None: ``min(0.8 H, H / 0.8)`` of the first
            ``average_window`` updates.
        very_slow_update_rate: the init stage's step (> 0).
        slow_update_rate: the smallest adjust step (> 0).
        fast_update_rate: the largest adjust step (> 0).
        average_window: updates the entropy is averaged over (>= 1).
        track_target_changes: not in ALF: a target moved by more than 5 % since adjusting
            last (re)started restarts it from ``retarget_update_rate`` (> 0).

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 3)  # 4 actions
        >>> controller = EntropyTargetAlgorithm(spec, target_entropy=0.5, skip_free_stage=True)
        >>> for h in (1.2, 1.0, 0.8, 0.6, 0.45, 0.4):  # a policy losing entropy
        ...     info = controller.entropy_loss(torch.full((16,), h))  # one update a batch
        >>> round(float(controller.alpha), 4), int(controller.stage)  # 0.1 at first
        (0.3732, 0)
    """

    State = StagedState
    rule = staticmethod(staged_rule)

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        skip_free_stage: bool = False,
        max_entropy: Optional[float] = None,
        target_entropy: Any = None,
        very_slow_update_rate: float = 0.001,
        slow_update_rate: float = 0.01,
        fast_update_rate: float = np.log(2),
        min_alpha: float = 1e-4,
        average_window: int = 2,
        update_mode: str = "auto",
        track_target_changes: bool = False,
        retarget_update_rate: float = 0.1,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "EntropyTargetAlgorithm",
    ):
        super().__init__(**arguments(locals(), "skip_free_stage", "max_entropy", "average_window"))
        window = check_int("average_window", average_window, minimum=1)
        stage = 1 if skip_free_stage else (-2 - window if max_entropy is None else -2)
        self.make_state(
            stage=np.int32(stage),
            update_rate=np.float32(fast_update_rate),
            max_entropy=float(max_entropy or 0.0),
            ref_target=0.0,
            window=torch.zeros(self.batch_shape + (window,)),
            seen=0,
        )
        self.driver.ref_target.copy_(self.driver.target)
        top = float(self.driver.target.max())  # both in float32
        if max_entropy is not None and top > np.float32(check_real("max_entropy", max_entropy)):
            raise ValueError(f"target_entropy ({top:.6g}) must be <= max_entropy ({max_entropy})")
        self._max_entropy_given = max_entropy is not None
        self._stuck_after = max(STUCK_UPDATES, 10 * window)
        self._stuck_checked = False

    def _constants(self, s, lo, hi):
        for arg in (
            "very_slow_update_rate",
            "slow_update_rate",
            "fast_update_rate",
            "retarget_update_rate",
        ):
            check_real(arg, s[arg], positive=True)
        if not isinstance(s["track_target_changes"], bool):
            raise TypeError(
                "track_target_changes must be a bool, got "
                f"{type(s['track_target_changes']).__name__}"
            )
        return StagedConsts(
            s["very_slow_update_rate"],
            _alf_rate(s["slow_update_rate"]),
            _alf_rate(s["fast_update_rate"]),
            math.log(s["min_alpha"]) if s["min_alpha"] > 0 else MIN_LOG_ALPHA,
            s["retarget_update_rate"],
            float(s["track_target_changes"]),
        )

    @property
    def stage(self) -> torch.Tensor:
        """The stage (``describe_stage``)."""
        return self.driver.stage

    @property
    def update_rate(self) -> torch.Tensor:
        """The adjust stage's step of ``log_alpha`` now."""
        return self.driver.update_rate

    @property
    def max_entropy(self) -> torch.Tensor:
        """The given or estimated upper bound of the entropy."""
        return self.driver.max_entropy

    @property
    def avg_entropy(self) -> torch.Tensor:
        """The average entropy the stages compare."""
        return window_mean(TensorOps, self.driver.window, self.driver.seen)

    def debug_values(self) -> Dict[str, torch.Tensor]:
        return dict(avg_entropy=self.avg_entropy, stage=self.stage, update_rate=self.update_rate)

    def check_progress(self) -> None:
        """Still before the adjust stage after ``_stuck_after`` updates: one warning."""
        if self._stuck_checked or self.updates < self._stuck_after:
            return
        self._stuck_checked = True
        stage = int(self.stage.min())
        if stage < 0:
            given = "given" if self._max_entropy_given else "estimated from the first entropies"
            self.warn(
                "stuck",
                (
                    f"is still in its {describe_stage(stage).split()[2]} stage after "
                    f"{self.updates} updates (the average entropy "
                    f"({float(self.avg_entropy.min()):.3f}), max_entropy "
                    f"{float(self.max_entropy.min()):.3f} ({given}), the target "
                    f"({float(self.driver.target.min()):.3f}), "
                    f"{int(self.num_nonfinite_entropy.max())} NaN/inf entropies). To make it "
                    "act: give max_entropy (a little above the target), set "
                    "skip_free_stage=True, or start from a smaller initial_alpha (alpha "
                    f"{float(self.alpha.min()):.3g})."
                ),
            )

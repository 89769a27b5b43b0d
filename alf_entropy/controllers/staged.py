"""ALF's staged controller (``EntropyTargetAlgorithm``), step for step.

Its rule, ``rules.staged_rule``, says what each stage does; the class says how to use it.
"""
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import gin
import numpy as np
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.rules import TensorOps, staged_rule, window_mean
from alf_entropy.controllers.state import StagedConsts, StagedState
from alf_entropy.utils import summary
from alf_entropy.utils.checks import check_int, check_real

__all__ = ["EntropyTargetAlgorithm", "describe_stage", "STUCK_UPDATES"]

STUCK_UPDATES = 1000
"""A staged controller still before its adjust stage after ``max(STUCK_UPDATES, 10 *
average_window)`` updates warns once."""


def describe_stage(stage: Any) -> str:
    """What a staged controller's ``stage`` means, in words (for printing).

    Args:
        stage: :attr:`EntropyTargetAlgorithm.stage` (a 0-d integer tensor, read
            on the host) or an int.

    Returns:
        str: e.g. ``"stage -1: free (alpha frozen until the entropy falls below the target)"``.

    Raises:
        TypeError: if ``stage`` is not an integer (or a 0-d integer tensor).

    Example:
        >>> describe_stage(-3)
        'stage -3: estimating max_entropy (1 more update), then init, free and adjust'
        >>> describe_stage(1)
        'stage 1: adjust (the average entropy is above the target)'
    """
    if isinstance(stage, torch.Tensor) and stage.numel() == 1 and not stage.is_floating_point():
        stage = int(stage)
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)):
        raise TypeError(f"stage must be an int or a 0-d integer tensor, got {stage!r}")
    stage = int(stage)
    if stage < -2:
        left = -2 - stage
        what = (f"estimating max_entropy ({left} more update{'s' if left > 1 else ''}), "
                "then init, free and adjust")
    elif stage == -2:
        what = "init (alpha moves until the average entropy is below max_entropy)"
    elif stage == -1:
        what = "free (alpha frozen until the entropy falls below the target)"
    else:
        side = "above" if stage > 0 else "at or below"
        what = f"adjust (the average entropy is {side} the target)"
    return f"stage {stage}: {what}"


def _alf_rate(rate: float) -> float:
    """What ALF's ``torch.tensor(rate)`` holds (float32 for a Python float, float64 for a
    NumPy float64 such as the default ``np.log(2)``)."""
    return float(torch.tensor(rate).to(torch.float64))


@gin.configurable
class EntropyTargetAlgorithm(EntropyController):
    """ALF's staged controller: ``alpha`` keeps the entropy >= a target.

    Stages: estimate ``max_entropy`` from the first ``average_window`` updates
    (``stage < -2``); init (``-2``): ``log_alpha`` creeps down while the average
    entropy rises and up by half while it falls, until it is below
    ``max_entropy``; free (``-1``): ``alpha`` fixed until the entropy falls below
    the target; adjust (``0`` below / ``1`` above): ``log_alpha`` moves by
    ``update_rate`` (shrunk by 0.9 at each crossing, reset to
    ``fast_update_rate`` when the entropy drops far below the target).  One
    update may cascade through several stages, as in ALF.

    To approximate SAC's learned temperature, use SAC's ``target_entropy``,
    ``skip_free_stage=True`` and ``slow_update_rate = fast_update_rate = 4 *``
    SAC's temperature learning rate.  A controller still in its init or free
    stage (or estimating) after ``max(STUCK_UPDATES, 10 * average_window)``
    updates says so once, with what to change; it looks on the host path or
    at a summary step only.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        initial_alpha: initial ``alpha`` (> 0, >= ``min_alpha``).
        skip_free_stage: start directly in the adjust stage.
        max_entropy: upper bound of the entropy; None estimates it from the
            first ``average_window`` updates as ``min(0.8 H, H / 0.8)``.
        target_entropy: a number, a ``Scheduler``, any zero-argument callable,
            a ``SettledAnnealing`` or None (the spec's default); per member for a batch.
        very_slow_update_rate: the ``log_alpha`` step of the init stage (> 0).
        slow_update_rate: the smallest adjust-stage step (> 0).
        fast_update_rate: the largest adjust-stage step (> 0).
        min_alpha: floor of ``alpha``; ``<= 0`` means ``exp(-100)``.
        average_window: how many updates the entropy is averaged over (>= 1).
        update_mode: ``"auto"``, ``"host"``, ``"tensor"`` or ``"compiled"``
            (``base.UPDATE_MODES``); all run ``staged_rule``.
        track_target_changes: not in ALF: whenever the target has moved by
            more than 5% since the adjust stage last (re)started, it restarts
            from ``retarget_update_rate``.  False keeps ALF's behaviour.
        retarget_update_rate: the rate the adjust stage restarts from (> 0).
        max_alpha: optional ceiling of ``alpha`` (> ``min_alpha``, >= ``initial_alpha``).
        batch_shape: ``()``, or ``(K,)`` for K independent controllers.
        debug_summaries: write ``alpha``, ``avg_entropy``, ``stage``,
            ``update_rate``, ``nonfinite_entropy`` and ``target_entropy``.
        name: the name (summary scope).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range, ``target_entropy >
            max_entropy``, or a target above the largest entropy the spec allows.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 3)  # 4 actions
        >>> controller = EntropyTargetAlgorithm(spec, target_entropy=0.5, skip_free_stage=True)
        >>> for h in (1.2, 1.0, 0.8, 0.6, 0.45, 0.4):  # a policy losing entropy
        ...     info = controller.entropy_loss(torch.full((16,), h))  # one update a batch
        >>> round(float(controller.alpha), 4), int(controller.stage)  # 0.1 at first
        (0.3732, 0)
        >>> info.loss.shape  # -alpha * entropy per element: add it to the policy loss
        torch.Size([16])
    """

    State = StagedState

    def __init__(self, action_spec: Any, initial_alpha: float = 0.1,
                 skip_free_stage: bool = False, max_entropy: Optional[float] = None,
                 target_entropy: Any = None, very_slow_update_rate: float = 0.001,
                 slow_update_rate: float = 0.01, fast_update_rate: float = np.log(2),
                 min_alpha: float = 1e-4, average_window: int = 2, update_mode: str = "auto",
                 track_target_changes: bool = False, retarget_update_rate: float = 0.1,
                 max_alpha: Optional[float] = None, batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "EntropyTargetAlgorithm"):
        super().__init__(action_spec, debug_summaries, name)
        self._init_driver(target_entropy, batch_shape, update_mode)
        check_real("initial_alpha", initial_alpha, positive=True)
        check_real("min_alpha", min_alpha)
        if min_alpha > 0 and initial_alpha < min_alpha:
            raise ValueError(f"initial_alpha ({initial_alpha}) must be >= min_alpha ({min_alpha})")
        if max_alpha is not None and check_real("max_alpha", max_alpha,
                                                positive=True) < initial_alpha:
            raise ValueError(f"max_alpha ({max_alpha}) must be >= initial_alpha ({initial_alpha})"
                             f" and > min_alpha ({min_alpha})")
        window = check_int("average_window", average_window, minimum=1)
        if max_entropy is not None:
            max_entropy = check_real("max_entropy", max_entropy)
            if max(self._target.initial) > max_entropy:
                raise ValueError(f"target_entropy ({max(self._target.initial)}) must be <= "
                                 f"max_entropy ({max_entropy})")
        stage = 1 if skip_free_stage else (-2 - window if max_entropy is None else -2)
        f32 = self._full
        self._init_rule(StagedState(
            log_alpha=f32(float(np.float32(np.log(initial_alpha)))),
            stage=f32(stage, torch.int32), update_rate=f32(float(np.float32(fast_update_rate))),
            max_entropy=f32(0.0 if max_entropy is None else max_entropy),
            ref_target=self._target_now.clone(), window=torch.zeros(self._batch + (window,)),
            seen=f32(0, torch.int64)), dict(
                very_slow_update_rate=very_slow_update_rate, slow_update_rate=slow_update_rate,
                fast_update_rate=fast_update_rate, min_alpha=min_alpha, max_alpha=max_alpha,
                track_target_changes=track_target_changes,
                retarget_update_rate=retarget_update_rate))
        self._max_entropy_given = max_entropy is not None
        self._stuck_after = max(STUCK_UPDATES, 10 * window)
        self._host_updates = 0

    def _constants(self, s: Dict[str, Any]) -> Tuple[StagedConsts, float, float]:
        for arg in ("very_slow_update_rate", "slow_update_rate", "fast_update_rate",
                    "retarget_update_rate"):
            check_real(arg, s[arg], positive=True)
        min_alpha, max_alpha = check_real("min_alpha", s["min_alpha"]), s["max_alpha"]
        if max_alpha is not None and (check_real("max_alpha", max_alpha, positive=True)
                                      <= min_alpha):
            raise ValueError(f"max_alpha ({max_alpha}) must be > min_alpha ({min_alpha})")
        if not isinstance(s["track_target_changes"], bool):
            raise TypeError("track_target_changes must be a bool, got "
                            f"{type(s['track_target_changes']).__name__}")
        min_log_alpha = math.log(min_alpha) if min_alpha > 0 else -100.0
        consts = StagedConsts(s["very_slow_update_rate"], _alf_rate(s["slow_update_rate"]),
                              _alf_rate(s["fast_update_rate"]), min_log_alpha,
                              s["retarget_update_rate"], float(s["track_target_changes"]))
        hi = math.inf if max_alpha is None else float(np.float32(math.log(max_alpha)))
        return consts, float(np.float32(min_log_alpha)), hi

    def _rule(self, x: Any, s: StagedState, entropy: Any, valid: Any, target: Any, c: Any,
              b: Any) -> StagedState:
        return staged_rule(x, s, entropy, valid, target, c)

    @property
    def stage(self) -> torch.Tensor:
        """< -2 estimating max entropy, -2 init, -1 free, 0/1 adjust (1: above the target).

        :func:`describe_stage` says it in words.
        """
        return self._stage

    @property
    def update_rate(self) -> torch.Tensor:
        """The adjust stage's current step of ``log_alpha``."""
        return self._update_rate

    @property
    def max_entropy(self) -> torch.Tensor:
        """The given or estimated upper bound of the entropy."""
        return self._max_entropy

    @property
    def avg_entropy(self) -> torch.Tensor:
        """The running average entropy the stages compare."""
        return window_mean(TensorOps, self._window, self._seen)

    @property
    def target_entropy_fn(self) -> Callable[[], float]:
        """The target as given (a scheduler, callable or ``SettledAnnealing``)."""
        return self._target.fn

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        return {"avg_entropy": self.avg_entropy, "stage": self._stage,
                "update_rate": self._update_rate}

    def _after_update(self, on_host: bool, unreachable: Any) -> None:
        super()._after_update(on_host, unreachable)
        self._host_updates += 1
        if ("stuck" not in self._warned and self._host_updates >= self._stuck_after
                and (on_host or summary.should_record_summaries())):
            self._warned.add("stuck")  # the adjust stage never ends: one look suffices
            stage = int(self._stage.min())
            if stage < 0:
                self._warn("stuck", self._stuck_message(stage))

    def _stuck_message(self, stage: int) -> str:
        n, avg, alpha = self._host_updates, float(self.avg_entropy.min()), float(self.alpha.min())
        max_entropy, target = float(self._max_entropy.min()), float(self._target_now.min())
        given = "given" if self._max_entropy_given else "estimated from the first entropies"
        bound = f"max_entropy {max_entropy:.3f} ({given})"
        if stage < -2:
            why = (f"is still estimating max_entropy after {n} updates: no update had a finite "
                   f"entropy from a non-empty batch ({int(self._watch_nonfinite.max())} NaN/inf)")
            todo = "check the entropies fed to it, or give max_entropy"
        elif stage == -2:
            why = (f"is still in its init stage after {n} updates: until the average entropy "
                   f"({avg:.3f}) falls below {bound}, log_alpha only creeps by "
                   f"very_slow_update_rate per update and the target ({target:.3f}) is not acted "
                   "on")
            todo = ("give max_entropy (e.g. a little above the target), set skip_free_stage=True "
                    "to act on the target at once, or start from a smaller initial_alpha (alpha "
                    f"is {alpha:.3g}) so that the entropy can fall")
        else:
            why = (f"is still in its free stage after {n} updates: alpha ({alpha:.3g}) is frozen "
                   f"until the average entropy ({avg:.3f}) falls below the target ({target:.3f}); "
                   f"{bound}")
            todo = ("if the entropy should be held at the target, not only kept above it, set "
                    "skip_free_stage=True, or start from a smaller initial_alpha so that it falls "
                    "to the target (max_entropy only shortens the init stage)")
        return f"{why}. To make it act: {todo}."

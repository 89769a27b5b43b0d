"""A PID controller of ``log_alpha`` that holds the entropy at its target.

The gradient rule on a multiplier (SAC's temperature) is pure integral
control, hence its overshoot and limit cycles (Stooke et al. 2020, "Responsive
Safety in RL by PID Lagrangian Methods"); ALF's staged rule moves by fixed
steps whose size decays and then jumps.  :class:`PIDEntropyTargetAlgorithm`
acts on the entropy error with proportional, integral and derivative terms:

* **error**: ``e = (target - H) / error_scale``, ``H`` the batch-mean entropy.
  ``error_scale`` (from the action spec unless given) is how much the entropy
  of a Boltzmann-like policy moves per unit of ``log_alpha``: ``0.5`` per
  continuous dimension (a Gaussian's std grows as ``sqrt(alpha)``) and
  ``0.5 log N`` per discrete dimension with ``N`` actions.  So ``e`` is
  roughly the change of ``log_alpha`` the gap asks for, and one set of gains
  serves a 2-action Categorical and a 6-dimensional Gaussian alike.
* **output**: ``log_alpha = I + kp * ema(e) - kd * d``; ``I`` integrates
  ``ki * e``; ``d = (fast_ema(H) - slow_ema(H)) / error_scale`` is the recent
  trend of the entropy (derivative on the measurement: a step of the target
  gives no derivative kick).
* **bounded actuation**: ``log_alpha`` moves at most ``log(max_alpha_change)``
  per update and stays in ``[log min_alpha, log max_alpha]``.
* **anti-windup**: what ``min_alpha``/``max_alpha`` cut off is taken out of
  ``I`` (back-calculation), so ``I`` never runs ahead of the real ``alpha``;
  ``I`` holds while the P and D terms already push the other way (the trend
  is closing the gap); and while the base class's windup watch finds ``alpha``
  climbing without the entropy responding (a target the policy cannot reach)
  ``alpha`` holds (``I`` absorbs the hold), so it stays bounded without a
  user-set ``max_alpha``.
* **bumpless start**: the first update sets ``I`` so that the output equals
  ``initial_alpha``; P and D then act on changes from there.

The rule is written once over a select primitive (``torch.where`` on the
tensor path, plain Python on the host path), like the staged controller's
``_stage_machine``; both paths give the same numbers.
"""
import math
from typing import Any, Optional, Tuple

import gin
import numpy as np
import torch

from alf_entropy.algorithms.entropy_controller import (
    EntropyController,
    TargetArg,
    _HostOps,
    _TensorOps,
)
from alf_entropy.utils import summary
from alf_entropy.utils.checks import check_real
from alf_entropy.utils.dist_utils import entropy_per_log_alpha

__all__ = ["PIDEntropyTargetAlgorithm"]

def _pid_rule(x: Any, state: Tuple, entropy: Any, valid: Any, target: Any, stalled: Any,
              gains: Tuple, limits: Tuple) -> Tuple:
    """One PID update written over ``x``'s select primitive.

    Args:
        x: ``_HostOps`` or ``_TensorOps``.
        state: ``(log_alpha, integral, err_ema, fast, slow, count)``.
        entropy: the batch-mean entropy.
        valid: whether this update counts (finite, non-empty).
        target: the target entropy.
        stalled: the windup watch's flag (alpha holds).
        gains: ``(inv_scale, kp, ki, kd, err_beta, fast_beta, slow_beta, deadband)``.
        limits: ``(max_step, min_log_alpha, max_log_alpha)``.

    Returns:
        The new state.
    """
    log_alpha, integral, err_ema, fast, slow, count = state
    inv_scale, kp, ki, kd, err_beta, fast_beta, slow_beta, deadband = gains
    max_step, lo, hi = limits
    first = count == 0
    err = (target - entropy) * inv_scale
    new_err = x.where(first, err, err_beta * err_ema + (1 - err_beta) * err)
    new_fast = x.where(first, entropy, fast_beta * fast + (1 - fast_beta) * entropy)
    new_slow = x.where(first, entropy, slow_beta * slow + (1 - slow_beta) * entropy)
    trend = (new_fast - new_slow) * inv_scale
    pd = kp * new_err - kd * trend
    # Integrate only outside the dead band, while the PD action agrees with
    # the error (the trend is not already closing the gap), and never upwards
    # while stalled.
    inside = x.abs(target - entropy) <= deadband * x.abs(target)
    hold = inside | ((err > 0) & ((pd < 0) | stalled)) | ((err < 0) & (pd > 0))
    new_integral = integral + x.where(hold, 0.0, ki * err)
    # Bumpless start: the first output is the initial alpha, so P and D act
    # on changes of the error from there.
    new_integral = x.where(first, log_alpha - pd, new_integral)
    wanted = new_integral + pd
    # Back-calculation: I absorbs what the bounds of alpha cut off (a step
    # beyond the rate limit is delivered over the next updates).  While
    # stalled, alpha holds (falling on the D term's anticipation alone, with
    # no way back up, would ratchet it to min_alpha).
    hi = x.where(stalled, log_alpha, hi)
    lo = x.where(stalled, log_alpha, lo)
    bounded = x.minimum(x.maximum(wanted, lo), hi)
    new_integral = new_integral + (bounded - wanted)
    moved = x.minimum(x.maximum(bounded, log_alpha - max_step), log_alpha + max_step)
    new = (moved, new_integral, new_err, new_fast, new_slow, count + 1)
    return tuple(x.where(valid, n, o) for n, o in zip(new, state))


@gin.configurable
class PIDEntropyTargetAlgorithm(EntropyController):
    """PID control of ``log_alpha`` on the entropy error (module docstring).

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        initial_alpha: initial ``alpha`` (in ``[min_alpha, max_alpha]``).
        target_entropy: a number, a ``Scheduler``/zero-argument callable,
            or None for the spec's default.
        kp: proportional gain (>= 0), on an EMA of the error.
        ki: integral gain per update (>= 0).
        kd: derivative gain (>= 0), on the entropy's trend.
        error_ema: smoothing of the error for the P term, in ``[0, 1)``.
        trend_emas: ``(fast, slow)`` smoothing of the entropy whose
            difference is the trend, ``0 <= fast < slow < 1``.
        deadband: relative band around the target (``|H - target| <=
            deadband * |target|``) in which the integral holds, in ``[0, 1)``:
            no creeping of alpha for the last few hundredths of a nat (a
            discrete policy next to its maximum entropy).
        max_alpha_change: largest factor ``alpha`` may change by in one
            update (> 1).
        min_alpha: floor of ``alpha`` (> 0).
        max_alpha: ceiling of ``alpha`` (> ``min_alpha``); None: none.
        error_scale: entropy per unit of ``log_alpha`` (> 0); None: from
            the spec (``dist_utils.entropy_per_log_alpha``).
        update_mode: ``"tensor"`` (never syncs a GPU), ``"host"`` (numpy
            over CPU buffers) or ``"auto"`` (host on the CPU).
        debug_summaries: write ``alpha``, ``integral``, ``error`` and
            ``trend`` under ``name``.
        name: the name (summary scope).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 1)  # 2 actions
        >>> pid = PIDEntropyTargetAlgorithm(spec, target_entropy=0.5)
        >>> for _ in range(3):  # entropy below the target: alpha rises
        ...     alpha = pid.adjust_alpha(0.3)
        >>> bool(alpha > 0.1)
        True
    """

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: TargetArg = None,
        kp: float = 2.0,
        ki: float = 0.05,
        kd: float = 0.5,
        error_ema: float = 0.3,
        trend_emas: Tuple[float, float] = (0.6, 0.9),
        deadband: float = 0.0,
        max_alpha_change: float = 1.25,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        error_scale: Optional[float] = None,
        update_mode: str = "auto",
        debug_summaries: bool = False,
        name: str = "PIDEntropyTargetAlgorithm",
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        for arg, value in (("kp", kp), ("ki", ki), ("kd", kd)):
            check_real(arg, value, minimum=0.0)
        check_real("error_ema", error_ema, minimum=0.0, below=1.0)
        if not isinstance(trend_emas, (tuple, list)) or len(trend_emas) != 2:
            raise TypeError(f"trend_emas must be a pair (fast, slow), got {trend_emas!r}")
        fast, slow = (
            check_real(f"trend_emas[{i}]", v, minimum=0.0) for i, v in enumerate(trend_emas)
        )
        if not fast < slow < 1:
            raise ValueError(f"trend_emas must satisfy 0 <= fast < slow < 1, got {trend_emas!r}")
        check_real("deadband", deadband, minimum=0.0, maximum=0.99)
        check_real("max_alpha_change", max_alpha_change, above=1.0)
        check_real("initial_alpha", initial_alpha, positive=True)
        check_real("min_alpha", min_alpha, positive=True)
        if max_alpha is not None:
            check_real("max_alpha", max_alpha, positive=True)
            if max_alpha <= min_alpha:
                raise ValueError(f"max_alpha ({max_alpha}) must be > min_alpha ({min_alpha})")
        if not min_alpha <= initial_alpha <= (math.inf if max_alpha is None else max_alpha):
            raise ValueError(f"initial_alpha ({initial_alpha}) must be in [min_alpha, max_alpha] "
                             f"= [{min_alpha}, {max_alpha}]")
        if error_scale is None:
            error_scale = entropy_per_log_alpha(action_spec)
        check_real("error_scale", error_scale, positive=True)
        self._init_update_mode(update_mode)
        self._init_target(target_entropy)
        f32 = np.float32
        log_alpha = math.log(initial_alpha)
        # The changing state (saved by state_dict): log_alpha, integral,
        # error EMA, fast and slow entropy EMAs, count of updates.
        for key, value in (("_log_alpha", log_alpha), ("_integral", log_alpha),
                           ("_err_ema", 0.0), ("_fast", 0.0), ("_slow", 0.0)):
            self.register_buffer(key, torch.tensor(value, dtype=torch.float32))
        self.register_buffer("_count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("_stage", torch.tensor(1, dtype=torch.int32), persistent=False)
        max_log = math.inf if max_alpha is None else math.log(max_alpha)
        consts = (1.0 / error_scale, kp, ki, kd, error_ema, fast, slow, deadband,
                  math.log(max_alpha_change), math.log(min_alpha), max_log)
        # float32 constants: a buffer (moved by .to()) and its host twin.
        self.register_buffer("_consts", torch.tensor(consts, dtype=torch.float32), persistent=False)
        self._host_consts = tuple(f32(c) for c in consts)
        self._error_scale = float(error_scale)
        self._max_log_alpha_watch = max_log

    @property
    def stage(self) -> torch.Tensor:
        """Always 1: the PID controller has no stages (it always adjusts)."""
        return self._stage

    @property
    def error_scale(self) -> float:
        """Entropy per unit of ``log_alpha`` that normalises the error."""
        return self._error_scale

    @property
    def integral(self) -> torch.Tensor:
        """The integral term (in ``log_alpha`` units, ``log(initial_alpha)`` at start)."""
        return self._integral

    def _state(self) -> Tuple[torch.Tensor, ...]:
        return self._log_alpha, self._integral, self._err_ema, self._fast, self._slow, self._count

    def _update(
        self, entropy: torch.Tensor, count: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, Any]:
        self._refresh_target()
        entropy = entropy.to(self._log_alpha.device, torch.float32)
        if self._use_host():
            self._update_host(entropy, count)
        else:
            self._update_tensor(entropy, count)
        return self._log_alpha.exp(), ()

    def _summarize(self) -> None:
        with summary.scope(self._name):
            for tag, value in (("alpha", self.alpha), ("integral", self._integral),
                               ("error", self._err_ema),
                               ("trend", (self._fast - self._slow) / self._error_scale),
                               ("nonfinite_entropy", self._num_nonfinite)):
                summary.scalar(tag, value)

    def _update_tensor(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> None:
        finite = torch.isfinite(entropy)
        has_data = True if count is None else count > 0
        c = self._consts.unbind()
        new = _pid_rule(_TensorOps, self._state(), torch.nan_to_num(entropy), finite & has_data,
                        self._target_now, self._windup_stalled(), c[:8], c[8:])
        for buf, value in zip(self._state(), new):
            buf.copy_(value)

    def _update_host(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> None:
        # Reading CPU buffers is a memory read: there is no device to wait for.
        if count is not None and count.cpu().numpy()[()] <= 0:
            return
        ent = np.float32(entropy.detach().cpu().numpy()[()])
        if not np.isfinite(ent):
            return
        views = [buf.numpy() for buf in self._state()]
        c = self._host_consts
        target, stalled = self._target_now.numpy()[()], bool(self._windup_stalled().numpy())
        new = _pid_rule(_HostOps, tuple(v[()] for v in views), ent, True, target, stalled,
                        c[:8], c[8:])
        for view, value in zip(views, new):
            view[()] = value

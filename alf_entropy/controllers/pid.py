"""A PID controller of ``log_alpha`` that holds the entropy at its target.

The gradient rule on a multiplier (SAC's temperature) is pure integral
control, hence its overshoot and limit cycles (Stooke et al. 2020, "Responsive
Safety in RL by PID Lagrangian Methods"); ALF's staged rule moves by fixed
steps whose size decays and then jumps.  The PID rule (``rules.pid_rule``)
acts on the error ``(target - H) / error_scale``, where ``error_scale`` is how
much a Boltzmann-like policy's entropy moves per unit of ``log_alpha`` (0.5 per
continuous dimension, ``0.5 log N`` per discrete one with N actions), so one
set of gains serves a 2-action Categorical and a 6-dimensional Gaussian alike;
it is rate-limited, bounded, anti-windup and starts bumplessly.
"""
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import gin
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.rules import pid_rule
from alf_entropy.controllers.state import PIDConsts, PIDState
from alf_entropy.utils.checks import check_real
from alf_entropy.utils.entropies import entropy_per_log_alpha

__all__ = ["PIDEntropyTargetAlgorithm"]


@gin.configurable
class PIDEntropyTargetAlgorithm(EntropyController):
    """PID control of ``log_alpha`` on the entropy error (module docstring, ``rules.pid_rule``).

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        initial_alpha: initial ``alpha`` (in ``[min_alpha, max_alpha]``).
        target_entropy: a number, a ``Scheduler``/zero-argument callable, a
            ``SettledAnnealing`` or None for the spec's default; per member for a batch.
        kp: proportional gain (>= 0), on an EMA of the error.
        ki: integral gain per update (>= 0); the rate starts there.
        integral_growth: how much faster the integral runs each update while the
            entropy stays below the target without rising (> 1, or 1: never).
        max_integral_gain: the most the integral's rate may grow, ``x ki`` (>= 1).
        growth_band: relative band around the target in which the rate does not
            grow, in ``[0, 1)``.
        kd: derivative gain (>= 0), on the entropy's trend.
        error_ema: smoothing of the error for the P term, in ``[0, 1)``.
        trend_emas: ``(fast, slow)`` smoothing of the entropy whose difference
            is the trend, ``0 <= fast < slow < 1``.
        deadband: relative band around the target in which the integral holds,
            in ``[0, 1)``.
        max_alpha_change: largest factor ``alpha`` may change by in one update (> 1).
        min_alpha: floor of ``alpha`` (> 0).
        max_alpha: ceiling of ``alpha`` (> ``min_alpha``; None: none).  Below the
            target at the ceiling the windup watch finds the target unreachable
            (after ``WINDUP_WINDOW`` updates, one warning); 1 by default: a bonus
            heavier than the reward is rarely wanted (raise it for large rewards).
        error_scale: entropy per unit of ``log_alpha`` (> 0); None: from the spec.
        update_mode: ``"auto"``, ``"host"``, ``"tensor"`` or ``"compiled"``.
        batch_shape: ``()``, or ``(K,)`` for K independent controllers.
        debug_summaries: write ``alpha``, ``integral``, ``error`` and ``trend``.
        name: the name (summary scope).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 1)  # 2 actions
        >>> pid = PIDEntropyTargetAlgorithm(spec, target_entropy=0.5)
        >>> alphas = [float(pid.adjust_alpha(0.3)) for _ in range(3)]  # entropy below target
        >>> round(alphas[0], 6) == 0.1 and alphas[0] < alphas[1] < alphas[2]  # bumpless, rising
        True
    """

    State = PIDState

    def __init__(self, action_spec: Any, initial_alpha: float = 0.1,
                 target_entropy: Any = None, kp: float = 2.0, ki: float = 0.05,
                 kd: float = 0.5, integral_growth: float = 1.1, max_integral_gain: float = 30.0,
                 growth_band: float = 0.02, error_ema: float = 0.3,
                 trend_emas: Tuple[float, float] = (0.6, 0.9), deadband: float = 0.0,
                 max_alpha_change: float = 1.25, min_alpha: float = 1e-4,
                 max_alpha: Optional[float] = 1.0, error_scale: Optional[float] = None,
                 update_mode: str = "auto", batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "PIDEntropyTargetAlgorithm"):
        super().__init__(action_spec, debug_summaries, name)
        self._init_driver(target_entropy, batch_shape, update_mode)
        check_real("initial_alpha", initial_alpha, positive=True)
        check_real("min_alpha", min_alpha, positive=True)
        top = math.inf if max_alpha is None else check_real("max_alpha", max_alpha, positive=True)
        if not min_alpha <= initial_alpha <= top:
            raise ValueError(f"initial_alpha ({initial_alpha}) must be in [min_alpha, max_alpha] "
                             f"= [{min_alpha}, {max_alpha}]")
        log_alpha = self._full(math.log(initial_alpha))
        zero = self._full(0.0)
        self._init_rule(PIDState(log_alpha, log_alpha.clone(), zero, zero.clone(), zero.clone(),
                                 zero.long(), self._full(1.0)), dict(
            kp=kp, ki=ki, kd=kd, integral_growth=integral_growth,
            max_integral_gain=max_integral_gain, growth_band=growth_band, error_ema=error_ema,
            trend_emas=trend_emas, deadband=deadband, max_alpha_change=max_alpha_change,
            min_alpha=min_alpha, max_alpha=max_alpha, error_scale=error_scale))

    def _constants(self, s: Dict[str, Any]) -> Tuple[PIDConsts, float, float]:
        for arg in ("kp", "ki", "kd"):
            check_real(arg, s[arg], minimum=0.0)
        check_real("error_ema", s["error_ema"], minimum=0.0, below=1.0)
        trend = s["trend_emas"]
        if not isinstance(trend, (tuple, list)) or len(trend) != 2:
            raise TypeError(f"trend_emas must be a pair (fast, slow), got {trend!r}")
        fast, slow = (check_real(f"trend_emas[{i}]", v, minimum=0.0) for i, v in enumerate(trend))
        if not fast < slow < 1:
            raise ValueError(f"trend_emas must satisfy 0 <= fast < slow < 1, got {trend!r}")
        check_real("deadband", s["deadband"], minimum=0.0, maximum=0.99)
        growth = check_real("integral_growth", s["integral_growth"], minimum=1.0)
        check_real("max_integral_gain", s["max_integral_gain"], minimum=1.0)
        check_real("growth_band", s["growth_band"], minimum=0.0, below=1.0)
        check_real("max_alpha_change", s["max_alpha_change"], above=1.0)
        min_alpha, max_alpha = check_real("min_alpha", s["min_alpha"], positive=True), s[
            "max_alpha"]
        if max_alpha is not None and check_real("max_alpha", max_alpha,
                                                positive=True) <= min_alpha:
            raise ValueError(f"max_alpha ({max_alpha}) must be > min_alpha ({min_alpha})")
        scale = self._error_scale(s)
        consts = PIDConsts(1.0 / scale, s["kp"], s["ki"], s["kd"], s["error_ema"], fast, slow,
                           s["deadband"], math.log(s["max_alpha_change"]), growth, 1.0 / growth,
                           s["max_integral_gain"], s["growth_band"])
        return consts, math.log(min_alpha), math.inf if max_alpha is None else math.log(max_alpha)

    def _rule(self, x: Any, s: PIDState, entropy: Any, valid: Any, target: Any, c: Any,
              b: Any) -> PIDState:
        return pid_rule(x, s, entropy, valid, target, c, b)

    def _error_scale(self, s: Dict[str, Any]) -> float:
        if s["error_scale"] is None:
            return entropy_per_log_alpha(self._action_spec)
        return check_real("error_scale", s["error_scale"], positive=True)

    @property
    def error_scale(self) -> float:
        """Entropy per unit of ``log_alpha`` that normalises the error."""
        return self._error_scale(self._settings)

    @property
    def integral(self) -> torch.Tensor:
        """The integral term (in ``log_alpha`` units, ``log(initial_alpha)`` at start)."""
        return self._integral

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        c = self._consts.values
        return {"integral": self._integral, "error": self._err_ema,
                "trend": (self._fast - self._slow) * c.inv_scale}

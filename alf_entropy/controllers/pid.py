"""A PID controller of ``log_alpha`` that holds the entropy at its target: rate-limited,
bounded, anti-windup, bumpless; why and how: docs/pid_controller.md."""

import math
from collections import namedtuple
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from alf_entropy.controllers.base import EntropyController, arguments
from alf_entropy.controllers.driver import state_type
from alf_entropy.controllers.ops import f32
from alf_entropy.utils.checks import check_real
from alf_entropy.utils.dist_utils import entropy_per_log_alpha

__all__ = ["PIDEntropyTargetAlgorithm", "pid_rule", "NOISE_EMA"]

NOISE_EMA = 0.99
"""Memory of the readings' noise estimate (a running mean over its first 100 updates)."""

# fast, slow: EMAs of the level (the trend: their difference); gain: the integral rate's growth
# (+ below the target, - above); level: the entropy filtered by k; noise: the readings' noise
# variance; reading, before: the last two readings; slowdown: the last sqrt(k), on every gain.
PIDState = state_type(
    "PIDState", "integral err_ema fast slow gain level noise reading before slowdown"
)
PIDConsts = namedtuple(
    "PIDConsts",
    "inv_scale kp ki kd err_beta fast_beta slow_beta deadband "
    "max_step gain_growth max_gain gain_band noise_step noise_beta lo hi",
)


def pid_rule(x: Any, s: PIDState, entropy: Any, c: PIDConsts) -> PIDState:
    """``log_alpha = I + kp ema(e) - kd trend`` on ``e = (target - H) / error_scale``."""
    target = s.target
    first = s.count == 0
    d2 = entropy - 2.0 * s.reading + s.before  # white noise of variance v: 6 v on average
    w = x.maximum(1.0 / x.f32(x.maximum(s.count - 1, 1)), 1.0 - c.noise_beta)
    noise = x.where(s.count >= 2, s.noise + w * (d2 * d2 / 6.0 - s.noise), s.noise)
    k = 1.0 / x.maximum(c.kp * x.sqrt(noise) * c.inv_scale / c.noise_step, 1.0)  # the filter
    level = x.where(first, entropy, s.level + k * (entropy - s.level))
    g = x.sqrt(k)  # every gain slowed with the filter: the loop stays as damped
    err = (target - level) * c.inv_scale
    err_ema = x.where(first, err, c.err_beta * s.err_ema + (1 - c.err_beta) * err)
    fast = x.where(first, level, c.fast_beta * s.fast + (1 - c.fast_beta) * level)
    slow = x.where(first, level, c.slow_beta * s.slow + (1 - c.slow_beta) * level)
    trend = (fast - slow) * c.inv_scale  # > 0: rising
    raw = c.kp * err_ema - c.kd * trend
    pd = g * raw
    below = err_ema > 0
    outside = x.abs(err_ema) > c.gain_band * x.abs(target) * c.inv_scale
    same_side = x.where(below, s.gain > 0, s.gain < 0)
    growth = 1.0 + (c.gain_growth - 1.0) * k
    gain = x.abs(s.gain) * x.where(below & (trend <= 0), growth, 1.0 / growth)
    gain = x.minimum(x.where(gain < 1.0, 1.0, gain), c.max_gain)
    gain = x.where(same_side & outside, gain, 1.0)
    inside = x.abs(target - level) <= c.deadband * x.abs(target)
    hold = inside | ((err > 0) & (pd < 0)) | ((err < 0) & (pd > 0))
    step = x.clip(g * c.ki * gain * x.clip(err, -1.0, 2.0), -c.max_step, c.max_step)
    integral = s.integral + x.where(hold, 0.0, step) + (s.slowdown - g) * raw  # bumpless in g
    integral = x.where(first, s.log_alpha - pd, integral)
    wanted = integral + pd
    bounded = x.minimum(x.maximum(wanted, c.lo), c.hi)
    integral = integral + (bounded - wanted)
    log_alpha = x.minimum(x.maximum(bounded, s.log_alpha - c.max_step), s.log_alpha + c.max_step)
    return s._replace(
        log_alpha=log_alpha,
        integral=integral,
        err_ema=err_ema,
        fast=fast,
        slow=slow,
        gain=x.where(below, gain, -gain),
        level=level,
        noise=noise,
        reading=entropy,
        before=x.where(first, entropy, s.reading),
        slowdown=g,
    )


class PIDEntropyTargetAlgorithm(EntropyController):
    """PID control of ``log_alpha`` on the entropy error (``pid_rule``); shared arguments:
    ``EntropyController``'s; its own:

    Args:
        kp: proportional gain (>= 0), on an EMA of the error.
        ki: integral gain per update (>= 0); the rate starts there.
        integral_growth: the integral rate's growth per update below the target (>= 1).
        max_integral_gain: the most the integral's rate may grow, ``x ki`` (>= 1).
        growth_band: relative band around the target without growth, in ``[0, 1)``.
        kd: derivative gain (>= 0), on the entropy's trend.
        error_ema: smoothing of the error for the P term, in ``[0, 1)``.
        trend_emas: ``(fast, slow)`` EMAs whose difference is the trend, ``0 <= fast < slow < 1``.
        deadband: relative band around the target in which the integral holds, in ``[0, 1)``.
        max_alpha_change: the largest factor ``alpha`` may change by in one update (> 1).
        error_scale: entropy per unit of ``log_alpha`` (> 0); None: from the spec.
        noise_step: the ``log_alpha`` step the readings' noise may cause per update (> 0;
            the noisier, the more filtered and slower); ``inf``: no filter.

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
    rule = staticmethod(pid_rule)

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: Any = None,
        kp: float = 2.0,
        ki: float = 0.05,
        kd: float = 0.5,
        integral_growth: float = 1.1,
        max_integral_gain: float = 30.0,
        growth_band: float = 0.01,
        error_ema: float = 0.3,
        trend_emas: Tuple[float, float] = (0.6, 0.9),
        deadband: float = 0.0,
        max_alpha_change: float = 1.25,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        error_scale: Optional[float] = None,
        noise_step: float = 0.05,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "PIDEntropyTargetAlgorithm",
    ):
        super().__init__(**arguments(locals()))
        self.make_state(
            integral=math.log(initial_alpha),
            err_ema=0.0,
            fast=0.0,
            slow=0.0,
            gain=1.0,
            level=0.0,
            noise=0.0,
            reading=0.0,
            before=0.0,
            slowdown=1.0,
        )

    def _constants(self, s, lo, hi):
        for arg, least in (
            ("kp", 0.0),
            ("ki", 0.0),
            ("kd", 0.0),
            ("integral_growth", 1.0),
            ("max_integral_gain", 1.0),
        ):
            check_real(arg, s[arg], minimum=least)
        for arg in ("error_ema", "growth_band"):
            check_real(arg, s[arg], minimum=0.0, below=1.0)
        trend = s["trend_emas"]
        if not isinstance(trend, (tuple, list)) or len(trend) != 2:
            raise TypeError(f"trend_emas must be a pair (fast, slow), got {trend!r}")
        fast, slow = (check_real(f"trend_emas[{i}]", v, minimum=0.0) for i, v in enumerate(trend))
        if not fast < slow < 1:
            raise ValueError(f"trend_emas must satisfy 0 <= fast < slow < 1, got {trend!r}")
        check_real("deadband", s["deadband"], minimum=0.0, maximum=0.99)
        check_real("max_alpha_change", s["max_alpha_change"], above=1.0)
        noise_step = check_real("noise_step", s["noise_step"], positive=True, finite=False)
        return PIDConsts(
            *map(
                f32,
                (
                    1.0 / self._error_scale(s),
                    s["kp"],
                    s["ki"],
                    s["kd"],
                    s["error_ema"],
                    fast,
                    slow,
                    s["deadband"],
                    math.log(s["max_alpha_change"]),
                    s["integral_growth"],
                    s["max_integral_gain"],
                    s["growth_band"],
                    noise_step,
                    NOISE_EMA,
                    lo,
                    hi,
                ),
            )
        )

    def _error_scale(self, s):
        if s["error_scale"] is None:
            return entropy_per_log_alpha(self.action_spec)
        return check_real("error_scale", s["error_scale"], positive=True)

    @property
    def error_scale(self) -> float:
        """Entropy per unit of ``log_alpha`` that normalises the error."""
        return self._error_scale(self.settings)

    @property
    def integral(self) -> torch.Tensor:
        """The integral term (``log(initial_alpha)`` at the start)."""
        return self.driver.integral

    def debug_values(self) -> Dict[str, torch.Tensor]:
        s = self.driver.state
        return {
            "integral": s.integral,
            "error": s.err_ema,
            "trend": (s.fast - s.slow) / self.error_scale,
        }

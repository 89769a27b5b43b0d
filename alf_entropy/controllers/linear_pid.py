"""PID control of the coefficient itself (Stooke et al. 2020's PID-Lagrangian form): a
log-space rule nears 0 only by decades, this one reaches 0 and holds it, or goes below 0 (an
entropy penalty, while the entropy rises above the target without a bonus) down to a negative
``min_alpha``."""

from collections import namedtuple
from typing import Any, Dict, Optional, Sequence

import torch

from alf_entropy.controllers.base import EntropyController, arguments
from alf_entropy.controllers.driver import MAX_ALPHA, state_type
from alf_entropy.controllers.ops import f32
from alf_entropy.utils.checks import check_real

__all__ = ["LinearPIDEntropyTargetAlgorithm", "linear_pid_rule"]

# integral: in coefficient units, in [lo, max_alpha]; level: the smoothed entropy; alpha: the
# coefficient (log_alpha is its positive part's)
LinearPIDState = state_type("LinearPIDState", "integral level alpha")
# lo: max(min_alpha, 0), the floor but while the entropy rises above the target with the
# integral at lo: min_alpha
LinearPIDConsts = namedtuple("LinearPIDConsts", "kp ki kd beta lo hi g0 gslope min_alpha")


def linear_pid_rule(x: Any, s: LinearPIDState, entropy: Any, c: LinearPIDConsts) -> LinearPIDState:
    """``coef = clip(I + g (kp e - kd d))``, ``I = clip(I + ki e)``, ``e = target - H``, ``d``
    the smoothed entropy's rise; ``g = min(1, g0 + gslope I)`` scales the kicks with the
    coefficient's level.  A penalty (``coef < 0``) only while ``e < 0``, ``d > 0`` and
    ``I = 0``: the entropy rises above the target without a bonus behind it (a bonus's
    overshoot falls back as the bonus eases; an entropy that falls needs none).  ``I >= 0``."""
    first = s.count == 0
    level = x.where(first, entropy, c.beta * s.level + (1.0 - c.beta) * entropy)
    err = s.target - entropy
    rise = level - x.where(first, entropy, s.level)
    gain = x.clip(c.g0 + c.gslope * s.integral, c.g0, 1.0)
    integral = x.clip(s.integral + c.ki * err, c.lo, c.hi)
    floor = x.where((err < 0) & (rise > 0) & (integral <= c.lo), c.min_alpha, c.lo)
    coef = x.minimum(x.maximum(integral + gain * (c.kp * err - c.kd * rise), floor), c.hi)
    positive = x.log(x.maximum(coef, 0.0))
    return s._replace(log_alpha=positive, integral=integral, level=level, alpha=coef)


def _alpha_of_old_state(driver: Any, state: Dict[str, Any], prefix: str, *_: Any) -> None:
    """A state saved without ``alpha`` (before min_alpha < 0 was possible): ``exp(log_alpha)``."""
    if prefix + "log_alpha" in state:
        state.setdefault(prefix + "alpha", state[prefix + "log_alpha"].exp())


class LinearPIDEntropyTargetAlgorithm(EntropyController):
    """PID control of ``alpha`` itself, clamped at ``min_alpha``: 0, or below 0 for a penalty.

    Shared arguments: ``EntropyController``'s (``min_alpha < 0``: alpha goes down to it, an
    entropy penalty, while the entropy rises above the target with the integral at 0); its own:

    Args:
        kp: proportional gain, coefficient per nat (>= 0).
        ki: integral gain, coefficient per nat and update (>= 0).
        kd: derivative gain on the smoothed entropy's change, coefficient per nat (>= 0).
        trend_ema: smoothing of the entropy for the derivative, in ``[0, 1)``.
        gain_alpha: the integral from which P and D act in full (0: always); below, their share
            falls linearly to ``min_gain`` at 0, where a small coefficient moves the entropy much.
        min_gain: that share at an integral of 0 or below, in ``(0, 1]``.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 99)
        >>> pid = LinearPIDEntropyTargetAlgorithm(spec, target_entropy=2.0, initial_alpha=0.0,
        ...                                       min_alpha=0.0, max_alpha=1.0)
        >>> float(pid.adjust_alpha(3.0))  # above the target: no bonus at all
        0.0
        >>> float(pid.adjust_alpha(1.5)) > 0  # below: a bonus
        True
    """

    State = LinearPIDState
    rule = staticmethod(linear_pid_rule)
    ZERO_ALPHA = True
    SIGNED = True

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: Any = None,
        kp: float = 0.3,
        ki: float = 0.05,
        kd: float = 3.0,
        trend_ema: float = 0.5,
        gain_alpha: float = 0.0,
        min_gain: float = 1 / 3,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "LinearPIDEntropyTargetAlgorithm",
    ):
        super().__init__(**arguments(locals()))
        self.make_state(integral=float(initial_alpha), level=0.0, alpha=float(initial_alpha))
        self.driver.register_load_state_dict_pre_hook(_alpha_of_old_state)

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient (below 0: a penalty), detached."""
        return self.driver.alpha.detach().clone()

    def _constants(self, s, lo, hi):
        for arg in ("kp", "ki", "kd", "gain_alpha"):
            check_real(arg, s[arg], minimum=0.0)
        check_real("trend_ema", s["trend_ema"], minimum=0.0, below=1.0)
        check_real("min_gain", s["min_gain"], above=0.0, maximum=1.0)
        if s["max_alpha_change_per_iteration"] is not None:
            raise ValueError(
                "max_alpha_change_per_iteration must be None: a ratio cannot limit an alpha "
                "that reaches 0"
            )
        g0, ga = s["min_gain"], s["gain_alpha"]
        g0, gslope = (g0, (1.0 - g0) / ga) if ga > 0 else (1.0, 0.0)
        return LinearPIDConsts(
            *map(
                f32,
                (
                    s["kp"],
                    s["ki"],
                    s["kd"],
                    s["trend_ema"],
                    max(s["min_alpha"], 0.0),
                    s["max_alpha"] or MAX_ALPHA,
                    g0,
                    gslope,
                    s["min_alpha"],
                ),
            )
        )

    @property
    def integral(self) -> torch.Tensor:
        """The integral term (coefficient units)."""
        return self.driver.integral

    def debug_values(self) -> Dict[str, torch.Tensor]:
        return {"integral": self.driver.integral}

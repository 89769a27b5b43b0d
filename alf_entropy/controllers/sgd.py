"""SAC's gradient rule for ``alpha`` (ALF's ``SGDEntropyTargetAlgorithm``) as a pure rule: Adam
(its moments buffers) or plain steps down ``log_alpha * (H - target)``, in torch's kernels."""

import functools
from collections import namedtuple
from typing import Any, Dict, Optional, Sequence

import torch

from alf_entropy.controllers.base import EntropyController, arguments
from alf_entropy.controllers.driver import state_type
from alf_entropy.controllers.ops import TensorOps, window_average, window_mean
from alf_entropy.utils.checks import check_choice, check_int, check_real

__all__ = ["SGDEntropyTargetAlgorithm", "adam_step"]

# exp_avg, exp_avg_sq, adam_step: Adam's moments and step count (torch.optim.Adam's names)
SGDState = state_type("SGDState", "window seen exp_avg exp_avg_sq adam_step")
SGDConsts = namedtuple("SGDConsts", "lr adam")


def adam_step(
    lr: float,
    log_alpha: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    t: torch.Tensor,
    grad: torch.Tensor,
) -> tuple:
    """``torch.optim.Adam``'s step, bit for bit (betas 0.9, 0.999, eps 1e-8): ``(p, m, v, t)``."""
    t = t + 1
    m = torch.lerp(m, grad, 1 - 0.9)
    v = torch.addcmul(v * 0.999, grad, grad, value=1 - 0.999)
    steps = t.double()
    neg_step = (-lr / (1 - torch.pow(0.9, steps))).float()
    denom = torch.sqrt(v) / torch.sqrt(1 - torch.pow(0.999, steps)).float() + 1e-8
    return log_alpha + neg_step * m / denom, m, v, t


def sgd_rule(x: Any, s: SGDState, entropy: Any, c: SGDConsts) -> SGDState:
    """A step down the gradient ``H - target`` of ``log_alpha * (H - target)``."""
    _, avg, window, seen = window_average(x, s.window, s.seen, entropy)
    grad = x.f32(avg - s.target)
    new = s._replace(window=window, seen=seen)
    if c.adam:
        log_alpha, m, v, t = x.via_torch(
            functools.partial(adam_step, c.lr),
            s.log_alpha,
            s.exp_avg,
            s.exp_avg_sq,
            s.adam_step,
            grad,
        )
        return new._replace(log_alpha=log_alpha, exp_avg=m, exp_avg_sq=v, adam_step=t)
    step = functools.partial(torch.add, alpha=-c.lr)
    return new._replace(log_alpha=x.via_torch(step, s.log_alpha, grad))


class SGDEntropyTargetAlgorithm(EntropyController):
    """SAC's gradient rule: one step an update, by its own optimiser (a parent's never touches
    ``log_alpha``).  Shared arguments: ``EntropyController``'s:

    Args:
        lr: the learning rate of ``log_alpha`` (>= 0; 0: a fixed alpha that logs its target).
        optimizer: ``"adam"`` (SAC's: betas 0.9, 0.999, eps 1e-8) or ``"sgd"`` (plain
            gradient steps).
        window_size: updates the entropy is averaged over (>= 1).

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
        >>> sgd = SGDEntropyTargetAlgorithm(spec, target_entropy=-2.0)  # SAC's -dim(A)
        >>> float(sgd.adjust_alpha(0.5)) < 0.1  # entropy above the target: alpha falls
        True
        >>> before = sgd.alpha
        >>> info = sgd.entropy_loss(torch.full((8,), 0.5))  # steps alpha too
        >>> bool(sgd.alpha < before)
        True
    """

    State = SGDState
    rule = staticmethod(sgd_rule)

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: Any = None,
        window_size: int = 1,
        lr: float = 3e-4,
        optimizer: str = "adam",
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "SGDEntropyTargetAlgorithm",
    ):
        super().__init__(**arguments(locals(), "window_size"))
        window = check_int("window_size", window_size, minimum=1)
        self.make_state(
            window=torch.zeros(self.batch_shape + (window,)),
            seen=0,
            exp_avg=0.0,
            exp_avg_sq=0.0,
            adam_step=0,
        )

    def _constants(self, s, lo, hi):
        adam = check_choice("optimizer", s["optimizer"], ("adam", "sgd")) == "adam"
        return SGDConsts(check_real("lr", s["lr"], minimum=0.0), adam)

    def debug_values(self) -> Dict[str, torch.Tensor]:
        return {"entropy": window_mean(TensorOps, self.driver.window, self.driver.seen)}

"""SAC's gradient rule for ``alpha`` (ALF's ``SGDEntropyTargetAlgorithm``).

``log_alpha`` descends the loss ``log_alpha * (H - target)``, ``H`` the batch-mean entropy
averaged over the last ``window_size`` updates, with Adam (SAC's: ``lr=3e-4``) or plain
gradient steps, written as a rule like the others: the moments are buffers, saved and copied
with the module, and the tensor path reads nothing on the host.  Adam's arithmetic is torch's
own (``torch.optim.Adam`` gives the same bits), so the host path hands it to torch.
"""
import functools
from typing import Any, Dict, NamedTuple, Optional, Sequence

import gin
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.ops import TensorOps, window_average, window_mean
from alf_entropy.utils.checks import check_choice, check_int, check_real

__all__ = ["SGDEntropyTargetAlgorithm", "adam_step"]


class SGDState(NamedTuple):
    log_alpha: Any
    window: Any
    seen: Any
    exp_avg: Any  # Adam's moments and step count, as torch.optim.Adam names them
    exp_avg_sq: Any
    adam_step: Any


class SGDConsts(NamedTuple):
    lr: float
    adam: bool


def adam_step(lr: float, log_alpha: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
              t: torch.Tensor, grad: torch.Tensor) -> tuple:
    """One step of ``torch.optim.Adam`` (betas 0.9, 0.999, eps 1e-8; its single-tensor
    arithmetic, the bias corrections from a tensor step count): ``(log_alpha, m, v, t)``."""
    t = t + 1
    m = torch.lerp(m, grad, 1 - 0.9)
    v = torch.addcmul(v * 0.999, grad, grad, value=1 - 0.999)
    steps = t.to(torch.float64)
    neg_step = (-lr / (1 - torch.pow(0.9, steps))).to(torch.float32)
    denom = torch.sqrt(v) / torch.sqrt(1 - torch.pow(0.999, steps)).to(torch.float32) + 1e-8
    return log_alpha + neg_step * m / denom, m, v, t


def sgd_rule(x: Any, s: SGDState, entropy: Any, target: Any, c: SGDConsts) -> SGDState:
    """A step down the gradient ``H - target`` of ``log_alpha * (H - target)``."""
    _, avg, window, seen = window_average(x, s.window, s.seen, entropy)
    grad = x.f32(avg - target)
    if c.adam:
        log_alpha, m, v, t = x.via_torch(functools.partial(adam_step, c.lr), s.log_alpha,
                                         s.exp_avg, s.exp_avg_sq, s.adam_step, grad)
        return SGDState(log_alpha, window, seen, m, v, t)
    log_alpha = x.via_torch(functools.partial(torch.add, alpha=-c.lr), s.log_alpha, grad)
    return s._replace(log_alpha=log_alpha, window=window, seen=seen)


def _rule_of(optimizer: Any, lr: float) -> tuple:
    """``(name, lr)`` of ``optimizer``: a name, or an earlier config's torch optimiser factory
    (``functools.partial(torch.optim.Adam, lr=...)``) that the rule can run."""
    if isinstance(optimizer, str):
        return optimizer, lr
    opt = optimizer([torch.zeros((), requires_grad=True)]) if callable(optimizer) else None
    d = getattr(opt, "defaults", {})
    plain = not (d.get("weight_decay") or d.get("maximize") or d.get("momentum"))
    if type(opt) is torch.optim.Adam and plain and d["betas"] == (0.9, 0.999) and d[
            "eps"] == 1e-8 and not d["amsgrad"]:
        return "adam", d["lr"]
    if type(opt) is torch.optim.SGD and plain:
        return "sgd", d["lr"]
    raise TypeError(f"optimizer must be 'adam' (SAC's: betas 0.9, 0.999, eps 1e-8) or 'sgd' "
                    f"(plain steps), with lr=...; got {optimizer!r}")


@gin.configurable
class SGDEntropyTargetAlgorithm(EntropyController):
    """SAC's gradient rule for ``alpha`` (module docstring).

    Each update takes one step; ``entropy_loss``'s ``scalar_loss`` is zero, so a parent's
    optimiser never touches ``log_alpha``.

    The shared arguments are ``EntropyController``'s; its own:

    Args:
        lr: the learning rate of ``log_alpha`` (>= 0; 0: a fixed alpha that logs its target).
        optimizer: ``"adam"`` (SAC's) or ``"sgd"`` (plain gradient steps); a torch
            optimiser factory of earlier configs is read as one of these (with its lr).
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
        >>> bool(sgd.alpha < before), info.scalar_loss  # and leaves nothing to the caller
        (True, tensor(0.))
    """

    State = SGDState

    def __init__(self, action_spec: Any, initial_alpha: float = 0.1,
                 target_entropy: Any = None, window_size: int = 1, lr: float = 3e-4,
                 optimizer: str = "adam", min_alpha: float = 1e-4,
                 max_alpha: Optional[float] = None, update_mode: str = "auto",
                 batch_shape: Sequence[int] = (), debug_summaries: bool = False,
                 name: str = "SGDEntropyTargetAlgorithm", **unknown: Any):
        super().__init__(action_spec, target_entropy, initial_alpha, min_alpha, max_alpha,
                         update_mode, batch_shape, debug_summaries, name)
        optimizer, lr = _rule_of(optimizer, lr)
        self._settings.update(lr=lr, optimizer=optimizer)
        self._refuse(unknown)
        self._configure({})
        window = check_int("window_size", window_size, minimum=1)
        self.register_buffer("_window", torch.zeros(self._batch + (window,)))
        self.register_buffer("_seen", self._full(0, torch.int64))
        self.register_buffer("_exp_avg", self._full(0.0))
        self.register_buffer("_exp_avg_sq", self._full(0.0))
        self.register_buffer("_adam_step", self._full(0, torch.int64))

    def _constants(self, s: Dict[str, Any]) -> SGDConsts:
        check_choice("optimizer", s["optimizer"], ("adam", "sgd"))
        return SGDConsts(check_real("lr", s["lr"], minimum=0.0), s["optimizer"] == "adam")

    def _rule(self, x: Any, s: SGDState, entropy: Any, target: Any) -> SGDState:
        return sgd_rule(x, s, entropy, target, self._c)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        return {"entropy": window_mean(TensorOps, self._window, self._seen)}
